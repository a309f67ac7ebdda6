package api

import (
	"bufio"
	"bytes"
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

// ErrNoEndpoint wraps the *Error of a daemon that does not serve the path
// asked (HTTP 404 without CodeNotFound): one older than the call.
var ErrNoEndpoint = errors.New("vpcipd has no such endpoint")

// Client calls vpcipd over its unix socket, one connection per call. It
// speaks HTTP/1.0 (RFC 1945) itself instead of going through net/http: the
// plugin is a new process for every CNI call, and linking net/http (with
// crypto/tls and HTTP/2, which a unix socket never needs) made each start
// run 1.07 M user-space instructions instead of 0.75 M (cachegrind, CNI
// VERSION) in a 7.4 MB binary instead of 4.2 MB. An answer to an HTTP/1.0
// request is never chunked (RFC 9112 §7.1): its body ends at
// Content-Length or when the server closes the connection. The daemon's
// side is a standard net/http server (curl reaches it as before). The zero
// value is not usable; use NewClient.
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

// maxHeader bounds an answer's status line and headers together, in bytes.
// vpcipd's (a Go server's) take under 200; without a bound a peer sending
// an endless header line grows the plugin until the call's timeout.
const maxHeader = 64 << 10

// do sends in as JSON (none when nil) and decodes a 2xx answer into out.
// Errors: ErrUnreachable wrapped with the socket for a failure to connect,
// send or read the whole answer (timeouts and cancellation included); an
// *Error for a refusal (the daemon's own, or CodeInternal for a non-JSON
// error answer or an undecodable one).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		body = b
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
		if status == 404 && e.Code != CodeNotFound {
			return fmt.Errorf("%w: %w", ErrNoEndpoint, e)
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Version: Version, Code: CodeInternal, Message: fmt.Sprintf("decode vpcipd answer to %s: %v", path, err)}
	}
	return nil
}

// roundTrip sends one HTTP/1.0 request on a new connection and returns the
// answer's status code and whole body (at most maxAnswer bytes). ctx's
// deadline and cancellation end a blocked dial, write or read. An error
// names the step that failed: connecting, sending request, awaiting answer
// (no status line yet), reading answer headers, reading answer (the body).
func (c *Client) roundTrip(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	failed := func(step string, err error) error { return stepError(ctx, step, err) }
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return 0, nil, failed("connecting", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.0\r\nHost: vpcipd\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return 0, nil, failed("sending request", err)
	}

	head := &io.LimitedReader{R: conn, N: maxHeader}
	br := bufio.NewReader(head)
	status, hdr, err := readHead(br, head, failed)
	if err != nil {
		return 0, nil, err
	}
	head.N = maxAnswer + 1 // readBody's own bounds apply
	data, err := readBody(br, hdr, failed)
	if err != nil {
		return 0, nil, err
	}
	return status, data, nil
}

// readBody reads the whole body of an answer with headers hdr from br: at
// most maxAnswer bytes, by Content-Length or up to the end of the
// connection. failed names the step of an I/O error.
func readBody(br *bufio.Reader, hdr textproto.MIMEHeader, failed func(step string, err error) error) ([]byte, error) {
	if te := hdr.Get("Transfer-Encoding"); te != "" {
		return nil, fmt.Errorf("malformed HTTP response: Transfer-Encoding %q in an answer to HTTP/1.0", te)
	}
	if cl := hdr.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		switch {
		case err != nil || n < 0:
			return nil, fmt.Errorf("malformed HTTP response: Content-Length %q", cl)
		case n > maxAnswer:
			return nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, failed("reading answer", err)
		}
		return data, nil
	}
	data, err := io.ReadAll(io.LimitReader(br, maxAnswer+1))
	switch {
	case err != nil:
		return nil, failed("reading answer", err)
	case len(data) > maxAnswer:
		return nil, fmt.Errorf("answer larger than %d bytes", maxAnswer)
	}
	// A body without Content-Length (a Go server sends none for an answer
	// above 2 KiB to an HTTP/1.0 request) ends when the server closes, as it
	// also does when its handler aborts or the daemon dies mid-answer: only
	// the JSON tells the two apart. A cut answer is a failed read, like a
	// short Content-Length body, not a malformed answer.
	if derr := json.NewDecoder(bytes.NewReader(data)).Decode(new(json.RawMessage)); errors.Is(derr, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("reading answer: %w: the connection closed after %d bytes, inside the JSON", derr, len(data))
	}
	return data, nil
}

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

// readHead reads the final answer's status code and headers from br, which
// reads head, skipping interim 1xx answers (RFC 9110 §15.2: a client must
// parse them even unasked; a Go server sends 103 Early Hints to an HTTP/1.0
// request too). failed names the step of an I/O error.
func readHead(br *bufio.Reader, head *io.LimitedReader, failed func(step string, err error) error) (int, textproto.MIMEHeader, error) {
	for {
		// Not textproto's ReadLine: it returns a line cut by a timeout or
		// the end of the connection as if it were whole, and drops the error.
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, nil, failed("awaiting answer", headBound(head, err))
		}
		status, err := parseStatusLine(strings.TrimRight(line, "\r\n"))
		if err != nil {
			return 0, nil, err
		}
		hdr, err := textproto.NewReader(br).ReadMIMEHeader()
		if err != nil {
			return 0, nil, failed("reading answer headers", headBound(head, err))
		}
		// 101 Switching Protocols is final (and refused by the caller: we
		// never ask for an upgrade).
		if status >= 200 || status == 101 {
			return status, hdr, nil
		}
	}
}

// headBound is err from reading the status line or headers, or the header
// bound when head ran out before they ended.
func headBound(head *io.LimitedReader, err error) error {
	if head.N == 0 {
		return fmt.Errorf("answer headers larger than %d bytes", maxHeader)
	}
	return err
}

// parseStatusLine reads the code of an HTTP/1.x status line
// ("HTTP/1.0 200 OK"; RFC 9112 §4).
func parseStatusLine(line string) (int, error) {
	proto, rest, _ := strings.Cut(line, " ")
	codeText, _, _ := strings.Cut(rest, " ")
	code, err := strconv.Atoi(codeText)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || len(codeText) != 3 || code < 100 {
		return 0, fmt.Errorf("malformed HTTP response: status line %.60q", line)
	}
	return code, nil
}
