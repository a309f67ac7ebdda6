package warmpool

import (
	"net/netip"
	"slices"
	"strings"
	"time"
)

// shrink plans a DeleteENI or a Release when the targets allow one. When
// one is allowed but not yet due (Config.ReleaseInterval since
// Input.LastRelease, or Config.ENIMinAge since the ENI was attached), it
// returns Nothing with Until set and deferred true.
func (s *state) shrink() (p Plan, deferred bool) {
	interval := s.in.Config.ReleaseInterval
	if interval <= 0 {
		interval = DefaultReleaseInterval
	}
	var due time.Time // zero: a release is allowed now
	if !s.in.LastRelease.IsZero() && s.in.Now.Before(s.in.LastRelease.Add(interval)) {
		due = s.in.LastRelease.Add(interval)
	}
	if s.tgt.policy == byIPTargets && !s.in.LastGrow.IsZero() && s.in.Now.Before(s.in.LastGrow.Add(interval)) {
		// vpcip: no release within an interval of a growth, so a pod that
		// leaves does not give back what the next one is assigned again.
		due = latest(due, s.in.LastGrow.Add(interval))
	}
	// The strict target (whole free prefixes whenever prefix mode is
	// configured, whatever the refusals) so a release never opens a
	// shortfall that growth would refill once a refusal expires.
	strict := prefixMode(s.in)
	before := s.tgt.short(s.pool, strict)

	eni, young := s.deletable(strict)
	if eni != "" {
		if !due.IsZero() {
			return s.deferPlan("ENI "+eni+" unneeded", due), true
		}
		return Plan{Action: DeleteENI, ENI: eni, Reason: "ENI " + eni + " unneeded: no assigned or cooling address, " +
			s.tgt.describe() + " holds without it (" + s.poolText() + ")"}, false
	}
	rel, from := s.releasable(before, strict)
	if len(rel) > 0 {
		if !due.IsZero() {
			return s.deferPlan("surplus on "+from, due), true
		}
		n := 0
		for _, r := range rel {
			n += Slot{Prefix: r}.Size()
		}
		return Plan{Action: Release, ENI: from, Release: rel, Reason: "surplus: release " + count(n, "address") +
			" in " + count(len(rel), "slot") + " from " + from + " (" + s.tgt.describe() + ", " + s.poolText() + ")"}, false
	}
	if !young.IsZero() {
		return s.deferPlan("unneeded ENI younger than ENIMinAge", young), true
	}
	return Plan{}, false
}

func (s *state) deferPlan(what string, until time.Time) Plan {
	return Plan{Action: Nothing, Reason: what + ": allowed at " + stamp(until) + " (" + s.poolText() + ")", Until: until}
}

// deletable returns the first ENI (by ID) that may be deleted: not the
// primary, no assigned and no cooling address, at least Config.ENIMinAge
// old, and leaving the targets met without it (reference datastore: not
// required for WARM_IP_TARGET, MINIMUM_IP_TARGET or the warm ENI/prefix
// target). While the pool is short and stalled (no ENI could grow now), an
// ENI holding no slot is not needed either: growth failures never block
// shrinking. young is the earliest time an ENI that fails only the age rule
// becomes old enough; zero: none.
func (s *state) deletable(strict bool) (id string, young time.Time) {
	minAge := s.in.Config.ENIMinAge
	if minAge <= 0 {
		minAge = DefaultENIMinAge
	}
	for _, i := range s.order {
		e, ep := &s.in.ENIs[i], s.enis[i]
		if e.Primary || ep.assigned > 0 || ep.cooling > 0 {
			continue
		}
		without := s.pool.plus(ep, -1)
		if s.tgt.short(without, strict) > 0 && (len(e.Slots) > 0 || !s.stalled) && !s.fallbackLeftover(e, without) {
			continue // needed for a target
		}
		if old := e.Attached.Add(minAge); s.in.Now.Before(old) {
			young = earliest(young, old)
			continue
		}
		return e.ID, young
	}
	return "", young
}

// fallbackLeftover reports an ENI of single addresses only, made in prefix
// mode while no aligned /28 was free (RefusedNoPrefix): it counts for nothing
// toward the prefix target, so that target alone would keep it for good.
// It goes when the address target of the fallback holds without it.
func (s *state) fallbackLeftover(e *ENI, without pool) bool {
	if !prefixMode(s.in) || len(e.Slots) == 0 {
		return false
	}
	for _, sl := range e.Slots {
		if sl.Size() != 1 {
			return false
		}
	}
	return s.tgt.short(without, false) == 0
}

// releasable picks the free slots of one ENI to release: only under IP
// targets or the prefix target (under WARM_ENI_TARGET the reference frees
// whole ENIs only), only while the pool is not short, and only as many as
// keep it not short. The ENI is the one with the fewest assigned and cooling
// addresses (so it drains toward deletion), non-primary first, then by ID;
// within it, larger slots first, then by address. The result is in address
// order.
func (s *state) releasable(before int, strict bool) ([]netip.Prefix, string) {
	if before > 0 {
		return nil, ""
	}
	if s.tgt.policy == byENITarget {
		// The reference frees whole ENIs only under WARM_ENI_TARGET; but /28
		// prefixes left from prefix mode, now turned off, would otherwise be
		// held for good (on the primary ENI, which is never deleted): free
		// ones go while the target holds without them.
		if prefixMode(s.in) {
			return nil, ""
		}
		for _, i := range s.order {
			e := &s.in.ENIs[i]
			if rel := s.pickFree(e, strict, func(sl Slot) bool { return sl.Size() > 1 }); len(rel) > 0 {
				return rel, e.ID
			}
		}
		return nil, ""
	}
	order := s.releaseOrder()
	// A secondary ENI without assigned addresses is the one to drain, even
	// while some of its addresses wait out their cooldown: releasing from
	// the others first would leave it holding the addresses the targets
	// need, and so never deletable.
	for _, i := range order {
		e := &s.in.ENIs[i]
		if e.Primary || s.enis[i].assigned > 0 {
			continue
		}
		if rel := s.pickFree(e, strict, nil); len(rel) > 0 {
			return rel, e.ID
		}
		if s.enis[i].cooling > 0 {
			return nil, ""
		}
	}
	for _, i := range order {
		e := &s.in.ENIs[i]
		if rel := s.pickFree(e, strict, nil); len(rel) > 0 {
			return rel, e.ID
		}
	}
	return nil, ""
}

// pickFree greedily takes the ENI's free slots (those eligible, when given)
// while the pool stays at target without them.
func (s *state) pickFree(e *ENI, strict bool, eligible func(Slot) bool) []netip.Prefix {
	var free []Slot
	for _, sl := range e.Slots {
		if sl.Size() > 0 && sl.Assigned <= 0 && sl.Cooling <= 0 && (eligible == nil || eligible(sl)) {
			free = append(free, sl)
		}
	}
	slices.SortFunc(free, func(a, b Slot) int {
		if a.Size() != b.Size() {
			return b.Size() - a.Size()
		}
		return comparePrefix(a.Prefix, b.Prefix)
	})
	after := s.pool
	var out []netip.Prefix
	for i, sl := range free {
		if i > 0 && sl.Prefix == free[i-1].Prefix {
			continue // listed twice: released once
		}
		next := after
		next.add(&sl, -1)
		if s.tgt.short(next, strict) > 0 {
			continue
		}
		after = next
		out = append(out, sl.Prefix)
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// releaseOrder lists the ENIs' indexes in the order their free slots are
// given back: fewest assigned and cooling addresses first, then secondary
// ENIs before the primary, then by ENI id (so a plan is deterministic).
func (s *state) releaseOrder() []int {
	order := slices.Clone(s.order)
	used := func(i int) int { return s.enis[i].assigned + s.enis[i].cooling }
	slices.SortStableFunc(order, func(a, b int) int {
		ea, eb := &s.in.ENIs[a], &s.in.ENIs[b]
		if ua, ub := used(a), used(b); ua != ub {
			return ua - ub
		}
		if ea.Primary != eb.Primary {
			if eb.Primary {
				return -1
			}
			return 1
		}
		return strings.Compare(ea.ID, eb.ID)
	})
	return order
}
