package warmpool

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// t0 is the simulated clock's start.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// sim is a node whose cloud obeys every plan: it applies plans to its
// Input, checking each against the rules a real cloud and the policy's
// promises impose, places pods on free addresses and advances time.
type sim struct {
	in       Input
	next32   uint32    // next /32 handed out, from 10.64.0.0
	next28   uint32    // next /28 handed out, from 10.128.0.0
	nextENI  int       // next ENI number
	coolEnd  time.Time // when every cooling address becomes free
	cooldown time.Duration
	// holdCooling keeps settle from jumping the clock to the end of the
	// cooldown, for scenarios that play out within it.
	holdCooling bool
}

func newSim(lim Limits, cfg Config) *sim {
	return &sim{
		in: Input{
			ENIs:   []ENI{{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour)}},
			Limits: lim, Config: cfg, Now: t0,
		},
		next32:   0x0a400000,
		next28:   0x0a800000,
		nextENI:  1,
		cooldown: 30 * time.Second,
	}
}

func addr4(u uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)})
}

func (s *sim) newSlots(n int, prefixes bool) []Slot {
	out := make([]Slot, n)
	for i := range out {
		if prefixes {
			out[i].Prefix = netip.PrefixFrom(addr4(s.next28), 28)
			s.next28 += PrefixAddresses
		} else {
			out[i].Prefix = netip.PrefixFrom(addr4(s.next32), 32)
			s.next32++
		}
	}
	return out
}

func (s *sim) eni(id string) *ENI {
	for i := range s.in.ENIs {
		if s.in.ENIs[i].ID == id {
			return &s.in.ENIs[i]
		}
	}
	return nil
}

// apply executes p as the cloud would, after checking that it keeps every
// limit and promise; it returns what was violated.
func (s *sim) apply(p Plan) error {
	lim := s.in.Limits
	before := Summarize(s.in)
	switch p.Action {
	case Assign, CreateENI:
		least := 1
		if p.Action == CreateENI && targetOf(s.in).policy == byDemand {
			least = 0 // the adaptive policy attaches an ENI for room alone
		}
		if p.Count < least || p.Count > lim.SlotsPerENI {
			return fmt.Errorf("%v count %d outside %d..%d", p.Action, p.Count, least, lim.SlotsPerENI)
		}
		if p.Prefixes && !prefixMode(s.in) {
			return fmt.Errorf("prefixes planned outside prefix mode")
		}
		unit := 1
		if p.Prefixes {
			unit = PrefixAddresses
		}
		if lim.MaxPods > 0 && before.Total+p.Count*unit >= lim.MaxPods+unit {
			return fmt.Errorf("growth to %d addresses beyond max pods %d", before.Total+p.Count*unit, lim.MaxPods)
		}
		if p.Action == CreateENI {
			if len(s.in.ENIs) >= lim.MaxENIs {
				return fmt.Errorf("CreateENI with %d of %d ENIs", len(s.in.ENIs), lim.MaxENIs)
			}
			s.in.LastGrow = s.in.Now // as the daemon records it
			id := fmt.Sprintf("eni-%02d", s.nextENI)
			s.nextENI++
			s.in.ENIs = append(s.in.ENIs, ENI{ID: id, Attached: s.in.Now, Slots: s.newSlots(p.Count, p.Prefixes)})
			return nil
		}
		e := s.eni(p.ENI)
		if e == nil {
			return fmt.Errorf("Assign on unknown ENI %q", p.ENI)
		}
		if len(e.Slots)+p.Count > lim.SlotsPerENI {
			return fmt.Errorf("Assign %d on %s holding %d of %d slots", p.Count, e.ID, len(e.Slots), lim.SlotsPerENI)
		}
		e.Slots = append(e.Slots, s.newSlots(p.Count, p.Prefixes)...)
		s.in.LastGrow = s.in.Now
	case Release:
		if err := s.checkReleaseDue(); err != nil {
			return err
		}
		e := s.eni(p.ENI)
		if e == nil || len(p.Release) == 0 {
			return fmt.Errorf("Release %v on ENI %q", p.Release, p.ENI)
		}
		for _, r := range p.Release {
			i := slices.IndexFunc(e.Slots, func(sl Slot) bool { return sl.Prefix == r })
			if i < 0 {
				return fmt.Errorf("Release of %v not on %s", r, e.ID)
			}
			if e.Slots[i].Assigned > 0 || e.Slots[i].Cooling > 0 {
				return fmt.Errorf("Release of %v with %d assigned, %d cooling", r, e.Slots[i].Assigned, e.Slots[i].Cooling)
			}
			e.Slots = slices.Delete(e.Slots, i, i+1)
		}
		s.in.LastRelease = s.in.Now
	case DeleteENI:
		if err := s.checkReleaseDue(); err != nil {
			return err
		}
		e := s.eni(p.ENI)
		if e == nil {
			return fmt.Errorf("DeleteENI of unknown %q", p.ENI)
		}
		if e.Primary || busy(e) {
			return fmt.Errorf("DeleteENI of %s: primary %v, busy %v", e.ID, e.Primary, busy(e))
		}
		minAge := s.in.Config.ENIMinAge
		if minAge == 0 {
			minAge = DefaultENIMinAge
		}
		if s.in.Now.Sub(e.Attached) < minAge {
			return fmt.Errorf("DeleteENI of %s aged %v", e.ID, s.in.Now.Sub(e.Attached))
		}
		s.in.ENIs = slices.DeleteFunc(s.in.ENIs, func(x ENI) bool { return x.ID == p.ENI })
		s.in.LastRelease = s.in.Now
	default:
		return fmt.Errorf("apply of %v", p.Action)
	}
	return nil
}

func (s *sim) checkReleaseDue() error {
	iv := s.in.Config.ReleaseInterval
	if iv == 0 {
		iv = DefaultReleaseInterval
	}
	if !s.in.LastRelease.IsZero() && s.in.Now.Sub(s.in.LastRelease) < iv {
		return fmt.Errorf("release %v after the last one, interval %v", s.in.Now.Sub(s.in.LastRelease), iv)
	}
	return nil
}

// advance moves the clock; cooling addresses become free at coolEnd.
func (s *sim) advance(d time.Duration) {
	s.in.Now = s.in.Now.Add(d)
	if !s.coolEnd.IsZero() && !s.in.Now.Before(s.coolEnd) {
		for i := range s.in.ENIs {
			for j := range s.in.ENIs[i].Slots {
				s.in.ENIs[i].Slots[j].Cooling = 0
			}
		}
		s.coolEnd = time.Time{}
	}
}

// ordered visits slots primary ENI first, then by ENI ID, then in slot order.
func (s *sim) ordered(f func(sl *Slot) bool) {
	idx := make([]int, len(s.in.ENIs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		ea, eb := s.in.ENIs[a], s.in.ENIs[b]
		if ea.Primary != eb.Primary {
			if ea.Primary {
				return -1
			}
			return 1
		}
		return strings.Compare(ea.ID, eb.ID)
	})
	for _, i := range idx {
		for j := range s.in.ENIs[i].Slots {
			if f(&s.in.ENIs[i].Slots[j]) {
				return
			}
		}
	}
}

// addPod gives a pod the first free address; false when there is none.
func (s *sim) addPod() bool {
	ok := false
	s.ordered(func(sl *Slot) bool {
		if sl.Free() > 0 {
			sl.Assigned++
			ok = true
		}
		return ok
	})
	return ok
}

// delPod frees the last assigned address (the newest pod goes first); it
// cools down for s.cooldown.
func (s *sim) delPod() bool {
	var used []*Slot
	s.ordered(func(sl *Slot) bool {
		if sl.Assigned > 0 {
			used = append(used, sl)
		}
		return false
	})
	if len(used) == 0 {
		return false
	}
	sl := used[len(used)-1]
	sl.Assigned--
	sl.Cooling++
	s.coolEnd = s.in.Now.Add(s.cooldown)
	return true
}

// startPending gives waiting pods the free addresses there are.
func (s *sim) startPending() {
	for s.in.Pending > 0 && s.addPod() {
		s.in.Pending--
	}
}

// step calls Next once and acts on its plan as the daemon and the cloud
// would: an action is applied, then a simulated second passes and waiting
// pods start; Nothing or Wait with an Until advances the clock to it; at
// rest, the clock advances to the end of the cooldown if addresses cool
// (unless holdCooling). done reports a fixed point: Next has nothing to do
// and nothing will change by itself.
func (s *sim) step() (applied *Plan, done bool, err error) {
	p := Next(s.in)
	if p.Reason == "" || strings.Contains(p.Reason, "\n") {
		return nil, false, fmt.Errorf("plan %v with reason %q", p.Action, p.Reason)
	}
	switch p.Action {
	case Nothing, Wait:
		switch {
		case !p.Until.IsZero():
			if !p.Until.After(s.in.Now) {
				return nil, false, fmt.Errorf("%v until %v, not after now %v", p.Action, p.Until, s.in.Now)
			}
			s.advance(p.Until.Sub(s.in.Now))
			return nil, false, nil
		case !s.coolEnd.IsZero() && !s.holdCooling:
			s.advance(s.coolEnd.Sub(s.in.Now))
			return nil, false, nil
		}
		return nil, true, nil
	}
	if err := s.apply(p); err != nil {
		return nil, false, fmt.Errorf("%v: %w", p.Reason, err)
	}
	s.advance(time.Second)
	s.startPending()
	return &p, false, nil
}

// settle steps until a fixed point and returns the plans applied, or an
// error on a violated rule or after maxSteps.
func (s *sim) settle(maxSteps int) ([]Plan, error) {
	var applied []Plan
	for range maxSteps {
		p, done, err := s.step()
		if err != nil {
			return applied, fmt.Errorf("step %d: %w", len(applied), err)
		}
		if done {
			return applied, nil
		}
		if p != nil {
			applied = append(applied, *p)
		}
	}
	return applied, fmt.Errorf("no fixed point after %d steps; last plans %v", maxSteps, tail(applied, 6))
}

func tail(ps []Plan, n int) []string {
	var out []string
	for _, p := range ps[max(len(ps)-n, 0):] {
		out = append(out, p.Action.String()+" "+p.ENI+": "+p.Reason)
	}
	return out
}

// perENI lists each ENI's slot count, primary first then by ID.
func (s *sim) perENI() []int {
	var out []int
	for _, i := range newState(s.in).order {
		out = append(out, len(s.in.ENIs[i].Slots))
	}
	return out
}

// perPrefix lists each /28's assigned addresses in visiting order.
func (s *sim) perPrefix() []int {
	var out []int
	s.ordered(func(sl *Slot) bool {
		if sl.Size() == PrefixAddresses {
			out = append(out, sl.Assigned)
		}
		return false
	})
	return out
}

// busy reports whether any of the ENI's addresses is assigned or cooling.
func busy(e *ENI) bool {
	for _, sl := range e.Slots {
		if sl.Assigned > 0 || sl.Cooling > 0 {
			return true
		}
	}
	return false
}
