package warmpool

import (
	"net/netip"
	"slices"
	"time"
)

// The adaptive policy's release side (see adaptive.go's comment, Release):
// when surplus goes back, how much, and from which ENI.

// adaptiveShrink deletes an unneeded ENI or releases free slots beyond
// keep, down to high, once growth is ReleaseDelay old and the release
// interval allows.
func (s *state) adaptiveShrink(d demandTarget) (Plan, bool) {
	held := s.pool.available + s.pool.cooling
	if s.delayUntil().After(s.in.Now) {
		return Plan{}, false
	}
	minAge := s.in.Config.ENIMinAge
	if minAge <= 0 {
		minAge = DefaultENIMinAge
	}
	for _, i := range s.order {
		e, ep := &s.in.ENIs[i], s.enis[i]
		if e.Primary || ep.assigned > 0 || ep.cooling > 0 || s.in.Now.Before(e.Attached.Add(minAge)) ||
			len(e.Slots) > 0 || s.in.Now.Before(s.in.LastGrow.Add(scaled(s.in, ENIDeleteDelay))) {
			continue
		}
		unit := 1
		if s.prefixes {
			unit = PrefixAddresses
		}
		// The targets as they would be without the ENI's room: a refill
		// may then need a new ENI, which widens the margin.
		room := roomSlots(s.in) - max(s.in.Limits.SlotsPerENI, 0)
		without := demandOf(s.in, room, prefixMode(s.in), inUse(s.pool))
		if s.pool.available >= without.low && s.pool.available+room*unit >= without.reach {
			return Plan{Action: DeleteENI, ENI: e.ID, Reason: "ENI " + e.ID + " unneeded: no assigned or cooling address (" +
				d.describe() + ", " + s.poolText() + ")"}, true
		}
	}
	band := s.releaseBand(d)
	if held < d.keep+band {
		return Plan{}, false // too little to be worth a call
	}
	if !s.in.Demand.History.seen && s.pool.assigned == 0 && s.in.Now.Before(s.in.LastGrow.Add(scaled(s.in, FillSpan))) {
		// A new node's first pods are on their way: its first ENI's
		// addresses are theirs. Not a restarted daemon's node, which has
		// pods but remembers no arrival.
		return Plan{}, false
	}
	if s.pool.cooling >= s.baseBand() && s.in.Demand.History.within(s.in.Now, scaled(s.in, DepartureQuiet)) == 0 {
		return Plan{}, false // pods are leaving: release once their addresses are out of cooldown, in one call
	}
	if !s.prefixes && s.in.Demand.History.filling(s.in.Now, FillSpan) && s.in.Demand.History.within(s.in.Now, scaled(s.in, DepartureQuiet)) > 0 {
		return Plan{}, false // the node fills: what is free now its next pods take
	}
	keep, worth := s.releaseTo(d, band)
	if !worth {
		return Plan{}, false
	}
	rel, from := s.adaptiveReleasable(d.high, keep, false)
	n := addresses(rel)
	// Without the slack only where the peaks wanted more than the node
	// would hold after the release the slack allows: the next peak then
	// takes its growth call anyway, and keeping the /28 saves no call.
	if d.betweenJobs(s.in, s.pool.total-n) {
		rel, from = s.adaptiveReleasable(d.high, keep, true)
		n = addresses(rel)
	}
	if n == 0 {
		return Plan{}, false
	}
	if band < s.baseBand() && n < s.baseBand() && s.peakCallsAfter(from, n) > s.peakCallsAfter(from, 0) &&
		float64(n)*s.idleAbove(d, held-n).Hours() < 2*scaled(s.in, ReleaseWorth).Hours() {
		// Between a job's peaks, a release below the usual band that
		// makes the next peak take an assign call more for it (one call
		// an ENI: the ENIs it fills in order now reach this one) must
		// save two calls' worth on what it gives back; else the usual
		// band stands.
		band = s.baseBand()
		if held < d.keep+band {
			return Plan{}, false
		}
		if keep, worth = s.releaseTo(d, band); !worth {
			return Plan{}, false
		}
		rel, from = s.adaptiveReleasable(d.high, keep, false)
		if n = addresses(rel); n == 0 {
			return Plan{}, false
		}
	}
	if i := slices.IndexFunc(s.in.ENIs, func(e ENI) bool { return e.ID == from }); i >= 0 && s.enis[i].cooling+s.enis[i].assigned > 0 && s.pool.cooling > 0 &&
		s.in.Demand.History.within(s.in.Now, scaled(s.in, DepartureQuiet)) == 0 {
		return Plan{}, false // pods are leaving: an ENI they still hold goes once out of cooldown, in one call
	}
	return Plan{Action: Release, ENI: from, Release: rel, Reason: "surplus: release " + count(n, "address") + " from " + from +
		" (" + d.describe() + ", " + s.poolText() + ")"}, true
}

// addresses is how many addresses the slots hold: 16 a /28, 1 a /32.
func addresses(slots []netip.Prefix) int {
	n := 0
	for _, p := range slots {
		n += Slot{Prefix: p}.Size()
	}
	return n
}

// releaseTo is the level, in addresses available or cooling, a release
// goes down to: the lowest one from keep up, leaving at least band beyond
// it, whose release is worth its call, ReleaseWorth, over the time the
// addresses beyond it are expected to stay idle (idleAbove). false: no
// release is worth a call.
func (s *state) releaseTo(d demandTarget, band int) (int, bool) {
	held := s.pool.available + s.pool.cooling
	worth := scaled(s.in, ReleaseWorth).Hours()
	for l := d.keep; held-l >= band; l++ {
		if float64(held-l)*s.idleAbove(d, l).Hours() >= worth {
			return l, true
		}
	}
	return 0, false
}

// idleAbove is how long the addresses held beyond level (available or
// cooling) are expected to stay idle: until demand needs more than the
// level again (History.idleAhead), no longer than since the last growth.
func (s *state) idleAbove(d demandTarget, level int) time.Duration {
	h := s.in.Demand.History
	var since time.Duration // assigned since the last growth: idle no longer than that
	if !s.in.LastGrow.IsZero() {
		since = s.in.Now.Sub(s.in.LastGrow)
	}
	// For single addresses, also until the pool would be short of what it
	// wanted at its recent peaks (a job every few minutes whose margin the
	// level leaves out: the release would be assigned back at the next
	// one). A /28 has its own hysteresis (adaptiveReleasable's slack,
	// dropped only where the next peak grows anyway).
	idle := h.idleAhead(s.in.Now, inUse(s.pool)+level-d.margin, since)
	if !s.prefixes {
		idle = min(idle, h.idleAheadWant(s.in.Now, s.pool.assigned+level, since))
	}
	return idle
}

// releaseBand is the least surplus beyond keep worth a release call, in
// addresses: baseBand, but MinBand in secondary-IP mode between the peaks
// of a recurring job whose wanted addresses, capped at Limits.MaxPods,
// exceed what the node holds (demandTarget.betweenJobs with the node's
// holdings as the level, unlike the chunk's, so the rule holds while
// releases bring the node down, each one worth its call). The next peak
// takes its growth call whatever is kept, so a release pays for its own
// call only. Such a surplus is what an emptied ENI sized by the peaks,
// not filled whole, leaves on it once the job is gone.
func (s *state) releaseBand(d demandTarget) int {
	if !prefixMode(s.in) && d.betweenJobs(s.in, s.pool.total) && s.peakWant(ChunkMemory, s.pool.total) > s.pool.total {
		return MinBand
	}
	return s.baseBand()
}

// baseBand is the release band outside a recurring job's peaks: MinBand
// in prefix mode (a /28 is hysteresis enough), else half an ENI's slots,
// at least MinBand, so a release gives back enough to pay for the call
// and the assign that may follow it.
func (s *state) baseBand() int {
	if s.prefixes {
		return MinBand
	}
	return max(MinBand, ceilDiv(s.in.Limits.SlotsPerENI, 2))
}

// peakWant is the most addresses the pool wanted held in two episodes
// above level within memory (History.wantAgain), at most Limits.MaxPods:
// what a growth at the next peak can reach. 0: no such peak.
func (s *state) peakWant(memory time.Duration, level int) int {
	w := s.in.Demand.History.wantAgain(s.in.Now, scaled(s.in, memory), level)
	if m := s.in.Limits.MaxPods; m > 0 {
		w = min(w, m)
	}
	return w
}

// peakCallsAfter is how many EC2 calls the growth at the next peak of a
// recurring job takes after n free addresses of ENI from went back: from
// what the node would hold then to peakWant over WantMemory (growOn's
// sizing), one assign call per attached ENI it fills in growOn's order
// (not one under an address-limit refusal) and three per new ENI (create,
// attach, and its addresses with it), within Limits.MaxENIs. 0 with no
// such peak.
func (s *state) peakCallsAfter(from string, n int) int {
	level := s.pool.total - n
	short := s.peakWant(WantMemory, level) - level
	if short <= 0 {
		return 0
	}
	lim := s.in.Limits
	calls := 0
	for _, i := range s.order {
		e := &s.in.ENIs[i]
		room := lim.SlotsPerENI - len(e.Slots)
		if e.ID == from {
			room += n
		}
		if room <= 0 || short <= 0 || !s.ref.addrLimit(e.ID).IsZero() {
			continue
		}
		calls++
		short -= room
	}
	if short > 0 && lim.SlotsPerENI > 0 {
		calls += 3 * min(ceilDiv(short, lim.SlotsPerENI), max(lim.MaxENIs-len(s.in.ENIs), 0))
	}
	return calls
}

// delayUntil is when shrinking is allowed: ReleaseDelay (or
// EarlyReleaseDelay) after the last growth and Config.ReleaseInterval
// after the last release.
func (s *state) delayUntil() time.Time {
	interval := s.in.Config.ReleaseInterval
	if interval <= 0 {
		interval = DefaultReleaseInterval
	}
	var t time.Time
	if !s.in.LastGrow.IsZero() {
		delay := ReleaseDelay
		if was, ok := s.in.Demand.History.before(s.in.LastGrow); s.prefixes || ok && s.pool.assigned <= was {
			delay = EarlyReleaseDelay
		}
		t = s.in.LastGrow.Add(scaled(s.in, delay))
	}
	if !s.in.LastRelease.IsZero() {
		t = latest(t, s.in.LastRelease.Add(interval))
	}
	return t
}

// adaptiveUntil is when Next may plan a shrink without any change: the
// delay's end, if anything is beyond keep.
func (s *state) adaptiveUntil(d demandTarget) time.Time {
	if s.pool.available+s.pool.cooling <= d.keep {
		return time.Time{}
	}
	if u := s.delayUntil(); u.After(s.in.Now) {
		return u
	}
	return time.Time{}
}

// adaptiveReleasable picks free slots of one ENI (the one holding the
// fewest assigned and cooling addresses, secondary first) whose release
// leaves at least high addresses available and keep available or cooling.
// betweenJobs: the node waits for the next peak of a recurring job, which
// takes a growth call even if the node keeps what a release with the
// slack would leave (demandTarget.betweenJobs), so a /28 goes without the
// half /28 of slack beyond keep.
func (s *state) adaptiveReleasable(high, keep int, betweenJobs bool) ([]netip.Prefix, string) {
	order := s.releaseOrder()
	held := s.pool.available + s.pool.cooling
	for _, i := range order {
		e := &s.in.ENIs[i]
		var out []netip.Prefix
		left, avail := held, s.pool.available
		for _, sl := range freeSlots(e) {
			// While pods come (within ChunkMemory), a /28 goes only if
			// half a /28 beyond keep stays: demand that hovers at a
			// multiple of 16 does not release and assign one /28 over
			// and over. Not between a job's peaks: the next one takes
			// its growth call anyway, so keeping the /28 saves no call.
			slack := 0
			if sl.Size() > 1 && !betweenJobs && s.in.Demand.History.within(s.in.Now, scaled(s.in, ChunkMemory)) > 0 {
				slack = sl.Size() / 2
			}
			if left-sl.Size() < keep+slack || avail-sl.Size() < high {
				continue
			}
			left -= sl.Size()
			avail -= sl.Size()
			out = append(out, sl.Prefix)
		}
		if len(out) > 0 {
			slices.SortFunc(out, comparePrefix)
			return out, e.ID
		}
	}
	return nil, ""
}

// freeSlots are the ENI's slots with no assigned or cooling address,
// larger first, then by address, each once.
func freeSlots(e *ENI) []Slot {
	var free []Slot
	for _, sl := range e.Slots {
		if sl.Size() > 0 && sl.Assigned <= 0 && sl.Cooling <= 0 && !slices.ContainsFunc(free, func(x Slot) bool { return x.Prefix == sl.Prefix }) {
			free = append(free, sl)
		}
	}
	slices.SortFunc(free, func(a, b Slot) int {
		if a.Size() != b.Size() {
			return b.Size() - a.Size()
		}
		return comparePrefix(a.Prefix, b.Prefix)
	})
	return free
}
