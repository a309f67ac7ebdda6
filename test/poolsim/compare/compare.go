// Package compare runs every trace on every instance type and address mode
// against four pools side by side — the reference default, the reference
// with WARM_IP_TARGET=5/MINIMUM_IP_TARGET=10, vpcipd's default and vpcipd
// with the same two variables — and prints the table of `make bench-pool`.
package compare

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpcip/vpcip/test/poolsim"
	"github.com/vpcip/vpcip/test/poolsim/reference"
	"github.com/vpcip/vpcip/test/poolsim/vpcipd"
	"github.com/vpcip/vpcip/warmpool"
)

// Setup is one pool configuration of the table.
type Setup struct {
	Name     string
	Ours     bool
	WarmIP   int // WARM_IP_TARGET (with MinIP); 0: the default
	MinIP    int // MINIMUM_IP_TARGET
	Behavior poolsim.Behaviour
}

// Setups are the table's pools, in column order: the four compared, then
// vpcipd's default without its Kubernetes part.
// Every pool sees kubelet's lag from bind to first ADD as measured on the
// test cluster (poolsim.DefaultSandboxLag, DefaultSandboxLagPerPod); vpcipd's also has its Kubernetes part (on
// wherever the chart runs it: MY_NODE_NAME set, in-cluster API access), so
// it learns of pods bound to the node before their ADDs — except the last
// column, "ours-nokube" (the daemon run outside Kubernetes, or without API
// access), which sees no binding, only ADDs.
var Setups = []Setup{
	{Name: "ref", Behavior: refBehaviour},
	{Name: "ref-w5m10", WarmIP: 5, MinIP: 10, Behavior: refBehaviour},
	{Name: "ours", Ours: true, Behavior: ourBehaviour},
	{Name: "ours-w5m10", Ours: true, WarmIP: 5, MinIP: 10, Behavior: ourBehaviour},
	{Name: "ours-nokube", Ours: true, Behavior: ourBehaviourNoKube},
}

// NoKube is the index in Setups of our default without the Kubernetes part.
const NoKube = 4

var (
	// refBehaviour: aws-node fails an ADD at once when no address is free.
	refBehaviour = poolsim.Behaviour{SandboxLag: poolsim.DefaultSandboxLag, SandboxLagPerPod: poolsim.DefaultSandboxLagPerPod}
	// ourBehaviour: vpcipd holds an ADD up to VPCIP_ADD_WAIT (5 s), kicks
	// its pool loop at every ADD and DEL, and watches the node's pods.
	ourBehaviour = poolsim.Behaviour{AddWait: 5 * time.Second, Kick: true, Kube: true, SandboxLag: poolsim.DefaultSandboxLag, SandboxLagPerPod: poolsim.DefaultSandboxLagPerPod}
	// ourBehaviourNoKube: the same without the pod watch: no binding is
	// seen, the pool learns of a pod at its ADD.
	ourBehaviourNoKube = poolsim.Behaviour{AddWait: 5 * time.Second, Kick: true, SandboxLag: poolsim.DefaultSandboxLag, SandboxLagPerPod: poolsim.DefaultSandboxLagPerPod}
)

// Row is one trace on one instance type and mode, with a result per Setup.
type Row struct {
	Trace   string
	Type    string
	Prefix  bool
	Results []poolsim.Result
	Err     error
	// Bound is poolsim.MinIdleHours with the reference default's count of
	// calls on a demand curve where no pod waited: a lower bound on the
	// idle address-hours of any pool that makes no pod wait and calls no
	// more.
	// The curve is the reference default's run, or where the reference
	// made pods wait our default's, if ours made none (BoundOn says
	// which: a run without waits has the trace's own curve, each pod
	// holding its address from its first ADD). NaN: not computed (both
	// made pods wait). Where the exact bound's work would exceed boundWork,
	// Bound is poolsim.CoarseMinIdleHours on the same curve and calls, a
	// weaker bound (Coarse is true).
	Bound   float64
	BoundOn string // "ref" or "ours": the run whose curve Bound is on; "" with no Bound
	Coarse  bool   // Bound is poolsim.CoarseMinIdleHours
	// Online is poolsim.TwinFillBound or poolsim.TwinBound on the
	// reference default's curve, in secondary-IP mode: a lower bound on the
	// idle address-hours of any pool that cannot see pods before they are
	// bound, makes no pod wait, and makes no more EC2 calls than the
	// reference default here and on a twin trace (OnlineTwin: the same
	// pods until after the last ENI is first needed, then more), where
	// both made the fewest calls growth takes. NaN: not computed (prefix
	// mode, a run that made pods wait, a reference that made more calls,
	// no twin found).
	Online     float64
	OnlineTwin poolsim.Trace // the twin of Online; none where Online is NaN
}

// OutOfReachOnline reports whether the row's idle target is below
// Online: no pool that cannot see the trace ahead meets the row's targets
// and the twin's (calls, no waits) both.
func (r Row) OutOfReachOnline() bool {
	return !math.IsNaN(r.Online) && r.Online > r.IdleTarget()
}

// IdleTarget is the most idle address-hours our default may hold on the
// row: max(0.5× the reference default's, the bound + 10 % of the
// reference's), so a row where the bound allows half must reach half and
// the others must come within a tenth of the reference of what no policy
// that makes no pod wait and calls no more can beat. Without a bound (NaN),
// the floor (Result.FloorHours, which no pool avoids and the bound never
// goes below) stands in for it.
func (r Row) IdleTarget() float64 {
	ref := r.Results[0].IdleHours
	return max(0.5*ref, r.lowest()+0.1*ref)
}

// lowest is the bound, or the floor where there is no bound.
func (r Row) lowest() float64 {
	if math.IsNaN(r.Bound) {
		return floor(r)
	}
	return r.Bound
}

// RefBetter compares the reference default with our default on the row:
// idleAndCalls, the reference held fewer idle address-hours and made fewer
// EC2 mutating calls per pod start (strictly: a tie counts for ours); all,
// that and no more pods waited than ours (a tie on waits, often both 0,
// counts for the reference). A row where all is false is one where our
// default is not Pareto-dominated by the reference's.
func (r Row) RefBetter() (idleAndCalls, all bool) {
	ref, o := r.Results[0], r.Results[2]
	idleAndCalls = ref.IdleHours < o.IdleHours && ref.CallsPer1000() < o.CallsPer1000()
	return idleAndCalls, idleAndCalls && ref.Waited <= o.Waited
}

// Meets reports which per-row targets our default meets against the
// reference default: idle address-hours at most IdleTarget, EC2 mutating
// calls per pod start at most the reference's, and no more pods that
// waited than the reference.
func (r Row) Meets() (idle, calls, waits bool) {
	ref, o := r.Results[0], r.Results[2]
	return o.IdleHours <= r.IdleTarget(), o.CallsPer1000() <= ref.CallsPer1000(), o.Waited <= ref.Waited
}

// OnPath is the share of a run's pod starts whose first ADD found no free
// address, so an EC2 call (assign, or create and attach an ENI) stood on
// the pod's path: Waited / Starts, 0 for no starts.
func OnPath(res poolsim.Result) float64 {
	if res.Starts == 0 {
		return 0
	}
	return float64(res.Waited) / float64(res.Starts)
}

// boundWork caps the work of MinIdleHours per row (calls × ENIs ×
// segments², about a nanosecond each), and coarseWork that of
// CoarseMinIdleHours where the exact bound exceeds it (calls × blocks²).
const boundWork, coarseWork = 3e9, 3e9

// Options select what Table runs.
type Options struct {
	Seed   uint64
	Traces []poolsim.Generator    // nil: all
	Types  []poolsim.InstanceType // nil: all
	Modes  []bool                 // prefix mode off/on; nil: both
	Lat    poolsim.Latencies      // zero: poolsim.DefaultLatencies
}

// Table runs every combination, in parallel on the machine's CPUs.
func Table(o Options) []Row {
	if o.Traces == nil {
		o.Traces = poolsim.Generators
	}
	if o.Types == nil {
		o.Types = poolsim.InstanceTypes
	}
	if o.Modes == nil {
		o.Modes = []bool{false, true}
	}
	if o.Lat == (poolsim.Latencies{}) {
		o.Lat = poolsim.DefaultLatencies
	}
	var rows []Row
	type job struct{ row, setup int }
	var jobs []job
	var traces []poolsim.Trace
	for _, prefix := range o.Modes {
		for _, g := range o.Traces {
			for _, typ := range o.Types {
				rows = append(rows, Row{Trace: g.Name, Type: typ.Name, Prefix: prefix, Results: make([]poolsim.Result, len(Setups))})
				traces = append(traces, g.Trace(TraceSeed(o.Seed, g, typ), typ.MaxPods-2))
				for si := range Setups {
					jobs = append(jobs, job{len(rows) - 1, si})
				}
			}
		}
	}
	typeOf := map[string]poolsim.InstanceType{}
	for _, t := range o.Types {
		typeOf[t.Name] = t
	}
	var mu sync.Mutex
	work := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				r := &rows[j.row]
				res, err := Run(traces[j.row], typeOf[r.Type], r.Prefix, Setups[j.setup], o.Lat, o.Seed)
				mu.Lock()
				r.Results[j.setup] = res
				if err != nil {
					r.Err = err
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	// The bounds, in parallel too: the coarse one takes seconds a row.
	rowsLeft := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rowsLeft {
				bounds(&rows[i], traces[i], typeOf[rows[i].Type], o)
			}
		}()
	}
	for i := range rows {
		rowsLeft <- i
	}
	close(rowsLeft)
	wg.Wait()
	return rows
}

// bounds sets r's Bound (with BoundOn and Coarse) and Online.
func bounds(r *Row, tr poolsim.Trace, typ poolsim.InstanceType, o Options) {
	r.Bound, r.Online = math.NaN(), math.NaN()
	ref, curve, on := r.Results[0], r.Results[0], "ref"
	if ref.Waited > 0 {
		curve, on = r.Results[2], "ours"
	}
	if r.Err != nil || curve.Waited > 0 || curve.Unstarted > 0 || len(curve.Levels) == 0 {
		return
	}
	unit := 1
	if r.Prefix {
		unit = warmpool.PrefixAddresses
	}
	end := curve.Start.Add(tr.Duration)
	if b, ok := poolsim.MinIdleHours(curve.Levels, end, ref.Calls, unit, typ.Limits.PodAddressesPerENI(), typ.Limits.MaxENIs, boundWork); ok {
		r.Bound, r.BoundOn = b, on
	} else if b, ok := poolsim.CoarseMinIdleHours(curve.Levels, end, ref.Calls, unit, typ.Limits.PodAddressesPerENI(), typ.Limits.MaxENIs, coarseWork); ok {
		r.Bound, r.BoundOn, r.Coarse = b, on, true
	}
	r.Online, r.OnlineTwin = onlineBound(tr, typ, r.Prefix, ref, o)
}

// onlineBound is Row.Online: the reference default run on a twin of the
// trace and poolsim.TwinFillBound or poolsim.TwinBound; NaN where the
// argument does not apply. A fill's twin is the fill continued to the
// node's capacity (poolsim.TwinFill, not before 10 s after its last ENI is
// first needed); another trace's, or a fill's where that twin gives no
// bound, adds long-lived pods from 10 s after its last ENI is first needed
// (poolsim.TwinAfter): as many as that ENI count holds, or fewer (three
// quarters, half, a quarter of them, one) until the reference makes no pod
// wait and the fewest calls on the twin.
func onlineBound(tr poolsim.Trace, typ poolsim.InstanceType, prefix bool, ref poolsim.Result, o Options) (float64, poolsim.Trace) {
	slots := typ.Limits.PodAddressesPerENI()
	if prefix || ref.Waited > 0 || ref.Unstarted > 0 || len(ref.Levels) == 0 || slots <= 0 {
		return math.NaN(), poolsim.Trace{}
	}
	start := ref.Start
	end := start.Add(tr.Duration)
	tE, ok := poolsim.TwinFrom(ref.Levels, start, slots)
	if !ok {
		return math.NaN(), poolsim.Trace{}
	}
	if twin, ok := poolsim.TwinFill(tr, typ.MaxPods-2, tE+10*time.Second); ok {
		tres, err := Run(twin, typ, false, Setups[0], o.Lat, o.Seed)
		if err == nil && tres.Waited == 0 && tres.Unstarted == 0 {
			if b, ok := poolsim.TwinFillBound(ref.Levels, end, len(twin.Pods), ref.Calls, tres.Calls, slots, typ.Limits.MaxENIs); ok {
				return b, twin
			}
		}
	}
	top := poolsim.PeakInUse(ref.Levels)
	e := (top + slots - 1) / slots
	room := min(e*slots, typ.MaxPods-2) - top
	if room < 1 || ref.Calls != poolsim.GrowthCalls(e) {
		return math.NaN(), poolsim.Trace{}
	}
	for _, extra := range slices.Compact([]int{room, room * 3 / 4, room / 2, room / 4, 1}) {
		twin, ok := poolsim.TwinAfter(tr, tE+10*time.Second, extra)
		if !ok || extra < 1 {
			continue
		}
		tres, err := Run(twin, typ, false, Setups[0], o.Lat, o.Seed)
		if err != nil || tres.Waited > 0 || tres.Unstarted > 0 {
			continue
		}
		if b, ok := poolsim.TwinBound(ref.Levels, end, poolsim.PeakInUse(tres.Levels), ref.Calls, tres.Calls, slots, typ.Limits.MaxENIs); ok {
			return b, twin
		}
	}
	return math.NaN(), poolsim.Trace{}
}

// TraceSeed is the seed of the trace of g on typ in the table of seed:
// the same whether the whole table runs or a part of it (-traces, -mode).
func TraceSeed(seed uint64, g poolsim.Generator, typ poolsim.InstanceType) uint64 {
	ti := slices.IndexFunc(poolsim.Generators, func(x poolsim.Generator) bool { return x.Name == g.Name })
	yi := slices.IndexFunc(poolsim.InstanceTypes, func(x poolsim.InstanceType) bool { return x.Name == typ.Name })
	return seed + uint64(max(ti, 0)*100+max(yi, 0))
}

// Log, when set, receives every action vpcipd's pool executes (for Run).
var Log func(now time.Time, action, reason string)

// Run simulates one trace against one setup.
func Run(tr poolsim.Trace, typ poolsim.InstanceType, prefix bool, s Setup, lat poolsim.Latencies, seed uint64) (poolsim.Result, error) {
	return poolsim.Simulate(tr, typ, lat, s.Behavior, seed, func(clock *poolsim.Clock, cloud *poolsim.Cloud) (poolsim.Pool, error) {
		if !s.Ours {
			return reference.New(cloud, clock.Now, reference.Config{
				WarmENITarget: 1, WarmPrefixTarget: 1, WarmIPTarget: s.WarmIP, MinimumIPTarget: s.MinIP,
				PrefixDelegation: prefix, MaxPods: typ.MaxPods,
			}, seed), nil
		}
		cfg := warmpool.Config{WarmIPTarget: s.WarmIP, MinimumIPTarget: s.MinIP, PrefixDelegation: prefix}
		if s.WarmIP == 0 && s.MinIP == 0 {
			cfg.Adaptive = true
		}
		return vpcipd.New(cloud, clock.Now, vpcipd.Settings{Pool: cfg, MaxPods: typ.MaxPods, Log: Log})
	})
}

// Print writes the table: per row the setups' idle address-hours, pods
// that waited (count, p50, p99 in seconds) and EC2 mutating calls per
// 1,000 pod starts (the four compared, then our default without the
// Kubernetes part), then the ratios ours/reference for the defaults and
// for WARM_IP_TARGET=5/MINIMUM_IP_TARGET=10.
func Print(w io.Writer, rows []Row) {
	fmt.Fprintf(w, "%-8s %-11s %-4s | %-34s | %-34s | %-34s | %-34s | %-34s | %-11s | %-22s | %-22s | %-19s | %-11s\n", "trace", "type", "mode",
		"ref default", "ref WARM_IP=5/MIN=10", "ours default", "ours WARM_IP=5/MIN=10", "ours default, no Kubernetes part", "bound", "ours/ref default", "ours/ref WARM5/MIN10",
		"default: targets", "EC2 on path")
	sub := "idle-h  waited  p50s  p99s  calls/k"
	fmt.Fprintf(w, "%-8s %-11s %-4s | %-34s | %-34s | %-34s | %-34s | %-34s | %-11s | %-22s | %-22s | %-19s | %-11s\n", "", "", "", sub, sub, sub, sub, sub, "flr/r lb/r",
		"idle  wait  p99  calls", "idle  wait  p99  calls", "tgt-h  idle  calls", "ref%  ours%")
	fmt.Fprintln(w, strings.Repeat("-", 8+1+11+1+4+5*37+14+2*25+2+22+14))
	for _, r := range rows {
		mode := "ip"
		if r.Prefix {
			mode = "pd"
		}
		fmt.Fprintf(w, "%-8s %-11s %-4s", r.Trace, r.Type, mode)
		for _, res := range r.Results {
			fmt.Fprintf(w, " | %6.1f %7d %5.1f %5.1f %8.1f", res.IdleHours, res.Waited, res.P(0.5), res.P(0.99), res.CallsPer1000())
		}
		lb := ratio(r.Bound, r.Results[0].IdleHours)
		if r.BoundOn == "ours" {
			lb += "o" // on our default's curve: the reference made pods wait
		}
		if r.Coarse {
			lb += "c" // poolsim.CoarseMinIdleHours: the exact bound would take too long
		}
		fmt.Fprintf(w, " | %5s %5s", ratio(floor(r), r.Results[0].IdleHours), lb)
		for _, pair := range [][2]int{{2, 0}, {3, 1}} {
			o, ref := r.Results[pair[0]], r.Results[pair[1]]
			fmt.Fprintf(w, " | %4s %5s %4s %5s", ratio(o.IdleHours, ref.IdleHours), ratio(float64(o.Waited), float64(ref.Waited)),
				ratio(o.P(0.99), ref.P(0.99)), ratio(o.CallsPer1000(), ref.CallsPer1000()))
		}
		idle, calls, _ := r.Meets()
		fmt.Fprintf(w, " | %6.1f %5s %5s", r.IdleTarget(), met(idle), met(calls))
		fmt.Fprintf(w, " | %4.1f  %5.1f", 100*OnPath(r.Results[0]), 100*OnPath(r.Results[2]))
		if r.Err != nil {
			fmt.Fprintf(w, "  error: %v", r.Err)
		}
		fmt.Fprintln(w)
	}
}

// floor is the idle address-hours no pool avoids on the row's mode
// (poolsim.Result.FloorHours), the lower of the reference default's run
// and ours.
func floor(r Row) float64 {
	m := 0
	if r.Prefix {
		m = 1
	}
	return min(r.Results[0].FloorHours[m], r.Results[2].FloorHours[m])
}

// Summary writes how many rows meet each target of the comparison: our
// default against the reference default (idle address-hours ≤ 0.5×, pods
// that waited ≤ 1×, p99 wait ≤ 1×, EC2 calls per pod start ≤ 1×) and ours
// against the reference with WARM_IP_TARGET=5/MINIMUM_IP_TARGET=10 (pods
// that waited ≤ 1×, calls ≤ 1.5×), and the totals of pods that waited.
func Summary(w io.Writer, rows []Row) {
	var idle, waited, p99, calls, wWaited, wCalls, refW, ourW, refWW, ourWW, beyond int
	var beyondRows, jointRows []string
	jointly := 0
	for _, r := range rows {
		ref, refw, o, ow := r.Results[0], r.Results[1], r.Results[2], r.Results[3]
		idle += b2i(o.IdleHours <= 0.5*ref.IdleHours)
		if floor(r) > 0.5*ref.IdleHours {
			beyond++
			mode := "ip"
			if r.Prefix {
				mode = "pd"
			}
			beyondRows = append(beyondRows, r.Trace+"/"+r.Type+"/"+mode)
		}
		if r.Bound > 0.5*ref.IdleHours {
			jointly++
			mode := "ip"
			if r.Prefix {
				mode = "pd"
			}
			jointRows = append(jointRows, r.Trace+"/"+r.Type+"/"+mode)
		}
		waited += b2i(o.Waited <= ref.Waited)
		p99 += b2i(o.P(0.99) <= ref.P(0.99))
		calls += b2i(o.CallsPer1000() <= ref.CallsPer1000())
		wWaited += b2i(ow.Waited <= refw.Waited)
		wCalls += b2i(ow.CallsPer1000() <= 1.5*refw.CallsPer1000())
		refW, ourW, refWW, ourWW = refW+ref.Waited, ourW+o.Waited, refWW+refw.Waited, ourWW+ow.Waited
	}
	n := len(rows)
	fmt.Fprintf(w, "default vs reference default, rows meeting: idle ≤ 0.5× %d/%d, waited ≤ 1× %d/%d, p99 ≤ 1× %d/%d, calls ≤ 1× %d/%d; pods that waited in all rows: ours %d, reference %d\n",
		idle, n, waited, n, p99, n, calls, n, ourW, refW)
	fmt.Fprintf(w, "WARM_IP_TARGET=5/MINIMUM_IP_TARGET=10, rows meeting: waited ≤ 1× %d/%d, calls ≤ 1.5× %d/%d; pods that waited in all rows: ours %d, reference %d\n",
		wWaited, n, wCalls, n, ourWW, refWW)
	SummaryNoKube(w, rows)
	var idleMet, callsMet, both int
	var missed, overPath, online, open []string
	worstPath := 0.0
	for _, r := range rows {
		i, c, _ := r.Meets()
		idleMet, callsMet, both = idleMet+b2i(i), callsMet+b2i(c), both+b2i(i && c)
		if !i || !c {
			missed = append(missed, rowName(r))
		}
		if r.OutOfReachOnline() {
			online = append(online, fmt.Sprintf("%s (at least %.1f, target %.1f)", rowName(r), r.Online, r.IdleTarget()))
		} else if !i || !c {
			open = append(open, rowName(r))
		}
		if p := OnPath(r.Results[2]); r.Trace != "fill" {
			worstPath = max(worstPath, p)
			if p > 0.01 {
				overPath = append(overPath, rowName(r))
			}
		}
	}
	fmt.Fprintf(w, "per-row targets of the default (idle ≤ max(0.5× ref, bound + 0.1× ref), the floor where no bound; calls ≤ 1× ref): idle met %d/%d, calls met %d/%d, both %d/%d; not met: %v\n",
		idleMet, n, callsMet, n, both, n, missed)
	fmt.Fprintf(w, "pod starts with an EC2 call on their path, our default, traces but fill: at most %.2f %%; rows above 1 %%: %v\n", 100*worstPath, overPath)
	fmt.Fprintf(w, "idle ≤ 0.5× out of reach for any pool (floor above half the reference's idle): %d/%d %v\n", beyond, n, beyondRows)
	fmt.Fprintf(w, "idle ≤ 0.5× with no more waits and calls out of reach for any pool (bound above half the reference's idle): %d/%d %v\n", jointly, n, jointRows)
	fmt.Fprintf(w, "per-row targets out of reach together for any pool that cannot see pods ahead and also makes no pod wait and no more calls than the reference on a twin (the same pods until after the last ENI is first needed, then more that stay; on the simulator's node, where an address cools 30 s before reuse; poolsim.TwinBound, idle address-hours): %d/%d %v\n", len(online), n, online)
	fmt.Fprintf(w, "per-row targets not met where no bound shows them out of reach: %d/%d %v\n", len(open), n, open)
	var dominated, tradedWaits []string
	for _, r := range rows {
		ic, all := r.RefBetter()
		if all {
			dominated = append(dominated, rowName(r))
		} else if ic {
			tradedWaits = append(tradedWaits, fmt.Sprintf("%s (pods waited: reference %d, ours %d)", rowName(r), r.Results[0].Waited, r.Results[2].Waited))
		}
	}
	fmt.Fprintf(w, "rows where the reference default does better than ours on idle and calls and no worse on waits: %d/%d %v; better on idle and calls by making more pods wait: %d/%d %v\n",
		len(dominated), n, dominated, len(tradedWaits), n, tradedWaits)
}

// SummaryNoKube writes how our default fares without its Kubernetes part
// (Setups[NoKube]: no binding seen, the pool learns of a pod at its ADD)
// against the reference default and against itself with it: rows meeting
// idle ≤ 0.5×, waited ≤ 1× and calls ≤ 1× of the reference, and the
// totals of pods that waited and of idle address-hours both ways.
func SummaryNoKube(w io.Writer, rows []Row) {
	var idle, waited, calls, nkW, kW int
	var nkIdle, kIdle float64
	for _, r := range rows {
		ref, o, nk := r.Results[0], r.Results[2], r.Results[NoKube]
		idle += b2i(nk.IdleHours <= 0.5*ref.IdleHours)
		waited += b2i(nk.Waited <= ref.Waited)
		calls += b2i(nk.CallsPer1000() <= ref.CallsPer1000())
		nkW, kW = nkW+nk.Waited, kW+o.Waited
		nkIdle, kIdle = nkIdle+nk.IdleHours, kIdle+o.IdleHours
	}
	n := len(rows)
	fmt.Fprintf(w, "default without the Kubernetes part (no binding seen; bind to ADD %v + %v per pod queued ahead) vs reference default, rows meeting: idle ≤ 0.5× %d/%d, waited ≤ 1× %d/%d, calls ≤ 1× %d/%d; in all rows, without / with it: pods that waited %d / %d, idle address-hours %.0f / %.0f\n",
		poolsim.DefaultSandboxLag, poolsim.DefaultSandboxLagPerPod, idle, n, waited, n, calls, n, nkW, kW, nkIdle, kIdle)
}

func rowName(r Row) string {
	mode := "ip"
	if r.Prefix {
		mode = "pd"
	}
	return r.Trace + "/" + r.Type + "/" + mode
}

func met(b bool) string {
	if b {
		return "met"
	}
	return "NOT"
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ratio formats a/b; "=" when both are 0, "inf" when only b is.
func ratio(a, b float64) string {
	switch {
	case math.IsNaN(a) || math.IsNaN(b):
		return "-"
	case a == 0 && b == 0:
		return "="
	case b == 0:
		return "inf"
	}
	return fmt.Sprintf("%.2f", a/b)
}
