package warmpool

import (
	"net/netip"
	"slices"
	"time"
)

// Turning the no-/28 fallback's single addresses back into /28s (vpcip).
//
// In prefix mode, while the subnet has no aligned /28 free
// (RefusedNoPrefix), growth assigns single addresses. Once a /28 can be
// had again, those count toward every target as well as a /28's
// addresses would, so under the adaptive policy and the IP targets a node
// kept them for as long as they covered its demand: each a /32 of the
// subnet, each breaking a /28 other prefix-mode nodes could have had.
//
// convert plans the node as if its free single addresses were taken:
// when that pool would grow by an Assign of /28s on an attached ENI, the
// /28 is asked for now (the free single addresses still serve pods until
// it comes); when that pool is at target, the free single addresses are
// released, one ENI's per call, at most one release per
// Config.ReleaseInterval, and never within an interval of a growth. A
// single address a pod holds or that cools down is never released; it
// is released once it is free, if the pool is still at target without
// it. When every slot the node may have is taken (room on no ENI, no ENI
// more allowed), one ENI's free single addresses are released so that
// /28s take their slots (makeRoom), also when pods wait, which they
// would for good otherwise. When no /28 can be had now (a refusal, the
// pod limit, or only a new ENI would hold it), convert does nothing and
// the policy plans as before.

// convert returns the conversion's plan, or false when the policy plans
// as before.
func (s *state) convert() (Plan, bool) {
	if !s.prefixes || s.in.Config.KeepFallback {
		return Plan{}, false // not prefix mode, or /28s refused now
	}
	spare := s.spareSingles()
	if spare == 0 {
		return Plan{}, false
	}
	// The node as if its free single addresses were held by pods: they
	// keep their slots (EC2 counts them against the ENI's limit) but
	// count toward no target.
	in := s.in
	in.ENIs = slices.Clone(in.ENIs)
	for i := range in.ENIs {
		in.ENIs[i].Slots = slices.Clone(in.ENIs[i].Slots)
		for j := range in.ENIs[i].Slots {
			if sl := &in.ENIs[i].Slots[j]; spareSlot(*sl) {
				sl.Assigned = 1
			}
		}
	}
	without := Next(in)
	why := count(spare, "free single address") + " from the no-/28 fallback"
	switch {
	case without.Action == Assign && without.Prefixes:
		without.Reason = why + " count for nothing; " + without.Reason
		return without, true
	case without.Action == Wait:
		return s.makeRoom(why, without) // growth stalled at a limit: room, if the slots are it
	case without.Action == Assign || without.Action == CreateENI:
		return Plan{}, false // a /28 only on a new ENI: the policy plans with them
	}
	if newState(in).isShort() {
		// Short at a static limit: they serve pods, unless the limit is
		// the node's slots, which /28s would fill 16 times better.
		return s.makeRoom(why, without)
	}
	return s.releaseSpares(why, without)
}

// releaseDue is when a release of fallback singles is allowed, zero if
// now: Config.ReleaseInterval after the last release and the last growth.
func (s *state) releaseDue() time.Time {
	interval := s.in.Config.ReleaseInterval
	if interval <= 0 {
		interval = DefaultReleaseInterval
	}
	var due time.Time
	for _, t := range []time.Time{s.in.LastRelease, s.in.LastGrow} {
		if !t.IsZero() && s.in.Now.Before(t.Add(interval)) {
			due = latest(due, t.Add(interval))
		}
	}
	return due
}

// makeRoom frees the slots of one ENI's free single addresses for /28s
// when every slot the node may have is taken (no room on its ENIs, no ENI
// more allowed) and Limits.MaxPods is not reached: a slot holds 16
// addresses as a /28 and 1 as a single address, so a node of such slots
// is capped far below its /28 budget. Its plan releases them (paced as
// releaseSpares; when pods wait, also below the targets, as they would
// wait for good otherwise); the next plan asks for /28s in the freed slots. false: another limit binds, or the pool plans as before.
func (s *state) makeRoom(why string, other Plan) (Plan, bool) {
	lim := s.in.Limits
	if roomSlots(s.in) > 0 || len(s.in.ENIs) < lim.MaxENIs || s.maxPodsSlots(PrefixAddresses) == 0 {
		return Plan{}, false
	}
	if !s.isShort() {
		return s.releaseSpares(why+", the node's slots all taken", other)
	}
	// Short already: every spare of the ENI holding the most goes (the
	// pool is short with or without them; a /28 in their slots is not).
	var best []netip.Prefix
	from := ""
	for _, i := range s.order {
		var rel []netip.Prefix
		for _, sl := range s.in.ENIs[i].Slots {
			if spareSlot(sl) {
				rel = append(rel, sl.Prefix)
			}
		}
		if len(rel) > len(best) {
			best, from = rel, s.in.ENIs[i].ID
		}
	}
	if len(best) == 0 {
		return Plan{}, false
	}
	return s.pacedRelease(why+", the node's slots all taken and pods short", " for /28s in their slots", best, from, other), true
}

// pacedRelease is the release of a conversion's single addresses rel from
// ENI from, or Nothing until releaseDue allows it (other's Until kept).
func (s *state) pacedRelease(why, what string, rel []netip.Prefix, from string, other Plan) Plan {
	if due := s.releaseDue(); !due.IsZero() {
		return Plan{Action: Nothing, Until: earliest(due, other.Until),
			Reason: why + ": release allowed at " + stamp(due) + " (" + s.poolText() + ")"}
	}
	slices.SortFunc(rel, comparePrefix)
	return Plan{Action: Release, ENI: from, Release: rel,
		Reason: why + ": release " + count(len(rel), "address") + " from " + from + what + " (" + s.poolText() + ")"}
}

// spareSlot reports a single address no pod holds and none cools down.
func spareSlot(sl Slot) bool { return sl.Size() == 1 && sl.Assigned <= 0 && sl.Cooling <= 0 }

// spareSingles counts the node's free single addresses.
func (s *state) spareSingles() int {
	n := 0
	for _, e := range s.in.ENIs {
		for _, sl := range e.Slots {
			if spareSlot(sl) {
				n++
			}
		}
	}
	return n
}

// isShort reports whether the policy would grow the pool now, were it
// able to.
func (s *state) isShort() bool {
	if s.tgt.policy == byDemand {
		return s.pool.available < s.tgt.demand.low
	}
	return s.tgt.short(s.pool, s.prefixes) > 0
}

// releaseSpares releases free single addresses of the ENI where most of
// them can go (then primary first, by ID) while the targets hold without
// them, or plans Nothing until the release interval allows; other is the
// plan of the pool without them, whose Until a deferral keeps. false: none
// can go.
func (s *state) releaseSpares(why string, other Plan) (Plan, bool) {
	var best []netip.Prefix
	from := ""
	for _, i := range s.order {
		e := &s.in.ENIs[i]
		if rel := s.pickFree(e, true, spareSlot); len(rel) > len(best) {
			best, from = rel, e.ID
		}
	}
	if len(best) == 0 {
		return Plan{}, false // each is needed for a target (MINIMUM_IP_TARGET counts them)
	}
	return s.pacedRelease(why+", the pool at target without them", "", best, from, other), true
}
