package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// DefaultSocket is where vpcipd listens unless configured otherwise.
const DefaultSocket = "/run/vpcip/ipamd.sock"

// ErrUnreachable wraps failures to reach the daemon at all (socket missing,
// connection refused, timeout): the plugin answers CNI error 11.
var ErrUnreachable = errors.New("vpcipd unreachable")

// Client calls vpcipd over its unix socket through net/http, one
// connection per call (no keep-alive: the plugin makes one or two calls per
// process). The zero value is not usable; use NewClient.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the daemon at socket. timeout bounds each
// call (connect, request and answer); zero means 10 seconds.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr, Timeout: timeout}}
}

// Assign asks for the Key's address. Errors are *Error (daemon refusal) or
// wrap ErrUnreachable.
func (c *Client) Assign(ctx context.Context, req AssignRequest) (Assignment, error) {
	req.Version = Version
	var out Assignment
	err := c.do(ctx, "POST", "/v1/assign", req, &out)
	return out, err
}

// Release gives the Key's address back; an unknown Key is success.
func (c *Client) Release(ctx context.Context, req ReleaseRequest) (ReleaseResponse, error) {
	req.Version = Version
	var out ReleaseResponse
	err := c.do(ctx, "POST", "/v1/release", req, &out)
	return out, err
}

// Check returns the Key's assignment, or an *Error with CodeNotFound.
func (c *Client) Check(ctx context.Context, req CheckRequest) (Assignment, error) {
	req.Version = Version
	var out Assignment
	err := c.do(ctx, "POST", "/v1/check", req, &out)
	return out, err
}

// GC releases every assignment of req.Network not listed in req.Valid.
func (c *Client) GC(ctx context.Context, req GCRequest) (GCResponse, error) {
	req.Version = Version
	var out GCResponse
	err := c.do(ctx, "POST", "/v1/gc", req, &out)
	return out, err
}

// Status returns readiness and pool counts.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	err := c.do(ctx, "GET", "/v1/status", nil, &out)
	return out, err
}

// maxAnswer bounds an answer's body; a GC answer listing 10,000 released
// assignments fits.
const maxAnswer = 4 << 20

// do sends in as JSON (none when nil) and decodes a 2xx answer into out.
// Errors: ErrUnreachable wrapped with the socket for a failure to connect,
// send or read the whole answer (timeouts and cancellation included); an
// *Error for a refusal (the daemon's own, or CodeInternal for a non-JSON
// error answer or an undecodable one).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://vpcipd"+path, body)
	if err != nil {
		return fmt.Errorf("build %s request: %w", path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		return fmt.Errorf("%w at %s: reading answer: %v", ErrUnreachable, c.socket, err)
	case len(data) > maxAnswer:
		return fmt.Errorf("%w at %s: answer larger than %d bytes", ErrUnreachable, c.socket, maxAnswer)
	}
	if resp.StatusCode/100 != 2 {
		e := &Error{}
		if jerr := json.Unmarshal(data, e); jerr != nil || e.Code == "" {
			return &Error{Version: Version, Code: CodeInternal,
				Message: fmt.Sprintf("vpcipd answered %s %s: HTTP %d: %.200s", method, path, resp.StatusCode, data)}
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Version: Version, Code: CodeInternal, Message: fmt.Sprintf("decode vpcipd answer to %s: %v", path, err)}
	}
	return nil
}
