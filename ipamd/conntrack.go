package ipamd

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vpcip/vpcip/ipamd/datastore"
)

// flushWindow is how long the first address due for a conntrack flush waits
// for others, so addresses leaving cooldown together (a burst of DELs)
// share one dump of the table.
const flushWindow = 250 * time.Millisecond

// flushRetry is the wait after a failed flush before the next try.
const flushRetry = time.Second

// conntrackFlusher removes the connection-tracking entries of addresses
// before the datastore hands them out again (datastore's unflushed marks).
// Each flush is one dump of the node's conntrack table (the kernel walks
// all of it), so callers share dumps: a request joins the next dump, which
// begins after it, together with every other request made meanwhile. The
// background loop (run) flushes addresses as they leave cooldown, and the
// ones the store learns (start-up, new slots); with IP_COOLDOWN_PERIOD=0
// the ADD that hands out an unflushed address waits for a dump (flush).
type conntrackFlusher struct {
	host  Host
	store *datastore.Store
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex // guards the fields below
	pending map[netip.Addr]bool
	waiters []chan error
	running bool
}

// flush deletes the entries of addrs in a dump that begins after the call,
// and returns its error (or ctx's).
func (f *conntrackFlusher) flush(ctx context.Context, addrs []netip.Addr) error {
	done := make(chan error, 1)
	f.mu.Lock()
	if f.pending == nil {
		f.pending = map[netip.Addr]bool{}
	}
	for _, a := range addrs {
		f.pending[a] = true
	}
	f.waiters = append(f.waiters, done)
	if !f.running {
		f.running = true
		go f.dumpLoop()
	}
	f.mu.Unlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dumpLoop makes dumps while requests wait, each for every request queued
// before it began.
func (f *conntrackFlusher) dumpLoop() {
	for {
		f.mu.Lock()
		if len(f.waiters) == 0 {
			f.running = false
			f.mu.Unlock()
			return
		}
		addrs := make([]netip.Addr, 0, len(f.pending))
		for a := range f.pending {
			addrs = append(addrs, a)
		}
		waiters := f.waiters
		f.pending, f.waiters = nil, nil
		f.mu.Unlock()
		start := time.Now()
		n, err := f.host.FlushConntrack(addrs)
		f.log.Debug("conntrack flushed", "addresses", len(addrs), "entries", n, "took", time.Since(start), "err", err)
		for _, w := range waiters {
			w <- err
		}
	}
}

// run flushes the addresses the store has due, in batches, until ctx ends.
func (f *conntrackFlusher) run(ctx context.Context) {
	for {
		changed := f.store.Changed()
		due, mark, next := f.store.Conntrack().FlushDue(f.now())
		wait := time.Duration(0)
		if len(due) > 0 {
			if err := f.flush(ctx, due); ctx.Err() != nil {
				return
			} else if err != nil {
				f.log.Error("conntrack flush of released addresses failed; tried again (an ADD that takes one first waits for its own flush)",
					"addresses", len(due), "err", err)
				wait = flushRetry
			} else {
				f.store.Conntrack().Flushed(due, mark)
				continue
			}
		} else if !next.IsZero() {
			wait = max(next.Sub(f.now()), 0) + flushWindow
		}
		if !f.sleep(ctx, wait, changed) {
			return
		}
	}
}

// sleep waits for wait (forever when 0) or for a change to the store, then
// a window so that others join; false when ctx ended.
func (f *conntrackFlusher) sleep(ctx context.Context, wait time.Duration, changed <-chan struct{}) bool {
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-timer:
		return true
	case <-changed:
	}
	w := time.NewTimer(flushWindow)
	defer w.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-w.C:
		return true
	}
}
