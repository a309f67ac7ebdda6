package warmpool

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Next returns the one next action that moves the node's pool toward its
// target, with a one-line reason. It is pure and deterministic: ENIs are
// considered primary first, then by ID; addresses by address order, so the
// order of Input.ENIs does not matter.
//
// Order of decisions:
//  1. Growth, when the pool is short (see the package comment for the
//     targets): Assign on the first attached ENI with room (Count capped at
//     its room and at Limits.MaxPods), else CreateENI with the addresses in
//     the same call (never beyond Limits.MaxENIs). Under WARM_ENI_TARGET the
//     ENI is filled whole.
//  2. If growth is not needed or cannot happen now: DeleteENI of an ENI the
//     targets do not need, else Release of surplus free slots, at most once
//     per Config.ReleaseInterval.
//  3. Otherwise Wait (growth blocked by an active Refusal; Plan.Until says
//     until when) or Nothing (at target, or short at a static limit).
//
// Before all of these, in prefix mode with /28s not refused, free single
// addresses left from the no-/28 fallback are turned back into /28s
// (convert.go): a /28 is assigned when the pool would be short without
// them, and they are released when it would not.
//
// Next never plans an action on an assigned or cooling address, never
// deletes the primary ENI, and never plans growth that a later call would
// shrink: a release or deletion is planned only if the targets still hold
// after it, but for the fallback's free single addresses at the node's slot
// limit, which go so that /28s take their slots (convert.go, makeRoom).
func Next(in Input) Plan {
	s := newState(in)
	if p, ok := s.convert(); ok {
		return p
	}
	if s.tgt.policy == byDemand {
		p := s.adaptive()
		p.Wanted = inUse(s.pool) + s.tgt.demand.low
		return p
	}
	grow, blocked := s.grow()
	if grow.Action == Assign || grow.Action == CreateENI {
		return grow
	}
	shrink, deferred := s.shrink()
	if shrink.Action == Release || shrink.Action == DeleteENI {
		return shrink
	}
	if blocked {
		return grow // Wait, or Nothing at a static limit
	}
	p := shrink // Nothing until a release is allowed
	if !deferred {
		p = Plan{Action: Nothing, Reason: "at target (" + s.tgt.describe() + ", " + s.poolText() + ")"}
	}
	if u := s.ref.noPrefix; !u.IsZero() && s.tgt.short(s.pool, true) > 0 {
		// Met with single addresses only: the prefix target applies again
		// once the refusal ends.
		p.Until = earliest(p.Until, u)
		p.Reason += "; /28 prefixes refused until " + stamp(u)
	}
	return p
}

// state is Next's working view of one Input.
type state struct {
	in       Input
	order    []int  // indices into in.ENIs: primary first, then by ID
	enis     []pool // per ENI, same indices
	pool     pool   // the node: the sum of enis
	tgt      target
	prefixes bool // growth assigns /28 prefixes now (prefix mode, no active RefusedNoPrefix)
	ref      refusals
	// stalled: the pool is short and no ENI, old or new, could grow now
	// (max pods reached, subnet full, throttled, no slots per ENI).
	stalled bool
	// fillWhole: the adaptive policy in secondary-IP mode. A new ENI, the
	// first ENI of a node that holds no address, or an attached ENI
	// holding no address (while the node fills, or with no peak above
	// what the node holds that came back to size it by, or without
	// Demand.Bindings), gets all its slots at once (one call per ENI's
	// worth of addresses); other assigns go up to what the pool wanted
	// held at recent peaks that came back (History.wantAgain).
	fillWhole bool
	// wantSized: the adaptive policy, not in prefix mode's no-/28
	// fallback. An assign goes up to what the pool wanted held at recent
	// peaks that came back (History.wantAgain), in /28s in prefix mode.
	wantSized bool
}

func newState(in Input) *state {
	s := &state{in: in, tgt: targetOf(in)}
	s.order = make([]int, len(in.ENIs))
	s.enis = make([]pool, len(in.ENIs))
	for i := range s.order {
		s.order[i] = i
		s.enis[i] = poolOfENI(&in.ENIs[i])
		s.pool = s.pool.plus(s.enis[i], 1)
	}
	slices.SortStableFunc(s.order, func(a, b int) int {
		ea, eb := &in.ENIs[a], &in.ENIs[b]
		if ea.Primary != eb.Primary {
			if ea.Primary {
				return -1
			}
			return 1
		}
		return strings.Compare(ea.ID, eb.ID)
	})
	s.ref = activeRefusals(in.Refusals, in.Now)
	s.prefixes = prefixMode(in) && s.ref.noPrefix.IsZero()
	return s
}

// refusals holds, per kind, the latest Until among the refusals still in
// force at Now; zero: none.
type refusals struct {
	eniLimit, subnetFull, noPrefix, throttled time.Time
	subnetCap                                 int // slots a growth may ask for while the subnet refused a larger request; 0: none
	addrLimitAll                              time.Time
	addrLimitENI                              map[string]time.Time
}

func activeRefusals(rs []Refusal, now time.Time) refusals {
	var r refusals
	later := func(t *time.Time, u time.Time) {
		if u.After(*t) {
			*t = u
		}
	}
	for _, x := range rs {
		if !x.Until.After(now) {
			continue // expired: ignored
		}
		switch x.Kind {
		case RefusedENILimit:
			later(&r.eniLimit, x.Until)
		case RefusedSubnetFull:
			if half := x.Count / 2; half > 0 {
				if r.subnetCap == 0 || half < r.subnetCap {
					r.subnetCap = half
				}
				continue // a smaller request may still fit: not a stall
			}
			later(&r.subnetFull, x.Until)
		case RefusedNoPrefix:
			if half := x.Count / 2; half > 0 {
				// More /28s than the subnet had free: fewer may fit,
				// so ask for half before falling back to single
				// addresses.
				if r.subnetCap == 0 || half < r.subnetCap {
					r.subnetCap = half
				}
				continue
			}
			later(&r.noPrefix, x.Until)
		case RefusedThrottled:
			later(&r.throttled, x.Until)
		case RefusedAddressLimit:
			if x.ENI == "" {
				later(&r.addrLimitAll, x.Until)
				continue
			}
			if r.addrLimitENI == nil {
				r.addrLimitENI = map[string]time.Time{}
			}
			u := r.addrLimitENI[x.ENI]
			later(&u, x.Until)
			r.addrLimitENI[x.ENI] = u
		}
	}
	return r
}

// addrLimit is when the address-limit refusal for the ENI ends; zero: none.
func (r refusals) addrLimit(id string) time.Time {
	u := r.addrLimitAll
	if v := r.addrLimitENI[id]; v.After(u) {
		u = v
	}
	return u
}

// grow plans growth. blocked reports that the pool is short but cannot grow
// now; the returned plan is then Wait or Nothing with the reason.
func (s *state) grow() (p Plan, blocked bool) {
	short := s.tgt.short(s.pool, s.prefixes)
	if short == 0 {
		return Plan{}, false
	}
	unit := 1
	if s.prefixes {
		unit = PrefixAddresses
	}
	why := "short " + count(short, "address") + " (" + s.tgt.describe() + ", " + s.poolText() + ")"
	if !s.prefixes && prefixMode(s.in) {
		why += ", no free /28 in subnet: single addresses"
	}
	capSlots := s.maxPodsSlots(unit)
	if p, stalled := s.stall(why, capSlots); stalled {
		s.stalled = true
		return p, true
	}
	if s.tgt.policy == byIPTargets && roomSlots(s.in) == 0 && len(s.in.ENIs) < s.in.Limits.MaxENIs {
		// vpcip: no ENI for a shortfall that addresses cooling down cover
		// sooner than a new ENI would be ready.
		if until, ok := s.coolingCovers(short, ENILatency); ok {
			return Plan{Action: Wait, Until: until, Reason: why + ": addresses cooling down cover it by " + stamp(until) + ", sooner than a new ENI"}, true
		}
	}
	return s.growOn(ceilDiv(short, unit), capSlots, why)
}

// stall reports growth impossible on any ENI, old or new: no slots per
// ENI, max pods reached, or the subnet full or the API throttled.
func (s *state) stall(why string, capSlots int) (Plan, bool) {
	lim := s.in.Limits
	if lim.SlotsPerENI <= 0 {
		return Plan{Action: Nothing, Reason: why + ", but the ENI limits allow no slots"}, true
	}
	if capSlots == 0 {
		return Plan{Action: Nothing, Reason: why + ", but at max pods " + itoa(lim.MaxPods)}, true
	}
	if until := latest(s.ref.subnetFull, s.ref.throttled); !until.IsZero() {
		what := "subnet full"
		if !s.ref.throttled.IsZero() {
			what = "throttled"
		}
		return Plan{Action: Wait, Reason: why + ", " + what + " until " + stamp(until), Until: until}, true
	}
	return Plan{}, false
}

// growOn plans want more slots: on the first attached ENI with room, else
// on a new ENI, else Wait or Nothing (blocked).
func (s *state) growOn(want, capSlots int, why string) (p Plan, blocked bool) {
	lim := s.in.Limits
	if !s.prefixes && prefixMode(s.in) {
		// The no-/28 fallback is bounded: single addresses never take the
		// node's last open slot, so when the subnet has an aligned /28
		// again the node can take it (16 addresses in one slot) instead of
		// sitting at its ENI limit with /32s.
		open := s.openSlots()
		if open-1 < capSlots {
			capSlots = open - 1
		}
		if capSlots <= 0 {
			return Plan{Action: Wait, Until: s.ref.noPrefix,
				Reason: why + ", but the last open slot is kept for a /28 once the subnet has one (" + stamp(s.ref.noPrefix) + ")"}, true
		}
	}
	whole := s.tgt.policy == byENITarget // the reference fills ENIs whole
	var waitENI time.Time                // earliest end of an address-limit refusal on an ENI with room
	for _, i := range s.order {
		e := &s.in.ENIs[i]
		room := lim.SlotsPerENI - len(e.Slots)
		if room <= 0 {
			continue
		}
		if u := s.ref.addrLimit(e.ID); !u.IsZero() {
			waitENI = earliest(waitENI, u)
			continue
		}
		n := min(want, room)
		// Up to what the pool wanted held at recent peaks that came back:
		// demand that recurs (a job, a rollout's waves) takes one call,
		// not one per wave, and an emptied ENI no more than that.
		unit := 1
		if s.prefixes {
			unit = PrefixAddresses
		}
		again, recurs := 0, false
		if s.wantSized && n > 0 {
			h, memory := s.in.Demand.History, scaled(s.in, WantMemory)
			again = h.wantAgain(s.in.Now, memory, s.pool.total+n*unit)
			// Peaks that came back above what the node holds size an
			// emptied ENI also where this growth covers them already
			// (again is 0 then): it is not filled whole for want of a
			// peak. Only where pods are seen at their binding: a burst's
			// later pods the growth falls short of then make the pool
			// grow an assign call ahead of their ADDs; without the watch
			// the whole ENI is their buffer.
			recurs = again > 0 || s.in.Demand.Bindings && h.wantAgain(s.in.Now, memory, s.pool.total) > 0
		}
		if whole || (s.fillWhole && (s.pool.total == 0 || len(e.Slots) == 0 && (!recurs || s.in.Demand.History.filling(s.in.Now, FillSpan))) && n > 0) {
			n = room
		} else if again > 0 {
			n = min(room, max(n, ceilDiv(again-s.pool.total, unit)))
		}
		return s.growPlan(Assign, e.ID, n, capSlots, why), false
	}
	if len(s.in.ENIs) >= lim.MaxENIs {
		if !waitENI.IsZero() {
			return Plan{Action: Wait, Reason: why + ", ENIs refused addresses until " + stamp(waitENI), Until: waitENI}, true
		}
		return Plan{Action: Nothing, Reason: why + ", but at ENI limit " + itoa(lim.MaxENIs)}, true
	}
	if !s.ref.eniLimit.IsZero() {
		until := earliest(waitENI, s.ref.eniLimit)
		return Plan{Action: Wait, Reason: why + ", ENI attachment refused until " + stamp(s.ref.eniLimit), Until: until}, true
	}
	n := min(want, lim.SlotsPerENI)
	if whole || (s.fillWhole && n > 0) {
		n = lim.SlotsPerENI
	}
	return s.growPlan(CreateENI, "", n, capSlots, why), false
}

// openSlots is how many slots the node could still fill: those free on its
// attached ENIs and every slot of the ENIs it may still attach.
func (s *state) openSlots() int {
	lim := s.in.Limits
	n := max(lim.MaxENIs-len(s.in.ENIs), 0) * max(lim.SlotsPerENI, 0)
	for _, e := range s.in.ENIs {
		n += max(lim.SlotsPerENI-len(e.Slots), 0)
	}
	return n
}

// growPlan is the Assign or CreateENI of n slots, capped at capSlots
// (Limits.MaxPods).
func (s *state) growPlan(a ActionKind, eni string, n, capSlots int, why string) Plan {
	unit := "address"
	if s.prefixes {
		unit = "prefix"
	}
	capped := ""
	if capSlots < n {
		n = capSlots
		capped = " (max pods " + itoa(s.in.Limits.MaxPods) + ")"
	}
	if c := s.ref.subnetCap; c > 0 && c < n {
		n = c
		capped += " (the subnet refused a larger request)"
	}
	if a == Assign {
		why += ": assign " + count(n, unit) + " on " + eni + capped
	} else {
		why += ": create ENI with " + count(n, unit) + capped
	}
	return Plan{Action: a, ENI: eni, Count: n, Prefixes: s.prefixes, Reason: why}
}

// maxPodsSlots is how many more slots of unit addresses Limits.MaxPods
// allows: growth stops once the node holds MaxPods addresses, so the total
// never exceeds MaxPods rounded up to a whole slot. math.MaxInt: no limit.
func (s *state) maxPodsSlots(unit int) int {
	m := s.in.Limits.MaxPods
	if m <= 0 {
		return math.MaxInt
	}
	if s.pool.total >= m {
		return 0
	}
	return ceilDiv(m-s.pool.total, unit)
}

func (s *state) poolText() string {
	p := s.pool
	t := "available " + itoa(p.available) + ", total " + itoa(p.total)
	if p.cooling > 0 {
		t += ", cooling " + itoa(p.cooling)
	}
	if s.tgt.pending > 0 {
		t += ", pending " + itoa(s.tgt.pending)
	}
	if s.tgt.policy == byPrefixTarget {
		t += ", free prefixes " + itoa(p.freePrefixes)
	}
	return t
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func itoa(n int) string { return strconv.Itoa(n) }

// count is n and the unit ("address", "prefix", "slot"), plural unless 1.
func count(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	if strings.HasSuffix(unit, "ss") || strings.HasSuffix(unit, "x") {
		return itoa(n) + " " + unit + "es"
	}
	return itoa(n) + " " + unit + "s"
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// earliest is the earlier of two times, ignoring zero ones.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
