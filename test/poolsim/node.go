package poolsim

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Demand is what the node's pods ask of the pool at one moment.
type Demand struct {
	// Pending counts ADDs waiting inside the daemon for an address now.
	Pending int
	// Unaddressed counts pods bound to the node that hold no address: the
	// pending ones and those in kubelet's back-off after a failed ADD. It
	// is what the Kubernetes part of the daemon reports; 0 when the pool
	// runs without it.
	Unaddressed int
	// Bindings: Unaddressed is live (Behaviour.Kube).
	Bindings bool
}

// Pool is a node's address pool as the simulated node drives it.
type Pool interface {
	// Start brings the pool up from the cloud's state.
	Start(ctx context.Context) error
	// Assign gives pod an address now, or reports false (CNI ADD).
	Assign(pod string, now time.Time) bool
	// Release gives pod's address back (CNI DEL).
	Release(pod string, now time.Time)
	// Cycle runs one cycle of the pool loop, calling the cloud as it
	// decides; demand is read at each decision. It returns the time until
	// the next cycle is due.
	Cycle(ctx context.Context, demand func() Demand) time.Duration
}

// Behaviour is how the daemon around a Pool serves ADDs.
type Behaviour struct {
	// AddWait is how long an ADD that finds no address waits in the daemon
	// before failing (VPCIP_ADD_WAIT); 0: it fails at once (the reference:
	// "failed to assign an IP address to container").
	AddWait time.Duration
	// Kick: every ADD and DEL wakes the pool loop at once (vpcipd's kick
	// channel); otherwise the loop runs only when its timer says.
	Kick bool
	// Kube: the pool learns of pods bound to the node without an address
	// (Demand.Unaddressed) through its watch of the API server, WatchDelay
	// after the bind, and each such pod kicks the pool loop (vpcipd's
	// Kubernetes part: Cluster.Demand and its kick when demand rises).
	Kube bool
	// SandboxLag is how long after the scheduler binds a pod kubelet's
	// first CNI ADD for it runs when no other pod of the node waits for
	// its first ADD, on average: kubelet's watch sees the pod, its pod
	// worker syncs, and the runtime creates the pause sandbox and its
	// network namespace before calling the plugin. Each pod's own part is
	// drawn uniformly in [3·SandboxLag/4, 5·SandboxLag/4] from the run's
	// seed, the same for every pool. 0: the ADD runs at the bind.
	SandboxLag time.Duration
	// SandboxLagPerPod is added to a pod's lag for every pod bound to the
	// node before it whose first ADD has not run yet at its bind: the
	// node's sandbox creations share its runtime and CPUs, so in a burst
	// the later pods' ADDs come later (see DefaultSandboxLagPerPod).
	SandboxLagPerPod time.Duration
}

// DefaultSandboxLag and DefaultSandboxLagPerPod are Behaviour.SandboxLag
// and SandboxLagPerPod of the table, as test/kubecluster's
// TestClusterLeadTime measured them on a one-node cluster (kubelet 1.37,
// containerd 2, vpcip installed by Helm, m5.xlarge on vpcsim), from the
// scheduler's Scheduled event to the start of the plugin's first ADD, in
// three runs:
//
//   - pods one at a time (10, one every 3 s, in the third every 2 s): p50
//     358, 364 and 368 ms, p90 417, 384 and 412 ms, max 431, 399 and 732 ms;
//   - 24 pods in one apply: p50 1275, 1645 and 1489 ms, p90 3001, 2479 and
//     2198 ms, max 3782, 2645 and 2245 ms, growing with the pods bound before a pod whose
//     ADD had not run yet at its binding: about 140 ms per such pod when
//     the 24 are taken as bound at once, 170 ms fitted on the second run's
//     bindings (spread over 2.7 s by the scheduler).
//
// The machine had 2 cores shared with other test runs: a node with more
// CPUs may start a burst's sandboxes sooner. A lone pod's lag less the
// watch's WatchDelay (about 0.25 s) is shorter than an assign call
// (Latencies.Assign 0.4 s and the pool loop; warmpool.AssignLatency 1 s):
// seeing pods at their binding lets an assign call serve a burst's later
// pods, not a lone one.
const (
	DefaultSandboxLag       = 350 * time.Millisecond
	DefaultSandboxLagPerPod = 150 * time.Millisecond
)

// WatchDelay is how long after a bind the daemon's pod watch shows the pod
// (Behaviour.Kube): an informer event's usual delay.
const WatchDelay = 100 * time.Millisecond

// Cooldown is the address cooldown both pools of the table use
// (IP_COOLDOWN_PERIOD, 30 s): an address a pod gave back is held, not
// handed out, for this long. It bounds Result.FloorHours.
const Cooldown = 30 * time.Second

// Kubelet's retry of a failed sandbox creation: about 10 s, growing
// (reference-pool-algorithm.md): 10 s doubling per failure up to 5 minutes,
// each stretched by up to 50 % of jitter.
const (
	backoffBase = 10 * time.Second
	backoffCap  = 5 * time.Minute
	pollEvery   = 100 * time.Millisecond // a waiting ADD looks again (ipamd waitPoll)
)

// Result is what one run measured.
type Result struct {
	Starts    int         // pods that got an address
	Waited    int         // pods whose first ADD found no address at once
	Waits     []float64   // seconds from first ADD to address, of the pods that waited, sorted
	WaitedAt  []time.Time // first ADD of each pod that waited, in order of their addresses
	IdleHours float64     // addresses held by the instance and held by no pod, integrated over time, in address-hours
	Calls     int         // EC2 mutating calls
	ByCall    map[string]int
	MaxENIs   int       // most ENIs attached at once
	EndENIs   int       // ENIs attached at the end
	EndHeld   int       // addresses held at the end (Cloud.Held)
	Unstarted int       // pods still without an address at the end
	Start     time.Time // the trace's time 0, once the pool started: a pod arrives at Start + Pod.Arrive, the run ends at Start + Trace.Duration
	// FloorHours is the idle address-hours no pool could avoid on this
	// run's pod timings, for secondary-IP mode [0] and prefix mode [1]:
	// addresses in their Cooldown after a pod left (no pool hands them
	// out or releases them), in prefix mode rounded up to whole /28s, plus
	// the primary address of every ENI beyond the first that those slots
	// need. A pool that never made a pod wait holds at least this.
	FloorHours [2]float64
	// Levels is the run's demand curve: from each Level's At until the
	// next one's, Level.InUse addresses were assigned or cooling, of them
	// Level.Assigned assigned (for MinIdleHours).
	Levels []Level
}

// Level is the demand on a node from At on.
type Level struct {
	At       time.Time
	InUse    int // addresses assigned to pods or in their cooldown
	Assigned int // addresses assigned to pods (IdleHours counts the rest as idle)
}

// P returns the q-quantile (0..1) of the waits, in seconds; 0 without waits.
func (r Result) P(q float64) float64 {
	if len(r.Waits) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Waits)) + 0.5)
	return r.Waits[min(max(i-1, 0), len(r.Waits)-1)]
}

// CallsPer1000 is EC2 mutating calls per 1,000 pod starts.
func (r Result) CallsPer1000() float64 {
	if r.Starts == 0 {
		return 0
	}
	return float64(r.Calls) * 1000 / float64(r.Starts)
}

type podState struct {
	pod      Pod
	name     string
	first    time.Time // first ADD
	failures int
	waiting  bool      // an ADD waits in the daemon
	deadline time.Time // the waiting ADD fails then
	started  bool
	watched  bool // the daemon's pod watch shows the pod (Behaviour.Kube)
}

// node is one simulated node: kubelet, daemon front and pool loop.
type node struct {
	clock *Clock
	cloud *Cloud
	pool  Pool
	beh   Behaviour
	rng   *rand.Rand
	ctx   context.Context

	pods        []*podState
	waiting     []*podState // ADDs waiting in the daemon, in arrival order
	unaddressed int         // pods the daemon's watch shows bound without an address
	assigned    int
	cooling     int // addresses within Cooldown of their pod's departure
	res         Result

	idleSince time.Time
	idleNow   int
	floorNow  [2]int
	slotsENI  int // slots per ENI of the instance type

	loopGen int  // pool timer generation: a stale timer event does nothing
	running bool // a pool cycle runs (or is parked in a cloud call)
	kicked  bool // a kick came during the cycle
	polling bool
}

// Simulate runs trace on a fresh instance of typ whose pool is made by
// newPool, and returns what it measured.
func Simulate(trace Trace, typ InstanceType, lat Latencies, beh Behaviour, seed uint64,
	newPool func(clock *Clock, cloud *Cloud) (Pool, error)) (Result, error) {
	n := &node{clock: NewClock(), beh: beh, rng: rand.New(rand.NewPCG(seed, 7)), ctx: context.Background()}
	n.cloud = NewCloud(n.clock, typ, lat, n.account)
	n.slotsENI = max(typ.Limits.IPv4PerENI-1, 1)
	lagRNG := rand.New(rand.NewPCG(seed, 11)) // per pod in trace order: the same lags for every pool
	var err error
	if n.pool, err = newPool(n.clock, n.cloud); err != nil {
		return Result{}, err
	}
	n.clock.Settled = n.retryWaiting
	n.idleSince = n.clock.Now()
	var startErr error
	started := false
	n.clock.Go(func() { startErr, started = n.pool.Start(n.ctx), true })
	n.clock.RunWhile(func() bool { return !started })
	if startErr != nil {
		return Result{}, fmt.Errorf("pool start: %w", startErr)
	}
	t0 := n.clock.Now()
	n.res.Start = t0
	lags := sandboxLags(trace.Pods, beh, lagRNG)
	for i, p := range trace.Pods {
		ps := &podState{pod: p, name: fmt.Sprintf("pod-%05d", i)}
		n.pods = append(n.pods, ps)
		n.clock.At(t0.Add(p.Arrive), func() { n.bind(ps) })
		n.clock.At(t0.Add(p.Arrive+lags[i]), func() { n.arrive(ps) })
	}
	n.schedule(0)
	n.clock.Run(t0.Add(trace.Duration))
	n.account()
	n.res.ByCall, n.res.Calls = n.cloud.Calls()
	n.res.EndENIs, n.res.EndHeld = n.cloud.ENICount(), n.cloud.Held()
	slices.Sort(n.res.Waits)
	for _, ps := range n.pods {
		if !ps.started {
			n.res.Unstarted++
		}
	}
	return n.res, nil
}

// sandboxLags draws each pod's lag from bind to first ADD
// (Behaviour.SandboxLag, SandboxLagPerPod), in trace order from rng; the
// queue a pod finds is that of the pods bound before it (ties in trace
// order), which the pool does not change.
func sandboxLags(pods []Pod, beh Behaviour, rng *rand.Rand) []time.Duration {
	lags := make([]time.Duration, len(pods))
	if beh.SandboxLag <= 0 && beh.SandboxLagPerPod <= 0 {
		return lags
	}
	for i := range pods {
		if beh.SandboxLag > 0 {
			lags[i] = 3*beh.SandboxLag/4 + time.Duration(rng.Int64N(int64(beh.SandboxLag/2)+1))
		}
	}
	if beh.SandboxLagPerPod <= 0 {
		return lags
	}
	order := make([]int, len(pods))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(pods[a].Arrive, pods[b].Arrive) })
	var ahead []time.Duration // first ADDs not yet run, of the pods bound so far
	for _, i := range order {
		at := pods[i].Arrive
		ahead = slices.DeleteFunc(ahead, func(add time.Duration) bool { return add <= at })
		lags[i] += time.Duration(len(ahead)) * beh.SandboxLagPerPod
		ahead = append(ahead, at+lags[i])
	}
	return lags
}

// account integrates idle addresses up to now and records the new level.
func (n *node) account() {
	now := n.clock.Now()
	h := now.Sub(n.idleSince).Hours()
	n.res.IdleHours += float64(n.idleNow) * h
	for m := range n.floorNow {
		n.res.FloorHours[m] += float64(n.floorNow[m]) * h
	}
	n.idleSince = now
	n.idleNow = max(n.cloud.Held()-n.assigned, 0)
	for m, unit := range []int{1, 16} {
		slots := (n.assigned + n.cooling + unit - 1) / unit
		enis := max((slots+n.slotsENI-1)/n.slotsENI, 1)
		n.floorNow[m] = slots*unit + enis - 1 - n.assigned
	}
	n.res.MaxENIs = max(n.res.MaxENIs, n.cloud.ENICount())
	lv, l := Level{At: now, InUse: n.assigned + n.cooling, Assigned: n.assigned}, len(n.res.Levels)
	if l == 0 || n.res.Levels[l-1].InUse != lv.InUse || n.res.Levels[l-1].Assigned != lv.Assigned {
		if l > 0 && n.res.Levels[l-1].At.Equal(now) {
			n.res.Levels[l-1] = lv
		} else {
			n.res.Levels = append(n.res.Levels, lv)
		}
	}
}

func (n *node) demand() Demand {
	d := Demand{Pending: len(n.waiting)}
	if n.beh.Kube {
		d.Unaddressed, d.Bindings = n.unaddressed, true
	}
	return d
}

// bind: the scheduler binds the pod to the node; with Behaviour.Kube the
// daemon's watch shows it WatchDelay later and kicks the pool loop.
func (n *node) bind(ps *podState) {
	if !n.beh.Kube {
		return
	}
	n.clock.After(WatchDelay, func() {
		if ps.started {
			return
		}
		ps.watched = true
		n.unaddressed++
		n.kick()
	})
}

// arrive: kubelet's first ADD for the pod runs.
func (n *node) arrive(ps *podState) {
	ps.first = n.clock.Now()
	n.add(ps)
}

// add is one CNI ADD of the pod.
func (n *node) add(ps *podState) {
	if n.tryAssign(ps) {
		return
	}
	if n.beh.AddWait <= 0 {
		n.fail(ps)
		return
	}
	ps.waiting = true
	ps.deadline = n.clock.Now().Add(n.beh.AddWait)
	n.waiting = append(n.waiting, ps)
	n.clock.At(ps.deadline, func() {
		if ps.waiting {
			n.dropWaiting(ps)
			n.fail(ps)
		}
	})
	n.startPolling()
	n.kick()
}

func (n *node) tryAssign(ps *podState) bool {
	now := n.clock.Now()
	if !n.pool.Assign(ps.name, now) {
		return false
	}
	ps.started = true
	if ps.watched {
		n.unaddressed--
	}
	n.assigned++
	n.account()
	n.res.Starts++
	if w := now.Sub(ps.first); w > 0 {
		n.res.Waited++
		n.res.Waits = append(n.res.Waits, w.Seconds())
		n.res.WaitedAt = append(n.res.WaitedAt, ps.first)
	}
	n.clock.After(ps.pod.Life, func() { n.depart(ps) })
	n.kick()
	return true
}

// fail: the ADD failed; kubelet retries the sandbox after its back-off.
func (n *node) fail(ps *podState) {
	ps.failures++
	d := backoffBase
	for i := 1; i < ps.failures && d < backoffCap; i++ {
		d *= 2
	}
	d = min(d, backoffCap)
	d += time.Duration(n.rng.Float64() * 0.5 * float64(d))
	n.clock.After(d, func() { n.add(ps) })
}

func (n *node) dropWaiting(ps *podState) {
	ps.waiting = false
	n.waiting = slices.DeleteFunc(n.waiting, func(x *podState) bool { return x == ps })
}

// retryWaiting gives waiting ADDs the addresses that became free, oldest
// first.
func (n *node) retryWaiting() {
	for len(n.waiting) > 0 {
		ps := n.waiting[0]
		if !n.tryAssign(ps) {
			return
		}
		n.dropWaiting(ps)
	}
}

func (n *node) startPolling() {
	if n.polling {
		return
	}
	n.polling = true
	var poll func()
	poll = func() {
		n.retryWaiting()
		if len(n.waiting) == 0 {
			n.polling = false
			return
		}
		n.clock.After(pollEvery, poll)
	}
	n.clock.After(pollEvery, poll)
}

// depart: the pod ends; CNI DEL gives its address back.
func (n *node) depart(ps *podState) {
	n.pool.Release(ps.name, n.clock.Now())
	n.assigned--
	n.cooling++
	n.account()
	n.clock.After(Cooldown, func() {
		n.cooling--
		n.account()
	})
	n.kick()
}

// kick wakes the pool loop (vpcipd), folding kicks during a cycle into one.
func (n *node) kick() {
	if !n.beh.Kick {
		return
	}
	if n.running {
		n.kicked = true
		return
	}
	n.schedule(0)
}

// schedule sets the pool loop's timer to d from now.
func (n *node) schedule(d time.Duration) {
	n.loopGen++
	gen := n.loopGen
	n.clock.After(d, func() {
		if gen == n.loopGen && !n.running {
			n.cycle()
		}
	})
}

func (n *node) cycle() {
	n.running = true
	n.kicked = false
	n.clock.Go(func() {
		next := n.pool.Cycle(n.ctx, n.demand)
		n.running = false
		if n.kicked {
			next = 0
		}
		n.schedule(next)
	})
}
