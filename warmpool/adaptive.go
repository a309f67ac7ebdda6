package warmpool

import (
	"math"
	"net/netip"
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
//	margin = max(MinWarm, ⌈rate × refill⌉, min(⌈BurstShare × burst⌉, cap))
//	         refill: AssignLatency while an attached ENI has room, else
//	         ENILatency; cap: half an ENI's slots (secondary IPs) or half
//	         a /28, half of what the reference keeps warm; MinWarm is 0
//	         once a node that had pods saw none for ChunkMemory
//	ahead  = typical − arrivals within BurstWindow, while a burst is under
//	         way (BurstStart arrivals within BurstOnset): the rest of a
//	         burst as large as the typical recent one (the median of the
//	         minutes' largest bursts of BurstStart or more)
//	low    = need + ahead + margin   grow when fewer are available
//	high   = low + chunk             one growth call fills up to this
//	keep   = high + chunk            release only what is free or cooling
//	                                 beyond keep (and MinBand), down to high
//	peak   = most addresses assigned or cooling observed after an
//	         arrival within PeakMemory: high and keep are at least
//	         peak − in use + margin
//
// chunk is the hysteresis between growth and release: in secondary-IP mode
// max(⌈rate × ChunkSpan⌉, slots per ENI / ChunkShare), at most the arrivals
// within ChunkMemory, so a growth call serves many pods and a dip does not
// release what the next rise assigns again; in prefix mode 0, as the /28
// granularity is hysteresis enough. Shrinking also waits ReleaseDelay after
// the last growth, and deleting an ENI ENIDeleteDelay. A growth is sized to
// reach high in one call. No ENI is created for a shortfall that addresses
// cooling down cover within ENILatency: the plan waits for them. A
// secondary ENI that holds no assigned or cooling address is deleted once
// the others hold keep. The memory fades with time alone: the caller plans
// again every VPCIP_POOL_INTERVAL, whatever Plan.Until says. The delays and
// memories below are for the default release interval (30 s); a shorter
// Config.ReleaseInterval shrinks them in proportion (tests and demos).
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
	// BurstShare is the part of the largest recent burst kept warm.
	BurstShare = 1.0
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
	// PeakMemory is how long the most addresses in use at once are kept
	// (free ones beyond margin) for the next rise.
	PeakMemory = 20 * time.Minute
	// ReleaseDelay is how long after the last growth surplus is kept.
	ReleaseDelay = 3 * time.Minute
	// ENIDeleteDelay is how long after the last growth an unneeded ENI is
	// kept: deleting and creating one again costs five EC2 calls.
	ENIDeleteDelay = 15 * time.Minute
	// MinBand is the least surplus worth a release call, in addresses.
	MinBand = 2
	// MinWarm is the least margin: addresses kept free for the next pod.
	MinWarm = 1
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
}

// demandTarget is the adaptive policy's figures for one Input.
type demandTarget struct {
	need, ahead, margin, low, high, keep int
	rate                                 float64 // arrivals per second
	burst                                int
}

func demandOf(in Input, room int, prefixes bool, inUse int) demandTarget {
	var d demandTarget
	d.need = max(in.Pending, in.Demand.Unaddressed, 0)
	h := in.Demand.History
	d.rate = max(float64(h.within(in.Now, RateWindow))/RateWindow.Seconds(), float64(h.within(in.Now, BurstWindow))/BurstWindow.Seconds())
	var typical int
	d.burst, typical = h.bursts(in.Now, scaled(in, BurstMemory))
	if h.within(in.Now, BurstOnset) >= BurstStart {
		d.ahead = max(typical-h.within(in.Now, BurstWindow), 0)
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
	d.margin = max(floor, ceilF(d.rate*refill.Seconds()), min(ceilF(BurstShare*float64(d.burst)), burstCap))
	d.low = d.need + d.ahead + d.margin
	chunk := 0
	if !prefixes {
		byRate := ceilF(d.rate * ChunkSpan.Seconds())
		// The ENI share only while pods come: no churn, no calls to save.
		chunk = max(byRate, min(in.Limits.SlotsPerENI/ChunkShare, h.within(in.Now, scaled(in, ChunkMemory))))
	}
	d.high = d.low + chunk
	d.keep = d.high + chunk
	if peak := h.peak(in.Now, scaled(in, PeakMemory)); peak > 0 {
		free := max(peak-inUse, 0) + d.margin
		d.high = max(d.high, free)
		d.keep = max(d.keep, free)
	}
	return d
}

// History is what the adaptive policy remembers of a node's recent
// demand: the arrivals (address requests) of the last ChunkMemory, and per
// minute the largest burst and the most addresses in use, for BurstMemory.
// The zero value is empty. It holds ChunkMemory's arrivals plus about 80
// minutes; Record and Observe are amortized O(1). The caller keeps it:
// Record at each address request, Observe with each snapshot it plans
// with, and passes it in Input.Demand.
type History struct {
	recent []time.Time // within ChunkMemory of the last Record, oldest first
	peaks  []peak      // per minute, oldest first, within BurstMemory
	seen   bool        // an arrival was recorded
	fresh  bool        // an arrival was recorded since the last Observe
}

type peak struct {
	minute time.Time
	burst  int // most arrivals within BurstWindow
	inUse  int // most addresses assigned or cooling
}

// Record adds an arrival at t (not before the previous one) and returns
// the updated history; the receiver's storage may be reused.
func (h History) Record(t time.Time) History {
	cut := 0
	for cut < len(h.recent) && t.Sub(h.recent[cut]) > ChunkMemory {
		cut++
	}
	h.recent = append(h.recent[cut:], t)
	h.seen, h.fresh = true, true
	h = h.minute(t)
	last := &h.peaks[len(h.peaks)-1]
	last.burst = max(last.burst, h.within(t, BurstWindow))
	return h
}

// Observe records that inUse addresses were assigned or cooling at t, if
// a pod arrived since the last Observe (the level demand reached, not the
// cooldown's tail after pods left), and returns the updated history.
func (h History) Observe(t time.Time, inUse int) History {
	if !h.fresh {
		return h
	}
	h.fresh = false
	h = h.minute(t)
	last := &h.peaks[len(h.peaks)-1]
	last.inUse = max(last.inUse, inUse)
	return h
}

// Snapshot is a copy of h that stays unchanged while h goes on recording
// (Record only appends beyond the copy's arrivals; the minutes are copied),
// for handing to Next from another goroutine.
func (h History) Snapshot() History {
	h.peaks = slices.Clone(h.peaks)
	h.recent = h.recent[:len(h.recent):len(h.recent)]
	return h
}

// minute makes t's minute the last entry of peaks and drops the ones older
// than BurstMemory.
func (h History) minute(t time.Time) History {
	m := t.Truncate(time.Minute)
	if n := len(h.peaks); n == 0 || h.peaks[n-1].minute.Before(m) {
		h.peaks = append(h.peaks, peak{minute: m})
	}
	cut := 0
	for cut < len(h.peaks)-1 && t.Sub(h.peaks[cut].minute) > BurstMemory {
		cut++
	}
	h.peaks = h.peaks[cut:]
	return h
}

// within counts the arrivals in (now − d, now].
func (h History) within(now time.Time, d time.Duration) int {
	n := 0
	for i := len(h.recent) - 1; i >= 0; i-- {
		age := now.Sub(h.recent[i])
		if age >= d {
			break
		}
		if age >= 0 {
			n++
		}
	}
	return n
}

// peak is the most addresses in use observed within memory of now.
func (h History) peak(now time.Time, memory time.Duration) int {
	n := 0
	for _, p := range h.peaks {
		if now.Sub(p.minute) <= memory {
			n = max(n, p.inUse)
		}
	}
	return n
}

// bursts are the largest burst within memory of now and the typical
// one: the median of the minutes' largest bursts of BurstStart or more.
func (h History) bursts(now time.Time, memory time.Duration) (largest, typical int) {
	var sizes []int
	for _, p := range h.peaks {
		if now.Sub(p.minute) <= memory && p.burst >= BurstStart {
			sizes = append(sizes, p.burst)
		}
		if now.Sub(p.minute) <= memory {
			largest = max(largest, p.burst)
		}
	}
	if len(sizes) == 0 {
		return largest, 0
	}
	slices.Sort(sizes)
	return largest, sizes[len(sizes)/2]
}

// scaled is d in the time scale of Config.ReleaseInterval: the adaptive
// policy's delays and memories are for the default 30 s interval and
// shrink with a shorter one (tests and demos), never grow.
func scaled(in Input, d time.Duration) time.Duration {
	iv := in.Config.ReleaseInterval
	if iv <= 0 || iv >= DefaultReleaseInterval {
		return d
	}
	return time.Duration(float64(d) * float64(iv) / float64(DefaultReleaseInterval))
}

func ceilF(x float64) int { return int(math.Ceil(x - 1e-9)) }

func (d demandTarget) describe() string {
	return "adaptive: need " + itoa(d.need) + ", ahead " + itoa(d.ahead) + ", margin " + itoa(d.margin) + ", grow below " + itoa(d.low) +
		" to " + itoa(d.high) + ", keep " + itoa(d.keep)
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
	p, blocked := s.growOn(ceilDiv(want, unit), capSlots, why)
	if blocked {
		s.stalled = true
	}
	return p, p.Action == Assign || p.Action == CreateENI || p.Action == Wait
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
			s.in.Now.Before(s.in.LastGrow.Add(scaled(s.in, ENIDeleteDelay))) {
			continue
		}
		if (held-ep.available >= d.keep && s.pool.available-ep.available >= d.high) || (len(e.Slots) == 0 && s.pool.available >= d.low) {
			return Plan{Action: DeleteENI, ENI: e.ID, Reason: "ENI " + e.ID + " unneeded: no assigned or cooling address (" +
				d.describe() + ", " + s.poolText() + ")"}, true
		}
	}
	if held < d.keep+max(MinBand, d.keep-d.high) {
		return Plan{}, false // too little to be worth a call
	}
	rel, from := s.adaptiveReleasable(d.high, d.keep)
	if len(rel) == 0 {
		return Plan{}, false
	}
	n := 0
	for _, r := range rel {
		n += Slot{Prefix: r}.Size()
	}
	return Plan{Action: Release, ENI: from, Release: rel, Reason: "surplus: release " + count(n, "address") + " from " + from +
		" (" + d.describe() + ", " + s.poolText() + ")"}, true
}

// delayUntil is when shrinking is allowed: ReleaseDelay after the last
// growth and Config.ReleaseInterval after the last release.
func (s *state) delayUntil() time.Time {
	interval := s.in.Config.ReleaseInterval
	if interval <= 0 {
		interval = DefaultReleaseInterval
	}
	var t time.Time
	if !s.in.LastGrow.IsZero() {
		t = s.in.LastGrow.Add(scaled(s.in, ReleaseDelay))
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
func (s *state) adaptiveReleasable(high, keep int) ([]netip.Prefix, string) {
	order := s.releaseOrder()
	held := s.pool.available + s.pool.cooling
	for _, i := range order {
		e := &s.in.ENIs[i]
		if !e.Primary && s.enis[i].assigned+s.enis[i].cooling == 0 {
			continue // an idle ENI goes whole once unneeded: one call less than emptying it first
		}
		var out []netip.Prefix
		left, avail := held, s.pool.available
		for _, sl := range freeSlots(e) {
			if left-sl.Size() < keep || avail-sl.Size() < high {
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
