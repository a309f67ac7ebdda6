package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/netnsdir"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// Kill campaign: vpcipd is killed with SIGKILL at random moments while pods
// churn on two vpcsim nodes: ADDs, DELs, stale repeated DELs of deleted
// sandboxes carrying their old result, new sandboxes of the same pod (after
// a DEL, or after a runtime restart that dropped the old netns without one),
// GC with the runtime's list, and restarts with the checkpoint kept, removed
// or corrupted. After every restart: no address is on two live sandboxes,
// every live sandbox is wired (pod interface, host route to a veth that
// names it) and recorded by its daemon, and no dead sandbox's record holds
// a live sandbox's address. Once churn stops and the runtime's DELs and GC
// ran, nothing is left: no assignment, veth, route, rule or netns.
//
// VPCIP_KILLS sets the number of kills (default 6, a short run for make
// test); make soak runs 100.

// killsEnv names the variable that sets the campaign's number of kills.
const killsEnv = "VPCIP_KILLS"

func TestKillCampaign(t *testing.T) {
	kills := 6
	if v := os.Getenv(killsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of kills", killsEnv, v)
		}
		kills = n
	}
	if testing.Short() {
		t.Skip("kill campaign")
	}
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", Prefix: fmt.Sprintf("ek%d", os.Getpid()%10000),
		DaemonEnv: []string{"IP_COOLDOWN_PERIOD=0", "VPCIP_GC_GRACE=10s", "VPCIP_RECONCILE_INTERVAL=2s",
			"VPCIP_METRICS_ADDR=off"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(kills)*20*time.Second+2*time.Minute)
	defer cancel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill campaign: %d kills, seed %d", kills, seed)
	rng := rand.New(rand.NewPCG(seed, 12))
	nodes := make([]*churner, len(c.Nodes))
	for i, n := range c.Nodes {
		nodes[i] = &churner{t: t, node: n, rng: rand.New(rand.NewPCG(seed, uint64(i))), pods: map[string]int{}, ops: map[string]int{}}
	}
	began := time.Now()
	for k := range kills {
		victim := nodes[rng.IntN(len(nodes))]
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, ch := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); ch.run(ctx, stop) }()
		}
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		victim.node.StopDaemon(true) // kill -9 at a random moment of the churn
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		close(stop)
		wg.Wait()
		how := tamperCheckpoint(t, victim.node, rng)
		if err := victim.node.StartDaemon(ctx); err != nil {
			t.Fatalf("kill %d: restart %s (%s): %v", k+1, victim.node.Name, how, err)
		}
		for _, ch := range nodes {
			ch.retryDels(ctx)
		}
		checkInvariants(t, ctx, c, nodes, fmt.Sprintf("after kill %d of %s (checkpoint %s)", k+1, victim.node.Name, how))
		if t.Failed() {
			t.Fatalf("stopping the campaign at kill %d", k+1)
		}
	}
	t.Logf("kill campaign: %d kills in %s; ops: %s", kills, time.Since(began).Round(time.Second), opsSummary(nodes))
	for _, ch := range nodes {
		ch.drain(ctx)
	}
	assertNoLeak(t, ctx, c, nodes)
}

// tamperCheckpoint keeps, removes or corrupts the node's checkpoint before a
// restart, and says which.
func tamperCheckpoint(t *testing.T, n *cluster.Node, rng *rand.Rand) string {
	t.Helper()
	switch r := rng.IntN(10); {
	case r < 2:
		if err := os.Remove(n.Checkpoint()); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return "removed"
	case r < 3:
		if err := os.WriteFile(n.Checkpoint(), []byte("\x00\x00{\"version\":1,"), 0o600); err != nil {
			t.Fatal(err)
		}
		return "corrupted"
	}
	return "kept"
}

// sandbox is one pod sandbox the runtime made, with its libcni cache entry
// (kept for stale DELs after it was deleted).
type sandbox struct {
	pod   *podruntime.Pod
	cache []byte
}

// churner is one node's runtime: it adds, deletes and recreates sandboxes.
type churner struct {
	t    *testing.T
	node *cluster.Node
	rng  *rand.Rand

	mu      sync.Mutex // guards the fields below
	live    []*sandbox
	dead    []*sandbox     // deleted or dropped; their stale DELs are replayed
	pending []*sandbox     // DEL failed (daemon down): retried after the restart
	pods    map[string]int // pod name → sandboxes made for it
	ops     map[string]int // what the churn did, for the log
	seq     int
}

func (ch *churner) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		ch.step(ctx)
	}
}

// step does one random runtime action.
func (ch *churner) step(ctx context.Context) {
	ch.mu.Lock()
	nLive, nDead := len(ch.live), len(ch.dead)
	r := ch.rng.IntN(100)
	ch.mu.Unlock()
	switch {
	case nLive < 3 || (nLive < 12 && r < 35):
		ch.add(ctx, ch.newPodName())
	case r < 55:
		ch.del(ctx, ch.takeLive())
	case r < 65 && nDead > 0:
		ch.staleDel(ctx)
	case r < 80:
		old := ch.takeLive()
		ch.del(ctx, old) // kubelet: sandbox died, DEL, then a new sandbox of the pod
		ch.add(ctx, old.pod.Name)
	case r < 92:
		old := ch.takeLive()
		ch.drop(old) // runtime restart: the netns went, no DEL came
		ch.add(ctx, old.pod.Name)
	default:
		ch.gc(ctx)
	}
}

func (ch *churner) count(op string) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.ops[op]++
}

func (ch *churner) newPodName() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.seq++
	return fmt.Sprintf("p%d", ch.seq)
}

// takeLive removes a random live sandbox from the live set.
func (ch *churner) takeLive() *sandbox {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	i := ch.rng.IntN(len(ch.live))
	s := ch.live[i]
	ch.live = append(ch.live[:i], ch.live[i+1:]...)
	return s
}

func (ch *churner) add(ctx context.Context, name string) {
	p, err := ch.node.AddPod(ctx, "default", name)
	if err != nil {
		ch.count("add-failed") // daemon down: the runtime undid the sandbox
		return
	}
	cache, _ := os.ReadFile(ch.cachePath(p))
	ch.mu.Lock()
	ch.live = append(ch.live, &sandbox{pod: p, cache: cache})
	ch.pods[name]++
	ch.mu.Unlock()
	ch.count("add")
}

func (ch *churner) cachePath(p *podruntime.Pod) string {
	return fmt.Sprintf("%s/results/%s-%s-%s", ch.node.Runtime.CacheDir, p.Network, p.ContainerID, p.IfName)
}

// del runs the runtime's DEL; when it fails (daemon down) the sandbox is
// kept to retry, as kubelet does.
func (ch *churner) del(ctx context.Context, s *sandbox) {
	err := ch.node.DelPod(ctx, s.pod)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if err != nil {
		ch.pending = append(ch.pending, s)
		ch.ops["del-failed"]++
		return
	}
	ch.dead = append(ch.dead, s)
	ch.ops["del"]++
}

// drop removes the sandbox's netns without a DEL (a runtime restart).
func (ch *churner) drop(s *sandbox) {
	if err := netnsdir.Delete(s.pod.Netns); err != nil {
		ch.t.Errorf("drop netns %s: %v", s.pod.Netns, err)
	}
	ch.mu.Lock()
	ch.dead = append(ch.dead, s)
	ch.ops["drop"]++
	ch.mu.Unlock()
}

// staleDel replays the DEL of a deleted sandbox with its old cached result
// (prevResult), as a runtime retrying an old DEL does. It must not fail
// when the daemon is up, whatever now holds the address.
func (ch *churner) staleDel(ctx context.Context) {
	ch.mu.Lock()
	s := ch.dead[ch.rng.IntN(len(ch.dead))]
	ch.mu.Unlock()
	if len(s.cache) > 0 {
		if err := os.WriteFile(ch.cachePath(s.pod), s.cache, 0o600); err != nil {
			ch.t.Errorf("restore cache of %s: %v", s.pod.Name, err)
			return
		}
	}
	if err := ch.node.DelPod(ctx, s.pod); err != nil {
		ch.count("stale-del-failed")
		return
	}
	ch.count("stale-del")
}

// gc runs the runtime's GC with its live sandboxes as the valid list.
func (ch *churner) gc(ctx context.Context) {
	ch.mu.Lock()
	valid := make([]*podruntime.Pod, 0, len(ch.live))
	for _, s := range ch.live {
		valid = append(valid, s.pod)
	}
	ch.mu.Unlock()
	if err := ch.node.Runtime.GC(ctx, valid); err != nil {
		ch.count("gc-failed")
		return
	}
	ch.count("gc")
}

// retryDels retries the DELs that failed while the daemon was down.
func (ch *churner) retryDels(ctx context.Context) {
	ch.mu.Lock()
	pending := ch.pending
	ch.pending = nil
	ch.mu.Unlock()
	for _, s := range pending {
		if err := ch.node.DelPod(ctx, s.pod); err != nil {
			ch.t.Errorf("%s: DEL of %s retried after the restart: %v", ch.node.Name, s.pod.Name, err)
			continue
		}
		ch.mu.Lock()
		ch.dead = append(ch.dead, s)
		ch.mu.Unlock()
	}
}

// drain deletes every live sandbox, then runs GC with nothing valid once the
// daemon's GC grace has passed, as a runtime does after the node empties.
func (ch *churner) drain(ctx context.Context) {
	for len(ch.live) > 0 {
		ch.del(ctx, ch.takeLive())
	}
	ch.retryDels(ctx)
	time.Sleep(10500 * time.Millisecond) // VPCIP_GC_GRACE (its least, config.MinGCGrace)
	if err := ch.node.Runtime.GC(ctx, nil); err != nil {
		ch.t.Errorf("%s: final GC: %v", ch.node.Name, err)
	}
}

func opsSummary(nodes []*churner) string {
	total := map[string]int{}
	for _, ch := range nodes {
		for k, v := range ch.ops {
			total[k] += v
		}
	}
	return fmt.Sprint(total)
}
