package warmpool

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// adaptiveSim is a random node under the adaptive policy: random ENIs and
// slots (randomSim), a random arrival history and last growth.
func adaptiveSim(r *rand.Rand) *sim {
	s := randomSim(r)
	s.in.Config.WarmENITarget, s.in.Config.WarmIPTarget, s.in.Config.MinimumIPTarget, s.in.Config.WarmPrefixTarget = 0, 0, 0, 0
	s.in.Config.Adaptive = true
	at := t0.Add(-time.Duration(r.IntN(3600)) * time.Second)
	for range r.IntN(200) {
		at = at.Add(time.Duration(r.ExpFloat64() * float64(time.Duration(1+r.IntN(60))*time.Second)))
		if at.After(t0) {
			break
		}
		s.in.Demand.History = s.in.Demand.History.Record(at).Observe(at, r.IntN(60))
	}
	if r.IntN(2) == 0 {
		s.in.LastGrow = t0.Add(-time.Duration(r.IntN(600)) * time.Second)
	}
	if r.IntN(3) == 0 {
		s.in.Demand.Unaddressed = r.IntN(20)
	}
	s.in.Demand.Bindings = r.IntN(2) == 0
	return s
}

// TestAdaptiveMarginBindings: a node that saw a burst of 100 pods keeps a
// tenth of it free (10 addresses); seeing pods at their binding
// (Demand.Bindings), it keeps BoundAhead free and the rest as room on
// attached ENIs, only as far as that room goes, in both modes.
func TestAdaptiveMarginBindings(t *testing.T) {
	var h History
	at := t0.Add(-40 * time.Minute)
	for i := range 100 {
		h = h.Record(at.Add(time.Duration(i) * 50 * time.Millisecond))
	}
	for _, c := range []struct {
		prefixes bool
		bindings bool
		room     int // slots
		want     int
	}{
		{false, false, 29, 10},
		{false, true, 29, BoundAhead},
		{false, true, 2, 8},
		{false, true, 0, 10},
		{true, false, 4, 8},
		{true, true, 4, BoundAhead},
		{true, true, 0, 8},
	} {
		in := Input{Now: t0, Limits: Limits{MaxENIs: 8, SlotsPerENI: 29, PrefixSupported: true},
			Config: Config{Adaptive: true, PrefixDelegation: c.prefixes}, Demand: Demand{History: h, Bindings: c.bindings}}
		if d := demandOf(in, c.room, c.prefixes, 0); d.margin != c.want {
			t.Errorf("prefixes %v, bindings %v, room %d slots: margin %d, want %d (%s)", c.prefixes, c.bindings, c.room, d.margin, c.want, d.describe())
		}
	}
}

// TestAdaptiveKeepsLimits: over random nodes, the adaptive policy never
// exceeds an ENI, slot or max-pods limit, never releases an assigned or
// cooling address, never deletes the primary, a busy or a young ENI, never
// releases twice within the interval, honours every refusal in force, and a
// shrink is never followed at once by growth nor a growth by a shrink. The
// fourth seed's nodes are filling (within FillSpan of their first pod) in
// a random time scale.
func TestAdaptiveKeepsLimits(t *testing.T) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 0xada))
		counts := map[ActionKind]int{}
		for i := range 4000 {
			s := adaptiveSim(r)
			if seed == 3 {
				// Nodes filling: every history starts within FillSpan,
				// in the time scale of a random release interval.
				s.in.Config.ReleaseInterval = []time.Duration{0, 3 * time.Second, 10 * time.Second}[r.IntN(3)]
				h := NewHistory(s.in.Config)
				at := t0.Add(-time.Duration(r.Int64N(int64(scaled(s.in, FillSpan)))))
				for range 1 + r.IntN(100) {
					at = at.Add(time.Duration(r.ExpFloat64() * float64(time.Duration(1+r.IntN(20))*time.Second)))
					if at.After(t0) {
						break
					}
					h = h.Record(at).Observe(at, r.IntN(60))
				}
				s.in.Demand.History = h
			}
			p := Next(s.in)
			counts[p.Action]++
			fail := func(err error) { t.Fatalf("seed %d case %d: %v\nplan %+v\ninput %+v", seed, i, err, p, s.in) }
			if p.Reason == "" || strings.Contains(p.Reason, "\n") {
				fail(fmt.Errorf("reason %q", p.Reason))
			}
			if p.Action == Wait && !strings.Contains(p.Reason, "cooling") {
				if err := checkRefusals(s.in, p); err != nil {
					fail(err)
				}
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
			if p.Action == Assign || p.Action == CreateENI {
				if q := Next(after.in); q.Action == Release || q.Action == DeleteENI {
					fail(fmt.Errorf("growth followed at once by shrink: %s", q.Reason))
				}
			}
		}
		for _, k := range []ActionKind{Nothing, Assign, CreateENI, Release, DeleteENI} {
			if counts[k] == 0 {
				t.Errorf("seed %d: no random case produced %v", seed, k)
			}
		}
	}
}

// podEvent is a pod arriving (+1) or leaving (−1) at a time.
type podEvent struct {
	at   time.Time
	sign int
}

// replay drives the adaptive policy through pod events as the daemon
// would: an arrival takes a free address (or waits, counted in Pending),
// every event is followed by plans until Nothing, and time jumps to the
// next event or a plan's Until. It returns the actions applied.
func replay(t *testing.T, s *sim, events []podEvent, end time.Time) []Plan {
	t.Helper()
	var applied []Plan
	s.holdCooling = true
	settle := func() {
		for range 64 {
			c := Summarize(s.in)
			s.in.Demand.History = s.in.Demand.History.Observe(s.in.Now, c.Assigned+c.Cooling)
			p := Next(s.in)
			if p.Action == Nothing || p.Action == Wait {
				return
			}
			if err := s.apply(p); err != nil {
				t.Fatalf("at %v: %v: %v", s.in.Now.Sub(t0), p.Reason, err)
			}
			p.Until = s.in.Now // when it was applied
			applied = append(applied, p)
			s.startPending()
		}
		t.Fatalf("at %v: no fixed point in 64 plans", s.in.Now.Sub(t0))
	}
	i := 0
	for s.in.Now.Before(end) {
		for i < len(events) && !events[i].at.After(s.in.Now) {
			if events[i].sign > 0 {
				s.in.Demand.History = s.in.Demand.History.Record(s.in.Now)
				if !s.addPod() {
					s.in.Pending++
				}
			} else if !s.delPod() {
				t.Fatalf("at %v: no pod to delete", s.in.Now.Sub(t0))
			}
			i++
		}
		settle()
		next := end
		if i < len(events) {
			next = events[i].at
		}
		if p := Next(s.in); !p.Until.IsZero() && p.Until.Before(next) {
			next = p.Until
		}
		if !s.coolEnd.IsZero() && s.coolEnd.Before(next) {
			next = s.coolEnd
		}
		// The daemon plans again at least every VPCIP_POOL_INTERVAL: the
		// policy's memory of arrivals fades without any event.
		next = minTime(next, s.in.Now.Add(scaled(s.in, 10*time.Second)))
		s.advance(max(next.Sub(s.in.Now), time.Millisecond))
		s.startPending()
	}
	settle()
	return applied
}

var m5xlarge = Limits{MaxENIs: 4, SlotsPerENI: 14, MaxPods: 58, PrefixSupported: true}

// TestAdaptiveFlatLoadDoesNotOscillate: a flat load of 30 pods, one of them
// replaced every 90 seconds for six hours: after the first hour the pool
// neither grows after a shrink nor shrinks after a growth, in either mode.
func TestAdaptiveFlatLoadDoesNotOscillate(t *testing.T) {
	for _, prefixes := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefixes=%v", prefixes), func(t *testing.T) {
			s := newSim(m5xlarge, Config{Adaptive: true, PrefixDelegation: prefixes})
			var ev []podEvent
			for i := range 30 {
				ev = append(ev, podEvent{t0.Add(time.Duration(i) * 10 * time.Second), 1})
			}
			for at := t0.Add(10 * time.Minute); at.Before(t0.Add(6 * time.Hour)); at = at.Add(90 * time.Second) {
				ev = append(ev, podEvent{at, -1}, podEvent{at.Add(15 * time.Second), 1})
			}
			applied := replay(t, s, ev, t0.Add(6*time.Hour))
			last := Nothing
			for _, p := range applied {
				if p.Until.Before(t0.Add(time.Hour)) {
					continue
				}
				grow := p.Action == Assign || p.Action == CreateENI
				if (grow && (last == Release || last == DeleteENI)) || (!grow && (last == Assign || last == CreateENI)) {
					t.Errorf("at %v: %v after %v on a flat load: %s", p.Until.Sub(t0), p.Action, last, p.Reason)
				}
				last = p.Action
			}
			if c := Summarize(s.in); c.Assigned != 30 || c.Total-c.Assigned > 16+m5xlarge.SlotsPerENI {
				t.Errorf("end: %+v; want 30 assigned and less than an ENI and a prefix idle", c)
			}
		})
	}
}

// TestAdaptiveConvergesAfterBurst: 10 long-lived pods, then a burst of 40
// pods within 2 s that live 2 minutes: every burst pod gets an address, and
// once the burst is out of memory the pool is back to less than a release
// band (half an ENI's slots) beyond the 10 pods, or one /28 in prefix mode,
// on one ENI (in secondary-IP mode with one more, empty, attached as room
// for a burst), at a fixed point.
func TestAdaptiveConvergesAfterBurst(t *testing.T) {
	for _, prefixes := range []bool{false, true} {
		t.Run(fmt.Sprintf("prefixes=%v", prefixes), func(t *testing.T) {
			s := newSim(m5xlarge, Config{Adaptive: true, PrefixDelegation: prefixes})
			var ev []podEvent
			for i := range 10 {
				ev = append(ev, podEvent{t0.Add(time.Duration(i) * 30 * time.Second), 1})
			}
			burst := t0.Add(20 * time.Minute)
			for i := range 40 {
				at := burst.Add(time.Duration(i) * 50 * time.Millisecond)
				ev = append(ev, podEvent{at, 1})
			}
			for i := range 40 {
				ev = append(ev, podEvent{burst.Add(2*time.Minute + time.Duration(i)*time.Millisecond), -1})
			}
			end := burst.Add(BurstMemory + ChunkMemory + ReleaseDelay + ENIDeleteDelay)
			replay(t, s, ev, end)
			c := Summarize(s.in)
			slack := max(MinBand, ceilDiv(m5xlarge.SlotsPerENI, 2)) - 1
			if prefixes {
				slack = PrefixAddresses
			}
			holding := 0 // ENIs holding addresses; in secondary-IP mode one more, empty, is kept as room
			for _, e := range s.in.ENIs {
				if len(e.Slots) > 0 {
					holding++
				}
			}
			enis := 1
			if !prefixes {
				enis = 2
			}
			if s.in.Pending != 0 || c.Assigned != 10 || c.Total > 10+slack || holding != 1 || c.ENIs > enis {
				t.Errorf("after the burst: pending %d, %+v, %d ENIs holding addresses; want 10 assigned, at most %d held, 1 ENI holding them, at most %d ENIs",
					s.in.Pending, c, holding, 10+slack, enis)
			}
			if p := Next(s.in); p.Action != Nothing || !p.Until.IsZero() {
				t.Errorf("after the burst: %v until %v (%s); want a fixed point", p.Action, p.Until, p.Reason)
			}
		})
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// TestIdleAhead: demand that rose above a level every five minutes is
// expected back at the next five-minute mark; demand that rose once is
// expected to stay away as long again as it has been away.
func TestIdleAhead(t *testing.T) {
	var periodic, once History
	for m := range 21 {
		at := t0.Add(time.Duration(m) * time.Minute)
		high := 5
		if m%5 == 0 {
			high = 20
		}
		periodic = periodic.Record(at).Observe(at, high)
		onceLevel := 5
		if m == 2 {
			onceLevel = 20
		}
		once = once.Record(at).Observe(at, onceLevel)
	}
	now := t0.Add(22 * time.Minute) // the last rise ended at 21m
	if got, want := periodic.idleAhead(now, 10, 0), 3*time.Minute; got != want {
		t.Errorf("periodic: %v; want the rest of the 4-minute gap, %v", got, want)
	}
	if got, want := once.idleAhead(now, 10, 0), 19*time.Minute; got != want {
		t.Errorf("once: %v; want as long again as idle, %v", got, want)
	}
	if got, want := once.idleAhead(now, 10, 5*time.Minute), 5*time.Minute; got != want {
		t.Errorf("once, grown 5 minutes ago: %v; want %v", got, want)
	}
}

// TestIdleAheadOverdue: demand that rose above a level after gaps of 2,
// 4, 6, 8 and 10 minutes and has now been away 7 minutes is expected back
// within the gaps still possible (8 and 10 minutes: 1 or 3 more, the
// upper median of which is taken), not after as long again as it has been away;
// away longer than every gap seen, the pattern is broken and as long again
// is expected.
func TestIdleAheadOverdue(t *testing.T) {
	var h History
	at := t0
	rise := func() {
		h = h.Record(at).Observe(at, 20)
		at = at.Add(time.Minute)
	}
	rise()
	for _, gap := range []int{2, 4, 6, 8, 10} {
		at = at.Add(time.Duration(gap) * time.Minute)
		rise()
	}
	last := at // the end of the last minute above the level
	if got, want := h.idleAhead(last.Add(7*time.Minute), 10, 0), 3*time.Minute; got != want {
		t.Errorf("7 minutes after: %v; want the median of the 1 and 3 minutes left of the 8- and 10-minute gaps, %v", got, want)
	}
	if got, want := h.idleAhead(last.Add(3*time.Minute), 10, 0), 5*time.Minute; got != want {
		t.Errorf("3 minutes after: %v; want the upper median of the 1, 3, 5 and 7 minutes left, %v", got, want)
	}
	if got, want := h.idleAhead(last.Add(11*time.Minute), 10, 0), 11*time.Minute; got != want {
		t.Errorf("11 minutes after: %v; want as long again as idle (longer than every gap), %v", got, want)
	}
}

// TestAdaptiveTimeScale: with a release interval 15 times shorter (the
// demo's 2 s) and pods coming and going 15 times sooner, the pool gives
// back a burst's addresses 15 times sooner, give or take the cloud's
// latencies, which stay: every window and memory of the policy shrinks
// with the interval (before, RateWindow and the per-minute peaks did not,
// and the demo saw no release for two minutes after its scale-down).
func TestAdaptiveTimeScale(t *testing.T) {
	givenBack := func(f float64) time.Duration {
		at := func(d time.Duration) time.Time { return t0.Add(time.Duration(float64(d) * f)) }
		cfg := Config{Adaptive: true, ReleaseInterval: time.Duration(float64(DefaultReleaseInterval) * f)}
		s := newSim(m5xlarge, cfg)
		s.in.Demand.History = NewHistory(cfg)
		s.cooldown = time.Duration(float64(s.cooldown) * f)
		var ev []podEvent
		for i := range 10 {
			ev = append(ev, podEvent{at(time.Duration(i) * 30 * time.Second), 1})
		}
		burst, leave := at(20*time.Minute), at(25*time.Minute)
		for i := range 30 { // 30 pods within 3 s, at any scale
			ev = append(ev, podEvent{burst.Add(time.Duration(i) * 100 * time.Millisecond), 1})
		}
		for i := range 30 {
			ev = append(ev, podEvent{leave.Add(time.Duration(i) * 100 * time.Millisecond), -1})
		}
		var last time.Duration // the last release within 15 minutes (scaled) of the departures
		for _, p := range replay(t, s, ev, at(3*time.Hour)) {
			if (p.Action == Release || p.Action == DeleteENI) && p.Until.After(leave) && !p.Until.After(leave.Add(at(15*time.Minute).Sub(t0))) {
				last = p.Until.Sub(leave)
			}
		}
		if last == 0 {
			t.Fatalf("scale %v: no release after the burst left", f)
		}
		return last
	}
	full, short := givenBack(1), givenBack(1.0/15)
	t.Logf("burst given back %v after it left at 30 s, %v at 2 s", full, short)
	if want := full/15 + ENILatency; short > want {
		t.Errorf("with a 2 s release interval the burst's addresses went back %v after it left; want at most %v (%v/15 and the cloud's latency)", short, want, full)
	}
}

// TestHistoryBefore: the early release compares the addresses assigned
// with the most in use in the minute that held the growth − 90 s, not with
// the minute a burst began in.
func TestHistoryBefore(t *testing.T) {
	base := t0.Truncate(time.Minute)
	var h History
	h = h.Record(base.Add(10*time.Second)).Observe(base.Add(10*time.Second), 20) // minute 0: 20 in use
	h = h.Record(base.Add(70*time.Second)).Observe(base.Add(70*time.Second), 25) // minute 1: a burst begins, 25
	grow := base.Add(100 * time.Second)                                          // growth in minute 1
	if got, ok := h.before(grow); !ok || got != 20 {
		t.Errorf("before(growth at 1m40s) = %d, %v; want 20 (minute 0), true", got, ok)
	}
	if _, ok := h.before(base.Add(5 * time.Minute)); ok {
		t.Errorf("before(5m): a minute with no arrival counted")
	}
}

// cronNode is an m5.large-like node (3 ENIs of 9 addresses, all attached
// and full) with 12 addresses assigned, its pods started by a job every
// minute (3 pods, the pool wanting minuteWant addresses held) and a larger
// one every 5 minutes (5 more pods: 19 in use, the pool wanting jobWant),
// the last of those 4 minutes ago; the pool last grew 30 minutes ago.
func cronNode(minuteWant, jobWant int) Input {
	var h History
	for m := 40; m >= 0; m-- {
		at := t0.Add(-time.Duration(m)*time.Minute - 30*time.Second)
		if m%5 == 3 { // the 5-minute job: t0 − 4 min, − 9 min, ...
			at = at.Add(-30 * time.Second)
			h = arrivals(h, at, at.Add(4*time.Second), 500*time.Millisecond, 19)
			h = h.Want(at.Add(4*time.Second), jobWant)
			continue
		}
		h = arrivals(h, at, at.Add(2*time.Second), time.Second, 15)
		h = h.Want(at.Add(2*time.Second), minuteWant)
	}
	return Input{Now: t0, Limits: Limits{MaxENIs: 3, SlotsPerENI: 9}, Config: Config{Adaptive: true},
		LastGrow: t0.Add(-30 * time.Minute), Demand: Demand{History: h, Bindings: true},
		ENIs: []ENI{
			{ID: "eni-00", Primary: true, Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400000, 9, 9, 0)},
			{ID: "eni-01", Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400100, 9, 3, 0)},
			{ID: "eni-02", Attached: t0.Add(-time.Hour), Slots: slotsOf(0x0a400200, 9, 0, 0)},
		}}
}

// TestNoReleaseTheNextJobAssignsBack: addresses the pool wanted held at
// every 5-minute job (its pods and their margin) stay between the jobs: a
// release now would be assigned back at the next one, a minute away, two
// calls for four address-minutes. Where the jobs wanted no more than their
// pods, the same pool gives the surplus back.
func TestNoReleaseTheNextJobAssignsBack(t *testing.T) {
	if p := Next(cronNode(17, 23)); p.Action == Release {
		t.Errorf("released %d addresses the next job wants (%s)", len(p.Release), p.Reason)
	}
	p := Next(cronNode(15, 19))
	if p.Action != Release {
		t.Errorf("%v (%s); want a release down to what the jobs wanted", p.Action, p.Reason)
	}
	if p := Next(cronNode(17, 23)); p.Wanted <= 12 {
		t.Errorf("Plan.Wanted %d; want the 12 assigned plus low", p.Wanted)
	}
}

// TestHistoryWant: what the pool wanted is kept per minute, the most of
// the minute, only in a minute a pod arrived in (a quiet node's margin is
// not demand), and idleAheadWant finds the next minute above a level after
// the usual gap.
func TestHistoryWant(t *testing.T) {
	var h History
	h = h.Want(t0.Add(-20*time.Minute), 30) // no arrival yet: not kept
	for _, m := range []int{14, 9, 4} {
		at := t0.Add(-time.Duration(m) * time.Minute)
		h = h.Record(at).Observe(at, 3).Want(at, 8).Want(at.Add(time.Second), 6)
	}
	h = h.Want(t0.Add(-time.Minute), 30) // a minute without arrivals
	for _, p := range h.peaks {
		if p.want != 0 && p.want != 8 {
			t.Errorf("minute %s: want %d; want 8 (the most of a minute with arrivals)", p.minute, p.want)
		}
	}
	// Above 7 every 5 minutes, the last 4 minutes ago (its minute ended
	// 3 ago, 4 minutes between such minutes): next due in 1 minute.
	// Nothing above 8.
	if got := h.idleAheadWant(t0, 7, 0); got != time.Minute {
		t.Errorf("idleAheadWant(7) = %s; want 1m0s", got)
	}
	if got := h.idleAheadWant(t0, 8, 0); got < 14*time.Minute {
		t.Errorf("idleAheadWant(8) = %s; want at least the 14 minutes remembered", got)
	}
}

// TestGrowthUpToTheRecentWant: where the pool wanted 26 addresses held at
// every 5-minute job, a growth at the next job asks for what brings it
// there in one call, more than high alone (7 here): the job's later pods
// would take another call. An ENI a release emptied, past FillSpan, is
// filled to that, not whole (9).
func TestGrowthUpToTheRecentWant(t *testing.T) {
	in := cronNode(17, 26)
	// 16 assigned, 2 free, eni-02 emptied by a release: short at a job.
	in.ENIs[1].Slots = slotsOf(0x0a400100, 9, 7, 0)
	in.ENIs[2].Slots = nil
	in.Pending = 2
	in.Demand.History = in.Demand.History.Record(t0).Record(t0).Observe(t0, 16)
	p := Next(in)
	if p.Action != Assign || p.ENI != "eni-02" || p.Count != 8 {
		t.Errorf("%v %s %d (%s); want Assign of 8 on eni-02 (18 held, 26 wanted)", p.Action, p.ENI, p.Count, p.Reason)
	}
}

// TestOneOffPeakSizesNoGrowth: a peak the pool wanted once (40 addresses,
// 50 minutes ago) does not size a growth now (high's few): only demand
// that came back does (the same peak twice: the ENI's 12 of room), also
// an hourly one (two rollouts within WantMemory), not one older.
func TestOneOffPeakSizesNoGrowth(t *testing.T) {
	for _, c := range []struct {
		name  string
		peaks []time.Duration // before t0, each a minute of arrivals wanting 40
		more  bool            // growth beyond high
	}{
		{"once", []time.Duration{50 * time.Minute}, false},
		{"twice", []time.Duration{50 * time.Minute, 20 * time.Minute}, true},
		{"an hourly rollout's last two", []time.Duration{125 * time.Minute, 65 * time.Minute}, true},
		{"twice, beyond WantMemory", []time.Duration{WantMemory + 20*time.Minute, WantMemory + 5*time.Minute}, false},
	} {
		var h History
		for _, ago := range c.peaks {
			at := t0.Add(-ago)
			h = arrivals(h, at, at.Add(30*time.Second), 5*time.Second, 30).Want(at.Add(30*time.Second), 40)
		}
		h = h.Record(t0).Observe(t0, 15)
		in := Input{Now: t0, Limits: xlarge, Config: Config{Adaptive: true}, LastGrow: t0.Add(-20 * time.Minute),
			LastRelease: t0.Add(-10 * time.Minute), Pending: 1, Demand: Demand{History: h, Bindings: true},
			ENIs: []ENI{
				{ID: "eni-00", Primary: true, Attached: t0.Add(-2 * time.Hour), Slots: slotsOf(0x0a400000, 14, 14, 0)},
				{ID: "eni-01", Attached: t0.Add(-2 * time.Hour), Slots: slotsOf(0x0a400100, 2, 1, 0)},
			}}
		p := Next(in)
		if p.Action != Assign {
			t.Fatalf("%s: %v (%s); want an assign", c.name, p.Action, p.Reason)
		}
		if more := p.Count > 6; more != c.more {
			t.Errorf("%s: assign %d (%s); want beyond high %v", c.name, p.Count, p.Reason, c.more)
		}
	}
}

// TestHistoryTimeGoingBack: a plan's now may come a little before an ADD
// recorded in the next minute (Cycle reads the clock, Arrived runs, Input
// observes at the earlier now). A minute BurstMemory before the latest
// time recorded is out of every reckoning but wantAgain's, as when it was
// dropped, whatever time comes after.
func TestHistoryTimeGoingBack(t *testing.T) {
	var h History
	old := t0.Add(-BurstMemory).Add(time.Second)
	h = h.Record(old).Observe(old, 30)
	now, rec := t0.Add(-10*time.Millisecond), t0.Add(10*time.Millisecond)
	h = h.Record(rec).Observe(now, 5)
	if got := h.idleAhead(now, 10, 0); got != 0 {
		t.Errorf("idleAhead(10) = %s; want 0 (the minute that held 30 is older than BurstMemory)", got)
	}
	if got := h.peak(now, BurstMemory); got != 5 {
		t.Errorf("peak = %d; want 5", got)
	}
}

// TestEmptiedENISizedByPeaksItCovers: an ENI a release emptied is sized by
// the peaks that came back also where this growth covers them (the node
// holds 18, the jobs wanted 20, high asks for a few): it gets what high
// asks, not all its slots. Filling it whole (9) left a surplus below the
// release band on it once the job was gone. Where no peak came back above
// what the node holds, nothing sizes it: it is filled whole, as before; so
// it is without the pod watch, where the whole ENI is the buffer for a
// burst's later pods, which no binding shows ahead of their ADDs.
func TestEmptiedENISizedByPeaksItCovers(t *testing.T) {
	for _, c := range []struct {
		name        string
		minute, job int
		noWatch     bool
		whole       bool
	}{
		{"the jobs wanted 20", 17, 20, false, false},
		{"the jobs wanted what the node holds", 17, 18, false, true},
		{"the jobs wanted 20, no pod watch", 17, 20, true, true},
	} {
		in := cronNode(c.minute, c.job)
		in.Demand.Bindings = !c.noWatch
		in.ENIs[1].Slots = slotsOf(0x0a400100, 9, 7, 0)
		in.ENIs[2].Slots = nil
		in.Pending = 2
		in.Demand.History = in.Demand.History.Record(t0).Record(t0).Observe(t0, 16)
		p := Next(in)
		if p.Action != Assign || p.ENI != "eni-02" {
			t.Fatalf("%s: %v %s %d (%s); want an assign on eni-02", c.name, p.Action, p.ENI, p.Count, p.Reason)
		}
		if whole := p.Count == 9; whole != c.whole {
			t.Errorf("%s: assign %d (%s); want all 9 slots %v", c.name, p.Count, p.Reason, c.whole)
		}
	}
}
