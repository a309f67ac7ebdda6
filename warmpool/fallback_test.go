package warmpool

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestAdaptiveFallbackKeepsASlotForAPrefix: the adaptive default policy in
// prefix mode, while the subnet has no aligned /28 (RefusedNoPrefix), must
// keep the node's last open slot as the targets policies do: every growth
// of single addresses, on an attached ENI or a new one, leaves a slot for a
// /28.
func TestAdaptiveFallbackKeepsASlotForAPrefix(t *testing.T) {
	for _, lim := range []Limits{
		{MaxENIs: 2, SlotsPerENI: 4, PrefixSupported: true},
		{MaxENIs: 3, SlotsPerENI: 4, PrefixSupported: true},
		{MaxENIs: 3, SlotsPerENI: 10, PrefixSupported: true},
		{MaxENIs: 4, SlotsPerENI: 1, PrefixSupported: true},
	} {
		s := newSim(lim, Config{PrefixDelegation: true, Adaptive: true})
		until := t0.Add(10 * time.Minute)
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: until}}
		// A burst of arrivals: more pods than the node's slots hold as /32s.
		for i := range 40 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			s.in.Demand.History = s.in.Demand.History.Record(at)
		}
		s.in.Now = t0.Add(4 * time.Second)
		s.in.Pending = 40
		for steps := 0; s.in.Now.Before(until) && steps < 60; steps++ {
			c := Summarize(s.in)
			s.in.Demand.History = s.in.Demand.History.Observe(s.in.Now, c.Assigned+c.Cooling)
			p, done, err := s.step()
			if err != nil {
				t.Fatalf("%+v: %v", lim, err)
			}
			if done {
				break
			}
			if p != nil && p.Prefixes {
				t.Fatalf("%+v: prefix call while refused: %s", lim, p.Reason)
			}
			if open := s.openSlots(); open < 1 {
				t.Fatalf("%+v: the fallback filled every slot (%d ENIs, %d pods waiting); last plan %v: %s",
					lim, len(s.in.ENIs), s.in.Pending, p.Action, p.Reason)
			}
		}
	}
}

// TestFallbackNeverTakesTheLastSlot drives random pod arrivals and
// departures on nodes in prefix mode while the subnet refuses /28s, under
// each policy, and checks that no growth of single addresses leaves the
// node without an open slot for a /28.
func TestFallbackNeverTakesTheLastSlot(t *testing.T) {
	cfgs := []Config{
		{PrefixDelegation: true, Adaptive: true},
		{PrefixDelegation: true, WarmPrefixTarget: 1},
		{PrefixDelegation: true, WarmIPTarget: 5},
		{PrefixDelegation: true, WarmIPTarget: 2, MinimumIPTarget: 10},
		{PrefixDelegation: true, WarmENITarget: 1},
		{PrefixDelegation: true},
	}
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 7))
		lim := Limits{MaxENIs: 1 + r.IntN(4), SlotsPerENI: 1 + r.IntN(10), PrefixSupported: true}
		if r.IntN(3) == 0 {
			lim.MaxPods = 1 + r.IntN(40)
		}
		cfg := cfgs[r.IntN(len(cfgs))]
		s := newSim(lim, cfg)
		s.holdCooling = true
		until := t0.Add(time.Hour)
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: until}}
		for ev := 0; ev < 80 && s.in.Now.Before(until); ev++ {
			s.churn(r, func(p Plan, open int, err error) {
				if err != nil {
					t.Fatalf("seed %d %+v %+v: %v: %v", seed, lim, cfg, p.Reason, err)
				}
				if (p.Action == Assign || p.Action == CreateENI) && open >= 1 && s.openSlots() < 1 {
					t.Fatalf("seed %d %+v %+v: %v took the last open slot: %s", seed, lim, cfg, p.Action, p.Reason)
				}
			})
		}
	}
}

// TestFallbackRecovers: after a no-/28 fallback under random demand and
// other refusals overlapping it, once every refusal ends the node settles
// (no oscillation within the settle bound) with no pod waiting unless a
// static limit holds it (max pods, or no open slot left).
func TestFallbackRecovers(t *testing.T) {
	cfgs := []Config{
		{PrefixDelegation: true, Adaptive: true},
		{PrefixDelegation: true, WarmPrefixTarget: 1},
		{PrefixDelegation: true, WarmIPTarget: 5},
		{PrefixDelegation: true, WarmIPTarget: 2, MinimumIPTarget: 10},
		{PrefixDelegation: true},
	}
	kinds := []RefusalKind{RefusedENILimit, RefusedAddressLimit, RefusedThrottled, RefusedSubnetFull}
	for seed := range uint64(1500) {
		r := rand.New(rand.NewPCG(seed, 11))
		lim := Limits{MaxENIs: 1 + r.IntN(4), SlotsPerENI: 1 + r.IntN(10), PrefixSupported: true}
		if r.IntN(3) == 0 {
			lim.MaxPods = 1 + r.IntN(60)
		}
		cfg := cfgs[r.IntN(len(cfgs))]
		s := newSim(lim, cfg)
		s.holdCooling = true
		until := t0.Add(30 * time.Minute)
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: until}}
		for ev := 0; ev < 60; ev++ {
			if r.IntN(8) == 0 {
				k := kinds[r.IntN(len(kinds))]
				s.in.Refusals = append(s.in.Refusals, Refusal{Kind: k, Until: s.in.Now.Add(time.Duration(1+r.IntN(120)) * time.Second), Count: r.IntN(4)})
			}
			s.churn(r, func(p Plan, _ int, err error) {
				if err != nil {
					t.Fatalf("seed %d: %v: %v", seed, p.Reason, err)
				}
			})
		}
		s.advance(max(until.Sub(s.in.Now), 0) + time.Second)
		s.in.Refusals = nil
		s.holdCooling = false
		s.startPending()
		applied, err := s.settle(200)
		s.startPending()
		if err != nil {
			t.Fatalf("seed %d %+v %+v: %v", seed, lim, cfg, err)
		}
		c := Summarize(s.in)
		if s.in.Pending > 0 && (lim.MaxPods == 0 || c.Total < lim.MaxPods) && s.openSlots() > 0 {
			t.Errorf("seed %d %+v %+v: %d pods wait with %d open slots after the refusal (%+v); last plans %v; next %s",
				seed, lim, cfg, s.in.Pending, s.openSlots(), c, tail(applied, 4), Next(s.in).Reason)
		}
	}
}

// churn is one random event of a churning node: an arrival (two in three,
// recorded in the demand history; it waits when no address is free) or a
// departure; then plans are applied until the pool rests (at most 20),
// each reported to applied with the node's open slots before it and the
// error applying it; then up to 4 s pass.
func (s *sim) churn(r *rand.Rand, applied func(p Plan, openBefore int, err error)) {
	if r.IntN(3) > 0 {
		s.in.Demand.History = s.in.Demand.History.Record(s.in.Now)
		if !s.addPod() {
			s.in.Pending++
		}
	} else {
		s.delPod()
	}
	for range 20 {
		c := Summarize(s.in)
		s.in.Demand.History = s.in.Demand.History.Observe(s.in.Now, c.Assigned+c.Cooling)
		open := s.openSlots()
		p := Next(s.in)
		if p.Action == Nothing || p.Action == Wait {
			break
		}
		err := s.apply(p)
		applied(p, open, err)
		s.startPending()
	}
	s.advance(time.Duration(r.IntN(4000)) * time.Millisecond)
}

// TestAdaptiveReachKeepsASlotForAPrefix: the adaptive policy attaches an
// ENI for reach (a recent burst of 6 pods) while the subnet has no aligned
// /28; the new ENI's single addresses leave the node's last slot open.
func TestAdaptiveReachKeepsASlotForAPrefix(t *testing.T) {
	lim := Limits{MaxENIs: 2, SlotsPerENI: 4, PrefixSupported: true}
	s := newSim(lim, Config{PrefixDelegation: true, Adaptive: true})
	s.in.ENIs[0].Slots = s.newSlots(4, false)
	s.in.ENIs[0].Slots[0].Assigned, s.in.ENIs[0].Slots[1].Assigned = 1, 1
	for i := range 6 { // a burst of 6 a minute ago; 4 of its pods have left
		at := t0.Add(time.Duration(i) * time.Second)
		s.in.Demand.History = s.in.Demand.History.Record(at).Observe(at, i+1)
	}
	s.in.Now = t0.Add(time.Minute)
	s.in.Demand.History = s.in.Demand.History.Observe(s.in.Now, 2)
	s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(10 * time.Minute)}}
	p := Next(s.in)
	if p.Action != CreateENI {
		t.Fatalf("setup: want an ENI for reach, got %v: %s", p.Action, p.Reason)
	}
	if p.Prefixes || p.Count > lim.SlotsPerENI-1 {
		t.Errorf("%v with %d slots (prefixes %v) fills the node's last open slot with /32s: %s", p.Action, p.Count, p.Prefixes, p.Reason)
	}
}

// TestFallbackUnderRenewedRefusals: a subnet with no aligned /28 for good.
// Each refusal ends, the plan tries a /28, the cloud refuses again (the
// daemon's backoff: 30 s doubling to 5 minutes). Over two hours of pods
// coming and going, under each policy: the last open slot is never taken
// by /32s, nothing grows back what was just released (no oscillation),
// and the prefix attempts stay within one per backoff period.
func TestFallbackUnderRenewedRefusals(t *testing.T) {
	cfgs := []Config{
		{PrefixDelegation: true, Adaptive: true},
		{PrefixDelegation: true, WarmPrefixTarget: 1},
		{PrefixDelegation: true, WarmIPTarget: 3},
		{PrefixDelegation: true, WarmIPTarget: 1, MinimumIPTarget: 6},
	}
	for seed := range uint64(120) {
		r := rand.New(rand.NewPCG(seed, 3))
		lim := Limits{MaxENIs: 2 + r.IntN(3), SlotsPerENI: 2 + r.IntN(9), PrefixSupported: true}
		cfg := cfgs[r.IntN(len(cfgs))]
		s := newSim(lim, cfg)
		s.holdCooling = true
		backoff := 30 * time.Second
		s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(backoff)}}
		end := t0.Add(2 * time.Hour)
		attempts := 0
		for s.in.Now.Before(end) {
			switch {
			case r.IntN(2) == 0:
				s.in.Demand.History = s.in.Demand.History.Record(s.in.Now)
				if !s.addPod() {
					s.in.Pending++
				}
			default:
				s.delPod()
			}
			shrunk := false // within this settle, with no pod event since
			lastShrink := ""
			for range 20 {
				c := Summarize(s.in)
				s.in.Demand.History = s.in.Demand.History.Observe(s.in.Now, c.Assigned+c.Cooling)
				p := Next(s.in)
				if p.Action == Nothing || p.Action == Wait {
					break
				}
				if p.Prefixes {
					attempts++
					backoff = min(2*backoff, 5*time.Minute)
					s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: s.in.Now.Add(backoff)}}
					continue
				}
				open := s.openSlots()
				if err := s.apply(p); err != nil {
					t.Fatalf("seed %d %+v %+v: %v: %v", seed, lim, cfg, p.Reason, err)
				}
				switch p.Action {
				case Release, DeleteENI:
					shrunk = true
					lastShrink = p.Action.String() + " " + p.ENI + ": " + p.Reason
				case Assign, CreateENI:
					if open >= 1 && s.openSlots() < 1 {
						t.Fatalf("seed %d %+v %+v: %v took the last open slot: %s", seed, lim, cfg, p.Action, p.Reason)
					}
					s.in.LastGrow = s.in.Now // as the daemon records it
					if shrunk {
						t.Errorf("seed %d %+v %+v: growth right after a release, no pod event between: %s\n  after %s", seed, lim, cfg, p.Reason, lastShrink)
					}
				}
				s.startPending()
			}
			s.advance(time.Duration(1+r.IntN(20)) * time.Second)
		}
		if limit := int(2*time.Hour/(5*time.Minute)) + 8; attempts > limit {
			t.Errorf("seed %d %+v %+v: %d /28 attempts in 2 h, want at most %d", seed, lim, cfg, attempts, limit)
		}
	}
}

// TestAdaptiveReachInTheFallbackComesEmpty: pods arriving every half second
// while the subnet has no aligned /28: an ENI the adaptive policy attaches
// for reach comes without addresses. Its slots are for /28s once they can be
// had (16 addresses each); growth asks for the single addresses pods and
// margin need. With a minute of arrivals in single addresses, three such
// ENIs of 14 took an m5.xlarge's slots and capped it at 71 addresses, its
// /28 budget being 896 (found by review).
func TestAdaptiveReachInTheFallbackComesEmpty(t *testing.T) {
	lim := Limits{MaxENIs: 4, SlotsPerENI: 14, PrefixSupported: true}
	s := newSim(lim, Config{PrefixDelegation: true, Adaptive: true})
	s.in.ENIs[0].Slots = s.newSlots(9, false)
	for i := range 6 {
		s.in.ENIs[0].Slots[i].Assigned = 1
	}
	for i := range 40 { // a pod every half second for 20 s
		at := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		s.in.Demand.History = s.in.Demand.History.Record(at).Observe(at, min(i+1, 6))
	}
	s.in.Now = t0.Add(20 * time.Second)
	s.in.Refusals = []Refusal{{Kind: RefusedNoPrefix, Until: t0.Add(10 * time.Minute)}}
	for range 5 { // the assign pods and margin need, then the ENI for reach
		p, done, err := s.step()
		if err != nil || done {
			t.Fatalf("step: %v (done %v)", err, done)
		}
		if p == nil || p.Action != CreateENI {
			continue
		}
		if p.Count != 0 || p.Prefixes {
			t.Errorf("an ENI for reach in the fallback with %d slots (prefixes %v), want none: %s", p.Count, p.Prefixes, p.Reason)
		}
		return
	}
	t.Fatalf("setup: no ENI for reach within 5 plans (last: %s)", Next(s.in).Reason)
}
