package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

const burst = 30

// preWarmed is how many addresses the node holds for (a) and (b): 20
// sequential pods per round of (a) and 30 per burst of (b), none reused
// within the cooldown (an m5.4xlarge holds 232).
func preWarmed(rounds, bursts int) int { return min(rounds*20+bursts*burst+2, 232) }

// latency measures (a) and (b) on one m5.4xlarge node and on a reference node
// running ptp+host-local, with the same runtime code path.
func (b *bench) latency(ctx context.Context) error {
	work, err := os.MkdirTemp("", "vpcip-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: b.prefix("bl"), Nodes: 1, InstanceType: "m5.4xlarge", BinDir: b.bin, WorkDir: work,
		// Every round's addresses held from the start (MINIMUM_IP_TARGET)
		// and the pool grown before the first measurement, so no refill
		// runs while ADDs are measured: EC2's side of a refill is vpcsim
		// and its fabric here, which share this machine's cores, while on
		// AWS it runs off the node (and the reference chain makes no cloud
		// call at all).
		DaemonEnv: []string{"WARM_IP_TARGET=1", "MINIMUM_IP_TARGET=" + strconv.Itoa(preWarmed(b.rounds, b.burstRounds))},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	node := c.Nodes[0]
	ref, err := referenceNode(ctx, work, b.prefix("bl")+"r")
	if err != nil {
		return err
	}
	defer podruntime.CleanupNetns(ref.Netns)

	if err := waitWarmFor(ctx, node, preWarmed(b.rounds, b.burstRounds), 3*time.Minute); err != nil {
		return err
	}
	ours, theirs := timings{cpu: cpuMeter{daemonPID: node.DaemonPID()}}, timings{}
	for r := range b.rounds {
		if err := waitWarm(ctx, node, 20); err != nil {
			return err
		}
		if err := sequential(ctx, node.Runtime, 20, fmt.Sprintf("seq%d", r), &ours); err != nil {
			return err
		}
		if err := sequential(ctx, ref, 20, fmt.Sprintf("seq%d", r), &theirs); err != nil {
			return err
		}
	}
	b.add(Figure{Name: "(a) warm ADD p50", Value: ours.p(0.5, ours.add), Ref: theirs.p(0.5, theirs.add), Unit: "ms", Goal: "≤ 0.6×"})
	b.add(Figure{Name: "(a) warm ADD p99", Value: ours.p(0.99, ours.add), Ref: theirs.p(0.99, theirs.add), Unit: "ms", Goal: "≤ 0.8×"})
	b.add(Figure{Name: "(a) DEL p50", Value: ours.p(0.5, ours.del), Ref: theirs.p(0.5, theirs.del), Unit: "ms"})
	b.add(Figure{Name: "(a) DEL p99", Value: ours.p(0.99, ours.del), Ref: theirs.p(0.99, theirs.del), Unit: "ms"})
	b.addCPU("(a)", &ours, &theirs)
	walk, err := conntrackWalk(node.Netns)
	if err != nil {
		return err
	}
	b.add(Figure{Name: "(a) one conntrack table dump", Value: ms(walk), Unit: "ms",
		Note: "CPU; vpcipd makes one per batch of addresses before reuse"})

	// One burst is 30 samples on a 2-core machine: repeat it (b.burstRounds
	// times) and report percentiles over all of them and the median wall time.
	bo, bt := timings{cpu: ours.cpu}, timings{}
	var wallsOurs, wallsRef []time.Duration
	for range b.burstRounds {
		if err := waitWarm(ctx, node, burst); err != nil {
			return err
		}
		w, err := concurrent(ctx, node.Runtime, burst, &bo)
		if err != nil {
			return err
		}
		wallsOurs = append(wallsOurs, w)
		if w, err = concurrent(ctx, ref, burst, &bt); err != nil {
			return err
		}
		wallsRef = append(wallsRef, w)
	}
	wallOurs, wallRef := median(wallsOurs), median(wallsRef)
	b.add(Figure{Name: "(b) 30 concurrent ADDs p50", Value: bo.p(0.5, bo.add), Ref: bt.p(0.5, bt.add), Unit: "ms", Goal: "≤ 0.5×"})
	b.add(Figure{Name: "(b) 30 concurrent ADDs p99", Value: bo.p(0.99, bo.add), Ref: bt.p(0.99, bt.add), Unit: "ms"})
	b.add(Figure{Name: "(b) 30 concurrent ADDs wall time (median)", Value: ms(wallOurs), Ref: ms(wallRef), Unit: "ms"})
	b.addCPU("(b)", &bo, &bt)
	return nil
}

// addCPU adds the CPU time per ADD of ours (plugin + daemon) against the
// reference chain's, our split between plugin and daemon, and the same for
// DEL when DELs were measured.
func (b *bench) addCPU(tag string, ours, ref *timings) {
	b.add(Figure{Name: tag + " CPU time per ADD", Value: ours.perAdd(ours.addCPU + ours.addDaemonCPU),
		Ref: ref.perAdd(ref.addCPU), Unit: "ms", Goal: "≤ 0.5×"})
	b.add(Figure{Name: tag + " of which in vpcip-cni", Value: ours.perAdd(ours.addCPU), Unit: "ms",
		Note: fmt.Sprintf("the rest in vpcipd: %.2f ms", ours.perAdd(ours.addDaemonCPU))})
	if ours.cpuDels > 0 {
		b.add(Figure{Name: tag + " CPU time per DEL", Value: ours.perDel(ours.delCPU + ours.delDaemonCPU),
			Ref: ref.perDel(ref.delCPU), Unit: "ms"})
	}
}

// referenceNode is a plain netns named netnsName whose conflist is ptp +
// host-local.
func referenceNode(ctx context.Context, work, netnsName string) (*podruntime.Node, error) {
	dir, err := cluster.ReferencePlugins(ctx, "", "ptp", "host-local")
	if err != nil {
		return nil, err
	}
	n := &podruntime.Node{Netns: netnsName, ConfDir: filepath.Join(work, "ref-net.d"), BinDir: dir,
		CacheDir: filepath.Join(work, "ref-cache"), Prefix: netnsName}
	if err := os.MkdirAll(n.ConfDir, 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"reference","plugins":[{"type":"ptp","mtu":9001,
"ipam":{"type":"host-local","ranges":[[{"subnet":"10.250.0.0/16"}]],"dataDir":%q}}]}`, filepath.Join(work, "ref-ipam"))
	if err := os.WriteFile(filepath.Join(n.ConfDir, "10-reference.conflist"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if err := podruntime.CreateNetns(n.Netns); err != nil {
		return nil, err
	}
	return n, nil
}

type timings struct {
	add, del []time.Duration

	cpu                  cpuMeter
	addCPU, addDaemonCPU time.Duration // summed over len(add) ADDs
	delCPU, delDaemonCPU time.Duration // summed over cpuDels DELs
	cpuDels              int
}

// perAdd and perDel are CPU milliseconds per operation.
func (t *timings) perAdd(d time.Duration) float64 {
	if len(t.add) == 0 {
		return 0
	}
	return ms(d) / float64(len(t.add))
}

func (t *timings) perDel(d time.Duration) float64 {
	if t.cpuDels == 0 {
		return 0
	}
	return ms(d) / float64(t.cpuDels)
}

func (t *timings) p(q float64, d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s)) + 0.5)
	return ms(s[min(max(i-1, 0), len(s)-1)])
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sequential(ctx context.Context, n *podruntime.Node, count int, tag string, t *timings) error {
	var pods []*podruntime.Pod
	for i := range count {
		s := t.cpu.now()
		p, err := n.Add(ctx, podruntime.PodSpec{Namespace: "bench", Name: fmt.Sprintf("%s-%d", tag, i)})
		if err != nil {
			return err
		}
		chain, daemon := t.cpu.since(s)
		t.addCPU, t.addDaemonCPU = t.addCPU+chain, t.addDaemonCPU+daemon
		t.add = append(t.add, p.AddTime)
		pods = append(pods, p)
	}
	for _, p := range pods {
		s := t.cpu.now()
		if err := n.Del(ctx, p); err != nil {
			return err
		}
		chain, daemon := t.cpu.since(s)
		t.delCPU, t.delDaemonCPU, t.cpuDels = t.delCPU+chain, t.delDaemonCPU+daemon, t.cpuDels+1
		t.del = append(t.del, p.DelTime)
	}
	return nil
}

func concurrent(ctx context.Context, n *podruntime.Node, count int, t *timings) (time.Duration, error) {
	pods := make([]*podruntime.Pod, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	s := t.cpu.now()
	start := time.Now()
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = n.Add(ctx, podruntime.PodSpec{Namespace: "bench", Name: fmt.Sprintf("burst-%d", i)})
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	chain, daemon := t.cpu.since(s)
	t.addCPU, t.addDaemonCPU = t.addCPU+chain, t.addDaemonCPU+daemon
	for i, p := range pods {
		if errs[i] != nil {
			return 0, errs[i]
		}
		t.add = append(t.add, p.AddTime)
	}
	for _, p := range pods {
		if err := n.Del(ctx, p); err != nil {
			return 0, err
		}
	}
	return wall, nil
}

func waitWarm(ctx context.Context, n *cluster.Node, want int) error {
	return waitWarmFor(ctx, n, want, 60*time.Second)
}

// waitWarmFor waits up to limit for want warm addresses on n.
func waitWarmFor(ctx context.Context, n *cluster.Node, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		st, err := n.Client().Status(ctx)
		if err == nil && st.Warm >= want {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: pool did not reach %d warm addresses", n.Name, want)
}

// memory measures (c): vpcipd's VmRSS with b.memPods pods on a c5.18xlarge.
func (b *bench) memory(ctx context.Context) error {
	work, err := os.MkdirTemp("", "vpcip-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix: b.prefix("bm"), Nodes: 1, InstanceType: "c5.18xlarge", BinDir: b.bin, WorkDir: work,
		DaemonEnv: []string{"WARM_IP_TARGET=32"},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	node := c.Nodes[0]
	idle := rss(node.DaemonPID())
	for i := range b.memPods {
		if _, err := node.AddPod(ctx, "bench", fmt.Sprintf("mem-%d", i)); err != nil {
			return err
		}
	}
	b.add(Figure{Name: "(c) vpcipd RSS, idle", Value: float64(idle) / 1024, Unit: "MiB"})
	b.add(Figure{Name: fmt.Sprintf("(c) vpcipd RSS with %d pods", b.memPods), Value: float64(rss(node.DaemonPID())) / 1024, Unit: "MiB"})
	return nil
}

// rss reads VmRSS of pid, in KiB.
func rss(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, _ := strconv.Atoi(f[0])
				return v
			}
		}
	}
	return 0
}
