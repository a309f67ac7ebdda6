package datastore

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Cloud keeps the store's ENIs and slots (secondary addresses and /28
// prefixes) equal to EC2's, and marks slots and ENIs for release so that
// nothing on them is handed out while the cloud call is in flight. Get it
// from Store.Cloud; it works under the store's lock.
type Cloud struct{ s *state }

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
func (c Cloud) Sync(enis []provider.ENI, now time.Time) Repairs {
	s := c.s
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
func (c Cloud) PutENI(e provider.ENI) Repairs {
	s := c.s
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
	for _, p := range e.IPv6Prefixes {
		slots = append(slots, p.Masked())
	}
	slices.SortFunc(slots, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(slots)
}

func (s *state) putENILocked(pe provider.ENI, r *Repairs) {
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
func (s *state) addSlotLocked(eni string, slot netip.Prefix) {
	if lazy(slot) {
		// Only the addresses handed out before (restored from the
		// checkpoint) are known; the rest are made as Assign needs them.
		for _, addr := range s.knownInLocked(slot) {
			a := s.addrs[addr]
			a.eni, a.slot = eni, slot
		}
		return
	}
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
func (s *state) dropSlotLocked(slot netip.Prefix, r *Repairs) {
	for addr := range s.slotAddrsLocked(slot) {
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

func (s *state) forgetENILocked(id string, r *Repairs) {
	for _, slot := range s.enis[id].Slots {
		s.dropSlotLocked(slot, r)
	}
	delete(s.enis, id)
	r.ForgottenENIs = append(r.ForgottenENIs, id)
}

// AddSlots records slots the cloud just assigned to an ENI
// (EC2 AssignPrivateIpAddresses).
func (c Cloud) AddSlots(eniID string, slots []netip.Prefix) {
	s := c.s
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
func (c Cloud) MarkRelease(eniID string, slots []netip.Prefix, now time.Time) []netip.Prefix {
	s := c.s
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

func (s *state) slotFreeLocked(eniID string, slot netip.Prefix, now time.Time) bool {
	if lazy(slot) {
		return false // an IPv6 /80 is the node's for good: never given back by the pool
	}
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
func (c Cloud) FinishRelease(eniID string, slots []netip.Prefix, done bool) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	for _, slot := range slots {
		for addr := range s.slotAddrsLocked(slot) {
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
func (c Cloud) MarkDelete(eniID string) bool {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.enis[eniID]
	if e == nil || e.Primary() || e.Deleting {
		return false
	}
	for _, slot := range e.Slots {
		for addr := range s.slotAddrsLocked(slot) {
			if a := s.addrs[addr]; a != nil && a.owner != nil {
				return false
			}
		}
	}
	e.Deleting = true
	return true
}

// FinishDelete ends a MarkDelete: done true forgets the ENI, false keeps it.
func (c Cloud) FinishDelete(eniID string, done bool) {
	s := c.s
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
