package datastore

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/provider"
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
func (s *Store) Counts(now time.Time) Counts {
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
func (s *Store) Snapshot(now time.Time) []warmpool.ENI {
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
			for addr := range addrsOf(slot) {
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

func (s *Store) enisLocked() []ENI {
	out := make([]ENI, 0, len(s.enis))
	for _, e := range s.enis {
		c := *e
		c.Slots = slices.Clone(e.Slots)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b ENI) int { return a.DeviceNumber - b.DeviceNumber })
	return out
}

// Repairs is what a sync changed.
type Repairs struct {
	AdoptedENIs    []string       // ENIs the cloud shows and the store did not have
	ForgottenENIs  []string       // ENIs the store had and the cloud no longer shows
	AdoptedSlots   []netip.Prefix // slots the cloud shows and the store did not have
	ForgottenSlots []netip.Prefix // slots gone from the cloud (none held an assigned address)
	KeptAssigned   []netip.Addr   // assigned addresses the cloud no longer shows: kept for their pods, never reused
}

// Changes counts what a sync repaired.
func (r Repairs) Changes() int {
	return len(r.AdoptedENIs) + len(r.ForgottenENIs) + len(r.AdoptedSlots) + len(r.ForgottenSlots) + len(r.KeptAssigned)
}

// Sync makes the store's ENIs and slots equal to enis, which must come from
// the authoritative API (EC2 DescribeNetworkInterfaces), never from instance
// metadata alone. Assigned addresses the cloud no longer shows stay assigned
// to their keys (their pods still use them) but are not handed out again once
// released.
func (s *Store) Sync(enis []provider.ENI, now time.Time) Repairs {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r Repairs
	seen := map[string]bool{}
	for _, e := range enis {
		seen[e.ID] = true
		s.putENILocked(e, &r)
	}
	for id := range s.enis {
		if !seen[id] {
			s.forgetENILocked(id, &r)
		}
	}
	// Restored cooldown records of addresses no ENI holds are moot.
	for addr, a := range s.addrs {
		if a.eni == "" && a.owner == nil {
			delete(s.addrs, addr)
		}
	}
	s.synced = true
	s.gen++
	s.notifyLocked()
	return r
}

// PutENI records one ENI with exactly the slots the cloud returned for it
// (after CreateENI or a Describe of that ENI).
func (s *Store) PutENI(e provider.ENI) Repairs {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r Repairs
	s.putENILocked(e, &r)
	s.gen++
	s.notifyLocked()
	return r
}

func cloudSlots(e provider.ENI) []netip.Prefix {
	var slots []netip.Prefix
	for _, a := range e.SecondaryIPs {
		slots = append(slots, netip.PrefixFrom(a, a.BitLen()))
	}
	for _, p := range e.Prefixes {
		slots = append(slots, p.Masked())
	}
	slices.SortFunc(slots, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(slots)
}

func (s *Store) putENILocked(pe provider.ENI, r *Repairs) {
	e := s.enis[pe.ID]
	if e == nil {
		e = &ENI{ID: pe.ID}
		s.enis[pe.ID] = e
		r.AdoptedENIs = append(r.AdoptedENIs, pe.ID)
	}
	e.MAC, e.DeviceNumber, e.SubnetID = pe.MAC, pe.DeviceNumber, pe.SubnetID
	e.SubnetCIDR, e.Gateway, e.PrimaryIP = pe.SubnetCIDR, pe.Gateway, pe.PrimaryIP
	if !pe.Attached.IsZero() {
		e.Attached = pe.Attached
	}
	want := cloudSlots(pe)
	for _, slot := range e.Slots {
		if !slices.Contains(want, slot) {
			s.dropSlotLocked(slot, r)
			r.ForgottenSlots = append(r.ForgottenSlots, slot)
		}
	}
	for _, slot := range want {
		if !slices.Contains(e.Slots, slot) {
			r.AdoptedSlots = append(r.AdoptedSlots, slot)
		}
		s.addSlotLocked(e.ID, slot)
	}
	e.Slots = want
}

// addSlotLocked makes every address of slot known on eni, keeping owners and
// cooldown records restored from a checkpoint.
func (s *Store) addSlotLocked(eni string, slot netip.Prefix) {
	for addr := range addrsOf(slot) {
		a := s.addrs[addr]
		if a == nil {
			a = &address{}
			s.unflushedLocked(a) // a previous holder on this node may have left entries
			s.addrs[addr] = a
			delete(s.gone, addr) // flushed as a known address now
		}
		a.eni, a.slot = eni, slot
	}
}

// dropSlotLocked forgets a slot's free addresses; assigned ones become
// orphans held for their pods.
func (s *Store) dropSlotLocked(slot netip.Prefix, r *Repairs) {
	for addr := range addrsOf(slot) {
		a := s.addrs[addr]
		if a == nil {
			continue
		}
		if a.owner != nil {
			a.eni, a.slot, a.releasing = "", netip.Prefix{}, false
			r.KeptAssigned = append(r.KeptAssigned, addr)
			continue
		}
		s.forgetLocked(addr, a)
	}
}

func (s *Store) forgetENILocked(id string, r *Repairs) {
	for _, slot := range s.enis[id].Slots {
		s.dropSlotLocked(slot, r)
	}
	delete(s.enis, id)
	r.ForgottenENIs = append(r.ForgottenENIs, id)
}

// AddSlots records slots the cloud just assigned to an ENI
// (EC2 AssignPrivateIpAddresses).
func (s *Store) AddSlots(eniID string, slots []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	if e == nil {
		return
	}
	for _, slot := range slots {
		slot = slot.Masked()
		if !slices.Contains(e.Slots, slot) {
			e.Slots = append(e.Slots, slot)
		}
		s.addSlotLocked(eniID, slot)
	}
	slices.SortFunc(e.Slots, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	s.gen++
	s.notifyLocked()
}

// MarkRelease marks, for unassignment, those of slots on eniID whose every
// address is free and out of cooldown at now, and returns them. Marked slots
// are never handed out; FinishRelease ends the mark.
func (s *Store) MarkRelease(eniID string, slots []netip.Prefix, now time.Time) []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	if e == nil {
		return nil
	}
	var marked []netip.Prefix
	for _, slot := range slots {
		slot = slot.Masked()
		if !slices.Contains(e.Slots, slot) || !s.slotFreeLocked(eniID, slot, now) {
			continue
		}
		for addr := range addrsOf(slot) {
			s.addrs[addr].releasing = true
		}
		marked = append(marked, slot)
	}
	return marked
}

func (s *Store) slotFreeLocked(eniID string, slot netip.Prefix, now time.Time) bool {
	for addr := range addrsOf(slot) {
		a := s.addrs[addr]
		if a == nil || a.eni != eniID || a.owner != nil || a.releasing || s.coolingLocked(a, now) {
			return false
		}
	}
	return true
}

// FinishRelease ends a MarkRelease: done true forgets the slots (the cloud
// unassigned them), false makes them assignable again.
func (s *Store) FinishRelease(eniID string, slots []netip.Prefix, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	for _, slot := range slots {
		for addr := range addrsOf(slot) {
			a := s.addrs[addr]
			if a == nil || !a.releasing {
				continue
			}
			if done {
				s.forgetLocked(addr, a)
			} else {
				a.releasing = false
			}
		}
		if done && e != nil {
			e.Slots = slices.DeleteFunc(e.Slots, func(p netip.Prefix) bool { return p == slot })
		}
	}
	s.gen++
	s.notifyLocked()
}

// MarkDelete marks a secondary ENI for deletion if none of its addresses is
// assigned; nothing on it is handed out until FinishDelete.
func (s *Store) MarkDelete(eniID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	if e == nil || e.Primary() || e.Deleting {
		return false
	}
	for _, slot := range e.Slots {
		for addr := range addrsOf(slot) {
			if a := s.addrs[addr]; a != nil && a.owner != nil {
				return false
			}
		}
	}
	e.Deleting = true
	return true
}

// FinishDelete ends a MarkDelete: done true forgets the ENI, false keeps it.
func (s *Store) FinishDelete(eniID string, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	if e == nil {
		return
	}
	if !done {
		e.Deleting = false
		s.notifyLocked()
		return
	}
	var r Repairs
	s.forgetENILocked(eniID, &r)
	s.gen++
	s.notifyLocked() // its unflushed addresses are due (forgetLocked)
}
