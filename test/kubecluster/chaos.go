package kubecluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fault kinds of the chaos campaign.
const (
	FaultKillDaemon        = "kill -9 vpcipd"      // SIGKILL of the vpcipd container's process; kubelet restarts it
	FaultRestartContainerd = "restart containerd"  // SIGTERM containerd, start it again on the same state
	FaultRestartKubelet    = "restart kubelet"     // SIGTERM kubelet, start it again
	FaultStopAPIServer     = "stop the API server" // kube-apiserver down for a while (etcd keeps running)
	FaultEC2               = "EC2 throttling and errors"
	FaultReboot            = "node reboot" // see Cluster.Reboot; the checkpoint kept or lost at random
	// FaultUpgrade is `helm upgrade` to a build with another version
	// string, then, after a random part of the rollout (nodes run mixed
	// versions), `helm rollback`; needs Chaos.UpgradeImage.
	FaultUpgrade = "helm upgrade and rollback"
)

// APIRequestBudget is the most API requests per node per minute the vpcip
// daemons may make under the campaign's churn (README, `make chaos`): their
// informers' lists and watches, AddressBudget status writes and Events. The
// campaign fails above it. Measured at 9.5–9.6 on two nodes.
const APIRequestBudget = 15.0

// BudgetWindow is the least churn over which APIRequestBudget is measured:
// the churn goes on after the last fault until it has lasted this long. A
// daemon's start (a kill, a reboot, a rollout) costs a fixed burst of
// lists; six faults in the 71 s a short campaign took once made that burst
// alone 15.7 requests per node per minute, a rate of the faults' density
// rather than of the daemons' steady cost.
const BudgetWindow = 150 * time.Second

// AllFaults are the fault kinds the campaign injects, in a fixed order.
var AllFaults = []string{FaultKillDaemon, FaultRestartContainerd, FaultRestartKubelet, FaultStopAPIServer, FaultEC2, FaultReboot, FaultUpgrade}

// Chaos is a fault campaign on the cluster with the chart's DaemonSet: pods
// churn through kubelet (Deployments scaled up and down, rollout restarts,
// pods deleted with --force --grace-period=0, a crash-looping pod) while
// faults of each kind are injected at random moments chosen by a seeded RNG.
// The invariants (violations) are checked continuously from the outside
// (each pod's netns, EC2's view in vpcsim, each daemon's introspection, the
// API server) and must hold again after each fault; once churn stops and
// the grace has passed nothing may be left (leftovers).
type Chaos struct {
	S       *Scenario // the cluster, Helm and vpcipctl; the chart is installed by Run
	Seed    uint64
	Faults  int      // how many faults in all, each kind its share; 0 for PerKind of each kind
	PerKind int      // faults of each kind when Faults is 0; default 2
	Kinds   []string // default AllFaults
	// APIDownMax bounds how long the API server stays stopped (up to a
	// minute in the full campaign); EC2Window how long EC2 faults last;
	// Pause the random churn before each fault (0.2 to 1.2 times it).
	APIDownMax, EC2Window, Pause time.Duration
	// Settle bounds how long the invariants may stay broken after a fault
	// once the daemons and nodes are ready again.
	Settle time.Duration
	// UpgradeImage is a second build of the image (another version
	// string) for FaultUpgrade; without it that kind is left out.
	UpgradeImage string
	Logf         func(format string, args ...any)

	rngMu    sync.Mutex
	rng      *rand.Rand // fault plan and timing
	churnRng *rand.Rand
	checkRng *rand.Rand

	mu       sync.Mutex // guards the fields below
	faults   map[string]int
	cost     map[string][]faultCost // by kind, in order
	sampling struct {               // the checker's samples: how many, time in each part
		n                   int
		view, ping, metrics time.Duration
	}
	checks    map[string]int
	churned   map[string]int
	open      map[string]violation // violations seen in the last sample, by key
	longest   violation
	lastClean time.Time // start of the last sample that found nothing broken
	hard      error     // a duplicate address confirmed by a second look
	apiReq    apiCounter
}

// faultCost is what one fault took, from injecting it: Fault until it was
// over (the process back, the API server started, EC2 healthy, the
// rollback's rollout done), Recovered until the daemons and nodes were
// Ready, Total until a clean sample of every invariant begun after that.
type faultCost struct{ Fault, Recovered, Total time.Duration }

type violation struct {
	Since, Until time.Time
	What         string
}

func (v violation) duration() time.Duration { return v.Until.Sub(v.Since) }

// Deployments the campaign churns, and its crash-looping pod.
const (
	churnA, churnB, crashLoop = "churn-a", "churn-b", "crashloop"
)

// Run installs the chart, starts the workload and the checker, injects the
// faults, then stops the churn, removes the workload and checks that
// nothing is left. It logs the seed first and a summary last.
func (ch *Chaos) Run(ctx context.Context) error {
	if len(ch.Kinds) == 0 {
		for _, k := range AllFaults {
			if k != FaultUpgrade || ch.UpgradeImage != "" {
				ch.Kinds = append(ch.Kinds, k)
			}
		}
	}
	if ch.Faults == 0 {
		ch.Faults = max(ch.PerKind, 1) * len(ch.Kinds)
		if ch.PerKind == 0 {
			ch.Faults = 2 * len(ch.Kinds)
		}
	}
	if ch.APIDownMax == 0 {
		ch.APIDownMax = time.Minute
	}
	if ch.EC2Window == 0 {
		ch.EC2Window = 30 * time.Second
	}
	if ch.Pause == 0 {
		ch.Pause = 5 * time.Second
	}
	if ch.Settle == 0 {
		ch.Settle = 2 * time.Minute
	}
	ch.rng = rand.New(rand.NewPCG(ch.Seed, 1))
	ch.churnRng = rand.New(rand.NewPCG(ch.Seed, 2))
	ch.checkRng = rand.New(rand.NewPCG(ch.Seed, 3))
	ch.faults, ch.checks, ch.churned, ch.open = map[string]int{}, map[string]int{}, map[string]int{}, map[string]violation{}
	ch.cost = map[string][]faultCost{}
	ch.Logf("chaos campaign: seed %d, %d faults of %d kinds (VPCIP_CHAOS_SEED=%d reproduces the plan)", ch.Seed, ch.Faults, len(ch.Kinds), ch.Seed)
	start := time.Now()
	defer func() { ch.Logf("%s", ch.summary(time.Since(start))) }()

	if ch.UpgradeImage != "" {
		for _, n := range ch.S.C.Nodes {
			if err := n.importImage(ctx, ch.S.C.Tools.Ctr, ch.UpgradeImage); err != nil {
				return err
			}
		}
	}
	if err := ch.S.install(ctx); err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	if err := ch.countDaemonRequests(ctx); err != nil {
		return err
	}
	if err := ch.deploy(ctx); err != nil {
		return err
	}

	cctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	churnCtx, stopChurn := context.WithCancel(cctx)
	wg.Add(2)
	go func() { defer wg.Done(); ch.churn(churnCtx) }()
	go func() { defer wg.Done(); ch.check(cctx) }()
	churnStart := time.Now()
	ch.apiReq.sample(cctx, ch.S.C)

	err := ch.inject(ctx)
	if rest := BudgetWindow - time.Since(churnStart); err == nil && rest > 0 {
		ch.Logf("   churn goes on %s after the last fault: the API budget is measured over at least %s", rest.Round(time.Second), BudgetWindow)
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(rest):
		}
	}
	stopChurn()
	ch.apiReq.sample(ctx, ch.S.C)
	churnFor := time.Since(churnStart)
	if err == nil {
		err = ch.hardError()
	}
	if err == nil {
		err = ch.drain(ctx)
	}
	stopAll()
	wg.Wait()
	ch.mu.Lock()
	ch.closeAll(time.Now())
	ch.mu.Unlock()
	perNodeMin := float64(ch.apiReq.total) / churnFor.Minutes() / float64(len(ch.S.C.Nodes))
	ch.Logf("   vpcip daemons' API requests under churn: %d in %s over %d nodes = %.1f per node per minute (budget %.0f)",
		ch.apiReq.total, churnFor.Round(time.Second), len(ch.S.C.Nodes), perNodeMin, APIRequestBudget)
	if err == nil {
		err = ch.hardError()
	}
	if err == nil && perNodeMin > APIRequestBudget {
		err = fmt.Errorf("the daemons made %.1f API requests per node per minute under churn, above the budget of %.0f", perNodeMin, APIRequestBudget)
	}
	return err
}

func (ch *Chaos) hardError() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.hard
}

// plan is the order of the faults: each kind its share, shuffled.
func (ch *Chaos) plan() []string {
	p := make([]string, ch.Faults)
	for i := range p {
		p[i] = ch.Kinds[i%len(ch.Kinds)]
	}
	ch.rng.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// recover waits until the API server answers, both daemon pods are Ready
// and every node is Ready. kubelet's restart back-off of a killed container
// grows with each kill (up to 5 minutes), hence the long wait.
func (ch *Chaos) recover(ctx context.Context) error {
	if _, err := ch.S.C.WaitPods(ctx, "kube-system", "app.kubernetes.io/name=vpcip", 7*time.Minute, "vpcip daemons Ready", AllRunning(len(ch.S.C.Nodes))); err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := ch.S.C.Kubectl(ctx, "get", "nodes", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status} {end}`)
		if err == nil && strings.Count(out, "True") == len(ch.S.C.Nodes) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nodes Ready: %s (%v)", out, err)
		}
		time.Sleep(time.Second)
	}
}

// settle waits for a sample begun after since that finds no invariant
// broken; after Settle it fails with the last sample's violations and the
// state behind them.
func (ch *Chaos) settle(ctx context.Context, since time.Time) error {
	deadline := time.Now().Add(ch.Settle)
	for {
		ch.mu.Lock()
		clean := ch.lastClean.After(since)
		open := maps2list(ch.open)
		ch.mu.Unlock()
		if clean {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("invariants still broken %s after recovery:\n  %s\n%s", ch.Settle, strings.Join(open, "\n  "), ch.dumpState(ctx))
		}
		time.Sleep(time.Second)
	}
}

func maps2list(m map[string]violation) []string {
	var l []string
	for _, v := range m {
		l = append(l, fmt.Sprintf("%s (for %s)", v.What, time.Since(v.Since).Round(time.Second)))
	}
	slices.Sort(l)
	return l
}

// check samples the cluster until ctx ends, keeping the open violations,
// the longest one closed, and the time of the last clean sample. A
// duplicate address seen twice in a row is a hard failure.
func (ch *Chaos) check(ctx context.Context) {
	for ctx.Err() == nil {
		began := time.Now()
		checks := map[string]int{}
		v := ch.viewCluster(ctx)
		viewed := time.Now()
		bad := ch.violations(v, checks)
		for k, w := range ch.pingSample(ctx, v, checks) {
			bad[k] = w
		}
		if ctx.Err() != nil {
			return
		}
		pinged := time.Now()
		ch.apiReq.sampleEvery(ctx, ch.S.C, 30*time.Second)
		ch.mu.Lock()
		ch.sampling.n++
		ch.sampling.view += viewed.Sub(began)
		ch.sampling.ping += pinged.Sub(viewed)
		ch.sampling.metrics += time.Since(pinged)
		for k, n := range checks {
			ch.checks[k] += n
		}
		now := time.Now()
		for k, old := range ch.open {
			if _, still := bad[k]; !still {
				old.Until = now
				ch.closeOne(old)
				delete(ch.open, k)
			}
		}
		for k, what := range bad {
			if old, ok := ch.open[k]; ok {
				old.What = what
				ch.open[k] = old
				if strings.HasPrefix(k, "dup ") && ch.hard == nil {
					ch.hard = fmt.Errorf("duplicate address in two samples in a row: %s", what)
					ch.Logf("   FAILED: %s", what)
				}
				continue
			}
			ch.open[k] = violation{Since: began, What: what}
			ch.Logf("   violation: %s", what)
		}
		if len(bad) == 0 && len(v.Blind) == 0 {
			ch.lastClean = began
		}
		ch.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (ch *Chaos) closeOne(v violation) {
	if v.duration() > ch.longest.duration() {
		ch.longest = v
	}
}

func (ch *Chaos) closeAll(now time.Time) {
	for k, v := range ch.open {
		v.Until = now
		ch.closeOne(v)
		delete(ch.open, k)
	}
}

// dumpState is the cluster's state behind a violation: each node's live
// sandboxes, its daemon's assignments and EC2's addresses of its instance.
func (ch *Chaos) dumpState(ctx context.Context) string {
	v := ch.viewCluster(ctx)
	var b strings.Builder
	for _, n := range ch.S.C.Nodes {
		fmt.Fprintf(&b, "  %s (%s):\n    live sandboxes:", n.Name, n.InstanceID)
		for _, s := range v.Sandboxes {
			if s.Node == n.Name {
				fmt.Fprintf(&b, " %s=%v", s.Pod, s.Addr)
			}
		}
		b.WriteString("\n    daemon assignments:")
		if d, ok := v.Daemon[n.Name]; ok {
			for a, as := range d {
				fmt.Fprintf(&b, " %v=%s/%.12s", a, as.Pod.Name, as.Key.ContainerID)
			}
		} else {
			b.WriteString(" (introspection did not answer)")
		}
		b.WriteString("\n    EC2 assigns:")
		for a, i := range v.EC2 {
			if i == n.InstanceID {
				fmt.Fprintf(&b, " %v", a)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// drain stops the churn's workload: both Deployments and the crash-looping
// pod are deleted, and once their pods are gone and the GC grace and two
// host checks have passed, no node keeps anything of them.
func (ch *Chaos) drain(ctx context.Context) error {
	// The leftover check must see what live pods hold: on a node with live
	// pods it lists at least their addresses, veths, routes and netns.
	v := ch.viewCluster(ctx)
	for _, n := range ch.S.C.Nodes {
		live := 0
		for _, s := range v.Sandboxes {
			if s.Node == n.Name {
				live++
			}
		}
		l, err := ch.leftovers(ctx, n)
		if err != nil {
			return err
		}
		if len(l) < 2*live {
			return fmt.Errorf("%s: the leftover check sees %d items with %d live pods, want at least 2 each: %v", n.Name, len(l), live, l)
		}
	}
	for _, d := range []string{churnA, churnB, crashLoop} {
		if _, err := ch.S.C.Kubectl(ctx, "delete", "deployment", d, "--wait=false"); err != nil {
			return err
		}
	}
	if _, err := ch.S.C.WaitPods(ctx, "default", "", 5*time.Minute, "workload pods gone", func(p []Pod) bool { return len(p) == 0 }); err != nil {
		return err
	}
	gone := time.Now()
	deadline := gone.Add(WitnessGrace + 3*WitnessCheck + time.Minute)
	for {
		var left []string
		for _, n := range ch.S.C.Nodes {
			l, err := ch.leftovers(ctx, n)
			if err != nil {
				return err
			}
			for _, s := range l {
				left = append(left, n.Name+": "+s)
			}
		}
		ch.mu.Lock()
		ch.checks["nothing left once churn stopped"]++
		ch.mu.Unlock()
		if len(left) == 0 {
			ch.Logf("   churn stopped: workload gone; %s later no node keeps an address, veth, route, rule or netns of it", time.Since(gone).Round(time.Second))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left over %s after the workload went (grace %s):\n  %s", time.Since(gone).Round(time.Second), WitnessGrace, strings.Join(left, "\n  "))
		}
		time.Sleep(2 * time.Second)
	}
}

// summary is the campaign's closing report.
func (ch *Chaos) summary(took time.Duration) string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos campaign summary (seed %d, %s):\n  faults:", ch.Seed, took.Round(time.Second))
	for _, k := range ch.Kinds {
		fmt.Fprintf(&b, " %s=%d", k, ch.faults[k])
	}
	b.WriteString("\n  cost per fault, mean (max): over / recovered / invariants hold again")
	for _, k := range ch.Kinds {
		c := ch.cost[k]
		if len(c) == 0 {
			continue
		}
		var sum, most faultCost
		for _, x := range c {
			sum.Fault, sum.Recovered, sum.Total = sum.Fault+x.Fault, sum.Recovered+x.Recovered, sum.Total+x.Total
			most.Fault, most.Recovered, most.Total = max(most.Fault, x.Fault), max(most.Recovered, x.Recovered), max(most.Total, x.Total)
		}
		n, r := time.Duration(len(c)), func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
		fmt.Fprintf(&b, "\n    %-26s %3d: %s (%s) / %s (%s) / %s (%s)", k, len(c), r(sum.Fault/n), r(most.Fault),
			r(sum.Recovered/n), r(most.Recovered), r(sum.Total/n), r(most.Total))
	}
	if n := time.Duration(ch.sampling.n); n > 0 {
		fmt.Fprintf(&b, "\n  samples: %d, mean %s each (view %s, pings %s, API server metrics %s) plus 1 s between",
			n, ((ch.sampling.view + ch.sampling.ping + ch.sampling.metrics) / n).Round(10*time.Millisecond),
			(ch.sampling.view / n).Round(10*time.Millisecond), (ch.sampling.ping / n).Round(10*time.Millisecond), (ch.sampling.metrics / n).Round(10*time.Millisecond))
	}
	b.WriteString("\n  churn:")
	for _, k := range sortedKeys(ch.churned) {
		fmt.Fprintf(&b, " %s=%d", k, ch.churned[k])
	}
	b.WriteString("\n  checks:")
	for _, k := range sortedKeys(ch.checks) {
		fmt.Fprintf(&b, "\n    %-52s %d", k, ch.checks[k])
	}
	if ch.longest.What == "" {
		b.WriteString("\n  longest violation: none")
	} else {
		fmt.Fprintf(&b, "\n  longest violation: %s (from %s): %s", ch.longest.duration().Round(time.Second), ch.longest.Since.Format(time.TimeOnly), ch.longest.What)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}
