package ipamd

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// dumpHost records each conntrack flush; the first blocks until release is
// closed.
type dumpHost struct {
	NoHost
	release chan struct{}
	mu      sync.Mutex
	dumps   [][]netip.Addr
}

func (h *dumpHost) FlushConntrack(addrs []netip.Addr) (uint, error) {
	h.mu.Lock()
	first := len(h.dumps) == 0
	h.dumps = append(h.dumps, slices.Clone(addrs))
	h.mu.Unlock()
	if first {
		<-h.release
	}
	return 0, nil
}

// Requests made while a dump runs share the next one, which begins after
// them; none is answered by a dump that began before it.
func TestConntrackFlushesShareDumps(t *testing.T) {
	h := &dumpHost{release: make(chan struct{})}
	f := &conntrackFlusher{host: h, log: slog.New(slog.DiscardHandler), now: time.Now}
	a := netip.MustParseAddr("10.0.0.1")
	firstDone := make(chan error, 1)
	go func() { firstDone <- f.flush(context.Background(), []netip.Addr{a}) }()
	for h.count() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.flush(context.Background(), []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})}); err != nil {
				t.Error(err)
			}
		}()
	}
	f.waitQueued(t, 10)
	close(h.release)
	wg.Wait()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if h.count() != 2 || len(h.dumps[1]) != 10 {
		t.Fatalf("dumps %v, want the first alone and one for the 10 requests made meanwhile", h.dumps)
	}
}

func (h *dumpHost) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.dumps)
}

// waitQueued waits until n requests wait for the next dump.
func (f *conntrackFlusher) waitQueued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		got := len(f.waiters)
		f.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}
