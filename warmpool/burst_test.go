package warmpool

import (
	"fmt"
	"testing"
	"time"
)

// c5Large are a c5.18xlarge's limits in secondary-IP mode: 15 ENIs of 49
// secondary addresses.
var c5Large = Limits{MaxENIs: 15, SlotsPerENI: 49}

// jobsNode is a c5.18xlarge-like node between the bursts of a recurring
// job: 49 long-lived pods on the primary ENI, eni-01 holding 49 free
// addresses, eni-02 and eni-03 attached empty (room for the next job). Jobs of 100 pods came 25 and 12
// minutes ago (the pool wanted 160 addresses held at each); lastArrival is
// how long ago the last pod came.
func jobsNode(bindings bool, lastArrival time.Duration) Input {
	in := afterJobs(bindings, []time.Duration{25 * time.Minute, 12 * time.Minute}, 149, 160, 10*time.Minute,
		slotsOf(0x0a400000, 49, 49, 0), slotsOf(0x0a400100, 49, 0, 0), nil, nil)
	if lastArrival < 12*time.Minute {
		at := t0.Add(-lastArrival)
		in.Demand.History = in.Demand.History.Record(at).Observe(at, 49)
	}
	return in
}

// afterJobs is a c5.18xlarge-like node at t0 after the bursts of a job:
// each burst (ago before t0) brought the node to inUse addresses in use
// within 2 seconds and the pool wanted want held; the pool last grew with
// the latest burst and last released lastRelease before t0. ENI i (eni-0i,
// the first primary, all attached an hour ago) holds slots[i].
func afterJobs(bindings bool, ago []time.Duration, inUse, want int, lastRelease time.Duration, slots ...[]Slot) Input {
	var h History
	for _, a := range ago {
		at := t0.Add(-a)
		h = arrivals(h, at, at.Add(2*time.Second), 20*time.Millisecond, inUse).Want(at.Add(2*time.Second), want)
	}
	in := Input{Now: t0, Limits: c5Large, Config: Config{Adaptive: true},
		LastGrow: t0.Add(-ago[len(ago)-1]), LastRelease: t0.Add(-lastRelease),
		Demand: Demand{History: h, Bindings: bindings}}
	for i, sl := range slots {
		in.ENIs = append(in.ENIs, ENI{ID: fmt.Sprintf("eni-%02d", i), Primary: i == 0, Attached: t0.Add(-time.Hour), Slots: sl})
	}
	return in
}

// TestAwaitingPeakKeepsWhatTheFirstPodsTake: between the bursts of a job
// that will need a growth call anyway (the pool wanted 160 held, the node
// holds 98), a node whose pods are seen at their binding keeps free only
// what a burst's first pods take before that call is done (BoundAhead, 6
// addresses), and releases the rest in one call. Without the pod watch, or with a pod
// arrived within DepartureQuiet, it keeps the hysteresis of a third of an
// ENI on top of its margin as before (6 + 16; without the watch the margin
// is a tenth of the last 101-pod burst, 11).
func TestAwaitingPeakKeepsWhatTheFirstPodsTake(t *testing.T) {
	for _, c := range []struct {
		name        string
		bindings    bool
		lastArrival time.Duration
		keep        int
	}{
		{"pods seen at binding, quiet", true, time.Hour, BoundAhead},
		{"pods seen at binding, one came 30 s ago", true, 30 * time.Second, BoundAhead + 16},
		{"no pod watch, quiet", false, time.Hour, 11 + 16},
	} {
		in := jobsNode(c.bindings, c.lastArrival)
		d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs)))
		if d.keep != c.keep {
			t.Errorf("%s: keep %d, want %d (%s)", c.name, d.keep, c.keep, d.describe())
		}
		p := Next(in)
		if c.keep == BoundAhead && (p.Action != Release || p.ENI != "eni-01" || len(p.Release) != 49-BoundAhead) {
			t.Errorf("%s: %v of %d on %s (%s); want a release from eni-01 down to %d free", c.name, p.Action, len(p.Release), p.ENI, p.Reason, BoundAhead)
		}
		if p.Action != Release && p.Action != Nothing {
			t.Errorf("%s: %v (%s); want a release or nothing", c.name, p.Action, p.Reason)
		}
		if left := 49 - len(p.Release); left < c.keep {
			t.Errorf("%s: release of %d leaves %d free, below keep %d (%s)", c.name, len(p.Release), left, c.keep, p.Reason)
		}
	}
	if in := jobsNode(true, time.Hour); !awaitingPeak(in, 159) || awaitingPeak(in, 160) {
		t.Errorf("awaitingPeak(159) %v, awaitingPeak(160) %v; want true, false (the peaks wanted 160)", awaitingPeak(in, 159), awaitingPeak(in, 160))
	}
	// What the node holds does not turn the rule on or off: after the
	// release (6 free on eni-01) the keep is the same, so no flat load
	// releases and assigns back over and over.
	for _, free := range []int{49, BoundAhead, 0} {
		in := jobsNode(true, time.Hour)
		in.ENIs[1].Slots = slotsOf(0x0a400100, free, 0, 0)
		if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.keep != BoundAhead {
			t.Errorf("%d free on eni-01: keep %d, want %d (%s)", free, d.keep, BoundAhead, d.describe())
		}
	}
	// The node holds 196 addresses, more than the 160 the peaks wanted:
	// the rule still holds (it compares with what the pool wants). With
	// no room left the margin is 11, and no hysteresis tops it.
	in := jobsNode(true, time.Hour)
	in.ENIs[2].Slots = slotsOf(0x0a400200, 49, 0, 0)
	in.ENIs[3].Slots = slotsOf(0x0a400300, 49, 0, 0)
	if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.keep != max(d.margin, BoundAhead) {
		t.Errorf("196 held: keep %d, want the margin %d, at least %d (%s)", d.keep, d.margin, BoundAhead, d.describe())
	}
	// One pod bound and waiting: a peak has begun, the rule is off.
	in = jobsNode(true, time.Hour)
	in.Demand.Unaddressed = 1
	if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.keep <= d.low {
		t.Errorf("1 pod bound without an address: keep %d, want the hysteresis beyond low %d (%s)", d.keep, d.low, d.describe())
	}
}

// burstNode is a c5.18xlarge-like node whose pods are seen at their
// binding (bindings), with jobs of 40 pods 35 and 20 minutes ago, at the
// start of the next one: n of its pods bound, none with an address or an
// ADD yet (the watch shows them before their ADDs). The primary ENI is full; eni-01 holds 10 free
// addresses and room for 29 more, eni-02 (when room) is attached empty.
func burstNode(bindings, room bool, n int) Input {
	return burstNodePeak(bindings, room, n, 89)
}

// burstNodePeak is burstNode with peak addresses in use during the earlier
// jobs.
func burstNodePeak(bindings, room bool, n, peak int) Input {
	var h History
	for _, ago := range []time.Duration{35 * time.Minute, 20 * time.Minute} {
		at := t0.Add(-ago)
		h = arrivals(h, at, at.Add(2*time.Second), 50*time.Millisecond, peak).Want(at.Add(2*time.Second), 96)
	}
	in := Input{Now: t0, Limits: c5Large, Config: Config{Adaptive: true},
		LastGrow: t0.Add(-20 * time.Minute), LastRelease: t0.Add(-10 * time.Minute),
		Demand: Demand{History: h, Bindings: bindings, Unaddressed: n},
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 49, 49, 0)},
			{ID: "eni-01", Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400100, 20, 10, 0)},
		}}
	if room {
		in.ENIs = append(in.ENIs, ENI{ID: "eni-02", Attached: t0.Add(-time.Hour)})
	} else {
		in.ENIs[1].Slots = slotsOf(0x0a400100, 49, 39, 0)
	}
	return in
}

// TestRoomServesTheRestOfABurst: at a burst's start, with its pods seen at
// their binding and room on attached ENIs for the rest of a typical burst,
// the free addresses that cover the pods bound so far and the margin make
// no call: the rest is assigned when its bindings show, an assign call
// ahead of its ADDs, and no ENI is attached meanwhile (its four seconds
// would hold those calls up). Once the bound pods and the margin outgrow
// the free addresses, one assign asks for the rest of the burst too.
// Without the pod watch, with a watch no sooner than the ADDs, or without
// room for the rest (an ENI refused addresses has none), the first pods
// make the pool grow for the whole burst, as before.
func TestRoomServesTheRestOfABurst(t *testing.T) {
	grows := func(p Plan) bool { return p.Action == Assign || p.Action == CreateENI }
	in := burstNode(true, true, 3)
	d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs)))
	if !d.roomServes || d.ahead == 0 || d.low != d.need+d.margin || d.high < d.need+d.ahead+d.margin {
		t.Errorf("3 bound, room: %s, roomServes %v; want low = need + margin, high with ahead", d.describe(), d.roomServes)
	}
	if p := Next(in); grows(p) {
		t.Errorf("3 bound, 10 free, room for the rest: %v (%s); want no call", p.Action, p.Reason)
	}
	in = burstNode(true, true, 8)
	if p := Next(in); p.Action != Assign || p.ENI != "eni-01" || p.Count != 29 {
		t.Errorf("8 bound, 10 free: %v of %d on %s (%s); want one assign for the rest of the burst, eni-01's room of 29", p.Action, p.Count, p.ENI, p.Reason)
	}
	if p := Next(burstNode(false, true, 3)); !grows(p) {
		t.Errorf("no pod watch: %v (%s); want growth for the burst", p.Action, p.Reason)
	}
	in = burstNode(true, false, 3)
	if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.roomServes {
		t.Errorf("no room for the rest: roomServes (%s)", d.describe())
	}
	if p := Next(in); !grows(p) {
		t.Errorf("no room for the rest: %v (%s); want growth for the burst", p.Action, p.Reason)
	}
	// eni-02's room is refused addresses (growth skips it): 29 left, less
	// than the rest of the burst.
	in = burstNode(true, true, 3)
	in.Refusals = []Refusal{{Kind: RefusedAddressLimit, ENI: "eni-02", Until: t0.Add(time.Minute)}}
	if p := Next(in); !grows(p) {
		t.Errorf("eni-02 refused: %v (%s); want growth for the burst", p.Action, p.Reason)
	}
	// A watch that shows the pods no sooner than their ADDs (as many ADDs
	// waiting as pods bound without an address): growth for the burst.
	in = burstNode(true, true, 3)
	in.Pending = 3
	if p := Next(in); !grows(p) {
		t.Errorf("3 ADDs waiting, 3 bound: %v (%s); want growth for the burst", p.Action, p.Reason)
	}
	// A slow watch: the burst's first 3 ADDs came and took free addresses
	// before their bindings showed; the one pod shown bound without an
	// address is in kubelet's back-off. Growth for the burst, as before.
	in = burstNode(true, true, 1)
	for i := range 3 {
		at := t0.Add(-time.Second + time.Duration(i)*100*time.Millisecond)
		in.Demand.History = in.Demand.History.Record(at).Observe(at, 62)
	}
	if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.roomServes || d.ahead == 0 {
		t.Errorf("3 ADDs before their bindings, 1 pod in back-off: roomServes %v, ahead %d (%s); want ahead and no roomServes", d.roomServes, d.ahead, d.describe())
	}
	if p := Next(in); !grows(p) {
		t.Errorf("3 ADDs before their bindings, 1 pod in back-off: %v (%s); want growth for the burst", p.Action, p.Reason)
	}
	// Earlier jobs held 150 in use, so reach wants more room than the
	// attached ENIs have; while bound pods wait on room, no ENI is
	// attached (its seconds would hold up their assigns).
	in = burstNodePeak(true, true, 3, 150)
	if d := demandOf(in, roomSlots(in), false, inUse(poolOf(in.ENIs))); d.reach <= 10+roomSlots(in) {
		t.Fatalf("reach %d, want above the 10 free and %d of room (%s)", d.reach, roomSlots(in), d.describe())
	}
	if p := Next(in); p.Action == CreateENI || p.Action == Assign {
		t.Errorf("3 bound, reach short: %v (%s); want no call while room serves the burst", p.Action, p.Reason)
	}
}

// TestRoomServesABurstInPrefixMode: the same in prefix mode, room counted
// in /28s (10 free slots, 160 addresses): the 16 free addresses of a /28
// cover the 3 pods bound so far and the margin, so no call. In the no-/28
// fallback a free slot takes one address, 10 in all, less than the rest of
// the burst: its first pods make the pool grow.
func TestRoomServesABurstInPrefixMode(t *testing.T) {
	in := burstNode(true, false, 3)
	in.Limits = Limits{MaxENIs: 4, SlotsPerENI: 14, PrefixSupported: true}
	in.Config.PrefixDelegation = true
	in.ENIs = []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: prefixSlots(0x0a800000, 4, 3)}}
	d := demandOf(in, roomSlots(in), true, inUse(poolOf(in.ENIs)))
	if !d.roomServes || d.low != d.need+d.margin {
		t.Errorf("prefix mode, 10 free slots: %s, roomServes %v; want low = need + margin", d.describe(), d.roomServes)
	}
	if p := Next(in); p.Action == Assign || p.Action == CreateENI {
		t.Errorf("prefix mode, 16 free, room for the rest: %v (%s); want no call", p.Action, p.Reason)
	}
	in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Hour)}}
	if d := demandOf(in, roomSlots(in), true, inUse(poolOf(in.ENIs))); d.roomServes {
		t.Errorf("no-/28 fallback, 10 free slots of one address each: roomServes (%s)", d.describe())
	}
}

// prefixJobsNode is an m5.xlarge-like node in prefix mode between the
// bursts of a recurring job: 11 long-lived pods in the primary ENI's first
// /28, free /28s after it (free of them). Jobs of 24 pods came 25 and 12
// minutes ago, each with 35 addresses in use and want addresses wanted
// held; lastArrival is how long ago the last pod came.
func prefixJobsNode(bindings bool, lastArrival time.Duration, free, want int) Input {
	var h History
	for _, ago := range []time.Duration{25 * time.Minute, 12 * time.Minute} {
		at := t0.Add(-ago)
		h = arrivals(h, at, at.Add(2*time.Second), 87*time.Millisecond, 35).Want(at.Add(2*time.Second), want)
	}
	if lastArrival < 12*time.Minute {
		at := t0.Add(-lastArrival)
		h = h.Record(at).Observe(at, 11)
	}
	slots := prefixSlots(0x0a800000, 1+free, 0)
	slots[0].Assigned = 11
	return Input{Now: t0, Limits: Limits{MaxENIs: 4, SlotsPerENI: 14, PrefixSupported: true},
		Config:   Config{Adaptive: true, PrefixDelegation: true},
		LastGrow: t0.Add(-12 * time.Minute), LastRelease: t0.Add(-10 * time.Minute),
		Demand: Demand{History: h, Bindings: bindings},
		ENIs:   []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slots}}}
}

// TestBetweenJobsPrefixModeReleasesWithoutSlack: in prefix mode a /28
// goes only if half a /28 beyond keep stays, while pods come, so demand
// that hovers at a multiple of 16 does not release and assign one over and
// over. Between the peaks of a recurring job whose pods are seen at their
// binding and that wanted 40 addresses held, more than the 32 the node
// would hold after a release with the slack, the next peak takes a growth
// call anyway: both free /28s go in one call, leaving the 5 free addresses
// of the first (keep is the margin, 3). Without the pod watch, or with a
// pod arrived within DepartureQuiet, one /28 goes and 21 addresses stay
// free, as before. Once released, the node holds its one /28 and makes no
// call. Where the peaks wanted 28, which 32 addresses cover, the slack
// stays: the next peak would otherwise take a growth call it does not
// take now.
func TestBetweenJobsPrefixModeReleasesWithoutSlack(t *testing.T) {
	for _, c := range []struct {
		name        string
		bindings    bool
		lastArrival time.Duration
		released    int // /28s
	}{
		{"pods seen at binding, quiet", true, time.Hour, 2},
		{"pods seen at binding, one came 30 s ago", true, 30 * time.Second, 1},
		{"no pod watch, quiet", false, time.Hour, 1},
	} {
		in := prefixJobsNode(c.bindings, c.lastArrival, 2, 40)
		p := Next(in)
		if p.Action != Release || len(p.Release) != c.released {
			t.Errorf("%s: %v of %d /28s (%s); want a release of %d", c.name, p.Action, len(p.Release), p.Reason, c.released)
		}
		for _, r := range p.Release {
			if r.Bits() != 28 || r == in.ENIs[0].Slots[0].Prefix {
				t.Errorf("%s: releases %v; want only the free /28s", c.name, r)
			}
		}
	}
	in := prefixJobsNode(true, time.Hour, 0, 40)
	if p := Next(in); p.Action != Nothing {
		t.Errorf("after the release, 5 free: %v (%s); want nothing", p.Action, p.Reason)
	}
	for _, c := range []struct {
		free, released int
	}{{2, 1}, {1, 0}} {
		in := prefixJobsNode(true, time.Hour, c.free, 28)
		if p := Next(in); len(p.Release) != c.released {
			t.Errorf("peaks wanting 28, %d free /28s: %v of %d /28s (%s); want %d, the slack kept", c.free, p.Action, len(p.Release), p.Reason, c.released)
		}
	}
	// A job of 3 pods (below ReachBurst) is no recurring peak to wait
	// for: the slack stays.
	in = prefixJobsNode(true, time.Hour, 2, 40)
	var h History
	for _, ago := range []time.Duration{25 * time.Minute, 12 * time.Minute} {
		at := t0.Add(-ago)
		h = arrivals(h, at, at.Add(time.Second), 500*time.Millisecond, 14).Want(at.Add(time.Second), 40)
	}
	in.Demand.History = h
	if p := Next(in); p.Action == Release && len(p.Release) != 1 {
		t.Errorf("jobs of 3 pods: release of %d /28s (%s); want at most one", len(p.Release), p.Reason)
	}
}

// rolloutPrefixNode is an m5.4xlarge-like node in prefix mode at the first
// wave of an hourly rollout: 75 pods in five /28s (5 addresses free) and 6
// ADDs waiting. wants are what the pool wanted held at earlier rollouts
// (each an episode of arrivals), within WantMemory.
func rolloutPrefixNode(wants ...int) Input {
	var h History
	for i, w := range wants {
		at := t0.Add(-time.Duration(len(wants)-i) * time.Hour)
		h = arrivals(h, at, at.Add(20*time.Second), time.Second, 90).Want(at.Add(20*time.Second), w)
	}
	slots := prefixSlots(0x0a800000, 5, 4)
	slots[4].Assigned = 11
	return Input{Now: t0, Limits: Limits{MaxENIs: 8, SlotsPerENI: 29, PrefixSupported: true},
		Config:  Config{Adaptive: true, PrefixDelegation: true},
		Pending: 6, LastGrow: t0.Add(-50 * time.Minute), LastRelease: t0.Add(-40 * time.Minute),
		Demand: Demand{History: h},
		ENIs:   []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-2 * time.Hour), Slots: slots}}}
}

// TestPrefixGrowthSizedByRecurringPeaks: in prefix mode, as in
// secondary-IP mode, a growth goes up to what the pool wanted held at
// peaks that came back (two earlier rollouts that wanted 112 addresses
// held): one call for 2 /28s rather than a /28 now and another at the
// next wave. Peaks that wanted no more than the node holds (80) size
// nothing, nor does a single earlier peak, nor do peaks in the no-/28
// fallback, where each single address more may break a /28 of the subnet.
func TestPrefixGrowthSizedByRecurringPeaks(t *testing.T) {
	one := Next(rolloutPrefixNode(80, 80))
	if one.Action != Assign || !one.Prefixes || one.Count != 1 {
		t.Fatalf("peaks wanting 80: %v of %d (prefixes %v, %s); want 1 /28", one.Action, one.Count, one.Prefixes, one.Reason)
	}
	if p := Next(rolloutPrefixNode(112, 112)); p.Action != Assign || !p.Prefixes || p.Count != 2 {
		t.Errorf("two earlier peaks wanting 112: %v of %d (prefixes %v, %s); want 2 /28s in one call", p.Action, p.Count, p.Prefixes, p.Reason)
	}
	if p, q := Next(rolloutPrefixNode(112)), Next(rolloutPrefixNode(80)); p.Count != q.Count {
		t.Errorf("one earlier peak wanting 112: %v of %d (%s); want %d, as with one wanting 80", p.Action, p.Count, p.Reason, q.Count)
	}
	in, control := rolloutPrefixNode(112, 112), rolloutPrefixNode(80, 80)
	in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Hour)}}
	control.Refusals = in.Refusals
	if p, q := Next(in), Next(control); p.Prefixes || p.Action != Assign || p.Count != q.Count {
		t.Errorf("no-/28 fallback: %v of %d (prefixes %v, %s); want single addresses, %d as with peaks wanting 80", p.Action, p.Count, p.Prefixes, p.Reason, q.Count)
	}
}

// TestNoPrefixRefusalHalvesAMultiPrefixRequest: EC2 refuses a request for
// more aligned /28s than the subnet has free (InsufficientCidrBlocks), all
// or nothing. A refused request for 2 /28s makes the pool ask for 1, still
// a /28; only a refused single /28 (or one of unknown size) sends it to
// single addresses.
func TestNoPrefixRefusalHalvesAMultiPrefixRequest(t *testing.T) {
	in := rolloutPrefixNode(112, 112)
	if p := Next(in); p.Action != Assign || !p.Prefixes || p.Count != 2 {
		t.Fatalf("setup: %v of %d (prefixes %v, %s); want 2 /28s", p.Action, p.Count, p.Prefixes, p.Reason)
	}
	for _, c := range []struct {
		refused  int
		prefixes bool
		count    int
	}{{2, true, 1}, {8, true, 2}, {1, false, 0}, {0, false, 0}} {
		in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Minute), Count: c.refused}}
		p := Next(in)
		if p.Action != Assign || p.Prefixes != c.prefixes || (c.prefixes && p.Count != c.count) {
			t.Errorf("after %d /28s refused: %v of %d (prefixes %v, %s); want prefixes %v, %d", c.refused, p.Action, p.Count, p.Prefixes, p.Reason, c.prefixes, c.count)
		}
	}
}

// leftoverNode is a c5.18xlarge-like node 3 minutes after a job's pods
// left: 49 long-lived pods on the primary ENI, eni-01 holding free free
// addresses (what a growth sized by the peaks left on it), eni-02 and
// eni-03 attached empty (room for the next job), jobs of 100 pods 24 and 4
// minutes ago whose peaks wanted want addresses held each.
func leftoverNode(bindings bool, free, want int) Input {
	return afterJobs(bindings, []time.Duration{24 * time.Minute, 4 * time.Minute}, 149, want, 2*time.Minute,
		slotsOf(0x0a400000, 49, 49, 0), slotsOf(0x0a400100, free, 0, 0), nil, nil)
}

// TestBetweenJobsReleasesBelowTheBand: between the peaks of a job that
// wanted more than the node holds, a surplus of fewer addresses than half
// an ENI (here 15 free, keep 6: 9 beyond it, the band 25) goes in one
// call: the next peak takes its growth call whatever is kept. Without the
// pod watch, or where the peaks wanted no more than the node holds, the
// band stands and the surplus stays.
func TestBetweenJobsReleasesBelowTheBand(t *testing.T) {
	for _, c := range []struct {
		name     string
		bindings bool
		want     int
		release  int
	}{
		{"pods seen at binding, peaks wanted 160", true, 160, 15 - BoundAhead},
		{"no pod watch", false, 160, 0},
		{"peaks wanted 60, the node holds 64", true, 60, 0},
	} {
		in := leftoverNode(c.bindings, 15, c.want)
		p := Next(in)
		got := 0
		if p.Action == Release {
			got = len(p.Release)
		}
		if got != c.release {
			t.Errorf("%s: %v of %d (%s); want a release of %d", c.name, p.Action, got, p.Reason, c.release)
		}
	}
	// Pods leaving (3 addresses of eni-00 cooling, no arrival within a
	// minute) hold a release back only when as many cool as the usual
	// band (25): a few do not defer it on a slowly falling load.
	in := leftoverNode(true, 15, 160)
	in.ENIs[0].Slots = slotsOf(0x0a400000, 49, 46, 3)
	if p := Next(in); p.Action != Release || p.ENI != "eni-01" {
		t.Errorf("3 cooling on eni-00: %v from %s (%s); want a release from eni-01", p.Action, p.ENI, p.Reason)
	}
}

// leftoverBehind is leftoverNode with 60 long-lived pods (the primary ENI
// full, 11 on eni-01, which has room for 38 more), the 15 free addresses on
// eni-02 and eni-03 attached empty; jobs 15 and 5 minutes ago whose peaks
// wanted want addresses held each. The pool grew with the last job.
func leftoverBehind(want int) Input {
	return afterJobs(true, []time.Duration{15 * time.Minute, 5 * time.Minute}, 100, want, 2*time.Minute,
		slotsOf(0x0a400000, 49, 49, 0), slotsOf(0x0a400100, 11, 11, 0), slotsOf(0x0a400200, 15, 0, 0), nil)
}

// TestBelowTheBandPaysForThePeaksExtraCall: a release below half an ENI
// that makes the next peak take one assign call more (the peaks wanted
// 110: eni-01's room covers them, but not once eni-02's 9 surplus
// addresses went) must save two calls' worth (2 × ReleaseWorth); here 9
// addresses for the 6 minutes until the next job is due save less, and
// stay. Where the peak fills eni-02 anyway (160 wanted), one call's worth
// does, and they go.
func TestBelowTheBandPaysForThePeaksExtraCall(t *testing.T) {
	in := leftoverBehind(110)
	s := newState(in)
	if before, after := s.peakCallsAfter("eni-02", 0), s.peakCallsAfter("eni-02", 9); before != 1 || after != 2 {
		t.Errorf("peak assign calls %d before the release, %d after; want 1, 2", before, after)
	}
	if p := Next(in); p.Action == Release {
		t.Errorf("110 wanted: released %d from %s (%s); want the surplus kept", len(p.Release), p.ENI, p.Reason)
	}
	p := Next(leftoverBehind(160))
	if p.Action != Release || p.ENI != "eni-02" || len(p.Release) != 15-BoundAhead {
		t.Errorf("160 wanted: %v of %d from %s (%s); want a release of %d from eni-02", p.Action, len(p.Release), p.ENI, p.Reason, 15-BoundAhead)
	}
}

// cappedJobsNode is a c5.18xlarge-like node (MaxPods 250) after jobs of
// 165 pods that filled it to its cap every 8 minutes (the pool wanted 263
// held at each, more than max pods allow): 82 long-lived pods on eni-00
// and eni-01 (16 free there), eni-02 to eni-04 attached empty, eni-05
// holding the 5 addresses the cap left it.
func cappedJobsNode() Input {
	in := afterJobs(true, []time.Duration{20 * time.Minute, 12 * time.Minute, 4 * time.Minute}, 247, 263, 40*time.Second,
		slotsOf(0x0a400000, 49, 49, 0), slotsOf(0x0a400100, 49, 33, 0), nil, nil, nil, slotsOf(0x0a400500, 5, 0, 0))
	in.Limits.MaxPods = 250
	return in
}

// peakGrowthCalls plays the next job's burst on in (165 pods bound, 4
// minutes on) and counts the growth calls until the pool stops growing.
func peakGrowthCalls(t *testing.T, in Input) int {
	t.Helper()
	s := (&sim{in: in, next32: 0x0a500000, nextENI: len(in.ENIs), cooldown: 30 * time.Second}).clone()
	s.in.Now = t0.Add(4 * time.Minute)
	s.in.Demand.History = arrivals(s.in.Demand.History, s.in.Now.Add(-2*time.Second), s.in.Now, 20*time.Millisecond, 82)
	s.in.Demand.Unaddressed = 165
	calls := 0
	for range 20 {
		p := Next(s.in)
		if p.Action != Assign && p.Action != CreateENI {
			break
		}
		if err := s.apply(p); err != nil {
			t.Fatal(err)
		}
		calls++
	}
	return calls
}

// TestBetweenJobsAtMaxPods: on a node whose jobs fill it to max pods, the
// next peak's growth stops at the cap, so eni-05's 5 addresses are the
// last it assigns: releasing them makes that peak take a fourth assign
// call (played here), peakCallsAfter counts it (the peaks' want capped at
// max pods), and they stay, as two calls' worth is not saved.
func TestBetweenJobsAtMaxPods(t *testing.T) {
	in := cappedJobsNode()
	released := in
	released.ENIs = append([]ENI(nil), in.ENIs...)
	released.ENIs[5].Slots = nil
	keep, drop := peakGrowthCalls(t, in), peakGrowthCalls(t, released)
	s := newState(in)
	if model0, model5 := s.peakCallsAfter("eni-05", 0), s.peakCallsAfter("eni-05", 5); model0 != keep || model5 != drop {
		t.Errorf("peakCallsAfter %d kept, %d released; the peak played takes %d and %d", model0, model5, keep, drop)
	}
	if keep >= drop {
		t.Fatalf("the peak takes %d calls with eni-05's addresses kept, %d released; want more released", keep, drop)
	}
	if p := Next(in); p.Action == Release {
		t.Errorf("released %d from %s (%s); want eni-05's addresses kept", len(p.Release), p.ENI, p.Reason)
	}
}
