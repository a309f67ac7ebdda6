package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultSocket is where vpcipd listens unless configured otherwise.
const DefaultSocket = "/run/vpcip/ipamd.sock"

// ErrUnreachable wraps failures to reach the daemon at all (socket missing,
// connection refused, timeout): the plugin answers CNI error 11.
var ErrUnreachable = errors.New("vpcipd unreachable")

// Client calls vpcipd over its unix socket. The zero value is not usable; use
// NewClient.
//
// It speaks HTTP/1.0 itself, one connection per call, rather than through
// net/http: the plugin is a new process for every pod, and linking net/http
// (with crypto/tls and x509, which its client pulls in) costs each start
// about 260,000 instructions of package initialisation and 80 page faults
// (a tenth of an ADD's instructions). HTTP/1.0 keeps the answer
// simple to read: a Go server never chunks it and closes the connection
// after it, so the body is what follows the headers (Content-Length when
// given).
type Client struct {
	socket  string
	timeout time.Duration
}

// NewClient returns a client for the daemon at socket. timeout bounds each
// call (connect, request and answer); zero means 10 seconds.
func NewClient(socket string, timeout time.Duration) *Client {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Client{socket: socket, timeout: timeout}
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

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		body = b
	}
	status, data, err := c.roundTrip(ctx, method, path, body)
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnreachable, c.socket, err)
	}
	if status/100 != 2 {
		e := &Error{}
		if jerr := json.Unmarshal(data, e); jerr != nil || e.Code == "" {
			return &Error{Version: Version, Code: CodeInternal,
				Message: fmt.Sprintf("vpcipd answered %s %s: HTTP %d: %.200s", method, path, status, data)}
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Version: Version, Code: CodeInternal, Message: fmt.Sprintf("decode vpcipd answer to %s: %v", path, err)}
	}
	return nil
}

// roundTrip sends one HTTP/1.0 request on a new connection and returns the
// answer's status code and body. Errors are failures to reach the daemon or
// to read its answer.
func (c *Client) roundTrip(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	// A cancelled ctx ends a call blocked on the connection at once.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := make([]byte, 0, 160+len(body))
	req = fmt.Appendf(req, "%s %s HTTP/1.0\r\nHost: vpcipd\r\n", method, path)
	if body != nil {
		req = fmt.Appendf(req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req = append(append(req, "\r\n"...), body...)
	if _, err := conn.Write(req); err != nil {
		return 0, nil, ctxErr(ctx, fmt.Errorf("sending request: %w", err))
	}
	status, data, err := readAnswer(bufio.NewReader(conn))
	if err != nil {
		return 0, nil, ctxErr(ctx, fmt.Errorf("reading answer: %w", err))
	}
	return status, data, nil
}

// ctxErr prefers the context's error (deadline, cancellation) to the
// connection error it caused.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

// readAnswer reads an HTTP/1.x answer: the status line, the headers, and
// the body (Content-Length bytes when given, else up to the end of the
// connection), at most maxAnswer bytes.
func readAnswer(br *bufio.Reader) (int, []byte, error) {
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err != nil {
		return 0, nil, err
	}
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || status < 100 || status > 999 {
		return 0, nil, fmt.Errorf("malformed status line %.100q", line)
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return 0, nil, fmt.Errorf("headers: %w", err)
	}
	if te := hdr.Get("Transfer-Encoding"); te != "" && te != "identity" {
		return 0, nil, fmt.Errorf("unexpected Transfer-Encoding %q in an HTTP/1.0 answer", te)
	}
	want := int64(-1)
	if cl := hdr.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 || n > maxAnswer {
			return 0, nil, fmt.Errorf("bad Content-Length %q", cl)
		}
		want = n
	}
	limit := want
	if limit < 0 {
		limit = maxAnswer + 1
	}
	data, err := io.ReadAll(io.LimitReader(br, limit))
	switch {
	case err != nil:
		return 0, nil, err
	case want >= 0 && int64(len(data)) < want:
		return 0, nil, fmt.Errorf("answer ends after %d of %d bytes", len(data), want)
	case len(data) > maxAnswer:
		return 0, nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	return status, data, nil
}
