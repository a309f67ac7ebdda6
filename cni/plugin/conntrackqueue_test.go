package plugin

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"
)

// dumpLog is a stand-in for dumpAndDelete that records the address sets it
// was asked for (the queue logic is pure file locking; the real dump is
// tested through the plugin in test/cnitest).
type dumpLog struct {
	mu    sync.Mutex
	calls [][]netip.Addr
	at    []time.Time
	delay time.Duration
	err   error
}

func (d *dumpLog) dump(want map[[4]byte]uint) (map[[4]byte]uint, error) {
	d.mu.Lock()
	var set []netip.Addr
	for a := range want {
		set = append(set, netip.AddrFrom4(a))
		want[a] = 1
	}
	sort.Slice(set, func(i, j int) bool { return set[i].Less(set[j]) })
	d.calls = append(d.calls, set)
	d.at = append(d.at, time.Now())
	d.mu.Unlock()
	time.Sleep(d.delay)
	return want, d.err
}

func newQueue(t *testing.T) conntrackQueue {
	q, err := openConntrackQueue(filepath.Join(t.TempDir(), "conntrack-flush"))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func queuedFiles(t *testing.T, q conntrackQueue) []string {
	files, _ := q.queued()
	return files
}

func TestConntrackQueueAlone(t *testing.T) {
	q, d := newQueue(t), &dumpLog{}
	n, err := q.flush(netip.MustParseAddr("100.64.1.9"), d.dump)
	if err != nil || n != 1 {
		t.Fatalf("flush = %d, %v; want 1, nil", n, err)
	}
	if len(d.calls) != 1 || len(d.calls[0]) != 1 {
		t.Errorf("dumps %v, want one for 100.64.1.9", d.calls)
	}
	if f := queuedFiles(t, q); len(f) != 0 {
		t.Errorf("requests left: %v", f)
	}
}

// Requests queued by other processes are served by the same dump.
func TestConntrackQueueServesQueued(t *testing.T) {
	q, d := newQueue(t), &dumpLog{}
	for _, r := range []string{"100.64.1.10_77_1", "100.64.1.11_78_2"} {
		if err := os.WriteFile(filepath.Join(q.dir, r), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.flush(netip.MustParseAddr("100.64.1.9"), d.dump); err != nil {
		t.Fatal(err)
	}
	want := "[100.64.1.9 100.64.1.10 100.64.1.11]"
	if len(d.calls) != 1 || fmtAddrs(d.calls[0]) != want {
		t.Errorf("dumps %v, want one for %s", d.calls, want)
	}
	if f := queuedFiles(t, q); len(f) != 0 {
		t.Errorf("requests left: %v", f)
	}
}

// A process whose request another's dump removed does not dump.
func TestConntrackQueueCoveredByAnother(t *testing.T) {
	q, d := newQueue(t), &dumpLog{}
	lock, err := os.OpenFile(filepath.Join(q.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := flock(lock); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   uint
		err error
	}
	done := make(chan result)
	go func() {
		n, err := q.flush(netip.MustParseAddr("100.64.1.9"), d.dump)
		done <- result{n, err}
	}()
	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		files = queuedFiles(t, q)
	}
	if len(files) != 1 {
		t.Fatalf("queued %v, want the waiting request", files)
	}
	os.Remove(files[0]) // as the dumping process does after its dump
	lock.Close()
	r := <-done
	if r.err != nil || r.n != 0 || len(d.calls) != 0 {
		t.Errorf("covered request: flush = %d, %v with dumps %v; want 0, nil and no dump", r.n, r.err, d.calls)
	}
}

// A failed dump leaves the queued requests for their own processes.
func TestConntrackQueueFailedDumpKeepsRequests(t *testing.T) {
	q, d := newQueue(t), &dumpLog{err: errors.New("netlink: no buffer space")}
	if err := os.WriteFile(filepath.Join(q.dir, "100.64.1.10_77_1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := q.flush(netip.MustParseAddr("100.64.1.9"), d.dump); err == nil {
		t.Fatal("dump error not returned")
	}
	if f := queuedFiles(t, q); len(f) != 2 {
		t.Errorf("requests left %v, want both", f)
	}
}

// Concurrent requests are each served by a dump that began after they were
// made, with fewer dumps than requests.
func TestConntrackQueueConcurrent(t *testing.T) {
	q, d := newQueue(t), &dumpLog{delay: 20 * time.Millisecond}
	const n = 8
	var wg sync.WaitGroup
	asked := make([]time.Time, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			asked[i] = time.Now()
			if _, err := q.flush(netip.AddrFrom4([4]byte{100, 64, 2, byte(i)}), d.dump); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := range n {
		a := netip.AddrFrom4([4]byte{100, 64, 2, byte(i)})
		served := false
		for c, set := range d.calls {
			for _, x := range set {
				if x == a && !d.at[c].Before(asked[i]) {
					served = true
				}
			}
		}
		if !served {
			t.Errorf("%v: no dump after it asked (dumps %v)", a, d.calls)
		}
	}
	if len(d.calls) >= n {
		t.Errorf("%d dumps for %d concurrent requests, want fewer", len(d.calls), n)
	}
	if f := queuedFiles(t, q); len(f) != 0 {
		t.Errorf("requests left: %v", f)
	}
}

func fmtAddrs(a []netip.Addr) string {
	s := "["
	for i, x := range a {
		if i > 0 {
			s += " "
		}
		s += x.String()
	}
	return s + "]"
}
