package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// flushConntrackShared is flushConntrack for a burst: each dump walks the
// kernel's whole conntrack table (every netns's, ~5 ms of CPU here), so
// plugin processes that need one at the same time share it. A process
// queues its address (a file), then takes the node's lock; if a dump that
// began after it queued has already covered its address (the file is
// gone), it is done; otherwise it dumps once for every queued address and
// removes their files. Each address is still dumped after it was asked
// for and before the caller goes on, as with a dump of its own. Alone, a
// process makes one dump, as before; when the queue cannot be used it
// dumps alone. Only the dumping process learns how many entries were
// deleted; the others report 0.
//
// dir is the node's queue directory (invocation.conntrackQueue): a lock
// file and one empty file per waiting request.
func flushConntrackShared(dir string, addr netip.Addr) (uint, error) {
	if !addr.Is4() {
		return 0, nil
	}
	q, err := openConntrackQueue(dir)
	if err != nil {
		return flushConntrack(addr)
	}
	return q.flush(addr, dumpAndDelete)
}

// conntrackQueue is one node's queue directory.
type conntrackQueue struct{ dir string }

// openConntrackQueue makes the queue directory dir.
func openConntrackQueue(dir string) (conntrackQueue, error) {
	return conntrackQueue{dir}, os.MkdirAll(dir, 0o755)
}

// flush queues addr and waits for a dump covering it, or makes one for
// every queued address with dump.
func (q conntrackQueue) flush(addr netip.Addr, dump func(map[[4]byte]uint) (map[[4]byte]uint, error)) (uint, error) {
	alone := func() (uint, error) {
		n, err := dump(map[[4]byte]uint{addr.As4(): 0})
		if err != nil {
			return n[addr.As4()], fmt.Errorf("conntrack entries of %v: %w", addr, err)
		}
		return n[addr.As4()], nil
	}
	request := filepath.Join(q.dir, fmt.Sprintf("%s_%d_%d", addr, os.Getpid(), time.Now().UnixNano()))
	if err := os.WriteFile(request, nil, 0o644); err != nil {
		return alone()
	}
	lock, err := os.OpenFile(filepath.Join(q.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		os.Remove(request)
		return alone()
	}
	defer lock.Close() // releases the lock too
	if err := flock(lock); err != nil {
		os.Remove(request)
		return alone()
	}
	if _, err := os.Stat(request); errors.Is(err, fs.ErrNotExist) {
		return 0, nil // covered by a dump that began after the request
	}
	requests, want := q.queued()
	want[addr.As4()] = 0
	n, err := dump(want)
	if err != nil {
		// The requests stay: each waiting process dumps again.
		return n[addr.As4()], fmt.Errorf("conntrack entries of %v: %w", addr, err)
	}
	for _, r := range requests {
		os.Remove(r)
	}
	os.Remove(request)
	return n[addr.As4()], nil
}

// queued lists the request files and their addresses.
func (q conntrackQueue) queued() ([]string, map[[4]byte]uint) {
	want := map[[4]byte]uint{}
	entries, _ := os.ReadDir(q.dir)
	var files []string
	for _, e := range entries {
		a, _, ok := strings.Cut(e.Name(), "_")
		addr, err := netip.ParseAddr(a)
		if !ok || err != nil || !addr.Is4() {
			continue
		}
		want[addr.As4()] = 0
		files = append(files, filepath.Join(q.dir, e.Name()))
	}
	return files, want
}

// flock takes f's exclusive lock, waiting as long as another holds it.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
