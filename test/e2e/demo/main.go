// Command demo is `make demo`: vpcip doing its job on vpcsim. It starts a
// simulated VPC with two m5.large instances, a vpcipd per instance, installs
// the conflist, starts pods through libcni exactly as a runtime does, shows
// cross-node and outside traffic and each node's capacity, deletes half the
// pods, shows the pool settle, and removes everything it made (also on
// Ctrl-C).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
	"github.com/vpcip/vpcip/warmpool"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding vpcipd, vpcip-cni and vpcipctl")
	nodes := flag.Int("nodes", 2, "instances")
	pods := flag.Int("pods", 40, "pods to start, spread over the nodes")
	itype := flag.String("instance-type", "m5.large", "EC2 instance type of every node")
	prefix := flag.String("prefix", "vdemo", "name prefix of every netns and link the demo makes")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (it builds network namespaces)")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	err := run(ctx, *bin, *nodes, *pods, *itype, *prefix)
	switch {
	case ctx.Err() != nil:
		fmt.Println("interrupted")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
	step("done in %s", time.Since(start).Round(100*time.Millisecond))
}

// demoEnv runs the default (adaptive) warm pool with short timers, so the
// pool is seen settling within the demo: production has IP_COOLDOWN_PERIOD=30,
// a 30 s release interval (the adaptive policy's delays and memories shrink
// with it, here 15-fold) and a 1 minute ENI minimum age.
var demoEnv = []string{"IP_COOLDOWN_PERIOD=5",
	"VPCIP_RELEASE_INTERVAL=" + releaseInterval.String(), "VPCIP_ENI_MIN_AGE=5s", "VPCIP_POOL_INTERVAL=1s"}

// releaseInterval is the demo's VPCIP_RELEASE_INTERVAL.
const releaseInterval = 2 * time.Second

// settleQuiet is how long EC2's view of the nodes must stay unchanged, with
// nothing cooling, for the pool to count as settled: the adaptive policy's
// ReleaseDelay and DepartureQuiet at the demo's time scale (16 s), the
// least it waits after pods came or left before a release.
var settleQuiet = (warmpool.ReleaseDelay + warmpool.DepartureQuiet) / (warmpool.DefaultReleaseInterval / releaseInterval)

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run(ctx context.Context, bin string, nodes, npods int, itype, prefix string) error {
	binAbs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "vpcip-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	step("starting vpcsim: %d × %s, EC2 API and IMDS inside the fabric", nodes, itype)
	fmt.Printf("    vpcipd settings for the demo: %s\n", strings.Join(demoEnv, " "))
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: prefix, Nodes: nodes, InstanceType: itype, BinDir: binAbs, WorkDir: work, Outside: true,
		DaemonEnv: demoEnv,
		Logf:      func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down")
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "teardown:", err)
			return
		}
		fmt.Printf("    removed every netns, link and process the demo made (prefix %s)\n", prefix)
	}()
	step("vpcipd ready on every node; conflist installed by `vpcipd install-cni`")

	step("starting %d pods through libcni (Kubernetes CNI_ARGS)", npods)
	pods, err := startPods(ctx, c, npods)
	if err != nil {
		if ctx.Err() == nil {
			for _, n := range c.Nodes {
				fmt.Printf("--- %s vpcipd log (last lines)\n%s\n", n.Name, n.LogTail(5))
			}
		}
		return err
	}
	printPods(c, pods)

	if err := showTraffic(ctx, c, pods); err != nil {
		if os.Getenv("VPCIP_DEMO_HOLD") != "" {
			fmt.Println("holding for inspection until interrupted:", err)
			<-ctx.Done()
		}
		return err
	}
	if err := showCapacity(ctx, c); err != nil {
		return err
	}

	before := cloudView(c)
	step("deleting half the pods")
	// Per node, the pods on the highest device numbers go: scale-down then
	// empties an ENI, whose addresses the pool gives back while it keeps the
	// ENI attached (README, "The default warm pool").
	kept := slices.Clone(pods)
	slices.SortStableFunc(kept, func(a, b placed) int { return deviceOf(c, b) - deviceOf(c, a) })
	deleted := map[*cluster.Node]int{}
	kept = slices.DeleteFunc(kept, func(p placed) bool {
		if deleted[p.node] >= len(pods)/len(c.Nodes)/2 {
			return false
		}
		deleted[p.node]++
		if err == nil {
			err = p.node.DelPod(ctx, p.pod)
		}
		return true
	})
	if err != nil {
		return err
	}
	step("waiting for the pool to settle: the default pool gives idle surplus back once that saves enough idle address-time to be worth an EC2 call, and keeps an emptied ENI attached without addresses for the next burst (WARM_ENI_TARGET=1 would delete it)")
	deletedAt := time.Now()
	settled, err := waitSettled(ctx, c, settleQuiet, 90*time.Second)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Println("    " + err.Error())
	} else {
		fmt.Printf("    settled %.0f s after the deletion (nothing changed for the next %s)\n", settled.Sub(deletedAt).Seconds(), settleQuiet)
	}
	after := cloudView(c)
	for _, n := range c.Nodes {
		fmt.Printf("    %s as EC2 sees it: %s → %s\n", n.Name, before[n.Name], after[n.Name])
	}
	if err := showCapacity(ctx, c); err != nil {
		return err
	}
	for _, p := range kept {
		if err := p.node.DelPod(ctx, p.pod); err != nil {
			return err
		}
	}
	return nil
}

type placed struct {
	node *cluster.Node
	pod  *podruntime.Pod
}

func startPods(ctx context.Context, c *cluster.Cluster, n int) ([]placed, error) {
	out := make([]placed, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			node := c.Nodes[i%len(c.Nodes)]
			p, err := node.AddPod(ctx, "default", fmt.Sprintf("web-%02d", i+1))
			out[i], errs[i] = placed{node, p}, err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func printPods(c *cluster.Cluster, pods []placed) {
	per := map[string]int{}
	byDevice := map[string]map[int]int{}
	for _, p := range pods {
		per[p.node.Name]++
		if byDevice[p.node.Name] == nil {
			byDevice[p.node.Name] = map[int]int{}
		}
		byDevice[p.node.Name][deviceOf(c, p)]++
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    NODE\tINSTANCE\tPODS\tPODS PER ENI (device number: pods)")
	for _, n := range c.Nodes {
		var parts []string
		devs := make([]int, 0, len(byDevice[n.Name]))
		for d := range byDevice[n.Name] {
			devs = append(devs, d)
		}
		sort.Ints(devs)
		for _, d := range devs {
			parts = append(parts, fmt.Sprintf("eth%d: %d", d, byDevice[n.Name][d]))
		}
		fmt.Fprintf(tw, "    %s\t%s\t%d\t%s\n", n.Name, n.InstanceID, per[n.Name], strings.Join(parts, ", "))
	}
	tw.Flush()
}

// deviceOf is the device number of the ENI that EC2 says holds the pod's address.
func deviceOf(c *cluster.Cluster, p placed) int {
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID != p.node.InstanceID {
			continue
		}
		for _, a := range e.SecondaryIPs {
			if a == p.pod.Address {
				return e.DeviceIndex
			}
		}
		for _, pr := range e.Prefixes {
			if pr.Contains(p.pod.Address) {
				return e.DeviceIndex
			}
		}
	}
	return -1
}

func describe(c *cluster.Cluster, p placed) string {
	return fmt.Sprintf("%s (%s on %s eth%d)", p.pod.Name, p.pod.Address, p.node.Name, deviceOf(c, p))
}

func showTraffic(ctx context.Context, c *cluster.Cluster, pods []placed) error {
	step("pod-to-pod traffic through the fabric (ping)")
	// One pod on the primary ENI (eth0) and one on a secondary ENI per node.
	pick := func(n *cluster.Node, primary bool) (placed, bool) {
		for _, p := range pods {
			if p.node == n && (deviceOf(c, p) == 0) == primary {
				return p, true
			}
		}
		return placed{}, false
	}
	n1, n2 := c.Nodes[0], c.Nodes[len(c.Nodes)-1]
	for _, pr := range [][2]struct {
		n       *cluster.Node
		primary bool
	}{
		{{n1, true}, {n2, true}},
		{{n1, false}, {n2, false}},
		{{n2, false}, {n1, true}},
	} {
		from, ok1 := pick(pr[0].n, pr[0].primary)
		to, ok2 := pick(pr[1].n, pr[1].primary)
		if !ok1 || !ok2 || from.pod == to.pod {
			continue // too few pods for a secondary ENI
		}
		if err := cluster.Ping(ctx, from.pod, to.pod.Address); err != nil {
			return err
		}
		fmt.Printf("    %s → %s: ok\n", describe(c, from), describe(c, to))
	}
	last, ok := pick(n2, false)
	if !ok {
		last, _ = pick(n2, true)
	}

	step("pod to the outside host %s through SNAT", c.Outside)
	if err := c.StartSourceEcho(ctx); err != nil {
		return err
	}
	seen, err := c.SourceSeenOutside(ctx, last.pod)
	if err != nil {
		return err
	}
	fmt.Printf("    %s → %s: the outside host saw source %s (%s's primary address is %s)\n",
		describe(c, last), c.Outside, seen, last.node.Name, last.node.PrimaryIP)
	return nil
}

func showCapacity(ctx context.Context, c *cluster.Cluster) error {
	step("vpcipctl capacity")
	for _, n := range c.Nodes {
		out, err := n.Ctl(ctx, "capacity")
		if err != nil {
			return err
		}
		fmt.Printf("    [%s]\n", n.Name)
		for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			fmt.Println("    " + line)
		}
	}
	return nil
}

// cloudView is, per node, the ENIs and secondary addresses EC2 has
// assigned, with each ENI's count by device number: "3 ENIs, 18 secondary
// addresses (eth0: 9, eth1: 9, eth2: 0)".
func cloudView(c *cluster.Cluster) map[string]string {
	out := map[string]string{}
	for _, n := range c.Nodes {
		var enis []vpcsim.ENIInfo
		addrs := 0
		for _, e := range c.Cloud.NetworkInterfaces() {
			if e.InstanceID == n.InstanceID {
				enis = append(enis, e)
				addrs += len(e.SecondaryIPs) + 16*len(e.Prefixes)
			}
		}
		slices.SortFunc(enis, func(a, b vpcsim.ENIInfo) int { return a.DeviceIndex - b.DeviceIndex })
		per := make([]string, len(enis))
		for i, e := range enis {
			per[i] = fmt.Sprintf("eth%d: %d", e.DeviceIndex, len(e.SecondaryIPs)+16*len(e.Prefixes))
		}
		out[n.Name] = fmt.Sprintf("%d ENIs, %d secondary addresses (%s)", len(enis), addrs, strings.Join(per, ", "))
	}
	return out
}

// waitSettled waits until no node has addresses cooling and EC2's view of
// every node has not changed for quiet, and returns when the view last
// changed (or cooling last ended).
func waitSettled(ctx context.Context, c *cluster.Cluster, quiet, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	last, since := "", time.Now()
	for time.Now().Before(deadline) {
		view := fmt.Sprint(cloudView(c))
		cooling := 0
		for _, n := range c.Nodes {
			st, err := n.Client().Status(ctx)
			if err != nil {
				return since, err
			}
			cooling += st.Cooling
		}
		if view != last || cooling > 0 {
			last, since = view, time.Now()
		} else if time.Since(since) >= quiet {
			return since, nil
		}
		select {
		case <-ctx.Done():
			return since, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return since, fmt.Errorf("pool still changing after %s", timeout)
}
