package warmpool

import (
	"math"
	"slices"
	"time"
)

// The adaptive policy (Config.Adaptive): vpcip's default when no warm
// variable is set. Its figures, in addresses unless noted:
//
//	need   = max(Input.Pending, Demand.Unaddressed)   pods waiting now
//	rate   = arrivals per second within RateWindow, or within BurstWindow
//	         if more (a fast rise is seen at once)      (Demand.History)
//	burst  = most arrivals within BurstWindow in the last BurstMemory
//	typical= the median of the minutes' largest bursts of BurstStart or
//	         more and at least a quarter of burst
//	margin = max(MinWarm, ⌈x + 2√x⌉, min(⌈BurstShare × burst⌉, cap)),
//	         x = rate × refill: the arrivals within refill and two standard
//	         deviations of a Poisson count; refill: AssignLatency while an
//	         attached ENI has room, else ENILatency; cap: half an ENI's
//	         slots (secondary IPs) or half a /28; MinWarm is 0 once a node
//	         that had pods saw none for ChunkMemory; with Demand.Bindings
//	         the burst's share is at most BoundAhead plus what the
//	         attached ENIs' room falls short of it (room serves the rest)
//	ahead  = typical − max(arrivals within BurstWindow, need), while a
//	         burst is under way (BurstStart arrivals within BurstOnset, or
//	         BurstStart pods waiting): the rest of a typical burst, asked
//	         for in the same call as its first pods
//	low    = need + ahead + margin   grow when fewer are available;
//	         need + margin with Demand.Bindings while the watch shows
//	         the burst's pods before their ADDs (Unaddressed − Pending
//	         at least BurstStart) and the attached ENIs' room takes ahead
//	         (assignableRoom: not on an ENI refused addresses, within
//	         MaxPods, a slot one address in prefix mode's no-/28
//	         fallback): the burst's later pods are
//	         seen at their bindings, an assign call before their ADDs, so
//	         they make the pool grow when they come, and no ENI is
//	         attached for reach while bound pods wait for addresses
//	high   = need + ahead + margin + chunk   one growth call fills up
//	                                 to this
//	keep   = high                    surplus is what is free or cooling
//	                                 beyond keep
//	reach  = need + typical + margin, and the most in use within
//	         ReachMemory − in use + margin, when typical ≥ ReachBurst;
//	         else low, plus an ENI's slots in secondary-IP mode once the
//	         node saw a pod, while none waits or arrived within
//	         BurstWindow (room for a first burst, whose size is unknown):
//	         addresses available or assignable on attached ENIs; within
//	         FillSpan of the node's first pod, once two ENIs hold
//	         addresses, the ENI attached for it comes with all its slots
//
// chunk is the hysteresis between growth and release: in secondary-IP mode
// max(⌈two-minute rate × ChunkSpan⌉, slots per ENI / ChunkShare), the
// latter at most the arrivals within ChunkMemory, except between the peaks
// of a recurring job (awaitingPeak: with Demand.Bindings, no pod waiting
// or arrived within DepartureQuiet, bursts of ReachBurst pods or more, and
// the pool wanted more than in use + low + chunk at two peaks within
// ChunkMemory): the next peak takes a growth call whatever is kept, so
// chunk only tops the margin up to min(BoundAhead, typical), what the
// peak's first pods take before that call is done; in prefix mode 0, as a
// /28 is hysteresis enough, except within FillSpan of the node's first
// pod: ⌈two-minute rate × ChunkSpan⌉, so a filling node asks for a
// minute of arrivals in one call, not one /28 per call. While pods come,
// a /28 goes only if half a /28 beyond keep stays, except between the
// peaks of a recurring job (demandTarget.betweenJobs) that wanted more
// than the node would hold after a release with the slack: the next
// peak's growth call comes anyway.
//
// Growth: a growth is sized to reach high in one call. In secondary-IP mode
// a new ENI, a node's first addresses, and an attached ENI holding no
// address (within FillSpan of the node's first pod, or with no peak above
// what the node holds that came back to size it by, or without
// Demand.Bindings), get all its slots at once
// (one call per ENI, as the reference); later assigns, in both modes
// (in /28s in prefix mode, not in its no-/28 fallback), are sized to
// high, or up to what the pool wanted held at peaks that came back (two
// episodes at least) within WantMemory (Plan.Wanted, History.Want) if
// more: demand that recurs, a job or a rollout's waves, takes one call, a
// one-off peak sizes nothing, and an ENI a release emptied is not filled
// beyond it. No ENI
// is created for a shortfall that addresses cooling down cover within
// ENILatency: the plan waits for them. When available addresses and room on
// attached ENIs fall short of reach, an ENI is attached without addresses
// (with them if the rate takes them within ChunkSpan): pods the Kubernetes
// part shows bound to the node get their addresses by one assign call,
// so room serves a burst without holding its addresses. Measured on a test
// cluster (test/kubecluster TestClusterLeadTime), kubelet's first ADD comes
// about 0.35 s after the binding for a lone pod, less than an assign call,
// and about 0.15 s later for each pod of a burst queued ahead: the call is
// ready before the ADDs of a burst's later pods, while its first pods and
// lone ones take the margin's free addresses.
//
// Release: surplus goes only if it is at least the release band (MinBand,
// and half an ENI's slots in secondary-IP mode but between the peaks of a
// recurring job that wanted more than the node holds, within MaxPods),
// ReleaseDelay after the last growth (EarlyReleaseDelay in prefix mode, or
// once no more addresses are assigned than in the minute before it), one
// release per Config.ReleaseInterval, while pods are not leaving
// (cooldowns first end, DepartureQuiet; and an ENI whose pods are leaving
// goes once they are gone, in one call), not while a node within FillSpan
// of its first pod still sees pods arrive, nor within FillSpan of the last
// growth on a node that has seen no pod yet and holds none (its first pods
// are coming; a restarted daemon's node with pods releases as before), and
// only if it saves ReleaseWorth per call (between a recurring job's peaks,
// a release below half an ENI that makes the next peak take an assign
// call more must save twice that on what it gives back): the surplus
// times how long it has been idle (since demand last needed it, and since
// the last growth), or, where demand came back at intervals, how long
// until the next time is due; for single addresses
// demand counts both the addresses in use and what the pool wanted held
// (Plan.Wanted: in use plus low), so a release that would leave the pool
// short at a job that comes every few minutes waits, as it would be
// assigned back then. It goes down to the lowest such
// level, from one ENI per call. An ENI holding no address is deleted
// ENIDeleteDelay after the last growth if low and reach hold without it
// (counted with the margin of a refill that would need a new ENI); its room
// costs one address (its own), and attaching it again five EC2 calls.
//
// The memory fades with time alone: the caller plans again every
// VPCIP_POOL_INTERVAL, whatever Plan.Until says. The windows, delays and
// memories below (RateWindow, ChunkSpan, BurstMemory, ChunkMemory,
// ReachMemory, ReleaseDelay, EarlyReleaseDelay, ENIDeleteDelay, DepartureQuiet, ReleaseWorth, FillSpan,
// and History's minutes) are for the default release interval (30 s); a
// shorter Config.ReleaseInterval shrinks them all in proportion (tests and
// demos see the same behaviour compressed: 2 s makes a minute 4 s). The
// cloud's latencies (AssignLatency, ENILatency) and a burst's spans
// (BurstWindow, BurstOnset) stay: pods and EC2 are no faster in a demo.
const (
	// AssignLatency is how soon addresses asked of an attached ENI can be
	// handed out: EC2 AssignPrivateIpAddresses (about 0.4 s) plus the pool
	// loop.
	AssignLatency = time.Second
	// ENILatency is how soon the addresses of a new ENI can be handed out:
	// CreateNetworkInterface, AttachNetworkInterface and instance metadata
	// (about 4 s) plus the pool loop.
	ENILatency = 5 * time.Second
	// RateWindow is how far back arrivals count toward the rate.
	RateWindow = 2 * time.Minute
	// BurstWindow is the span within which arrivals count as one burst.
	BurstWindow = 10 * time.Second
	// BurstStart is how many arrivals within BurstOnset mean a burst is
	// under way; bursts smaller than that are not typical ones.
	BurstStart = 2
	// BurstOnset is the span of BurstStart arrivals that starts a burst.
	BurstOnset = 2 * time.Second
	// BurstMemory is how long the largest recent burst shapes the margin:
	// longer than an hour, so hourly rollouts and jobs are remembered.
	BurstMemory = 75 * time.Minute
	// WantMemory is how long the pool's wanted peaks (History.Want) are
	// kept to size growth by demand that came back: two earlier episodes
	// of an hourly rollout or job.
	WantMemory = 150 * time.Minute
	// BurstShare is the part of the largest recent burst kept warm.
	BurstShare = 0.1
	// ChunkSpan is how many seconds of arrivals one growth call adds
	// beyond low at least.
	ChunkSpan = time.Minute
	// ChunkShare: in secondary-IP mode one growth call adds at least an
	// ENI's slots divided by this beyond low, and as much is kept beyond
	// that before release.
	ChunkShare = 3
	// ChunkMemory bounds chunk by the arrivals within it: a node without
	// churn keeps no hysteresis.
	ChunkMemory = 30 * time.Minute
	// ReachBurst is the least typical burst, in pods, for which attached
	// ENIs keep room (reach): smaller ones the margin covers.
	ReachBurst = 4
	// FillSpan is how long after its first pod a node is taken to be
	// filling: in secondary-IP mode, once the fill took the room of a
	// first ENI beyond the primary, the ENI attached for room comes with
	// all its addresses (three calls), not empty and filled later (four),
	// and no surplus is released while pods still arrive. Counted from the
	// first arrival History holds: a restarted daemon, which remembers no
	// demand, counts from its first pod since.
	FillSpan = 15 * time.Minute
	// ReachMemory is how long the most addresses in use at once are kept
	// within reach: ENIs with room for them stay attached.
	ReachMemory = BurstMemory
	// ReleaseDelay is how long after the last growth surplus is kept.
	ReleaseDelay = 3 * time.Minute
	// EarlyReleaseDelay replaces ReleaseDelay where the addresses a growth
	// served are likely given back already: in prefix mode (a /28 goes
	// only whole and with half a /28 kept beyond keep, so what a burst
	// still holds stays anyway), and in secondary-IP mode once no more
	// addresses are assigned than in the minute 90 s before the growth
	// (History.before: the pods it served are gone, a cron job's, not a
	// batch job's still running). Jobs every few minutes then give back their addresses half
	// a minute sooner, with fewer release-then-assign pairs.
	EarlyReleaseDelay = 150 * time.Second
	// ENIDeleteDelay is how long after the last growth an ENI holding no
	// address is kept: it costs one address (its own), deleting and
	// creating it again five EC2 calls and seconds of a burst's wait.
	ENIDeleteDelay = 6 * time.Hour
	// DepartureQuiet: with no arrival within it and at least a release
	// band of addresses cooling down, pods are leaving: a release waits
	// for their cooldown, so one call gives back what would take several.
	DepartureQuiet = time.Minute
	// ReleaseWorth is how much idleness a release call must save, in
	// address-time: surplus addresses go when their count times how long
	// they have been idle reaches it (50 addresses after 36 s, 5 after
	// 6 minutes), so bursts are given back soon after and small dips not
	// at all.
	ReleaseWorth = 30 * time.Minute
	// MinBand is the least surplus worth a release call, in addresses.
	MinBand = 2
	// MinWarm is the least margin: addresses kept free for the next pod.
	MinWarm = 1
	// BoundAhead is how many of a burst's pods, seen at their binding
	// (Demand.Bindings), reach their first ADD before an assign call
	// their bindings kicked is done: the margin's share of a burst is at
	// most this where attached ENIs have room for the rest. Measured on a
	// test cluster (test/kubecluster TestClusterLeadTime): the k-th pod of
	// a burst reaches its ADD about 0.35 + 0.15·k s after its binding, the
	// call's addresses are there WatchDelay (0.1 s) + AssignLatency after
	// it, so pods 0–5 come first.
	BoundAhead = 6
)

// Demand is what the node's pods ask of the pool beyond the addresses they
// hold, for the adaptive policy.
type Demand struct {
	// Unaddressed counts pods bound to the node that hold no address: ADDs
	// waiting in the daemon and pods in kubelet's back-off after an ADD
	// failed (Kubernetes: scheduled to the node, no pod IP). 0 when unknown.
	Unaddressed int
	// History summarizes recent arrivals; the caller keeps it.
	History History
	// Bindings: Unaddressed is live, from a synced watch of the pods bound
	// to the node (the Kubernetes part), so pods show there before their
	// ADDs; false when unknown (no Kubernetes part, or not synced).
	Bindings bool
}

// demandTarget is the adaptive policy's figures for one Input.
type demandTarget struct {
	need, ahead, margin, low, high, keep int
	reach                                int     // addresses available or assignable on attached ENIs wanted
	rate                                 float64 // arrivals per second
	burst, typical                       int     // pods: the largest recent burst, the typical one
	roomServes                           bool    // the rest of a burst under way (ahead) is left out of low: room serves it
}

func demandOf(in Input, room int, prefixes bool, inUse int) demandTarget {
	var d demandTarget
	d.need = max(in.Pending, in.Demand.Unaddressed, 0)
	h := in.Demand.History
	rateWindow := scaled(in, RateWindow)
	d.rate = max(float64(h.within(in.Now, rateWindow))/rateWindow.Seconds(), float64(h.within(in.Now, BurstWindow))/BurstWindow.Seconds())
	d.burst, d.typical = h.bursts(in.Now, scaled(in, BurstMemory))
	typical := d.typical
	if h.within(in.Now, BurstOnset) >= BurstStart || d.need >= BurstStart {
		d.ahead = max(typical-max(h.within(in.Now, BurstWindow), d.need), 0)
	}
	refill := ENILatency
	if room > 0 {
		refill = AssignLatency
	}
	floor := MinWarm
	if h.seen && h.within(in.Now, scaled(in, ChunkMemory)) == 0 {
		floor = 0 // a node quiet since pods came: the next pod waits for one assign call
	}
	burstCap := PrefixAddresses / 2
	if !prefixes {
		burstCap = max(in.Limits.SlotsPerENI/2, 1)
	}
	// Arrivals within refill at rate, with two standard deviations of a
	// Poisson count on top: a new ENI takes seconds, and two pods within
	// them are likely enough at a slow rate.
	x := d.rate * refill.Seconds()
	share := min(ceilF(BurstShare*float64(d.burst)), burstCap)
	if in.Demand.Bindings {
		// A burst's pods past the first BoundAhead are seen an assign
		// call ahead of their ADDs: room serves them, not free addresses.
		unit := 1
		if prefixes {
			unit = PrefixAddresses
		}
		share = max(min(share, BoundAhead), share-room*unit)
	}
	d.margin = max(floor, ceilF(x+2*math.Sqrt(x)), share)
	d.low = d.need + d.ahead + d.margin
	chunk := 0
	byRate := ceilF(float64(h.within(in.Now, rateWindow)) / rateWindow.Seconds() * scaled(in, ChunkSpan).Seconds())
	if !prefixes {
		// The ENI share only while pods come: no churn, no calls to save.
		chunk = max(byRate, min(in.Limits.SlotsPerENI/ChunkShare, h.within(in.Now, scaled(in, ChunkMemory))))
		if d.betweenJobs(in, inUse+d.low+chunk) {
			// The next peak takes a growth call whatever is kept now:
			// keep free only what its first pods take before that call
			// is done.
			chunk = max(min(BoundAhead, typical)-d.margin, 0)
		}
	} else if h.filling(in.Now, FillSpan) && activeRefusals(in.Refusals, in.Now).noPrefix.IsZero() {
		// Not in the no-/28 fallback: there growth asks only for what is
		// needed, as each single address more may break another /28.
		chunk = byRate
	}
	d.high = d.low + chunk
	d.keep = d.high
	// Room on attached ENIs is as good as free addresses for a burst's
	// later pods, which the Kubernetes part shows seconds before their
	// ADDs: one assign call is ready sooner than kubelet's sandboxes (not
	// for a lone pod, whose ADD comes about 0.35 s after its binding: the
	// margin serves it). Attached ENIs should reach a whole
	// typical burst beyond what is needed now, and the most in use within
	// ReachMemory; an ENI's room costs one address, its own.
	d.reach = d.low
	// Before a typical burst is known, secondary-IP mode keeps room for
	// an ENI's worth: a first burst (a job's pods) then waits for one
	// assign call, not for a new ENI. Not while pods come or wait: a
	// filling node gets its ENIs with addresses, in one call each.
	if !prefixes && h.seen && d.need == 0 && h.within(in.Now, BurstWindow) == 0 {
		d.reach = d.low + in.Limits.SlotsPerENI
	}
	if typical >= ReachBurst {
		d.reach = max(d.need+typical+d.margin, h.peak(in.Now, scaled(in, ReachMemory))-inUse+d.margin)
	}
	// The watch shows the burst's pods before their ADDs: BurstStart or
	// more pods bound without an address and without an ADD waiting. A
	// slow or stalled watch shows them once they hold their addresses, so
	// they do not count, and a pod in kubelet's back-off alone does not
	// open it: the rest of a burst is not left to bindings shown too late.
	if in.Demand.Bindings && d.ahead > 0 && in.Demand.Unaddressed-in.Pending >= BurstStart && assignableRoom(in, prefixes) >= d.ahead {
		// The rest of the burst is seen at its bindings, an assign call
		// ahead of its ADDs, and the attached ENIs have room for it: it
		// does not make the pool grow, but a growth still asks for it.
		d.low = d.need + d.margin
		d.roomServes = true
	}
	return d
}

// assignableRoom is how many addresses assign calls could add on the
// attached ENIs now: their free slots (a /28 each in prefix mode, one
// address in its no-/28 fallback), not those of an ENI under an
// address-limit refusal (growOn skips it), and no more than
// Limits.MaxPods allows.
func assignableRoom(in Input, prefixes bool) int {
	unit := 1
	ref := activeRefusals(in.Refusals, in.Now)
	if prefixes && ref.noPrefix.IsZero() {
		unit = PrefixAddresses
	}
	n := 0
	for _, e := range in.ENIs {
		if ref.addrLimit(e.ID).IsZero() {
			n += max(in.Limits.SlotsPerENI-len(e.Slots), 0) * unit
		}
	}
	if m := in.Limits.MaxPods; m > 0 {
		n = min(n, max(m-poolOf(in.ENIs).total, 0))
	}
	return n
}

// holding is how many of the node's ENIs hold an address or prefix.
func holding(in Input) int {
	n := 0
	for _, e := range in.ENIs {
		if len(e.Slots) > 0 {
			n++
		}
	}
	return n
}

// scaled is d in the time scale of Config.ReleaseInterval: the adaptive
// policy's windows, delays and memories are for the default 30 s interval
// and shrink with a shorter one (tests and demos), never grow.
func scaled(in Input, d time.Duration) time.Duration {
	if f := in.Config.timeScale(); f < 1 {
		return time.Duration(float64(d) * f)
	}
	return d
}

// timeScale is Config.ReleaseInterval over DefaultReleaseInterval, at most
// 1 (unset: 1).
func (c Config) timeScale() float64 {
	if c.ReleaseInterval <= 0 || c.ReleaseInterval >= DefaultReleaseInterval {
		return 1
	}
	return float64(c.ReleaseInterval) / float64(DefaultReleaseInterval)
}

func ceilF(x float64) int { return int(math.Ceil(x - 1e-9)) }

func (d demandTarget) describe() string {
	return "adaptive: need " + itoa(d.need) + ", ahead " + itoa(d.ahead) + ", margin " + itoa(d.margin) + ", grow below " + itoa(d.low) +
		" to " + itoa(d.high) + ", keep " + itoa(d.keep) + ", reach " + itoa(d.reach)
}

// roomSlots is how many slots the attached ENIs could still take.
func roomSlots(in Input) int {
	n := 0
	for _, e := range in.ENIs {
		n += max(in.Limits.SlotsPerENI-len(e.Slots), 0)
	}
	return n
}

// adaptive plans the adaptive policy's next action.
func (s *state) adaptive() Plan {
	d := s.tgt.demand
	if s.pool.available < d.low {
		if p, ok := s.adaptiveGrow(d); ok {
			return p
		}
	}
	if p, ok := s.adaptiveReach(d); ok {
		return p
	}
	if p, ok := s.adaptiveShrink(d); ok {
		return p
	}
	return Plan{Action: Nothing, Reason: "at target (" + d.describe() + ", " + s.poolText() + ")", Until: s.adaptiveUntil(d)}
}

// adaptiveGrow grows to high in one call; it returns false when growth
// waits (cooling addresses cover the shortfall) or cannot happen.
func (s *state) adaptiveGrow(d demandTarget) (Plan, bool) {
	unit := 1
	if s.prefixes {
		unit = PrefixAddresses
	}
	want := d.high - s.pool.available
	why := "short " + count(d.low-s.pool.available, "address") + " (" + d.describe() + ", " + s.poolText() + ")"
	capSlots := s.maxPodsSlots(unit)
	if p, stalled := s.stall(why, capSlots); stalled {
		s.stalled = true
		return p, p.Action == Wait
	}
	if roomSlots(s.in) == 0 && len(s.in.ENIs) < s.in.Limits.MaxENIs {
		if until, ok := s.coolingCovers(d.low-s.pool.available, ENILatency); ok {
			return Plan{Action: Wait, Until: until, Reason: why + ": addresses cooling down cover it by " + stamp(until) + ", sooner than a new ENI"}, true
		}
	}
	// Not in prefix mode's no-/28 fallback: every single address more
	// may break another /28 of the subnet.
	s.fillWhole = !prefixMode(s.in)
	s.wantSized = s.fillWhole || s.prefixes
	p, blocked := s.growOn(ceilDiv(want, unit), capSlots, why)
	if blocked {
		s.stalled = true
	}
	return p, p.Action == Assign || p.Action == CreateENI || p.Action == Wait
}

// adaptiveReach attaches an ENI, with no addresses, when the available
// addresses and the room of the attached ENIs fall short of reach.
func (s *state) adaptiveReach(d demandTarget) (Plan, bool) {
	if d.roomServes {
		// Bound pods wait for the assigns room serves them by: an ENI
		// attached now would hold those calls up for seconds.
		return Plan{}, false
	}
	unit := 1
	if s.prefixes {
		unit = PrefixAddresses
	}
	lim := s.in.Limits
	reachable := s.pool.available + roomSlots(s.in)*unit
	if reachable >= d.reach || len(s.in.ENIs) >= lim.MaxENIs || !s.ref.eniLimit.IsZero() || lim.SlotsPerENI <= 0 {
		return Plan{}, false
	}
	if lim.MaxPods > 0 && s.pool.total+roomSlots(s.in)*unit >= lim.MaxPods {
		return Plan{}, false // max pods are within reach already
	}
	if !latest(s.ref.subnetFull, s.ref.throttled).IsZero() {
		return Plan{}, false
	}
	// Addresses with it only if the arrival rate will take them soon (a
	// node filling): a fourth call to fill it later is then saved; in
	// secondary-IP mode it is then filled whole.
	n := min(ceilDiv(max(ceilF(d.rate*scaled(s.in, ChunkSpan).Seconds())-s.pool.available, 0), unit), lim.SlotsPerENI)
	if n > 0 && !prefixMode(s.in) {
		n = lim.SlotsPerENI
	}
	if !prefixMode(s.in) && holding(s.in) >= 2 && s.in.Demand.History.filling(s.in.Now, FillSpan) {
		// A filling node took the room of an ENI already: the next one
		// comes with its addresses (one call less than room and an assign).
		n = lim.SlotsPerENI
	}
	n = min(n, s.maxPodsSlots(unit))
	if c := s.ref.subnetCap; c > 0 && n > c {
		n = c // the subnet refused a larger request (growPlan)
	}
	if !s.prefixes && prefixMode(s.in) {
		// In the no-/28 fallback an ENI for reach comes empty: its slots
		// are for /28s once they can be had (16 addresses each), and
		// growth asks for the single addresses pods and margin need. A
		// minute of arrivals in single addresses filled ENIs whose slots
		// then capped the node far below its /28 budget.
		n = 0
	}
	return Plan{Action: CreateENI, Count: n, Prefixes: s.prefixes, Reason: "reach " + count(d.reach-reachable, "address") + " short (" +
		d.describe() + ", " + s.poolText() + "): create ENI with " + count(n, "slot")}, true
}

// coolingCovers reports whether at least n cooling addresses finish their
// cooldown within horizon, and when the n-th does.
func (s *state) coolingCovers(n int, horizon time.Duration) (time.Time, bool) {
	var ends []time.Time
	for _, e := range s.in.ENIs {
		for _, sl := range e.Slots {
			if sl.Cooling <= 0 || sl.CoolingUntil.IsZero() || sl.CoolingUntil.Sub(s.in.Now) > horizon {
				continue
			}
			for range sl.Cooling {
				ends = append(ends, sl.CoolingUntil)
			}
		}
	}
	if n <= 0 || len(ends) < n {
		return time.Time{}, false
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	return ends[n-1], true
}

// betweenJobs reports whether the node waits between the peaks of a
// recurring job, each of which takes a growth call even if the pool keeps
// level addresses (in use plus what it would keep without the rule): no
// pod waits, the typical burst is ReachBurst pods or more, and
// awaitingPeak holds.
func (d demandTarget) betweenJobs(in Input, level int) bool {
	return d.need == 0 && d.typical >= ReachBurst && awaitingPeak(in, level)
}

// awaitingPeak reports whether the node waits, between peaks, for one
// that will take a growth call even if the pool keeps what it would keep
// without this rule: the pool wanted more than above addresses held (in
// use plus that keep, not what the node holds, so releasing down to it
// does not make the rule release more) at two peaks or more within
// ChunkMemory (History.wantAgain: a job every few minutes, not an hourly
// rollout), no pod arrived within DepartureQuiet, and the node's pods are
// seen at their binding (Demand.Bindings), so the peak's later pods get
// their addresses from an assign call their bindings start.
func awaitingPeak(in Input, above int) bool {
	h := in.Demand.History
	return in.Demand.Bindings && h.within(in.Now, scaled(in, DepartureQuiet)) == 0 &&
		h.wantAgain(in.Now, scaled(in, ChunkMemory), above) > 0
}
