package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs handler as an HTTP server on a unix socket in a temp dir, the
// way vpcipd serves the API, and returns the socket path.
func serve(t *testing.T, handler http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// serveConns runs handle on its own goroutine for every connection to a
// unix socket in a temp dir, and returns the socket path.
func serveConns(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "r.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return sock
}

// serveRaw answers every connection with answer after reading the request
// headers, then closes it.
func serveRaw(t *testing.T, answer string) string {
	return serveConns(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		_, _ = io.WriteString(c, answer)
	})
}

// serveStalled answers every connection with the start of an answer, then
// sends nothing more until the client closes.
func serveStalled(t *testing.T, start string) string {
	return serveConns(t, func(c net.Conn) {
		// Read the request's head first: bytes sent before the request is
		// written are an unsolicited answer to net/http, which then fails
		// the call at once rather than at its deadline (a race on a loaded
		// machine).
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(c, start)
		_, _ = io.Copy(io.Discard, r)
	})
}

func TestClientAssignRoundTrip(t *testing.T) {
	var got AssignRequest
	var gotMethod, gotType string
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotMethod, gotType = r.Method+" "+r.URL.Path, r.Header.Get("Content-Type")
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Errorf("decode request: %v", err)
		}
		json.NewEncoder(w).Encode(Assignment{Version: Version, Key: got.Key, Address: netip.MustParseAddr("100.64.1.9"), RouteTable: 2, MTU: 9001})
	}))
	key := Key{Network: "vpcip", ContainerID: "c1", IfName: "eth0"}
	a, err := NewClient(sock, time.Second).Assign(context.Background(), AssignRequest{Key: key, Netns: "/var/run/netns/p1"})
	if err != nil {
		t.Fatal(err)
	}
	if gotMethod != "POST /v1/assign" || gotType != "application/json" {
		t.Errorf("request %q with Content-Type %q, want POST /v1/assign, application/json", gotMethod, gotType)
	}
	if got.Version != Version || got.Key != key || got.Netns != "/var/run/netns/p1" {
		t.Errorf("daemon got %+v", got)
	}
	if a.Address != netip.MustParseAddr("100.64.1.9") || a.RouteTable != 2 || a.Key != key {
		t.Errorf("assignment %+v", a)
	}
}

// An answer above 2 KiB (a Go server sends it chunked) arrives whole.
func TestClientLargeAnswer(t *testing.T) {
	var released []Assignment
	for i := range 2000 {
		released = append(released, Assignment{Key: Key{Network: "vpcip", ContainerID: strings.Repeat("c", 60) + string(rune('a'+i%26)), IfName: "eth0"}})
	}
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(GCResponse{Version: Version, Released: released})
	}))
	resp, err := NewClient(sock, 5*time.Second).GC(context.Background(), GCRequest{Network: "vpcip"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Released) != len(released) || resp.Released[1999].Key != released[1999].Key {
		t.Errorf("got %d released, want %d", len(resp.Released), len(released))
	}
}

func TestClientStatusGET(t *testing.T) {
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/status" || r.ContentLength > 0 {
			t.Errorf("got %s %s with %d body bytes", r.Method, r.URL.Path, r.ContentLength)
		}
		json.NewEncoder(w).Encode(Status{Version: Version, Ready: true, Counts: Counts{Warm: 7}})
	}))
	st, err := NewClient(sock, time.Second).Status(context.Background())
	if err != nil || !st.Ready || st.Warm != 7 {
		t.Fatalf("Status = %+v, %v", st, err)
	}
}

// An interim 1xx answer before the real one is skipped (RFC 9110 §15.2: a
// client must parse them even unasked); a Go server sends 103 Early Hints
// when a handler writes it.
func TestClientInterimAnswer(t *testing.T) {
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</v1/status>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		json.NewEncoder(w).Encode(Status{Version: Version, Ready: true, Counts: Counts{Warm: 3}})
	}))
	st, err := NewClient(sock, time.Second).Status(context.Background())
	if err != nil || !st.Ready || st.Warm != 3 {
		t.Fatalf("Status = %+v, %v", st, err)
	}
}

func TestClientErrors(t *testing.T) {
	refusal := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(Error{Version: Version, Code: CodeNoAddress, Cause: CauseENILimit, Message: "no address: ENI limit"})
	}))
	garbage := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream exploded", http.StatusBadGateway)
	}))
	slow := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	stalling := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"version":`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	closing := serveRaw(t, "") // reads the request, closes without answering
	// A handler that aborts (or a daemon killed) mid-answer closes the
	// connection after part of a chunked body, without its last chunk.
	aborting := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"version":"1","released":[`+strings.Repeat(`{"key":{"network":"n"}},`, 200))
		panic(http.ErrAbortHandler)
	}))
	tests := []struct {
		name       string
		socket     string
		answer     string // raw answer instead of socket, when set
		timeout    time.Duration
		code       Code // want an *Error with this code
		unreached  bool // want ErrUnreachable
		retryable  bool
		msgContain string
	}{
		{name: "daemon refusal", socket: refusal, code: CodeNoAddress, retryable: true, msgContain: "ENI limit"},
		{name: "non-JSON error", socket: garbage, code: CodeInternal, msgContain: "HTTP 502: upstream exploded"},
		{name: "no socket", socket: filepath.Join(t.TempDir(), "missing.sock"), unreached: true, msgContain: "missing.sock"},
		{name: "timeout", socket: slow, timeout: 200 * time.Millisecond, unreached: true, msgContain: "awaiting answer: context deadline exceeded"},
		{name: "timeout mid-status-line", socket: serveStalled(t, "HTTP/1.0 2"), timeout: 200 * time.Millisecond, unreached: true, msgContain: "awaiting answer: context deadline exceeded"},
		{name: "timeout mid-answer", socket: stalling, timeout: 200 * time.Millisecond, unreached: true, msgContain: "reading answer: context deadline exceeded"},
		{name: "truncated body", answer: "HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n{\"version\":", unreached: true, msgContain: "unexpected EOF"},
		{name: "not HTTP", answer: "SSH-2.0-OpenSSH\r\n\r\n", unreached: true, msgContain: "malformed HTTP response"},
		{name: "daemon stopped mid-call", socket: closing, unreached: true, msgContain: "EOF"},
		{name: "daemon stopped mid-answer", socket: aborting, unreached: true, msgContain: "reading answer"},
		{name: "headers too large", answer: "HTTP/1.0 200 OK\r\nX-Pad: " + strings.Repeat("a", 1<<20) + "\r\nContent-Length: 2\r\n\r\n{}", unreached: true, msgContain: "headers exceeded 65536 bytes"},
		{name: "answer too large", answer: "HTTP/1.0 200 OK\r\nContent-Length: 99999999\r\n\r\n{}", unreached: true, msgContain: "larger than"},
		{name: "bad status line", answer: "HTTP/1.0 2x0 OK\r\n\r\n{}", unreached: true, msgContain: "malformed HTTP status code"},
		{name: "bad JSON answer", answer: "HTTP/1.0 200 OK\r\n\r\n{not json", code: CodeInternal, msgContain: "decode vpcipd answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := tt.socket
			if tt.answer != "" {
				sock = serveRaw(t, tt.answer)
			}
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 2 * time.Second
			}
			_, err := NewClient(sock, timeout).Release(context.Background(), ReleaseRequest{Key: Key{Network: "n", ContainerID: "c", IfName: "eth0"}})
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.msgContain) {
				t.Errorf("error %q lacks %q", err, tt.msgContain)
			}
			if got := errors.Is(err, ErrUnreachable); got != tt.unreached {
				t.Errorf("errors.Is(%v, ErrUnreachable) = %v, want %v", err, got, tt.unreached)
			}
			if tt.code != "" {
				var e *Error
				if !errors.As(err, &e) || e.Code != tt.code || e.Retryable() != tt.retryable {
					t.Errorf("error %#v, want *Error code %s retryable %v", err, tt.code, tt.retryable)
				}
			}
		})
	}
}

// Cancelling the caller's context ends a call the daemon has not answered.
func TestClientCancel(t *testing.T) {
	sock := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := NewClient(sock, time.Minute).Check(ctx, CheckRequest{Key: Key{Network: "n", ContainerID: "c", IfName: "eth0"}})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("err = %v, want ErrUnreachable mentioning the cancellation", err)
	}
}

// TestClientNoEndpoint: a 404 that is not CodeNotFound (a daemon that does
// not serve the path) wraps ErrNoEndpoint and keeps the daemon's *Error; a
// CHECK's not-found does not.
func TestClientNoEndpoint(t *testing.T) {
	body := `{"version":"v1","code":"invalid-request","message":"vpcipd: no endpoint POST /v1/gc/plan (see package ipamd/api)"}`
	sock := serveRaw(t, "HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	_, err := NewClient(sock, time.Second).GCPlan(context.Background(), GCRequest{Network: "vpcip"})
	var e *Error
	if !errors.Is(err, ErrNoEndpoint) || !errors.As(err, &e) || e.Code != CodeInvalid {
		t.Errorf("GCPlan from a daemon without it: %v, want ErrNoEndpoint wrapping invalid-request", err)
	}
	body = `{"version":"v1","code":"not-found","message":"vpcipd holds no address for vpcip/c/eth0"}`
	sock = serveRaw(t, "HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	_, err = NewClient(sock, time.Second).Check(context.Background(), CheckRequest{Key: Key{Network: "vpcip", ContainerID: "c", IfName: "eth0"}})
	if errors.Is(err, ErrNoEndpoint) || !errors.As(err, &e) || e.Code != CodeNotFound {
		t.Errorf("Check of an unknown key: %v, want not-found without ErrNoEndpoint", err)
	}
}

// Each call has a connection of its own, closed when the answer is read:
// no idle connection is kept for a call that may never come (the plugin
// exits after one or two calls) and none the daemon closed is reused; and
// the Transport sends on the connection roundTrip dialled, not one more of
// its own (6 connections for 3 calls if it dialled again).
func TestClientOneConnectionPerCall(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	states := map[http.ConnState]int{}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(Status{Version: Version, Ready: true})
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			states[s]++
		},
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := NewClient(sock, time.Second)
	for range 3 {
		if _, err := c.Status(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		opened, closed := states[http.StateNew], states[http.StateClosed]
		mu.Unlock()
		if opened == 3 && closed == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("3 calls: %d connections opened, %d closed; want 3 and 3", opened, closed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
