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
	"net/url"
	"os"
	"time"
)

// DefaultSocket is where vpcipd listens unless configured otherwise.
const DefaultSocket = "/run/vpcip/ipamd.sock"

// ErrUnreachable wraps failures to reach the daemon at all (socket missing,
// connection refused, timeout): the plugin answers CNI error 11.
var ErrUnreachable = errors.New("vpcipd unreachable")

// ErrNoEndpoint wraps the *Error of a daemon that does not serve the path
// asked (HTTP 404 without CodeNotFound): one older than the call.
var ErrNoEndpoint = errors.New("vpcipd has no such endpoint")

// AnswerMargin is the most time Client.Assign leaves between the deadline
// it asks the daemon to answer by and the one it waits until.
const AnswerMargin = 250 * time.Millisecond

// Client calls vpcipd over its unix socket with net/http, one connection
// per call (no keep-alive: the plugin is a new process for every CNI call,
// and a kept connection the daemon has closed would fail the next POST).
// The daemon's side is a standard net/http server (curl reaches it too).
// The zero value is not usable; use NewClient.
type Client struct {
	socket  string
	timeout time.Duration
	http    *http.Client
}

// NewClient returns a client for the daemon at socket. timeout bounds each
// call (connect, request and the whole answer); zero means 10 seconds.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var d net.Dialer
	tr := &http.Transport{
		// roundTrip dials in the caller's goroutine and hands the
		// connection over through the request's context; dialling
		// here, in the Transport's fresh goroutine, also grows that
		// goroutine's small stack (~25K instructions per call).
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if conn, ok := ctx.Value(dialedConn{}).(net.Conn); ok {
				return conn, nil
			}
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: maxHeader,
		// Proxy stays nil: HTTP_PROXY in the runtime's environment must
		// not send a call for the socket elsewhere.
	}
	return &Client{socket: socket, timeout: timeout, http: &http.Client{Transport: tr}}
}

// Assign asks for the Key's address. Errors are *Error (daemon refusal) or
// wrap ErrUnreachable. Unless req has a Deadline, it gets the call's (ctx's
// or the client's timeout, the earlier) less a tenth of the time left, at
// most AnswerMargin: an answer the daemon sends by then reaches the caller
// before it gives up.
func (c *Client) Assign(ctx context.Context, req AssignRequest) (Assignment, error) {
	req.Version = Version
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok && req.Deadline.IsZero() {
		req.Deadline = dl.Add(-min(AnswerMargin, time.Until(dl)/10))
	}
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

// GC releases every stale assignment of req.Network at once (one-step GC,
// see GCRequest).
func (c *Client) GC(ctx context.Context, req GCRequest) (GCResponse, error) {
	req.Version = Version
	var out GCResponse
	err := c.do(ctx, "POST", "/v1/gc", req, &out)
	return out, err
}

// GCPlan lists the stale assignments of req.Network (GCResponse.Released)
// and releases nothing. A daemon that predates it answers an error
// wrapping ErrNoEndpoint.
func (c *Client) GCPlan(ctx context.Context, req GCRequest) (GCResponse, error) {
	req.Version = Version
	var out GCResponse
	err := c.do(ctx, "POST", "/v1/gc/plan", req, &out)
	return out, err
}

// GCRelease releases the stale assignments req.Release names and returns
// those it released. A daemon that predates it answers an error wrapping
// ErrNoEndpoint, having released nothing.
func (c *Client) GCRelease(ctx context.Context, req GCRequest) (GCResponse, error) {
	req.Version = Version
	var out GCResponse
	err := c.do(ctx, "POST", "/v1/gc/release", req, &out)
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

// maxHeader bounds an answer's status line and headers together, in bytes
// (http.Transport.MaxResponseHeaderBytes). vpcipd's (a Go server's) take
// under 200.
const maxHeader = 64 << 10

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
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	status, data, err := c.roundTrip(ctx, method, path, body)
	if err != nil {
		return fmt.Errorf("%w at %s: %s %s: %v", ErrUnreachable, c.socket, method, path, err)
	}
	if status/100 != 2 {
		e := &Error{}
		if jerr := json.Unmarshal(data, e); jerr != nil || e.Code == "" {
			e = &Error{Version: Version, Code: CodeInternal,
				Message: fmt.Sprintf("vpcipd answered %s %s: HTTP %d: %.200s", method, path, status, bytes.TrimSpace(data))}
		}
		if status == http.StatusNotFound && e.Code != CodeNotFound {
			return fmt.Errorf("%w: %w", ErrNoEndpoint, e)
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Version: Version, Code: CodeInternal, Message: fmt.Sprintf("decode vpcipd answer to %s: %v", path, err)}
	}
	return nil
}

// roundTrip sends one request and returns the answer's status code and
// whole body (at most maxAnswer bytes). An error names the step that
// failed: connecting, awaiting answer (request sent, no answer headers
// yet), reading answer (the body).
func (c *Client) roundTrip(ctx context.Context, method, path string, body io.Reader) (int, []byte, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return 0, nil, stepError(ctx, "connecting", err)
	}
	defer conn.Close() // the Transport closes it too (no keep-alive)
	ctx = context.WithValue(ctx, dialedConn{}, conn)
	req, err := http.NewRequestWithContext(ctx, method, "http://vpcipd"+path, body)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL are in the caller's message
		}
		return 0, nil, stepError(ctx, "awaiting answer", err)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxAnswer {
		return 0, nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		return 0, nil, stepError(ctx, "reading answer", err)
	case len(data) > maxAnswer:
		return 0, nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return resp.StatusCode, data, nil
}

// dialedConn is the context key under which roundTrip hands the
// Transport the connection it dialled for the request.
type dialedConn struct{}

// stepError is err from step of a call ending by ctx. When ctx is done its
// deadline or the caller's cancellation is the cause, not the socket
// timeout it causes (which can fire a moment before ctx reports it).
func stepError(ctx context.Context, step string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		err = cerr
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		err = context.DeadlineExceeded
	}
	return fmt.Errorf("%s: %w", step, err)
}
