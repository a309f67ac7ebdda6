package warmpool

import (
	"testing"
	"time"
)

// singlesOf counts the node's single addresses: those pods hold, and those
// free (neither assigned nor cooling).
func singlesOf(in Input) (held, free int) {
	for _, e := range in.ENIs {
		for _, sl := range e.Slots {
			switch {
			case sl.Size() != 1:
			case sl.Assigned > 0 || sl.Cooling > 0:
				held++
			default:
				free++
			}
		}
	}
	return held, free
}

// TestFallbackSinglesTurnBackIntoAPrefix: a prefix-mode node that fell back
// to single addresses (six, two held by pods) once the subnet had no /28,
// the refusal over: under the adaptive policy and WARM_IP_TARGET it gets a
// /28 and gives back the four free single addresses, keeps the two pods
// hold, and a pod arriving meanwhile never waits. Before convert.go both
// policies kept free single addresses for good, as they covered the
// targets.
func TestFallbackSinglesTurnBackIntoAPrefix(t *testing.T) {
	for _, cfg := range []Config{
		{PrefixDelegation: true, Adaptive: true},
		{PrefixDelegation: true, WarmIPTarget: 3},
		{PrefixDelegation: true, WarmIPTarget: 2, MinimumIPTarget: 4},
		{PrefixDelegation: true, WarmPrefixTarget: 1},
	} {
		s := newSim(Limits{MaxENIs: 2, SlotsPerENI: 8, PrefixSupported: true}, cfg)
		s.in.ENIs[0].Slots = s.newSlots(6, false)
		s.in.ENIs[0].Slots[0].Assigned = 1
		s.in.ENIs[0].Slots[1].Assigned = 1
		s.in.LastGrow = t0.Add(-time.Hour)
		// Expired: the refusal that made them.
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(-time.Second)}}
		var plans []Plan
		for step := range 30 {
			if step == 3 {
				// A pod arrives while the conversion runs.
				s.in.Demand.History = s.in.Demand.History.Record(s.in.Now)
				if !s.addPod() {
					t.Fatalf("%+v: a pod found no free address during the conversion; plans %v", cfg, tail(plans, 4))
				}
			}
			p, done, err := s.step()
			if err != nil {
				t.Fatalf("%+v: %v", cfg, err)
			}
			if done {
				break
			}
			if p != nil {
				plans = append(plans, *p)
			}
		}
		held, free := singlesOf(s.in)
		c := Summarize(s.in)
		if free != 0 || held != 2 || c.Prefixes < 1 || c.Assigned != 3 || s.in.Pending != 0 {
			t.Errorf("%+v: after the refusal: %d single addresses held by pods, %d free, %d /28s, %d assigned, %d waiting; want 2, 0, at least 1, 3, 0; plans %v; next %s",
				cfg, held, free, c.Prefixes, c.Assigned, s.in.Pending, tail(plans, 4), Next(s.in).Reason)
		}
		// KeepFallback: the behaviour before, for comparisons.
		k := cfg
		k.KeepFallback = true
		in := s.in
		in.Config = k
		in.ENIs = []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slots32("10.64.0.0", 6, 2, 0)}}
		if p := Next(in); p.Prefixes && cfg.WarmPrefixTarget == 0 {
			t.Errorf("%+v with KeepFallback: %v %s", cfg, p.Action, p.Reason)
		}
	}
}

// TestNoConversionWhileRefusedOrWithoutRoom: free single addresses of the
// fallback stay, and no /28 is asked for, while /28s are refused, and
// while only a new ENI would hold one at the ENI limit (they serve pods).
func TestNoConversionWhileRefusedOrWithoutRoom(t *testing.T) {
	cfg := Config{PrefixDelegation: true, Adaptive: true}
	in := Input{
		ENIs:   []ENI{eni("eni-0", time.Hour, slots32("10.0.0.1", 4, 1, 0)...)},
		Limits: Limits{MaxENIs: 1, SlotsPerENI: 8, PrefixSupported: true}, Config: cfg, Now: t0,
		Refusals: []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Minute)}},
	}
	if p := Next(in); p.Prefixes || p.Action == Release {
		t.Errorf("refused: %v %s; want no /28 and no release", p.Action, p.Reason)
	}
	in.Refusals = nil
	in.ENIs[0].Slots = slots32("10.0.0.1", 8, 5, 0) // the only ENI full of single addresses
	if p := Next(in); p.Prefixes {
		t.Errorf("no room: %v %s; want no /28", p.Action, p.Reason)
	}
}

// TestAdaptiveFallbackAsksForWhatIsNeeded: under the adaptive policy a
// prefix-mode node that falls back to single addresses asks for what its
// pods and margin need, not for a whole ENI's worth as in secondary-IP
// mode: each single address more may break another /28 of the subnet.
// Before, three waiting pods got nine. A filling node (first pod 3 min
// ago, pods at 0.5/s) asks for no more than the same node past FillSpan:
// the prefix-mode fill chunk, a minute of arrivals, applies only while
// /28s are not refused (found by review).
func TestAdaptiveFallbackAsksForWhatIsNeeded(t *testing.T) {
	in := Input{
		ENIs:     []ENI{eni("eni-0", time.Hour)},
		Limits:   Limits{MaxENIs: 3, SlotsPerENI: 9, PrefixSupported: true},
		Config:   Config{PrefixDelegation: true, Adaptive: true},
		Now:      t0,
		Pending:  3,
		Refusals: []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(time.Minute)}},
	}
	p := Next(in)
	if p.Action != Assign || p.Prefixes || p.Count > 4 {
		t.Errorf("Next = %v of %d (prefixes %v): %s; want at most 4 single addresses", p.Action, p.Count, p.Prefixes, p.Reason)
	}
	withFirst := func(first time.Duration) Input {
		h := arrivals(History{}, t0.Add(-first), t0.Add(-first), time.Second, 1)
		in.Demand.History = arrivals(h, t0.Add(-2*time.Minute), t0.Add(-time.Second), 2*time.Second, 3)
		return in
	}
	q := Next(withFirst(40 * time.Minute))
	if p := Next(withFirst(3 * time.Minute)); p.Action != Assign || p.Prefixes || p.Count > q.Count {
		t.Errorf("filling: %v of %d (prefixes %v): %s; past FillSpan the same node asks for %d (%s)", p.Action, p.Count, p.Prefixes, p.Reason, q.Count, q.Reason)
	}
}

// TestFallbackSinglesAtTheSlotLimitMakeRoom: a prefix-mode node whose every
// slot the fallback filled with a single address (2 ENIs of 4 slots, the ENI
// limit, 6 held by pods), the refusal over, 3 pods waiting: the free single
// addresses go so that /28s take their slots, and the pods get addresses.
// Before, the node stayed capped at its 8 single addresses (a slot holds 16
// as a /28) and the pods waited for good (found by review: an m5.xlarge
// capped at 71 addresses, its /28 budget 896). Not short, it does the same,
// paced as a release.
func TestFallbackSinglesAtTheSlotLimitMakeRoom(t *testing.T) {
	for _, pending := range []int{3, 0} {
		s := newSim(Limits{MaxENIs: 2, SlotsPerENI: 4, PrefixSupported: true}, Config{PrefixDelegation: true, Adaptive: true})
		s.in.ENIs[0].Slots = s.newSlots(4, false)
		s.in.ENIs = append(s.in.ENIs, ENI{ID: "eni-01", Attached: t0.Add(-time.Hour)})
		s.in.ENIs[1].Slots = s.newSlots(4, false)
		for i := range 3 {
			s.in.ENIs[0].Slots[i].Assigned = 1
			s.in.ENIs[1].Slots[i].Assigned = 1
		}
		s.in.LastGrow = t0.Add(-time.Hour)
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(-time.Second)}}
		s.in.Pending = pending
		var plans []Plan
		for range 40 {
			p, done, err := s.step()
			if err != nil {
				t.Fatalf("pending %d: %v", pending, err)
			}
			if done {
				break
			}
			if p != nil {
				plans = append(plans, *p)
			}
		}
		c := Summarize(s.in)
		if _, free := singlesOf(s.in); free != 0 || c.Prefixes < 1 || s.in.Pending != 0 {
			t.Errorf("pending %d: %d free single addresses, %d /28s, %d pods waiting; want 0, at least 1, 0; plans %v; next %s",
				pending, free, c.Prefixes, s.in.Pending, tail(plans, 6), Next(s.in).Reason)
		}
		releases := 0
		for _, p := range plans {
			if p.Action == Release {
				releases++
			}
		}
		if releases > 2 {
			t.Errorf("pending %d: %d releases for 2 free single addresses on 2 ENIs: %v", pending, releases, tail(plans, 6))
		}
	}
}

// slotConversion reports a release of single addresses followed by a /28
// growth: the fallback's singles giving their slots to /28s at the slot
// limit (makeRoom), which is no shrink the next plan undoes (16 addresses
// a slot come for each 1 gone).
func slotConversion(release, next Plan) bool {
	if release.Action != Release || !next.Prefixes || len(release.Release) == 0 {
		return false
	}
	for _, p := range release.Release {
		if p.Bits() != 32 {
			return false
		}
	}
	return true
}
