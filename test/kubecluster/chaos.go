package kubecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/vpcsim"
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

	mu        sync.Mutex // guards the fields below
	faults    map[string]int
	checks    map[string]int
	churned   map[string]int
	open      map[string]violation // violations seen in the last sample, by key
	longest   violation
	lastClean time.Time // start of the last sample that found nothing broken
	hard      error     // a duplicate address confirmed by a second look
	apiReq    apiCounter
}

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
	ch.Logf("   vpcip daemons' API requests under churn: %d in %s over %d nodes = %.1f per node per minute",
		ch.apiReq.total, churnFor.Round(time.Second), len(ch.S.C.Nodes), float64(ch.apiReq.total)/churnFor.Minutes()/float64(len(ch.S.C.Nodes)))
	if err == nil {
		err = ch.hardError()
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

// inject runs the faults one after another: a random pause of churn, the
// fault on a random node, recovery (daemons and nodes ready, the API
// server answering), then a clean sample of every invariant within Settle.
func (ch *Chaos) inject(ctx context.Context) error {
	for i, kind := range ch.plan() {
		node := ch.S.C.Nodes[ch.rng.IntN(len(ch.S.C.Nodes))]
		time.Sleep(ch.Pause/5 + time.Duration(ch.rng.Int64N(int64(ch.Pause))))
		began := time.Now()
		detail, err := ch.fault(ctx, kind, node)
		if err != nil {
			return fmt.Errorf("fault %d (%s on %s): %w", i+1, kind, node.Name, err)
		}
		ch.mu.Lock()
		ch.faults[kind]++
		ch.mu.Unlock()
		where := " on " + node.Name
		if kind == FaultStopAPIServer || kind == FaultEC2 || kind == FaultUpgrade {
			where = "" // not a node's
		}
		if err := ch.recover(ctx); err != nil {
			return fmt.Errorf("after fault %d (%s%s%s): %w", i+1, kind, where, detail, err)
		}
		if err := ch.settle(ctx, time.Now()); err != nil {
			return fmt.Errorf("after fault %d (%s%s%s): %w", i+1, kind, where, detail, err)
		}
		if err := ch.hardError(); err != nil {
			return err
		}
		ch.Logf("   fault %d/%d: %s%s%s; recovered and invariants hold after %s", i+1, ch.Faults, kind, where, detail, time.Since(began).Round(time.Second))
	}
	return nil
}

// fault injects one fault and returns once it is over (the process
// restarted, the API server back, EC2 healthy again).
func (ch *Chaos) fault(ctx context.Context, kind string, n *Node) (string, error) {
	c := ch.S.C
	switch kind {
	case FaultKillDaemon:
		pid, err := daemonPID(n)
		if err != nil {
			return "", err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return "", fmt.Errorf("kill %d: %w", pid, err)
		}
		return fmt.Sprintf(" (pid %d)", pid), newDaemon(ctx, n, pid)
	case FaultRestartContainerd:
		return "", n.CRI.Restart(ctx)
	case FaultRestartKubelet:
		return "", c.RestartKubelet(n)
	case FaultStopAPIServer:
		down := time.Duration(1+ch.rng.Int64N(int64(ch.APIDownMax/time.Second))) * time.Second
		c.API.StopAPIServer()
		time.Sleep(down)
		if err := c.API.StartAPIServer(); err != nil {
			return "", err
		}
		return fmt.Sprintf(" for %s", down), nil
	case FaultReboot:
		keep := ch.rng.IntN(2) == 0
		how := " (/run emptied, checkpoint lost)"
		if keep {
			how = " (/run emptied but the checkpoint kept)"
		}
		pid, _ := daemonPID(n)
		if err := c.Reboot(ctx, n, keep); err != nil {
			return "", err
		}
		return how, newDaemon(ctx, n, pid)
	case FaultUpgrade:
		return ch.upgradeRollback(ctx)
	case FaultEC2:
		f := c.Cloud.Faults()
		rate := 0.2 + 0.6*ch.rng.Float64()
		window := time.Duration(5+ch.rng.Int64N(int64(ch.EC2Window/time.Second))) * time.Second
		f.SetThrottle(true, 0.5, 1)
		f.SetThrottle(false, 2, 2)
		f.SetErrorRate(vpcsim.AnyOp, rate, "InternalError")
		// Demand addresses while EC2 fails: scale a Deployment up now.
		ch.scale(ctx, churnA, 4+ch.rng.IntN(6))
		time.Sleep(window)
		f.SetErrorRate(vpcsim.AnyOp, 0, "")
		f.SetThrottle(true, 0, 0)
		f.SetThrottle(false, 0, 0)
		return fmt.Sprintf(" (%.0f%% InternalError, throttled, for %s)", rate*100, window), nil
	}
	return "", fmt.Errorf("unknown fault kind %q", kind)
}

// upgradeRollback upgrades the release to UpgradeImage, waits a random
// part (0 to 8 Pause) of its rollout, rolls back and waits for the rollback's rollout.
// It returns which version each node's daemon ran at the rollback.
func (ch *Chaos) upgradeRollback(ctx context.Context) (string, error) {
	c := ch.S.C
	name, err := crinode.ImageName(ch.UpgradeImage)
	if err != nil {
		return "", err
	}
	tag := name[strings.LastIndexByte(name, ':')+1:]
	if _, err := c.InstallChart(ch.S.Helm, true, ch.S.Values, "image.tag="+tag); err != nil {
		return "", err
	}
	time.Sleep(time.Duration(ch.rng.Int64N(int64(8 * ch.Pause))))
	var ran []string
	for _, n := range c.Nodes {
		v := "down"
		if st, err := ch.S.daemonState(ctx, n); err == nil {
			v = st.Node.Version
		}
		ran = append(ran, n.Name+"="+v)
	}
	if _, err := c.Helm(ch.S.Helm, "rollback", Release, "-n", "kube-system"); err != nil {
		return "", err
	}
	ds, err := c.Kubectl(ctx, "get", "daemonset", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil {
		return "", err
	}
	if _, err := c.Kubectl(ctx, "rollout", "status", "-n", "kube-system", "daemonset/"+ds, "--timeout=10m"); err != nil {
		return "", err
	}
	return fmt.Sprintf(" (to %s; at the rollback: %s)", tag, strings.Join(ran, " ")), nil
}

// daemonPID finds the vpcipd daemon process of node n: the process whose
// command line is the DaemonSet's vpcipd container command (the install-cni
// container runs vpcipd with arguments) in the node's network namespace.
func daemonPID(n *Node) (int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/var/run/netns", n.Netns), &want); err != nil {
		return 0, err
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || string(cmd) != "/usr/local/bin/vpcipd\x00" {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", p.Name(), "ns", "net"), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no vpcipd daemon process in %s's netns", n.Name)
}

// newDaemon waits until kubelet has started a vpcipd daemon process on n
// other than old (its restart back-off grows with each kill, up to 5 min).
func newDaemon(ctx context.Context, n *Node, old int) error {
	deadline := time.Now().Add(7 * time.Minute)
	for {
		pid, err := daemonPID(n)
		if err == nil && pid != old {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no new vpcipd on %s after %s (%v)", n.Name, 7*time.Minute, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
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
		bad := ch.violations(v, checks)
		for k, w := range ch.pingSample(ctx, v, checks) {
			bad[k] = w
		}
		if ctx.Err() != nil {
			return
		}
		ch.apiReq.sample(ctx, ch.S.C)
		ch.mu.Lock()
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

// deploy starts the churned Deployments and the crash-looping pod (its
// container exits at once, so kubelet restarts it with back-off while its
// sandbox keeps its address).
func (ch *Chaos) deploy(ctx context.Context) error {
	for _, d := range []string{churnA, churnB} {
		m, err := ch.S.deployment(d, 4, "")
		if err != nil {
			return err
		}
		if err := ch.S.C.Apply(ctx, m); err != nil {
			return err
		}
	}
	image, err := crinode.ImageName(ch.S.C.Image)
	if err != nil {
		return err
	}
	crash := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - {name: exits, image: %[2]q, imagePullPolicy: Never, command: ["/usr/local/bin/vpcipd", "-version"]}
`, crashLoop, image)
	if err := ch.S.C.Apply(ctx, crash); err != nil {
		return err
	}
	_, err = ch.S.C.WaitPods(ctx, "default", "app in ("+churnA+","+churnB+")", 4*time.Minute, "8 churn pods Running", AllRunning(8))
	return err
}

// churn changes the workload every 1 to 4 s until ctx ends: scale a
// Deployment to 0..9 replicas, restart its rollout, or force-delete one of
// its pods. Errors (the API server may be down) are counted, not fatal.
func (ch *Chaos) churn(ctx context.Context) {
	for ctx.Err() == nil {
		ch.rngMu.Lock()
		op, d := ch.churnRng.IntN(10), []string{churnA, churnB}[ch.churnRng.IntN(2)]
		replicas, pick, pause := ch.churnRng.IntN(10), ch.churnRng.IntN(100), 1000+ch.churnRng.IntN(3000)
		ch.rngMu.Unlock()
		var what string
		var err error
		switch {
		case op < 4:
			what, err = "scale", ch.scale(ctx, d, replicas)
		case op < 6:
			what = "rollout restart"
			_, err = ch.S.C.Kubectl(ctx, "rollout", "restart", "deployment", d)
		default:
			what = "force delete"
			var pods []Pod
			if pods, err = ch.S.C.Pods(ctx, "default", "app="+d); err == nil && len(pods) > 0 {
				p := pods[pick%len(pods)]
				_, err = ch.S.C.Kubectl(ctx, "delete", "pod", p.Name, "--force", "--grace-period=0", "--wait=false")
			}
		}
		if err != nil && ctx.Err() == nil {
			what += " (failed)"
		}
		ch.mu.Lock()
		ch.churned[what]++
		ch.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(pause) * time.Millisecond):
		}
	}
}

func (ch *Chaos) scale(ctx context.Context, d string, replicas int) error {
	_, err := ch.S.C.Kubectl(ctx, "scale", "deployment", d, fmt.Sprintf("--replicas=%d", replicas))
	return err
}

// daemonFlowSchema classifies the vpcip daemons' requests (API Priority and
// Fairness) so that kube-apiserver's
// apiserver_flowcontrol_dispatched_requests_total counts them apart.
const daemonFlowSchema = "vpcip-daemons"

// countDaemonRequests makes the FlowSchema that matches the DaemonSet's
// ServiceAccount, at the priority level kube-system's service accounts
// already use.
func (ch *Chaos) countDaemonRequests(ctx context.Context) error {
	sa, err := ch.S.C.Kubectl(ctx, "get", "daemonset", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip",
		"-o", "jsonpath={.items[0].spec.template.spec.serviceAccountName}")
	if err != nil || sa == "" {
		return fmt.Errorf("the DaemonSet's ServiceAccount: %q %v", sa, err)
	}
	return ch.S.C.Apply(ctx, fmt.Sprintf(`apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: %s}
spec:
  matchingPrecedence: 300
  priorityLevelConfiguration: {name: workload-high}
  distinguisherMethod: {type: ByUser}
  rules:
    - subjects: [{kind: ServiceAccount, serviceAccount: {name: %s, namespace: kube-system}}]
      resourceRules: [{verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}]
      nonResourceRules: [{verbs: ["*"], nonResourceURLs: ["*"]}]
`, daemonFlowSchema, sa))
}

// apiCounter sums the daemons' dispatched requests across API server
// restarts (the counter starts again at 0 in a new process).
type apiCounter struct {
	mu      sync.Mutex
	started bool // the first sample is the baseline
	last    float64
	total   int
}

func (a *apiCounter) sample(ctx context.Context, c *Cluster) {
	v, err := daemonRequests(ctx, c)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case !a.started:
		a.started = true
	case v < a.last: // a restarted API server counts from 0
		a.total += int(v)
	default:
		a.total += int(v - a.last)
	}
	a.last = v
}

// daemonRequests reads apiserver_flowcontrol_dispatched_requests_total of
// the daemons' FlowSchema from kube-apiserver's /metrics.
func daemonRequests(ctx context.Context, c *Cluster) (float64, error) {
	cs, err := kubernetes.NewForConfig(c.API.Config)
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(cctx)
	if err != nil {
		return 0, err
	}
	return sumMetric(string(body), "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="`+daemonFlowSchema+`"`)
}

// sumMetric adds the samples of a metric (Prometheus text format) whose
// labels contain label.
func sumMetric(text, name, label string) (float64, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, errors.New(name + " with " + label + ": no sample")
	}
	return sum, sc.Err()
}
