package warmpool

import (
	"net/netip"
	"testing"
	"time"
)

// slotsOf returns n /32 slots from base, the first assigned of them
// assigned and the next cooling of them cooling.
func slotsOf(base uint32, n, assigned, cooling int) []Slot {
	out := make([]Slot, n)
	for i := range out {
		out[i].Prefix = netip.PrefixFrom(addr4(base+uint32(i)), 32)
		switch {
		case i < assigned:
			out[i].Assigned = 1
		case i < assigned+cooling:
			out[i].Cooling = 1
			out[i].CoolingUntil = t0.Add(20 * time.Second)
		}
	}
	return out
}

// arrivals records one arrival every step from from until to, each
// observed with inUse addresses in use.
func arrivals(h History, from, to time.Time, step time.Duration, inUse int) History {
	for at := from; !at.After(to); at = at.Add(step) {
		h = h.Record(at).Observe(at, inUse)
	}
	return h
}

// xlarge are an m5.xlarge's limits in secondary-IP mode: 4 ENIs of 14
// secondary addresses.
var xlarge = Limits{MaxENIs: 4, SlotsPerENI: 14}

// twoENIsFilling is an m5.xlarge in secondary-IP mode whose first pod came
// first before t0 and 16 more in the last 4 minutes (the last 15 s ago):
// 23 pods on two ENIs of 14 addresses, 5 free, none attached empty.
func twoENIsFilling(first time.Duration) Input {
	h := arrivals(History{}, t0.Add(-first), t0.Add(-first), time.Second, 1)
	h = arrivals(h, t0.Add(-4*time.Minute), t0.Add(-15*time.Second), 15*time.Second, 23)
	return Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, Demand: Demand{History: h, Bindings: true},
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 14, 13, 0)},
			{ID: "eni-01", Attached: t0.Add(-3 * time.Minute), Slots: slotsOf(0x0a400100, 14, 10, 0)},
		}}
}

// TestFillingNodeAttachesTheNextENIWithItsAddresses: a node whose pods
// came within FillSpan, and whose fill already took the room of a second
// ENI, attaches the ENI it keeps for room with all its addresses (create,
// attach, attribute: three calls), not empty with an assign to follow
// (four). Past FillSpan the room ENI comes empty as before.
func TestFillingNodeAttachesTheNextENIWithItsAddresses(t *testing.T) {
	for _, c := range []struct {
		name  string
		first time.Duration // first arrival before t0
		want  int
	}{
		{"filling", 5 * time.Minute, xlarge.SlotsPerENI},
		{"past the fill", 40 * time.Minute, 0},
	} {
		p := Next(twoENIsFilling(c.first))
		if p.Action != CreateENI || p.Count != c.want {
			t.Errorf("%s: %v %d (%s); want CreateENI with %d", c.name, p.Action, p.Count, p.Reason, c.want)
		}
	}
}

// TestFillingNodeReleasesNothingWhilePodsCome: a node within FillSpan of
// its first pod with pods still arriving keeps its surplus (its next pods
// take it; a release now is an assign later); the same pool past FillSpan
// releases it.
func TestFillingNodeReleasesNothingWhilePodsCome(t *testing.T) {
	for _, c := range []struct {
		name    string
		first   time.Duration
		release bool
	}{
		{"filling", 6 * time.Minute, false},
		{"past the fill", 25 * time.Minute, true},
	} {
		h := arrivals(History{}, t0.Add(-c.first), t0.Add(-c.first), time.Second, 1)
		h = arrivals(h, t0.Add(-5*time.Minute), t0.Add(-10*time.Second), 30*time.Second, 2)
		in := Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, Demand: Demand{History: h, Bindings: true},
			LastGrow: t0.Add(-5 * time.Minute),
			ENIs: []ENI{
				{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 14, 2, 0)},
				{ID: "eni-01", Attached: t0.Add(-5 * time.Minute), Slots: slotsOf(0x0a400100, 14, 0, 0)},
			}}
		p := Next(in)
		if got := p.Action == Release; got != c.release {
			t.Errorf("%s: %v (%s); want a release: %v", c.name, p.Action, p.Reason, c.release)
		}
	}
}

// TestLeavingPodsENIGoesInOneCall: while pods leave (addresses cooling,
// no arrival within DepartureQuiet), a release waits for the pods still
// on the ENI it would take addresses from, and then takes all of that
// ENI's addresses in one call, not its free ones now and the rest in a
// second call.
func TestLeavingPodsENIGoesInOneCall(t *testing.T) {
	h := arrivals(History{}, t0.Add(-2*time.Hour), t0.Add(-100*time.Minute), 30*time.Second, 20)
	in := Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, Demand: Demand{History: h, Bindings: true},
		LastGrow: t0.Add(-2 * time.Hour),
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-3 * time.Hour), Slots: slotsOf(0x0a400000, 14, 10, 1)},
			{ID: "eni-01", Attached: t0.Add(-2 * time.Hour), Slots: slotsOf(0x0a400100, 7, 2, 0)},
		}}
	if p := Next(in); p.Action == Release {
		t.Fatalf("pods leaving eni-01: %s; want no release before they are gone", p.Reason)
	}
	// The two pods left and their addresses cooled down, as did the
	// primary's: the ENI's seven go in one call.
	in.Now = t0.Add(time.Minute)
	in.ENIs[0].Slots = slotsOf(0x0a400000, 14, 10, 0)
	in.ENIs[1].Slots = slotsOf(0x0a400100, 7, 0, 0)
	p := Next(in)
	if p.Action != Release || p.ENI != "eni-01" || len(p.Release) != 7 {
		t.Fatalf("%v on %s of %d (%s); want the release of eni-01's 7 addresses", p.Action, p.ENI, len(p.Release), p.Reason)
	}
}

// prefixSlots returns n /28 slots from base (10.128.x.0 steps of 16), the
// first full of them with all 16 addresses assigned.
func prefixSlots(base uint32, n, full int) []Slot {
	out := make([]Slot, n)
	for i := range out {
		out[i].Prefix = netip.PrefixFrom(addr4(base+uint32(i*PrefixAddresses)), 28)
		if i < full {
			out[i].Assigned = PrefixAddresses
		}
	}
	return out
}

// TestFillingNodeGrowsPrefixesByItsRate: in prefix mode a node within
// FillSpan of its first pod, with pods arriving at 0.5 a second, asks for
// a minute of arrivals in one call (several /28s), not one /28 per call;
// past FillSpan a growth asks for what is short, one /28.
func TestFillingNodeGrowsPrefixesByItsRate(t *testing.T) {
	for _, c := range []struct {
		name    string
		first   time.Duration
		atLeast int // prefixes in the call
		atMost  int
	}{
		{"filling", 3 * time.Minute, 2, 14},
		{"past the fill", 40 * time.Minute, 1, 1},
	} {
		h := arrivals(History{}, t0.Add(-c.first), t0.Add(-c.first), time.Second, 1)
		h = arrivals(h, t0.Add(-2*time.Minute), t0.Add(-time.Second), 2*time.Second, 48)
		in := Input{Now: t0, Limits: Limits{MaxENIs: 4, SlotsPerENI: 14, PrefixSupported: true}, Config: Config{Adaptive: true, PrefixDelegation: true},
			Pending: 1, Demand: Demand{History: h, Bindings: true, Unaddressed: 1},
			ENIs: []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: prefixSlots(0x0a800000, 3, 3)}}}
		p := Next(in)
		if p.Action != Assign || !p.Prefixes || p.Count < c.atLeast || p.Count > c.atMost {
			t.Errorf("%s: %v of %d (prefixes %v; %s); want an assign of %d to %d /28s", c.name, p.Action, p.Count, p.Prefixes, p.Reason, c.atLeast, c.atMost)
		}
	}
}

// TestFillingRoomENIKeepsTheSubnetCap: a filling node (first pod 5 min
// ago, 2 ENIs holding addresses) whose CreateENI of 14 addresses EC2
// refused as InsufficientFreeAddressesInSubnet (Refusal Count 14, in
// force) asks for its room ENI with at most half as many, as growth does
// (found by review: the room ENI with all its slots was refused over and
// over within one pool cycle).
func TestFillingRoomENIKeepsTheSubnetCap(t *testing.T) {
	in := twoENIsFilling(5 * time.Minute)
	before := Next(in)
	if before.Action != CreateENI || before.Count != xlarge.SlotsPerENI {
		t.Fatalf("setup: %v %d (%s); want CreateENI with 14", before.Action, before.Count, before.Reason)
	}
	in.Refusals = []Refusal{{Kind: RefusedSubnetFull, Until: t0.Add(5 * time.Second), Count: before.Count}}
	p := Next(in)
	if (p.Action == CreateENI || p.Action == Assign) && p.Count > before.Count/2 {
		t.Errorf("with the subnet's refusal of %d slots in force: %v of %d (%s); want at most %d", before.Count, p.Action, p.Count, p.Reason, before.Count/2)
	}
}

// TestNewNodeKeepsItsFirstENIForItsFirstPods: a node whose first ENI got
// all its addresses (one call) and that has seen no pod yet releases none
// of them within FillSpan of that growth: its first pods are on their way,
// and a release now is an assign for each of their first waves later. Once
// FillSpan passes without a pod, the surplus goes.
func TestNewNodeKeepsItsFirstENIForItsFirstPods(t *testing.T) {
	for _, c := range []struct {
		name    string
		grewAgo time.Duration
		release bool
	}{
		{"4 minutes after the first growth", 4 * time.Minute, false},
		{"past FillSpan", FillSpan + time.Minute, true},
	} {
		in := Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, LastGrow: t0.Add(-c.grewAgo),
			Demand: Demand{History: History{}, Bindings: true},
			ENIs:   []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 14, 0, 0)}}}
		p := Next(in)
		if got := p.Action == Release; got != c.release {
			t.Errorf("%s: %v %v (%s); want release %v", c.name, p.Action, p.Release, p.Reason, c.release)
		}
	}
}

// TestRestartedDaemonReleasesItsSurplus: a daemon restarted 5 minutes ago
// (History empty, LastGrow its start) on a node with 20 pods and 22 free
// addresses releases as before: only a node without pods keeps its first
// ENI's addresses for the pods to come.
func TestRestartedDaemonReleasesItsSurplus(t *testing.T) {
	in := Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, LastGrow: t0.Add(-5 * time.Minute),
		Demand: Demand{History: History{}, Bindings: true},
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-3 * time.Hour), Slots: slotsOf(0x0a400000, 14, 14, 0)},
			{ID: "eni-01", Attached: t0.Add(-3 * time.Hour), Slots: slotsOf(0x0a400100, 14, 6, 0)},
			{ID: "eni-02", Attached: t0.Add(-3 * time.Hour), Slots: slotsOf(0x0a400200, 14, 0, 0)},
		}}
	if p := Next(in); p.Action != Release {
		t.Errorf("restarted 5 min ago, 20 pods, 22 free: %v (%s); want a release", p.Action, p.Reason)
	}
}
