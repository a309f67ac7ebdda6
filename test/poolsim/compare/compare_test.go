package compare

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/vpcip/vpcip/test/poolsim"
)

// TestTableSmoke runs the rollout trace on an m5.large in both modes: every
// pool starts every pod, the runs are deterministic, and the printed table
// has a row per run with the ratios.
func TestTableSmoke(t *testing.T) {
	o := Options{Seed: 3, Traces: poolsim.Generators[1:2], Types: poolsim.InstanceTypes[:1]}
	a, b := Table(o), Table(o)
	if len(a) != 2 {
		t.Fatalf("%d rows; want 2", len(a))
	}
	for i, r := range a {
		if r.Err != nil {
			t.Fatalf("%s/%s: %v", r.Trace, r.Type, r.Err)
		}
		for j, res := range r.Results {
			if res.Starts == 0 || res.Unstarted != 0 {
				t.Errorf("%s %v %s: %d starts, %d never started", r.Trace, r.Prefix, Setups[j].Name, res.Starts, res.Unstarted)
			}
			if res.IdleHours != b[i].Results[j].IdleHours || res.Calls != b[i].Results[j].Calls || res.Waited != b[i].Results[j].Waited {
				t.Errorf("%s %v %s: two runs differ", r.Trace, r.Prefix, Setups[j].Name)
			}
		}
	}
	for _, r := range a {
		ref := r.Results[0]
		if tgt := r.IdleTarget(); tgt < 0.5*ref.IdleHours || (!math.IsNaN(r.Bound) && tgt < r.Bound+0.1*ref.IdleHours) || tgt < floor(r)+0.1*ref.IdleHours {
			t.Errorf("%s: idle target %.1f below max(0.5× %.1f, bound %.1f (floor %.1f) + 10 %%)", rowName(r), tgt, ref.IdleHours, r.Bound, floor(r))
		}
		if got, want := OnPath(ref), float64(ref.Waited)/float64(ref.Starts); got != want {
			t.Errorf("%s: OnPath %v, want waited/starts %v", rowName(r), got, want)
		}
	}
	var out bytes.Buffer
	Print(&out, a)
	Summary(&out, a)
	if !strings.Contains(out.String(), "per-row targets of the default") || !strings.Contains(out.String(), "EC2 call on their path") ||
		!strings.Contains(out.String(), "per-row targets not met where no bound shows them out of reach") {
		t.Errorf("summary lacks the per-row targets or the on-path share:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "ours default, no Kubernetes part") || !strings.Contains(out.String(), "default without the Kubernetes part") {
		t.Errorf("table or summary lacks our default without the Kubernetes part:\n%s", out.String())
	}
	if got := strings.Count(out.String(), "rollout  m5.large"); got != 2 {
		t.Errorf("table has %d rollout rows:\n%s", got, out.String())
	}
}

// TestBoundOnOurCurveWhereTheReferenceWaited: on batch/m5.4xlarge/ip (seed
// 1) the reference default makes pods wait and ours makes none, so the
// bound is computed on our run's demand curve, with the reference's count
// of calls, and lies between the floor and our own idle (our run is one of
// the pools it bounds only if it made no more calls; the floor bounds all).
func TestBoundOnOurCurveWhereTheReferenceWaited(t *testing.T) {
	rows := Table(Options{Seed: 1, Traces: poolsim.Generators[2:3], Types: poolsim.InstanceTypes[2:3], Modes: []bool{false}})
	r := rows[0]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	ref, ours := r.Results[0], r.Results[2]
	if ref.Waited == 0 || ours.Waited > 0 {
		t.Fatalf("reference waited %d, ours %d: the test needs a row where only the reference made pods wait", ref.Waited, ours.Waited)
	}
	if r.BoundOn != "ours" || math.IsNaN(r.Bound) {
		t.Fatalf("bound %v on %q; want one on our curve", r.Bound, r.BoundOn)
	}
	if r.Bound < floor(r)-1e-9 {
		t.Errorf("bound %.2f below the floor %.2f", r.Bound, floor(r))
	}
	if ours.Calls <= ref.Calls && r.Bound > ours.IdleHours+1e-9 {
		t.Errorf("bound %.2f above our idle %.2f with no more calls (%d ≤ %d)", r.Bound, ours.IdleHours, ours.Calls, ref.Calls)
	}
	if got, want := r.IdleTarget(), max(0.5*ref.IdleHours, r.Bound+0.1*ref.IdleHours); got != want {
		t.Errorf("idle target %.2f; want %.2f", got, want)
	}
}

// TestOnlineBoundBelowRealPools: on the fill, rollout and steady rows in
// secondary-IP mode, every pool of the table that makes no pod wait and
// the fewest calls growth takes on the trace and on its twin
// (Row.OnlineTwin) holds at least Row.Online on the trace (the argument's
// premise, so a bound above one of them would be wrong: the reference
// always does, and on a fill ours too); on
// fill/m5.large, rollout/m5.xlarge and steady/m5.xlarge the bound is
// above the idle target.
func TestOnlineBoundBelowRealPools(t *testing.T) {
	var gens []poolsim.Generator
	for _, g := range poolsim.Generators {
		if g.Name == "fill" || g.Name == "rollout" || g.Name == "steady" {
			gens = append(gens, g)
		}
	}
	o := Options{Seed: 1, Traces: gens, Types: poolsim.InstanceTypes[:3], Modes: []bool{false}}
	rows := Table(o)
	checked := 0
	named, premise := map[string]bool{}, map[string]int{}
	for _, r := range rows {
		if r.Err != nil {
			t.Fatalf("%s: %v", rowName(r), r.Err)
		}
		if math.IsNaN(r.Online) {
			if r.Trace == "fill" {
				t.Errorf("%s: no online bound", rowName(r))
			}
			continue
		}
		named[rowName(r)] = r.OutOfReachOnline()
		typ := o.Types[slices.IndexFunc(o.Types, func(x poolsim.InstanceType) bool { return x.Name == r.Type })]
		slots := typ.Limits.PodAddressesPerENI()
		top := poolsim.PeakInUse(r.Results[0].Levels)
		growth := poolsim.GrowthCalls((top + slots - 1) / slots)
		for si, s := range Setups {
			res := r.Results[si]
			tres, err := Run(r.OnlineTwin, typ, false, s, o.Lat, o.Seed)
			if err != nil {
				t.Fatal(err)
			}
			if res.Waited > 0 || tres.Waited > 0 || res.Calls != growth || tres.Calls != growth {
				continue
			}
			checked++
			if si == 0 || si == 2 && r.Trace == "fill" {
				premise[rowName(r)]++
			}
			if res.IdleHours < r.Online-1e-9 {
				t.Errorf("%s, %s: idle %.2f below the online bound %.2f", rowName(r), s.Name, res.IdleHours, r.Online)
			}
		}
	}
	for _, want := range []string{"fill/m5.large/ip", "rollout/m5.xlarge/ip", "steady/m5.xlarge/ip"} {
		if !named[want] {
			t.Errorf("%s: online bound not above the idle target (bounds: %v)", want, named)
		}
	}
	for row := range named {
		want := 1 // the reference meets the premise wherever there is a bound
		if strings.HasPrefix(row, "fill/") {
			want = 2 // and ours, on a fill
		}
		if premise[row] < want {
			t.Errorf("%s: %d of the reference's and our runs met the premise; want %d", row, premise[row], want)
		}
	}
	if checked < 10 {
		t.Errorf("%d pool runs met the premise; want at least 10", checked)
	}
}

// TestRefBetter: the reference is better on idle and calls only where both
// are strictly lower, and on everything only where it also made no more
// pods wait; the summary names each kind of row apart.
func TestRefBetter(t *testing.T) {
	row := func(name string, refIdle, refCalls float64, refWaited int, ourIdle, ourCalls float64, ourWaited int) Row {
		res := func(idle, calls float64, waited int) poolsim.Result {
			return poolsim.Result{Starts: 1000, IdleHours: idle, Calls: int(calls), Waited: waited}
		}
		ref, ours := res(refIdle, refCalls, refWaited), res(ourIdle, ourCalls, ourWaited)
		return Row{Trace: name, Type: "m5.large", Results: []poolsim.Result{ref, ref, ours, ours, ours}, Bound: math.NaN(), Online: math.NaN()}
	}
	rows := []Row{
		row("beaten", 10, 20, 0, 11, 21, 0),     // worse on both, same waits
		row("waits", 10, 20, 5, 11, 21, 0),      // worse on both; the reference made pods wait
		row("tie", 10, 20, 0, 10, 21, 0),        // a tie on idle counts for ours
		row("better", 10, 20, 0, 9, 25, 0),      // fewer idle hours, more calls
		row("waitsworse", 10, 20, 0, 11, 21, 3), // worse on both and waited more
	}
	want := [][2]bool{{true, true}, {true, false}, {false, false}, {false, false}, {true, true}}
	for i, r := range rows {
		ic, all := r.RefBetter()
		if ic != want[i][0] || all != want[i][1] {
			t.Errorf("%s: RefBetter() = %v, %v; want %v, %v", r.Trace, ic, all, want[i][0], want[i][1])
		}
	}
	var out bytes.Buffer
	Summary(&out, rows)
	if !strings.Contains(out.String(), "on idle and calls and no worse on waits: 2/5 [beaten/m5.large/ip waitsworse/m5.large/ip]") ||
		!strings.Contains(out.String(), "by making more pods wait: 1/5 [waits/m5.large/ip (pods waited: reference 5, ours 0)]") {
		t.Errorf("summary's comparison line:\n%s", out.String())
	}
}
