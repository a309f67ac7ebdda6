package warmpool

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// randomSim builds a random node: limits, configuration, ENIs with /32 and
// /28 slots in every assigned/cooling/free mix, pending pods, a recent
// release and refusals, some expired.
func randomSim(r *rand.Rand) *sim {
	lim := Limits{MaxENIs: 1 + r.IntN(6), SlotsPerENI: 1 + r.IntN(20), PrefixSupported: r.IntN(3) > 0}
	cfg := Config{PrefixDelegation: r.IntN(2) == 0}
	switch r.IntN(5) {
	case 0:
		cfg.WarmENITarget = r.IntN(3)
	case 1:
		cfg.WarmIPTarget, cfg.MinimumIPTarget = r.IntN(20), r.IntN(40)
	case 2:
		cfg.WarmPrefixTarget = r.IntN(3)
	case 3:
		cfg.WarmENITarget, cfg.WarmIPTarget, cfg.MinimumIPTarget, cfg.WarmPrefixTarget = r.IntN(3), r.IntN(5), r.IntN(10), r.IntN(3)
	}
	cfg.ReleaseInterval = []time.Duration{0, 5 * time.Second, 30 * time.Second}[r.IntN(3)]
	cfg.ENIMinAge = []time.Duration{0, 10 * time.Second, 2 * time.Minute}[r.IntN(3)]
	unit := 1
	if cfg.PrefixDelegation && lim.PrefixSupported {
		unit = PrefixAddresses
	}
	if r.IntN(3) == 0 {
		lim.MaxPods = 1 + r.IntN(lim.MaxENIs*lim.SlotsPerENI*unit)
	}
	s := newSim(lim, cfg)
	s.in.ENIs = nil
	for i := range 1 + r.IntN(lim.MaxENIs) {
		e := ENI{ID: fmt.Sprintf("eni-%02d", i), Primary: i == 0, Attached: t0.Add(-time.Duration(r.IntN(300)) * time.Second)}
		for range r.IntN(lim.SlotsPerENI + 1) {
			sl := s.newSlots(1, unit > 1 && r.IntN(5) > 0)[0]
			if r.IntN(3) > 0 {
				sl.Assigned = r.IntN(sl.Size() + 1)
			}
			if r.IntN(2) == 0 {
				sl.Cooling = r.IntN(sl.Size() - sl.Assigned + 1)
				s.coolEnd = t0.Add(s.cooldown)
			}
			e.Slots = append(e.Slots, sl)
		}
		s.in.ENIs = append(s.in.ENIs, e)
	}
	s.nextENI = len(s.in.ENIs)
	if r.IntN(4) == 0 {
		s.in.Pending = r.IntN(30)
	}
	if r.IntN(2) == 0 {
		s.in.LastRelease = t0.Add(-time.Duration(r.IntN(60)) * time.Second)
	}
	for range r.IntN(4) {
		ref := Refusal{Kind: RefusalKind(1 + r.IntN(5)), Until: t0.Add(time.Duration(r.IntN(330)-30) * time.Second)}
		if ref.Kind == RefusedAddressLimit && r.IntN(2) == 0 {
			ref.ENI = s.in.ENIs[r.IntN(len(s.in.ENIs))].ID
		}
		s.in.Refusals = append(s.in.Refusals, ref)
	}
	return s
}

func randomInput(r *rand.Rand) Input { return randomSim(r).in }

func (s *sim) clone() *sim {
	c := *s
	c.in.ENIs = make([]ENI, len(s.in.ENIs))
	for i, e := range s.in.ENIs {
		e.Slots = slices.Clone(e.Slots)
		c.in.ENIs[i] = e
	}
	c.in.Refusals = slices.Clone(s.in.Refusals)
	return &c
}

// checkRefusals returns how p ignores a refusal in force.
func checkRefusals(in Input, p Plan) error {
	grows := p.Action == Assign || p.Action == CreateENI
	for _, r := range in.Refusals {
		if !r.Until.After(in.Now) {
			continue
		}
		switch {
		case grows && (r.Kind == RefusedSubnetFull || r.Kind == RefusedThrottled):
			return fmt.Errorf("%v while refused %v", p.Action, r.Kind)
		case p.Action == CreateENI && r.Kind == RefusedENILimit:
			return fmt.Errorf("CreateENI while the ENI limit is refused")
		case p.Action == Assign && r.Kind == RefusedAddressLimit && (r.ENI == "" || r.ENI == p.ENI):
			return fmt.Errorf("Assign on %s while its address limit is refused", p.ENI)
		case grows && p.Prefixes && r.Kind == RefusedNoPrefix:
			return fmt.Errorf("prefixes while /28s are refused")
		}
	}
	if p.Action == Wait && !slices.ContainsFunc(in.Refusals, func(r Refusal) bool { return r.Until.After(in.Now) }) {
		return fmt.Errorf("Wait with no refusal in force")
	}
	if (p.Action == Wait || p.Action == Nothing) && !p.Until.IsZero() && !p.Until.After(in.Now) {
		return fmt.Errorf("%v until %v, not after now", p.Action, p.Until)
	}
	return nil
}

// TestPlanKeepsLimitsAndPromises: over random states, one plan never
// exceeds an ENI, slot or max-pods limit, never releases an assigned or
// cooling address, never deletes the primary, a busy or a young ENI, never
// releases twice within the interval, honours every refusal in force, and
// never shrinks into a shortfall that the next plan would refill.
func TestPlanKeepsLimitsAndPromises(t *testing.T) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		counts := map[ActionKind]int{}
		for i := range 5000 {
			s := randomSim(r)
			p := Next(s.in)
			counts[p.Action]++
			fail := func(err error) { t.Fatalf("seed %d case %d: %v\nplan %+v\ninput %+v", seed, i, err, p, s.in) }
			if p.Reason == "" || strings.Contains(p.Reason, "\n") {
				fail(fmt.Errorf("reason %q", p.Reason))
			}
			if err := checkRefusals(s.in, p); err != nil {
				fail(err)
			}
			if p.Action == Nothing || p.Action == Wait {
				continue
			}
			after := s.clone()
			if err := after.apply(p); err != nil {
				fail(err)
			}
			if p.Action == Release || p.Action == DeleteENI {
				if q := Next(after.in); (q.Action == Assign || q.Action == CreateENI) && !slotConversion(p, q) {
					fail(fmt.Errorf("shrink followed at once by growth: %s", q.Reason))
				}
			}
		}
		for _, k := range []ActionKind{Nothing, Assign, CreateENI, Release, DeleteENI, Wait} {
			if counts[k] == 0 {
				t.Errorf("seed %d: no random case produced %v: the generator misses a region", seed, k)
			}
		}
	}
}

// TestRepeatedPlansConverge: applying plans on random nodes (the cloud
// obeying, waiting pods starting, cooldowns ending, time advancing) reaches
// a fixed point in a bounded number of calls, with no growth after a
// shrink once the refusals are over, and at the fixed point the pool is at
// target unless a limit stops it.
func TestRepeatedPlansConverge(t *testing.T) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 0xc0de))
		var grew, shrank, both int
		for i := range 1500 {
			s := randomSim(r)
			start := s.clone()
			var calm time.Time // when every refusal is over
			for _, ref := range s.in.Refusals {
				calm = latest(calm, ref.Until)
			}
			s.startPending()
			// shrunk: a shrink once every refusal was over; growth after it
			// is oscillation. converted: a shrink of no-/28 fallback /32s
			// only, after which a /28 may take their room (a one-way
			// conversion); any other growth after it is still oscillation.
			var shrunk, converted, didGrow, didShrink bool
			fail := func(err error) {
				t.Fatalf("seed %d case %d: %v\nstart %+v", seed, i, err, start.in)
			}
			for step := 0; ; step++ {
				if step == 400 {
					fail(fmt.Errorf("no fixed point after %d calls", step))
				}
				pre := s.clone().in
				p, done, err := s.step()
				if err != nil {
					fail(err)
				}
				if done {
					break
				}
				if p == nil {
					continue
				}
				switch p.Action {
				case Release, DeleteENI:
					didShrink = true
					if !pre.Now.Before(calm) {
						if fallbackOnly(pre, *p) {
							converted = true
						} else {
							shrunk = true
						}
					}
				case Assign, CreateENI:
					didGrow = true
					if shrunk || (converted && !p.Prefixes) {
						fail(fmt.Errorf("growth after shrink: %s", p.Reason))
					}
				}
			}
			c := Summarize(s.in)
			stuck := (s.in.Limits.MaxPods > 0 && c.Total >= s.in.Limits.MaxPods) ||
				(c.ENIs >= s.in.Limits.MaxENIs && !slices.ContainsFunc(s.in.ENIs, func(e ENI) bool { return len(e.Slots) < s.in.Limits.SlotsPerENI }))
			if c.Short > 0 && !stuck {
				fail(fmt.Errorf("fixed point short %d addresses with room to grow: %+v", c.Short, c))
			}
			grew, shrank = grew+b2i(didGrow), shrank+b2i(didShrink)
			both += b2i(didGrow && didShrink)
		}
		t.Logf("seed %d: of 1500 nodes %d grew, %d shrank, %d both", seed, grew, shrank, both)
		if grew < 100 || shrank < 100 || both < 10 {
			t.Errorf("seed %d: too few nodes grew (%d), shrank (%d) or both (%d) to judge convergence", seed, grew, shrank, both)
		}
	}
}

// fallbackOnly reports a shrink in prefix mode that gives back /32s only:
// the released slots, or every slot of the deleted ENI (at least one).
func fallbackOnly(in Input, p Plan) bool {
	if !in.Config.PrefixDelegation {
		return false
	}
	switch p.Action {
	case Release:
		return len(p.Release) > 0 && !slices.ContainsFunc(p.Release, func(r netip.Prefix) bool { return r.Bits() != 32 })
	case DeleteENI:
		for _, e := range in.ENIs {
			if e.ID == p.ENI {
				return len(e.Slots) > 0 && !slices.ContainsFunc(e.Slots, func(sl Slot) bool { return sl.Size() != 1 })
			}
		}
	}
	return false
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
