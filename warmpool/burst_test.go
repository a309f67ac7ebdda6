package warmpool

import (
	"testing"
	"time"
)

// c5Large are a c5.18xlarge's limits in secondary-IP mode: 15 ENIs of 49
// secondary addresses.
var c5Large = Limits{MaxENIs: 15, SlotsPerENI: 49}

// jobsNode is a c5.18xlarge-like node between the bursts of a recurring
// job: 49 long-lived pods on the primary ENI, eni-01 holding 49 free
// addresses, eni-02 and eni-03 attached empty (room for the next job). Jobs of 100 pods came 35 and 20
// minutes ago (the pool wanted 160 addresses held at each); lastArrival is
// how long ago the last pod came.
func jobsNode(bindings bool, lastArrival time.Duration) Input {
	var h History
	for _, ago := range []time.Duration{35 * time.Minute, 20 * time.Minute} {
		at := t0.Add(-ago)
		h = arrivals(h, at, at.Add(2*time.Second), 20*time.Millisecond, 149).Want(at.Add(2*time.Second), 160)
	}
	if lastArrival < 20*time.Minute {
		at := t0.Add(-lastArrival)
		h = h.Record(at).Observe(at, 49)
	}
	return Input{Now: t0, Limits: c5Large, Config: Config{Adaptive: true},
		LastGrow: t0.Add(-20 * time.Minute), LastRelease: t0.Add(-10 * time.Minute),
		Demand: Demand{History: h, Bindings: bindings},
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 49, 49, 0)},
			{ID: "eni-01", Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400100, 49, 0, 0)},
			{ID: "eni-02", Attached: t0.Add(-time.Hour)},
			{ID: "eni-03", Attached: t0.Add(-time.Hour)},
		}}
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
	if !awaitingPeak(jobsNode(true, time.Hour)) {
		t.Errorf("awaitingPeak false between the jobs' peaks")
	}
	in := jobsNode(true, time.Hour)
	in.ENIs[1].Slots = slotsOf(0x0a400100, 49, 0, 0)
	in.ENIs[2].Slots = slotsOf(0x0a400200, 49, 0, 0)
	in.ENIs[3].Slots = slotsOf(0x0a400300, 20, 0, 0)
	if awaitingPeak(in) {
		t.Errorf("awaitingPeak true with 167 addresses held, more than the 160 the peaks wanted")
	}
}

// burstNode is a c5.18xlarge-like node whose pods are seen at their
// binding (bindings), with jobs of 40 pods 35 and 20 minutes ago, at the
// start of the next one: n of its pods bound within the last second, none
// with an address yet. The primary ENI is full; eni-01 holds 10 free
// addresses and room for 29 more, eni-02 (when room) is attached empty.
func burstNode(bindings, room bool, n int) Input {
	var h History
	for _, ago := range []time.Duration{35 * time.Minute, 20 * time.Minute} {
		at := t0.Add(-ago)
		h = arrivals(h, at, at.Add(2*time.Second), 50*time.Millisecond, 89).Want(at.Add(2*time.Second), 96)
	}
	for i := range n {
		at := t0.Add(-time.Second + time.Duration(i)*100*time.Millisecond)
		h = h.Record(at).Observe(at, 49)
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
// Without the pod watch, or without room for the rest, the first pods
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
