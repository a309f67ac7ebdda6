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
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
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
	if err := run(ctx, *bin, *nodes, *pods, *itype, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run(ctx context.Context, bin string, nodes, npods int, itype, prefix string) error {
	start := time.Now()
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
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: prefix, Nodes: nodes, InstanceType: itype, BinDir: binAbs, WorkDir: work, Outside: true,
		// Keep a small warm pool so the demo shows the pool settling after scale-down.
		DaemonEnv: []string{"WARM_IP_TARGET=3", "MINIMUM_IP_TARGET=6", "IP_COOLDOWN_PERIOD=5", "VPCIP_RELEASE_INTERVAL=2s", "VPCIP_ENI_MIN_AGE=5s", "VPCIP_POOL_INTERVAL=1s"},
		Logf:      func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down")
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "teardown:", err)
		}
	}()
	step("vpcipd ready on every node; conflist installed by `vpcipd install-cni`")

	step("starting %d pods through libcni (Kubernetes CNI_ARGS)", npods)
	pods, err := startPods(ctx, c, npods)
	if err != nil {
		for _, n := range c.Nodes {
			fmt.Printf("--- %s vpcipd log (tail)\n%s\n", n.Name, n.LogTail(15))
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

	step("deleting half the pods")
	var kept []placed
	for i, p := range pods {
		if (i/len(c.Nodes))%2 == 0 { // every other pod of each node
			kept = append(kept, p)
			continue
		}
		if err := p.node.DelPod(ctx, p.pod); err != nil {
			return err
		}
	}
	step("waiting for the pool to settle (cooldown 5 s, then surplus released)")
	if err := waitSettled(ctx, c, 45*time.Second); err != nil {
		fmt.Println("    ", err)
	}
	if err := showCapacity(ctx, c); err != nil {
		return err
	}
	for _, p := range kept {
		if err := p.node.DelPod(ctx, p.pod); err != nil {
			return err
		}
	}
	step("done in %s", time.Since(start).Round(100*time.Millisecond))
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
	pick := func(n *cluster.Node, primary bool) placed {
		for _, p := range pods {
			if p.node == n && (deviceOf(c, p) == 0) == primary {
				return p
			}
		}
		return pods[0]
	}
	n1, n2 := c.Nodes[0], c.Nodes[len(c.Nodes)-1]
	pairs := [][2]placed{
		{pick(n1, true), pick(n2, true)},
		{pick(n1, false), pick(n2, false)},
		{pick(n2, false), pick(n1, true)},
	}
	for _, pr := range pairs {
		if err := cluster.Ping(ctx, pr[0].pod, pr[1].pod.Address); err != nil {
			return err
		}
		fmt.Printf("    %s → %s: ok\n", describe(c, pr[0]), describe(c, pr[1]))
	}
	last := pick(n2, false)

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

// waitSettled polls each node's pool until its warm count stops changing.
func waitSettled(ctx context.Context, c *cluster.Cluster, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := map[string]string{}
	stable := 0
	for time.Now().Before(deadline) {
		changed := false
		for _, n := range c.Nodes {
			out, err := n.Ctl(ctx, "pool", "-o", "json")
			if err != nil {
				return err
			}
			if last[n.Name] != out {
				changed = true
				last[n.Name] = out
			}
		}
		if changed {
			stable = 0
		} else if stable++; stable >= 6 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("pool still changing after %s", timeout)
}
