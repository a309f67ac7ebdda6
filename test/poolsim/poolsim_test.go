package poolsim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// TestClockParksGoroutines: a goroutine sleeping on the clock lets events
// due meanwhile run, and resumes at its wake-up time.
func TestClockParksGoroutines(t *testing.T) {
	c := NewClock()
	var woke time.Time
	var seen []bool
	c.At(Epoch.Add(time.Second), func() { seen = append(seen, !woke.IsZero()) })
	c.At(Epoch.Add(3*time.Second), func() { seen = append(seen, !woke.IsZero()) })
	c.Go(func() {
		c.Sleep(2 * time.Second)
		woke = c.Now()
	})
	c.Run(Epoch.Add(time.Hour))
	if !woke.Equal(Epoch.Add(2*time.Second)) || len(seen) != 2 || seen[0] || !seen[1] {
		t.Errorf("woke at %v, events saw it woken %v; want 2s, [false true]", woke.Sub(Epoch), seen)
	}
}

// TestCloudLimitsAndCalls: the cloud refuses beyond the instance's limits
// and counts mutating calls as EC2 bills them (a refused assign counts
// too).
func TestCloudLimitsAndCalls(t *testing.T) {
	c := NewClock()
	cloud := NewCloud(c, InstanceTypes[0], DefaultLatencies, nil) // m5.large: 3 ENIs × 9
	var errs []error
	c.Go(func() {
		ctx := context.Background()
		_, err := cloud.AssignAddresses(ctx, cloud.enis[0].ID, 10, false)
		errs = append(errs, err)
		for range 3 {
			_, err = cloud.CreateENI(ctx, provider.CreateENIRequest{Addresses: 9})
			errs = append(errs, err)
		}
	})
	c.Run(Epoch.Add(time.Hour))
	if !errors.Is(errs[0], provider.ErrAddressLimit) || errs[1] != nil || errs[2] != nil || !errors.Is(errs[3], provider.ErrENILimit) {
		t.Errorf("errors %v; want address limit, nil, nil, ENI limit", errs)
	}
	if by, n := cloud.Calls(); by["CreateNetworkInterface"] != 3 || by["AttachNetworkInterface"] != 3 || by["ModifyNetworkInterfaceAttribute"] != 2 ||
		by["DeleteNetworkInterface"] != 1 || n != 10 { // the refused attach deletes the new ENI again
		t.Errorf("calls %v (%d)", by, n)
	}
	if cloud.Held() != 2*9+2 {
		t.Errorf("held %d; want 20 (two ENIs of 9 and their primaries)", cloud.Held())
	}
}

// gate is a pool that has no address until open.
type gate struct {
	c    *Clock
	open time.Time
}

func (g *gate) Start(context.Context) error                               { return nil }
func (g *gate) Assign(string, time.Time) bool                             { return !g.c.Now().Before(g.open) }
func (g *gate) Release(string, time.Time)                                 {}
func (g *gate) Cycle(context.Context, func() Demand) (next time.Duration) { return time.Minute }

// TestADDWaitsAndKubeletBacksOff: an ADD waits in the daemon up to AddWait;
// without it, a failed ADD is retried by kubelet after 10 s, then 20 s.
func TestADDWaitsAndKubeletBacksOff(t *testing.T) {
	tr := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: 0, Life: time.Minute}}}
	for _, tc := range []struct {
		name     string
		beh      Behaviour
		open     time.Duration
		min, max time.Duration
	}{
		{"waits in the daemon", Behaviour{AddWait: 5 * time.Second}, 2 * time.Second, 2 * time.Second, 2*time.Second + pollEvery},
		{"fails at once, kubelet retries after 10 s", Behaviour{}, 2 * time.Second, 10 * time.Second, 15 * time.Second},
		{"second retry after 20 s more", Behaviour{}, 12 * time.Second, 30 * time.Second, 45 * time.Second},
	} {
		res, err := Simulate(tr, InstanceTypes[0], DefaultLatencies, tc.beh, 1, func(c *Clock, _ *Cloud) (Pool, error) {
			return &gate{c: c, open: c.Now().Add(tc.open)}, nil
		})
		if err != nil || res.Waited != 1 || len(res.Waits) != 1 {
			t.Fatalf("%s: %+v, %v", tc.name, res, err)
		}
		if w := time.Duration(res.Waits[0] * float64(time.Second)); w < tc.min || w > tc.max {
			t.Errorf("%s: waited %v; want %v–%v", tc.name, w, tc.min, tc.max)
		}
	}
}

// TestTracesAreBoundedAndSeeded: every generator is deterministic for a
// seed and never binds more pods than the node's capacity.
func TestTracesAreBoundedAndSeeded(t *testing.T) {
	for _, g := range Generators {
		a, b := g.Trace(7, 56), g.Trace(7, 56)
		if len(a.Pods) == 0 || len(a.Pods) != len(b.Pods) || a.Pods[len(a.Pods)-1] != b.Pods[len(b.Pods)-1] {
			t.Errorf("%s: not deterministic or empty (%d, %d pods)", g.Name, len(a.Pods), len(b.Pods))
		}
		var ends []time.Duration
		for _, p := range a.Pods {
			n := 0
			for _, e := range ends {
				if e > p.Arrive {
					n++
				}
			}
			if n >= 56 {
				t.Fatalf("%s: pod at %v arrives with %d running", g.Name, p.Arrive, n)
			}
			ends = append(ends, p.Arrive+p.Life)
		}
	}
}

// TestMinIdleHours: the bound on hand-made curves, in secondary-IP mode
// with large ENIs: 5 addresses for an hour, then 10 for an hour.
func TestMinIdleHours(t *testing.T) {
	at := func(h float64) time.Time { return Epoch.Add(time.Duration(h * float64(time.Hour))) }
	levels := []Level{{At: Epoch}, {At: at(0), InUse: 5, Assigned: 5}, {At: at(1), InUse: 10, Assigned: 10}}
	end := at(2)
	for _, tc := range []struct {
		name                  string
		calls, unit, slotsENI int
		want                  float64
	}{
		{"one call: 10 held for two hours", 1, 1, 100, 5},
		{"two calls: exactly the demand", 2, 1, 100, 0},
		{"no call: nothing can be held", 0, 1, 100, math.Inf(1)},
		{"prefix mode: 16 each hour", 1, 16, 100, 32 - 15},
		{"ENIs of 6: the second ENI costs 3 calls and its primary address", 4, 1, 6, 1},
		{"ENIs of 6, 3 calls: the new ENI's 6 slots hold the first hour, not the second", 3, 1, 6, math.Inf(1)},
		{"ENIs of 6, 2 calls: 10 on the primary ENI alone cannot be held", 2, 1, 6, math.Inf(1)},
	} {
		got, ok := MinIdleHours(levels, end, tc.calls, tc.unit, tc.slotsENI, 4, 1e6)
		if !ok || math.Abs(got-tc.want) > 1e-9 && !(math.IsInf(got, 1) && math.IsInf(tc.want, 1)) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
	// 10 addresses from the start on ENIs of 6: the new ENI brings 6, the
	// other 4 need an assign on the primary ENI, so 3 calls hold nothing.
	flat := []Level{{At: Epoch, InUse: 10, Assigned: 10}}
	if got, _ := MinIdleHours(flat, end, 3, 1, 6, 4, 1e6); !math.IsInf(got, 1) {
		t.Errorf("flat 10 on ENIs of 6 with 3 calls: %v; want +Inf (the primary ENI's assign is a fourth call)", got)
	}
	if got, _ := MinIdleHours(flat, end, 4, 1, 6, 4, 1e6); math.Abs(got-2) > 1e-9 {
		t.Errorf("flat 10 on ENIs of 6 with 4 calls: %v; want 2 (the second ENI's primary address for two hours)", got)
	}
	if _, ok := MinIdleHours(levels, end, 2, 1, 100, 4, 10); ok {
		t.Error("computed beyond maxWork")
	}
}

// watcher is a pool that always has an address and records, at each
// cycle, the pods the daemon's watch shows without one, and each ADD.
type watcher struct {
	c      *Clock
	seen   []time.Duration // cycle times (from Epoch) that saw Unaddressed > 0
	assign []time.Duration // ADD times
}

func (w *watcher) Start(context.Context) error { return nil }
func (w *watcher) Assign(string, time.Time) bool {
	w.assign = append(w.assign, w.c.Now().Sub(Epoch))
	return true
}
func (w *watcher) Release(string, time.Time) {}
func (w *watcher) Cycle(_ context.Context, demand func() Demand) time.Duration {
	if demand().Unaddressed > 0 {
		w.seen = append(w.seen, w.c.Now().Sub(Epoch))
	}
	return time.Minute
}

// TestSandboxLagAndWatch: kubelet's first ADD runs 3/4–5/4 of SandboxLag
// after the bind; with the Kubernetes part, the pool is kicked WatchDelay
// after the bind and sees the pod without an address before its ADD.
func TestSandboxLagAndWatch(t *testing.T) {
	tr := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: time.Minute, Life: time.Minute}}}
	var w *watcher
	const lag = time.Second
	_, err := Simulate(tr, InstanceTypes[0], DefaultLatencies, Behaviour{Kick: true, Kube: true, SandboxLag: lag, SandboxLagPerPod: DefaultSandboxLagPerPod}, 1,
		func(c *Clock, _ *Cloud) (Pool, error) { w = &watcher{c: c}; return w, nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(w.assign) != 1 || w.assign[0] < time.Minute+3*lag/4 || w.assign[0] > time.Minute+5*lag/4 {
		t.Fatalf("ADDs at %v; want one 0.75–1.25 s after the bind at 1m", w.assign)
	}
	if len(w.seen) == 0 || w.seen[0] != time.Minute+WatchDelay || w.seen[len(w.seen)-1] >= w.assign[0] {
		t.Errorf("cycles seeing the bound pod at %v; want from 1m%v, before its ADD at %v", w.seen, WatchDelay, w.assign[0])
	}
}

// TestSandboxLagQueue: pods bound at once reach their first ADD one
// SandboxLagPerPod apart on top of their own lag (the burst
// TestClusterLeadTime measured), a pod bound after the queue drained has
// its own lag alone, and every pool sees the same lags.
func TestSandboxLagQueue(t *testing.T) {
	var pods []Pod
	for range 24 {
		pods = append(pods, Pod{Arrive: time.Minute, Life: time.Hour})
	}
	pods = append(pods, Pod{Arrive: 2 * time.Minute, Life: time.Hour})
	beh := Behaviour{SandboxLag: DefaultSandboxLag, SandboxLagPerPod: DefaultSandboxLagPerPod}
	lags := sandboxLags(pods, beh, rand.New(rand.NewPCG(1, 11)))
	for i, l := range lags[:24] {
		queue := time.Duration(i) * DefaultSandboxLagPerPod
		if l < queue+3*DefaultSandboxLag/4 || l > queue+5*DefaultSandboxLag/4 {
			t.Errorf("burst pod %d: lag %v, want %v plus 3/4–5/4 of %v", i, l, queue, DefaultSandboxLag)
		}
	}
	if l := lags[24]; l < 3*DefaultSandboxLag/4 || l > 5*DefaultSandboxLag/4 {
		t.Errorf("lone pod after the burst: lag %v, want 3/4–5/4 of %v", l, DefaultSandboxLag)
	}
	if again := sandboxLags(pods, beh, rand.New(rand.NewPCG(1, 11))); !slices.Equal(again, lags) {
		t.Errorf("lags differ between runs of the same seed")
	}
}

// TestMinIdleHoursNotBelowTheFloor: on random curves with pods in their
// cooldown, in both modes, the bound is never below the floor of the same
// curve (Result.FloorHours: the in-use addresses in whole slots and the
// primary addresses of the ENIs they need, less those assigned). Both
// count cooling addresses as idle, as Result.IdleHours does; before, the
// bound did not, and bench-pool printed it below the floor on four rows.
func TestMinIdleHoursNotBelowTheFloor(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const slotsENI, maxENIs = 14, 4
	for trial := range 40 {
		unit := []int{1, 16}[trial%2]
		var levels []Level
		at := Epoch
		assigned, cooling := 0, 0
		for range 30 {
			assigned = max(0, min(assigned+r.IntN(11)-5, 50))
			cooling = r.IntN(6)
			levels = append(levels, Level{At: at, InUse: assigned + cooling, Assigned: assigned})
			at = at.Add(time.Duration(1+r.IntN(20)) * time.Minute)
		}
		end := at
		floor := curveFloor(levels, end, unit, slotsENI)
		got, ok := MinIdleHours(levels, end, 60, unit, slotsENI, maxENIs, 1e9)
		if !ok || got < floor-1e-9 {
			t.Errorf("trial %d, unit %d: bound %.3f (ok %v) below the floor %.3f", trial, unit, got, ok, floor)
		}
	}
}

// curveFloor is Result.FloorHours computed on levels until end: at each
// instant the addresses in use in whole slots of unit, plus the primary
// address of each ENI (of slotsENI slots) beyond the first, less those
// assigned.
func curveFloor(levels []Level, end time.Time, unit, slotsENI int) float64 {
	floor := 0.0
	for i, l := range levels {
		until := end
		if i+1 < len(levels) {
			until = levels[i+1].At
		}
		slots := (l.InUse + unit - 1) / unit
		enis := max((slots+slotsENI-1)/slotsENI, 1)
		floor += float64(slots*unit+enis-1-l.Assigned) * until.Sub(l.At).Hours()
	}
	return floor
}

// TestCoarseMinIdleHours: the coarse bound is never above the exact one
// nor below the floor on random curves, whatever the number of blocks, and
// on a hand-made curve it is what the pieces hold.
func TestCoarseMinIdleHours(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 60 {
		unit := []int{1, 16}[trial%2]
		slotsENI := []int{14, 1000}[trial/2%2]
		var levels []Level
		at := Epoch
		assigned := 0
		for range 25 {
			assigned = max(0, min(assigned+r.IntN(11)-5, 50))
			levels = append(levels, Level{At: at, InUse: assigned + r.IntN(6), Assigned: assigned})
			if r.IntN(4) > 0 { // else the next level is at the same instant
				at = at.Add(time.Duration(1+r.IntN(20)) * time.Minute)
			}
		}
		end := at.Add(time.Minute)
		floor := curveFloor(levels, end, unit, slotsENI)
		calls := r.IntN(12)
		exact, ok := MinIdleHours(levels, end, calls, unit, slotsENI, 4, 1e9)
		if !ok {
			t.Fatalf("trial %d: no exact bound", trial)
		}
		for _, work := range []float64{1e9, 2000, 300, 20} {
			got, ok := CoarseMinIdleHours(levels, end, calls, unit, slotsENI, 4, work)
			if !ok || got > exact+1e-9 || got < floor-1e-9 && !math.IsInf(got, 1) {
				t.Errorf("trial %d (unit %d, %d calls, work %v): coarse %.3f, exact %.3f, floor %.3f", trial, unit, calls, work, got, exact, floor)
			}
		}
	}
	// 5 in use for an hour, 10 for the next, then 5 for an hour: with 3
	// calls the pieces hold the demand, with 1 the peak throughout.
	h := func(x float64) time.Time { return Epoch.Add(time.Duration(x * float64(time.Hour))) }
	levels := []Level{{At: h(0), InUse: 5, Assigned: 5}, {At: h(1), InUse: 10, Assigned: 10}, {At: h(2), InUse: 5, Assigned: 5}}
	if got, _ := CoarseMinIdleHours(levels, h(3), 3, 1, 100, 1, 1e6); math.Abs(got) > 1e-9 {
		t.Errorf("3 calls: %v; want 0", got)
	}
	if got, _ := CoarseMinIdleHours(levels, h(3), 1, 1, 100, 1, 1e6); math.Abs(got-10) > 1e-9 {
		t.Errorf("1 call: %v; want 10 (10 held for three hours)", got)
	}
	if got, _ := CoarseMinIdleHours(levels, h(3), 0, 1, 100, 1, 1e6); !math.IsInf(got, 1) {
		t.Errorf("no call: %v; want +Inf", got)
	}
	if _, ok := CoarseMinIdleHours(levels, h(3), 1, 0, 100, 1, 1e6); ok {
		t.Error("unit 0 accepted")
	}
	// The first demand taken back at its instant: nothing is in use until
	// the next level, which holds nothing either, so no call is needed.
	m := func(x float64) time.Time { return Epoch.Add(time.Duration(x * float64(time.Minute))) }
	back := []Level{{At: m(13), InUse: 5, Assigned: 5}, {At: m(13), InUse: 0}, {At: m(13.1), InUse: 2}}
	if got, ok := CoarseMinIdleHours(back, m(13.1), 0, 1, 3, 4, 1e6); !ok || got != 0 {
		t.Errorf("demand taken back at its instant: coarse %v, %v; want 0", got, ok)
	}
}

// TestTwinFill: the twin continues a fill to capacity, one pod every 10 s
// after the last (or from the time given, if later), each staying to the
// end; traces with a pod that leaves, already at capacity, or whose twin
// would not fit before the end, have none.
func TestTwinFill(t *testing.T) {
	a := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: time.Second, Life: time.Hour - time.Second}, {Arrive: 5 * time.Second, Life: time.Hour - 5*time.Second}}}
	twin, ok := TwinFill(a, 4, 0)
	if !ok || len(twin.Pods) != 4 {
		t.Fatalf("twin %v, %v; want 4 pods", twin.Pods, ok)
	}
	for i, want := range []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, 25 * time.Second} {
		if p := twin.Pods[i]; p.Arrive != want || p.Arrive+p.Life != time.Hour {
			t.Errorf("pod %d: %v for %v; want from %v to the end", i, p.Arrive, p.Life, want)
		}
	}
	if len(a.Pods) != 2 {
		t.Errorf("the trace changed: %d pods", len(a.Pods))
	}
	if _, ok := TwinFill(a, 2, 0); ok {
		t.Error("a twin of a trace already at capacity")
	}
	// t_E after the last pod's binding (its ADD queued behind others):
	// the twin's pods come only after it, so no pool sees them sooner.
	late, ok := TwinFill(a, 4, 2*time.Minute)
	if !ok || len(late.Pods) != 4 || late.Pods[2].Arrive != 2*time.Minute || late.Pods[3].Arrive != 2*time.Minute+10*time.Second {
		t.Errorf("twin from 2m: %v, %v; want pods at 2m and 2m10s", late.Pods, ok)
	}
	if _, ok := TwinFill(a, 4, time.Hour-5*time.Second); ok {
		t.Error("a twin whose pods would arrive after the end")
	}
	leaves := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: time.Second, Life: time.Minute}}}
	if _, ok := TwinFill(leaves, 4, 0); ok {
		t.Error("a twin of a trace whose pod leaves")
	}
}

// TestTwinAfter: the twin adds pods every 10 s from the given time, each
// staying to the end; none that would arrive after the trace's end.
func TestTwinAfter(t *testing.T) {
	a := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: time.Second, Life: time.Minute}}}
	twin, ok := TwinAfter(a, 2*time.Minute, 3)
	if !ok || len(twin.Pods) != 4 || len(a.Pods) != 1 {
		t.Fatalf("twin %v, %v (trace %d pods); want 4 pods, the trace unchanged", twin.Pods, ok, len(a.Pods))
	}
	for i, want := range []time.Duration{2 * time.Minute, 2*time.Minute + 10*time.Second, 2*time.Minute + 20*time.Second} {
		if p := twin.Pods[i+1]; p.Arrive != want || p.Arrive+p.Life != time.Hour {
			t.Errorf("pod %d: %v for %v; want from %v to the end", i+1, p.Arrive, p.Life, want)
		}
	}
	if _, ok := TwinAfter(a, 59*time.Minute+55*time.Second, 2); ok {
		t.Error("a twin whose pod arrives after the end")
	}
	if _, ok := TwinAfter(a, time.Minute, 0); ok {
		t.Error("a twin with no pod more")
	}
}

// TestTwinBound: on a curve whose pods leave (ENIs of 3; 7 in use from
// minute 6, the third ENI first needed then; 3 from minute 30, one address
// cooling for a minute) with a twin of 8, 8 addresses and two ENI
// primaries are held from minute 6 to the end: idle 3 × 24 + 7 × 1 + 7 ×
// 29 address-minutes.
func TestTwinBound(t *testing.T) {
	at := func(m int) time.Time { return Epoch.Add(time.Duration(m) * time.Minute) }
	var levels []Level
	for i := range 7 {
		levels = append(levels, Level{At: at(i), InUse: i + 1, Assigned: i + 1})
	}
	levels = append(levels, Level{At: at(30), InUse: 4, Assigned: 3}, Level{At: at(31), InUse: 3, Assigned: 3})
	got, ok := TwinBound(levels, at(60), 8, 7, 7, 3, 4)
	if want := float64(3*24+7+7*29) / 60; !ok || math.Abs(got-want) > 1e-9 {
		t.Errorf("bound %v, %v; want %v", got, ok, want)
	}
	if from, ok := TwinFrom(levels, Epoch, 3); !ok || from != 6*time.Minute {
		t.Errorf("t_E %v, %v; want 6m0s", from, ok)
	}
	if _, ok := TwinFillBound(levels, at(60), 8, 7, 7, 3, 4); ok {
		t.Error("TwinFillBound on a curve whose pods leave")
	}
	for _, tc := range []struct {
		name            string
		peak, callsTwin int
	}{{"a call to spare on the twin", 8, 8}, {"the twin no larger", 7, 7}, {"the twin needs a fourth ENI", 10, 7}} {
		if got, ok := TwinBound(levels, at(60), tc.peak, 7, tc.callsTwin, 3, 4); ok {
			t.Errorf("%s: bound %v; want none", tc.name, got)
		}
	}
}

// TestTwinFillBound: on a hand-made fill of 7 addresses, one a minute,
// with ENIs of 3 (the third ENI is first needed at minute 6) and a twin of
// 8: from minute 6 to the end (54 minutes) 8 addresses and two ENI
// primaries are held, 7 assigned.
func TestTwinFillBound(t *testing.T) {
	at := func(m int) time.Time { return Epoch.Add(time.Duration(m) * time.Minute) }
	var levels []Level
	for i := range 7 {
		levels = append(levels, Level{At: at(i), InUse: i + 1, Assigned: i + 1})
	}
	end := at(60)
	got, ok := TwinFillBound(levels, end, 8, 7, 7, 3, 4)
	if want := 3 * 0.9; !ok || math.Abs(got-want) > 1e-9 {
		t.Errorf("bound %v, %v; want %v", got, ok, want)
	}
	if GrowthCalls(3) != 7 || GrowthCalls(1) != 1 {
		t.Errorf("GrowthCalls(3) %d, (1) %d; want 7, 1", GrowthCalls(3), GrowthCalls(1))
	}
	left := slices.Clone(levels)
	left[4].InUse, left[4].Assigned = 2, 2 // pods left
	cooling := slices.Clone(levels)
	cooling[5].Assigned--
	for _, tc := range []struct {
		name                  string
		levels                []Level
		twin, calls, twinCall int
		maxENIs               int
	}{
		{"a call to spare on the trace", levels, 8, 8, 7, 4},
		{"a call to spare on the twin", levels, 8, 7, 8, 4},
		{"the twin needs a fourth ENI", levels, 10, 7, 7, 4},
		{"the twin no larger", levels, 7, 7, 7, 4},
		{"beyond the ENI limit", levels, 8, 7, 7, 2},
		{"pods left", left, 8, 7, 7, 4},
		{"an address cooling", cooling, 8, 7, 7, 4},
	} {
		if got, ok := TwinFillBound(tc.levels, end, tc.twin, tc.calls, tc.twinCall, 3, tc.maxENIs); ok {
			t.Errorf("%s: bound %v; want none", tc.name, got)
		}
	}
}
