package datastore

import (
	"net/netip"
	"slices"
	"time"
)

// Conntrack flush bookkeeping. An address whose connection-tracking
// entries may lead to a previous holder is unflushed: every address the
// store learns (at start-up, restored or from the cloud), every address
// released (DEL, GC, route-less release), and any MarkUnflushed names
// (stale rules). It is due for a flush once its cooldown has passed, so
// entries made while it cooled down (a client retransmitting to the
// deleted pod) go too; the daemon flushes every due address in one dump
// (FlushDue, Flushed), off the ADD path. An Assign that hands out an
// address not flushed since (an ADD ahead of that dump, or
// IP_COOLDOWN_PERIOD=0, which leaves no time to flush in) says so with
// Assignment.Unflushed, and the caller flushes it before answering. An
// unflushed address that leaves the node (released to the cloud, its ENI
// deleted, gone from the cloud's view) is due at once: EC2 may give it to
// another node or pod, and this node's entries would still send a
// client's retransmissions to it.

// Conntrack is the conntrack flush bookkeeping described above. Get it
// from Store.Conntrack; it works under the store's lock.
type Conntrack struct{ s *state }

// SetFlushing turns the bookkeeping on (the daemon, which flushes);
// off, no address is ever unflushed. Set it before use.
func (c Conntrack) SetFlushing(on bool) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushing = on
}

// unflushedLocked marks a as unflushed by a mark newer than any flush
// started before now.
func (s *state) unflushedLocked(a *address) {
	if !s.flushing {
		return
	}
	s.flushMark++
	a.unflushed = s.flushMark
}

// forgetLocked drops addr, free, from the store; unflushed, it stays due
// for a flush until Flushed covers its mark.
func (s *state) forgetLocked(addr netip.Addr, a *address) {
	if a.unflushed != 0 {
		s.gone[addr] = a.unflushed
	}
	delete(s.addrs, addr)
}

// MarkUnflushed marks addr, if the store knows it and no one holds it, as
// needing a conntrack flush before it is handed out.
func (c Conntrack) MarkUnflushed(addr netip.Addr) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.addrs[addr]; a != nil && a.owner == nil {
		s.unflushedLocked(a)
		s.notifyLocked()
	}
}

// dueLocked reports whether free address a waits for a flush at now: it
// is unflushed and out of cooldown (a released address with no cooldown
// waits for the Assign that hands it out).
func (s *state) dueLocked(a *address, now time.Time) bool {
	if a.owner != nil || a.unflushed == 0 || a.releasing {
		return false
	}
	return a.unassignedAt.IsZero() || (s.cooldown > 0 && !s.coolingLocked(a, now))
}

// FlushDue returns the free addresses due for a conntrack flush at now,
// and those that left the node unflushed (sorted), the mark to give Flushed once they are flushed, and the
// earliest time another address becomes due (zero: none is cooling
// unflushed).
func (c Conntrack) FlushDue(now time.Time) (due []netip.Addr, mark uint64, next time.Time) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, a := range s.addrs {
		switch {
		case s.dueLocked(a, now):
			due = append(due, addr)
		case a.owner == nil && a.unflushed != 0 && s.cooldown > 0 && s.coolingLocked(a, now):
			if t := a.unassignedAt.Add(s.cooldown); next.IsZero() || t.Before(next) {
				next = t
			}
		}
	}
	for addr := range s.gone {
		due = append(due, addr)
	}
	slices.SortFunc(due, netip.Addr.Compare)
	return due, s.flushMark, next
}

// Flushed records that a conntrack flush of addrs began after FlushDue (or
// Assign) returned mark: those not marked again since are clean, and
// waiting Assigns look again.
func (c Conntrack) Flushed(addrs []netip.Addr, mark uint64) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, addr := range addrs {
		if a := s.addrs[addr]; a != nil && a.unflushed != 0 && a.unflushed <= mark {
			a.unflushed = 0
		}
		if m, ok := s.gone[addr]; ok && m <= mark {
			delete(s.gone, addr)
			s.gen++ // the checkpoint lists it (State.Departed)
		}
	}
	s.notifyLocked()
}
