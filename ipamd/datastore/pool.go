package datastore

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/warmpool"
)

// Counts are the pool's numbers, in addresses (ENIs for ENIs).
type Counts struct {
	Assigned  int // held by pods (orphans included)
	Warm      int // free, out of cooldown, assignable now
	Cooling   int // free but released less than the cooldown ago
	Releasing int // in slots being unassigned or on ENIs being deleted
	Total     int // on known ENIs
	Orphans   int // assigned, but the cloud no longer shows them on our ENIs
	ENIs      int // attached ENIs
	Slots     int // secondary addresses and /28 prefixes on those ENIs
}

// Counts tallies the pool at now.
func (d *Store) Counts(now time.Time) Counts {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var c Counts
	c.ENIs = len(s.enis)
	for _, e := range s.enis {
		c.Slots += len(e.Slots)
	}
	for _, a := range s.addrs {
		if a.eni == "" {
			if a.owner != nil {
				c.Assigned++
				c.Orphans++
			}
			continue
		}
		c.Total++
		e := s.enis[a.eni]
		switch {
		case a.owner != nil:
			c.Assigned++
		case a.releasing || (e != nil && e.Deleting):
			c.Releasing++
		case s.coolingLocked(a, now):
			c.Cooling++
		default:
			c.Warm++
		}
	}
	return c
}

// Snapshot is the pool as warmpool.Plan sees it at now. Slots being released
// are left out; they are gone as far as planning goes.
func (d *Store) Snapshot(now time.Time) []warmpool.ENI {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []warmpool.ENI{}
	for _, e := range s.enisLocked() {
		if e.Deleting {
			continue
		}
		we := warmpool.ENI{ID: e.ID, Primary: e.Primary(), Attached: e.Attached}
		for _, slot := range e.Slots {
			ws := warmpool.Slot{Prefix: slot}
			releasing := false
			for addr := range s.slotAddrsLocked(slot) {
				a := s.addrs[addr]
				switch {
				case a == nil:
				case a.releasing:
					releasing = true
				case a.owner != nil:
					ws.Assigned++
				case s.coolingLocked(a, now):
					ws.Cooling++
					if until := a.unassignedAt.Add(s.cooldown); until.After(ws.CoolingUntil) {
						ws.CoolingUntil = until
					}
				}
			}
			if !releasing {
				we.Slots = append(we.Slots, ws)
			}
		}
		out = append(out, we)
	}
	return out
}

// LazySlotBits is the size, in host bits, above which a slot is lazy: an
// IPv6 /80 (48 host bits, 2^48 addresses) is never listed address by
// address; the store knows only the addresses it handed out (and their
// cooldown), and Assign makes the next one as it needs it. IPv4 slots (/32
// secondary addresses, /28 prefixes) are listed whole, as before.
const LazySlotBits = 16

// lazy reports whether slot is a lazy slot (see LazySlotBits).
func lazy(slot netip.Prefix) bool { return slot.Addr().BitLen()-slot.Bits() > LazySlotBits }

// knownInLocked lists the known addresses inside slot, sorted.
func (s *state) knownInLocked(slot netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for addr := range s.addrs {
		if slot.Contains(addr) {
			out = append(out, addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// slotAddrsLocked yields the addresses of slot the store may know: every
// address of an IPv4 slot, the known ones of a lazy slot.
func (s *state) slotAddrsLocked(slot netip.Prefix) func(func(netip.Addr) bool) {
	if !lazy(slot) {
		return addrsOf(slot)
	}
	return slices.Values(s.knownInLocked(slot))
}

// addrsOf yields the addresses of a /32 or /28 slot.
func addrsOf(slot netip.Prefix) func(func(netip.Addr) bool) {
	return func(yield func(netip.Addr) bool) {
		for a := slot.Masked().Addr(); slot.Contains(a); a = a.Next() {
			if !yield(a) {
				return
			}
		}
	}
}

func (s *state) enisLocked() []ENI {
	out := make([]ENI, 0, len(s.enis))
	for _, e := range s.enis {
		c := *e
		c.Slots = slices.Clone(e.Slots)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ENI) int { return a.DeviceNumber - b.DeviceNumber })
	return out
}
