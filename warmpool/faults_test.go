package warmpool

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestCoolingAddressesAreNotAvailable_ref2896: the reference counted
// addresses in cooldown as free, so with a minimum target met the pool did
// not grow and ADDs failed until the cooldown ended
// (amazon-vpc-cni-k8s #2896, #1700).
func TestCoolingAddressesAreNotAvailable_ref2896(t *testing.T) {
	in := Input{
		ENIs:   []ENI{eni("eni-0", old, slots32("10.0.0.1", 8, 2, 6)...)},
		Limits: small, Config: Config{WarmIPTarget: 2, MinimumIPTarget: 8}, Now: t0,
	}
	got := Summarize(in)
	if got.Available != 0 || got.Cooling != 6 || got.Total != 8 {
		t.Errorf("Summarize: available %d, cooling %d, total %d; want 0, 6, 8", got.Available, got.Cooling, got.Total)
	}
	p := Next(in)
	if p.Action != Assign || p.ENI != "eni-0" || p.Count != 1 {
		// short = max(2 − 0, 8 − 8) = 2, and the primary has room for 1.
		t.Errorf("Next = %v %s %d (%s); want assign 1 on eni-0 (room 1 of 2 short)", p.Action, p.ENI, p.Count, p.Reason)
	}
}

// TestCooldownChurnNeverStarvesADD_ref2896 replays the field-failure
// scenario B10: WARM_IP_TARGET 2, MINIMUM_IP_TARGET 8, 30 s cooldown; 6 pods,
// 4 deleted, 4 new ones within 2 s. Every ADD finds an address while the
// instance has room, and no release touches a cooling address.
func TestCooldownChurnNeverStarvesADD_ref2896(t *testing.T) {
	s := growTo(t, small, Config{WarmIPTarget: 2, MinimumIPTarget: 8}, 6)
	s.holdCooling = true
	start := s.in.Now
	for range 4 {
		s.delPod()
	}
	if _, err := s.settle(50); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if !s.addPod() {
			t.Fatalf("new pod %d found no free address at %v: %+v", i+1, s.in.Now.Sub(t0), Summarize(s.in))
		}
		if _, err := s.settle(50); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.in.Now.Sub(start); d >= s.cooldown {
		t.Fatalf("scenario took %v, not within the %v cooldown", d, s.cooldown)
	}
	c := Summarize(s.in)
	if c.Assigned != 6 || c.Available < 2 {
		t.Errorf("after churn: assigned %d, available %d; want 6 and at least 2", c.Assigned, c.Available)
	}
}

// TestCoolingCountsTowardMinimum_ref1700: cooling addresses are held by the
// ENI, so they count toward MINIMUM_IP_TARGET: no growth past the floor
// because of them.
func TestCoolingCountsTowardMinimum_ref1700(t *testing.T) {
	in := Input{ENIs: []ENI{eni("eni-0", old, slots32("10.0.0.1", 8, 0, 8)...)}, Limits: small, Config: Config{MinimumIPTarget: 8}, Now: t0}
	if p := Next(in); p.Action != Nothing {
		t.Errorf("Next = %v (%s); want nothing: 8 held meet MINIMUM_IP_TARGET 8", p.Action, p.Reason)
	}
}

// TestPendingPodsCoveredInOneStep: the reference grows by one warm batch per
// round trip while pods wait; the waiting pods are a shortfall of their own,
// covered in one call.
func TestPendingPodsCoveredInOneStep(t *testing.T) {
	s := newSim(small, Config{WarmIPTarget: 2})
	s.in.Pending = 5
	applied, err := s.settle(10)
	if err != nil {
		t.Fatal(err)
	}
	want := []Plan{{Action: Assign, ENI: "eni-00", Count: 7}}
	if diff := cmp.Diff(want, applied, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Reason" }, cmp.Ignore())); diff != "" {
		t.Errorf("plans (-want +got):\n%s", diff)
	}
	if c := Summarize(s.in); s.in.Pending != 0 || c.Assigned != 5 || c.Available != 2 {
		t.Errorf("pending %d, assigned %d, available %d; want 0, 5, 2", s.in.Pending, c.Assigned, c.Available)
	}
}

// TestRefusedNoPrefixFallsBackToAddresses_ref2749: in prefix mode a subnet
// with free addresses but no aligned /28 left pods without addresses
// (amazon-vpc-cni-k8s #2749, #1634). With the refusal fed back, pods get
// single addresses within one cycle, and the prefix call is not repeated
// until the refusal ends.
func TestRefusedNoPrefixFallsBackToAddresses_ref2749(t *testing.T) {
	s := newSim(small, Config{PrefixDelegation: true, WarmPrefixTarget: 1})
	until := t0.Add(10 * time.Minute)
	s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: until}}
	s.in.Pending = 3
	for steps := 0; s.in.Now.Before(until); steps++ {
		if steps == 20 {
			t.Fatalf("no rest within 20 steps while refused")
		}
		before := Summarize(s.in)
		p, done, err := s.step()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			t.Fatalf("at rest while refused, not waiting for the refusal's end: %+v", before)
		}
		if p == nil {
			if s.in.Now.Before(until) {
				continue
			}
			// The clock jumped to the refusal's end: check the state
			// reached while it was in force.
			if s.in.Pending != 0 || before.Prefixes != 0 || before.Assigned != 3 {
				t.Errorf("pending %d, prefixes %d, assigned %d; want 0, 0, 3", s.in.Pending, before.Prefixes, before.Assigned)
			}
			break
		}
		if p.Prefixes {
			t.Fatalf("prefix call while the subnet refused /28s: %s", p.Reason)
		}
	}
	// The refusal over, the node returns to a whole free /28 and gives the
	// fallback addresses back, pods aside.
	s.in.Refusals = nil
	if _, err := s.settle(50); err != nil {
		t.Fatal(err)
	}
	c := Summarize(s.in)
	if c.FreePrefixes != 1 || c.Total-c.Prefixes*PrefixAddresses != 3 {
		t.Errorf("after the refusal: %+v; want 1 free prefix and only the 3 assigned /32s", c)
	}
}

// TestSurplusReleasedAfterBurst_ref329: the reference never gave back
// addresses after a burst (amazon-vpc-cni-k8s #329, #933). Field-failure B09:
// itype-small, WARM_IP_TARGET 2, MINIMUM_IP_TARGET 3; 25 pods, 24 deleted;
// the pool trims to max(2, 3 − 1) free and drops the empty ENIs.
func TestSurplusReleasedAfterBurst_ref329(t *testing.T) {
	s := growTo(t, small, Config{WarmIPTarget: 2, MinimumIPTarget: 3}, 25)
	for range 24 {
		s.delPod()
	}
	applied, err := s.settle(100)
	if err != nil {
		t.Fatal(err)
	}
	c := Summarize(s.in)
	if c.Assigned != 1 || c.Available != 2 || c.Total != 3 || c.ENIs != 1 {
		t.Errorf("after the burst: %+v; want 1 assigned, 2 available, 3 total on 1 ENI", c)
	}
	if len(applied) > 6 {
		t.Errorf("%d calls to trim; want a bounded few: %v", len(applied), tail(applied, len(applied)))
	}
	if s.in.Now.Sub(t0) > 10*time.Minute {
		t.Errorf("trimming took %v of simulated time", s.in.Now.Sub(t0))
	}
}

// TestSameInputSamePlan: the order of ENIs and slots in the input does not
// change the plan, reason included.
func TestSameInputSamePlan(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 2000 {
		in := randomInput(r)
		want := Next(in)
		shuffled := in
		shuffled.ENIs = make([]ENI, len(in.ENIs))
		for j, e := range in.ENIs {
			e.Slots = append([]Slot(nil), e.Slots...)
			r.Shuffle(len(e.Slots), func(a, b int) { e.Slots[a], e.Slots[b] = e.Slots[b], e.Slots[a] })
			shuffled.ENIs[j] = e
		}
		r.Shuffle(len(shuffled.ENIs), func(a, b int) { shuffled.ENIs[a], shuffled.ENIs[b] = shuffled.ENIs[b], shuffled.ENIs[a] })
		if diff := cmp.Diff(want, Next(shuffled), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
			t.Fatalf("case %d: shuffled input, different plan (-want +got):\n%s", i, diff)
		}
	}
}

// TestRefusalsWaitInsteadOfRepeatingCalls: the reference repeats a failing
// call every pool cycle. With the subnet's refusal fed back, no growth call
// is planned until the refusal ends; then the waiting pods are served.
func TestRefusalsWaitInsteadOfRepeatingCalls(t *testing.T) {
	s := newSim(small, Config{WarmIPTarget: 2})
	until := t0.Add(2 * time.Minute)
	s.in.Refusals = []Refusal{{Kind: RefusedSubnetFull, Until: until}}
	s.in.Pending = 3
	p := Next(s.in)
	if p.Action != Wait || !p.Until.Equal(until) {
		t.Fatalf("Next = %v until %v (%s); want wait until %v", p.Action, p.Until, p.Reason, until)
	}
	for now := t0; now.Before(until); now = now.Add(10 * time.Second) {
		s.in.Now = now
		if p := Next(s.in); p.Action != Wait {
			t.Fatalf("at %v: %v (%s) while the subnet is refused", now.Sub(t0), p.Action, p.Reason)
		}
	}
	s.in.Now = until
	applied, err := s.settle(10)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 1 || applied[0].Action != Assign || applied[0].Count != 5 || s.in.Pending != 0 {
		t.Errorf("after the refusal: %v, pending %d; want one assign of 5 and no pod waiting", tail(applied, 5), s.in.Pending)
	}
}

// TestIdleSecondaryENIDrainsBeforePrimary: after a burst, the primary ENI's
// addresses left cooldown first. Releasing surplus from the primary then
// would leave the secondary ENI holding the addresses MINIMUM_IP_TARGET
// needs once its own cooldown ends, so it could never be deleted. The plan
// waits for the secondary ENI instead, then deletes it (its addresses go
// with it) since the primary alone meets the targets.
func TestIdleSecondaryENIDrainsBeforePrimary(t *testing.T) {
	cfg := Config{WarmIPTarget: 2, MinimumIPTarget: 4}
	in := Input{
		ENIs: []ENI{
			eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 0, 9)...),
		},
		Limits: small, Config: cfg, Now: t0,
	}
	if p := Next(in); p.Action == Release {
		t.Fatalf("Next = release %v from %s while eni-1 is cooling; want no release from the primary (%s)", p.Release, p.ENI, p.Reason)
	}
	in.ENIs[1] = eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...)
	if p := Next(in); p.Action != DeleteENI || p.ENI != "eni-1" {
		t.Errorf("Next = %v %s (%s); want delete eni-1", p.Action, p.ENI, p.Reason)
	}
}

// TestSubnetRefusalHalvesTheRequest_B41: a subnet with 12 free addresses
// refuses a request for 14; the plan does not wait for the refusal to pass
// (leaving 12 addresses unused and pods without one) but asks for 7, then 3,
// then 1, and waits only once a single address was refused.
func TestSubnetRefusalHalvesTheRequest_B41(t *testing.T) {
	in := Input{
		ENIs:   []ENI{eni("eni-0", old, slots32("10.0.0.1", 9, 9, 0)...)},
		Limits: small, Config: Config{WarmIPTarget: 14}, Now: t0,
	}
	p := Next(in)
	if p.Action != CreateENI || p.Count != 9 {
		t.Fatalf("Next = %v %d (%s); want create ENI with 9 (a whole ENI's room)", p.Action, p.Count, p.Reason)
	}
	for _, tc := range []struct{ refused, want int }{{9, 4}, {4, 2}, {2, 1}} {
		in.Refusals = []Refusal{{Kind: RefusedSubnetFull, Until: t0.Add(time.Minute), Count: tc.refused}}
		p := Next(in)
		if p.Action != CreateENI || p.Count != tc.want {
			t.Errorf("after %d refused: Next = %v %d (%s); want create ENI with %d", tc.refused, p.Action, p.Count, p.Reason, tc.want)
		}
	}
	in.Refusals = []Refusal{{Kind: RefusedSubnetFull, Until: t0.Add(time.Minute), Count: 1}}
	if p := Next(in); p.Action != Wait {
		t.Errorf("after a single address was refused: Next = %v %d (%s); want Wait", p.Action, p.Count, p.Reason)
	}
	in.Refusals = []Refusal{{Kind: RefusedSubnetFull, Until: t0.Add(time.Minute)}}
	if p := Next(in); p.Action != Wait {
		t.Errorf("refusal of unknown size: Next = %v (%s); want Wait", p.Action, p.Reason)
	}
}

// TestPrefixesLeftFromPrefixModeAreReleased: with prefix delegation turned
// off, free /28s still held (on the primary ENI, never deleted) are released
// down to what WARM_ENI_TARGET needs, instead of being held for good.
func TestPrefixesLeftFromPrefixModeAreReleased(t *testing.T) {
	in := Input{
		ENIs: []ENI{eni("eni-0", old,
			p28("10.0.0.16/28", 0, 0), p28("10.0.0.32/28", 0, 0), p28("10.0.0.48/28", 0, 0))},
		Limits: small, Config: Config{WarmENITarget: 1}, Now: t0,
	}
	p := Next(in)
	if p.Action != Release || p.ENI != "eni-0" || len(p.Release) != 2 {
		t.Fatalf("Next = %v %s %v (%s); want 2 of the 3 free /28s released (16 free addresses still cover one ENI's 9)", p.Action, p.ENI, p.Release, p.Reason)
	}
	in.ENIs[0].Slots = []Slot{p28("10.0.0.16/28", 0, 0)}
	in.LastRelease = t0
	in.Now = t0.Add(time.Hour)
	if p := Next(in); p.Action != Nothing {
		t.Errorf("with one free /28 left: Next = %v %v (%s); want Nothing", p.Action, p.Release, p.Reason)
	}
	in.ENIs[0].Slots = []Slot{p28("10.0.0.16/28", 1, 0), p28("10.0.0.32/28", 0, 0)}
	in.ENIs[0].Slots[0].Assigned = 1
	if p := Next(in); p.Action == Release && slices.Contains(p.Release, netip.MustParsePrefix("10.0.0.16/28")) {
		t.Errorf("a /28 holding a pod was released: %v", p.Release)
	}
}

// TestFallbackENIDeletedWhenUnneeded_ref2749: in prefix mode with no aligned
// /28 free, the pool holds single addresses. An ENI of single addresses only,
// unneeded for the 16 addresses WARM_PREFIX_TARGET 1 stands for, is deleted:
// the prefix target alone (whole free /28s, of which there are none) would
// keep it for good.
func TestFallbackENIDeletedWhenUnneeded_ref2749(t *testing.T) {
	in := Input{
		ENIs: []ENI{
			eni("eni-0", old, slots32("10.0.0.1", 9, 0, 0)...),
			eni("eni-1", old, slots32("10.0.1.1", 9, 0, 0)...),
			eni("eni-2", old, slots32("10.0.2.1", 1, 0, 0)...),
		},
		Limits: small, Config: Config{PrefixDelegation: true, WarmPrefixTarget: 1}, Now: t0,
		Refusals: []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Minute)}},
	}
	p := Next(in)
	if p.Action != DeleteENI || p.ENI != "eni-2" {
		t.Fatalf("Next = %v %s (%s); want eni-2 deleted (18 free addresses cover 16 without it)", p.Action, p.ENI, p.Reason)
	}
	in.ENIs = in.ENIs[:2]
	in.LastRelease = t0
	in.Now = t0.Add(time.Hour)
	in.Refusals[0].Until = in.Now.Add(time.Minute)
	if p := Next(in); p.Action == DeleteENI {
		t.Errorf("Next = delete %s (%s); eni-1 is needed: 9 addresses without it are below 16", p.ENI, p.Reason)
	}
}

// TestFallbackKeepsASlotForAPrefix_ref2749: in prefix mode with no aligned
// /28 free, pods wanting more than the node's slots hold single addresses;
// unbounded, the fallback took every slot of every ENI, so once the subnet
// had a /28 again the node sat at its ENI limit and could not take it (16
// addresses in one slot) while pods waited. The fallback keeps the node's
// last open slot; when the refusal ends, the /28 goes there and the
// waiting pods start.
func TestFallbackKeepsASlotForAPrefix_ref2749(t *testing.T) {
	lim := Limits{MaxENIs: 2, SlotsPerENI: 4, PrefixSupported: true}
	s := newSim(lim, Config{PrefixDelegation: true, WarmPrefixTarget: 1})
	until := t0.Add(10 * time.Minute)
	s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: until}}
	s.in.Pending = 12 // more pods than the node's 8 slots hold as /32s
	for steps := 0; s.in.Now.Before(until); steps++ {
		if steps == 40 {
			t.Fatalf("no rest within 40 steps while refused: %+v", Summarize(s.in))
		}
		p, done, err := s.step()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if p != nil && p.Prefixes {
			t.Fatalf("prefix call while the subnet refused /28s: %s", p.Reason)
		}
		if open := s.openSlots(); open < 1 {
			t.Fatalf("the fallback filled every slot (%d ENIs of %d slots, %d pods waiting): no room for a /28 when the subnet has one",
				len(s.in.ENIs), lim.SlotsPerENI, s.in.Pending)
		}
	}
	if c := Summarize(s.in); c.Assigned != 7 || s.in.Pending != 5 {
		t.Errorf("while refused: %d pods on /32s, %d waiting; want 7 and 5 (one slot kept)", c.Assigned, s.in.Pending)
	}
	s.in.Refusals = nil
	if _, err := s.settle(50); err != nil {
		t.Fatal(err)
	}
	if c := Summarize(s.in); s.in.Pending != 0 || c.Prefixes != 1 || c.Assigned != 12 {
		t.Errorf("after the refusal: %+v, %d pods waiting; want every pod started, one on a /28", c, s.in.Pending)
	}
}

func (s *sim) openSlots() int {
	n := (s.in.Limits.MaxENIs - len(s.in.ENIs)) * s.in.Limits.SlotsPerENI
	for _, e := range s.in.ENIs {
		n += s.in.Limits.SlotsPerENI - len(e.Slots)
	}
	return n
}
