package fleet

import (
	"net/http"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestRequestKey: the harness's own requests are named as the API server's
// apiserver_request_total labels them, so that they can be subtracted.
func TestRequestKey(t *testing.T) {
	tests := []struct {
		method, path, want string
	}{
		{"POST", "/api/v1/namespaces/fl1/pods", "POST pods"},
		{"DELETE", "/api/v1/namespaces/fl1/pods/p1-node-1", "DELETE pods"},
		{"PUT", "/api/v1/nodes/fl1-node-1/status", "PUT nodes/status"},
		{"POST", "/api/v1/nodes", "POST nodes"},
		{"GET", "/api/v1/namespaces/fl1/pods/p1", "GET pods"},
		{"GET", "/api/v1/namespaces/fl1/pods", "LIST pods"},
		{"GET", "/api/v1/pods?watch=true", "WATCH pods"},
		{"PUT", "/apis/vpcip.io/v1alpha1/addressbudgets/n1/status", "PUT addressbudgets/status"},
		{"GET", "/metrics", ""},
		{"GET", "/api", ""},
	}
	for _, tt := range tests {
		u, err := url.Parse("https://127.0.0.1:6443" + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := requestKey(&http.Request{Method: tt.method, URL: u}); got != tt.want {
			t.Errorf("%s %s: %q, want %q", tt.method, tt.path, got, tt.want)
		}
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Second)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Second}, {0.99, 99 * time.Second}, {1, 100 * time.Second}, {0, time.Second}} {
		if got := quantile(ds, tt.q); got != tt.want {
			t.Errorf("quantile %v: %v, want %v", tt.q, got, tt.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

// TestReadProc reads this test process's CPU time and resident memory.
// It first spins until getrusage counts 60 ms of CPU (not 60 ms of wall
// time, which a loaded machine may give a fraction of the processor).
func TestReadProc(t *testing.T) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	deadline := time.Now().Add(30 * time.Second)
	for cpu() < 60*time.Millisecond && time.Now().Before(deadline) {
	}
	before := cpu()
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts clock ticks (10 ms): allow two.
	if s.CPU < max(before-20*time.Millisecond, 40*time.Millisecond) || s.RSS < 1<<20 {
		t.Fatalf("own process: CPU %v, RSS %d bytes; want at least what getrusage counted before (%v) less 20ms, and 1 MiB", s.CPU, s.RSS, before)
	}
}
