package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// kill -9 of the daemon in the middle of pod churn, then a restart: no
// address is held by two pods, every live pod keeps its address in the
// daemon's records, and pods deleted while it was down do not leak: their
// DELs succeed without the daemon, which frees their addresses as below
// once restarted. An ADD the kill cut short after the daemon recorded its
// address fails; the runtime's one DEL of it then finds the daemon down,
// removes the host side and succeeds, and its netns goes. The address
// stays in the daemon's
// records until its host check (every VPCIP_RECONCILE_INTERVAL, here 1 s)
// has seen it without a route twice, VPCIP_GC_GRACE (here the least, 10 s)
// after its assignment, and the netns witness confirms the sandbox gone: the
// records must match the live pods within grace + a few checks, not at once.
func TestDaemonKill9DuringChurn(t *testing.T) {
	const grace = 10 * time.Second
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{
		"IP_COOLDOWN_PERIOD=1", "VPCIP_RECONCILE_INTERVAL=1s", "VPCIP_GC_GRACE=" + grace.String()}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		mu   sync.Mutex
		live []*podruntime.Pod
	)
	churn := func(rounds int, tag string) {
		for i := range rounds {
			mu.Lock()
			del := len(live) > 0 && (len(live) >= 16 || rng.IntN(3) == 0)
			var victim *podruntime.Pod
			if del {
				k := rng.IntN(len(live))
				victim = live[k]
				live = append(live[:k], live[k+1:]...)
			}
			mu.Unlock()
			if del {
				// A DEL while the daemon is down removes the pod's host side
				// and succeeds; the restarted daemon frees the address by its
				// host check (after the grace, as for a cut-short ADD). Where
				// a DEL fails ("try again later"), the runtime retries it, as
				// kubelet does.
				for n.DelPod(ctx, victim) != nil && ctx.Err() == nil {
					time.Sleep(200 * time.Millisecond)
				}
				continue
			}
			p, err := addWithRetry(ctx, n, fmt.Sprintf("%s-%d", tag, i))
			if err != nil {
				t.Errorf("ADD during churn: %v", err)
				return
			}
			mu.Lock()
			live = append(live, p)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); churn(40, "a") }()
	time.Sleep(700 * time.Millisecond)
	n.StopDaemon(true) // kill -9, mid-churn
	time.Sleep(300 * time.Millisecond)
	if err := n.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	churn(10, "b")

	seen := map[netip.Addr]string{}
	assertPodsOwned(t, c, n, live, seen)
	held := checkpointAssignments(t, n)
	for wait := time.Now().Add(grace + 5*time.Second); len(held) != len(live) && time.Now().Before(wait); {
		time.Sleep(250 * time.Millisecond)
		held = checkpointAssignments(t, n)
	}
	if len(held) != len(live) {
		t.Errorf("daemon holds %d assignments for %d live pods: %v", len(held), len(live), held)
	}
	for _, p := range live {
		if held[p.ContainerID] != p.Address {
			t.Errorf("pod %s (%s) holds %s but the daemon records %v", p.Name, p.ContainerID[:12], p.Address, held[p.ContainerID])
		}
	}
}

// checkpointAssignments reads the daemon's assignments (container ID →
// address) through vpcipctl's JSON.
func checkpointAssignments(t *testing.T, n *cluster.Node) map[string]netip.Addr {
	t.Helper()
	out, err := n.Ctl(context.Background(), "pods", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods introspect.Pods
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		t.Fatalf("vpcipctl pods -o json: %v\n%s", err, out)
	}
	m := map[string]netip.Addr{}
	for _, a := range pods.Assignments {
		if prev, dup := m[a.Key.ContainerID]; dup {
			t.Errorf("container %s holds two assignments: %s and %s", a.Key.ContainerID, prev, a.Address)
		}
		m[a.Key.ContainerID] = a.Address
	}
	return m
}

// Throttling and injected errors during a burst: every pod eventually starts.
func TestThrottlingAndErrorsDuringBurst(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.xlarge"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := c.Cloud.Faults()
	f.SetThrottle(true, 2, 2)
	f.SetThrottle(false, 5, 5)
	f.SetErrorRate("AssignPrivateIpAddresses", 0.3, "InternalError")
	f.SetErrorRate("CreateNetworkInterface", 0.3, "InternalError")
	f.SetLatency("AttachNetworkInterface", 200*time.Millisecond, 100*time.Millisecond)
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 30, "burst", 10)
	assertPodsOwned(t, c, n, pods, map[netip.Addr]string{})
	f.Reset()
}

// IMDS lagging the API by seconds: pods still start, and no address is
// handed out twice.
func TestIMDSLag(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c.Cloud.Faults().SetIMDSLag(3 * time.Second)
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 15, "lag", 5)
	assertPodsOwned(t, c, n, pods, map[netip.Addr]string{})
}

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// An ENI created by a daemon that was killed between CreateNetworkInterface
// and AttachNetworkInterface stays `available` with our tags; the restarted
// daemon's sweeper deletes it once it is older than the grace period.
func TestLeakedENIFromKillBetweenCreateAndAttachIsDeleted(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{
		"VPCIP_LEAKED_ENI_GRACE=2s", "VPCIP_LEAK_SWEEP_INTERVAL=1s",
		"WARM_ENI_TARGET=1", // a whole ENI warm: 4 pods make the pool create one
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, f := c.Nodes[0], c.Cloud.Faults()
	f.SetLatency("AttachNetworkInterface", 30*time.Second, 0)
	created := f.Calls("CreateNetworkInterface")
	pods := addPods(t, ctx, n, 4, "grow", 4) // below one ENI's worth warm: the pool creates an ENI
	deadline := time.Now().Add(30 * time.Second)
	for f.Calls("CreateNetworkInterface") == created && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if f.Calls("CreateNetworkInterface") == created {
		t.Fatal("the daemon never created an ENI")
	}
	time.Sleep(300 * time.Millisecond) // inside the attach's latency
	n.StopDaemon(true)
	var leaked string
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.Status == "available" {
			leaked = e.ID
		}
	}
	if leaked == "" {
		t.Fatalf("no available ENI after kill -9 between create and attach: %+v", c.Cloud.NetworkInterfaces())
	}
	f.SetLatency("AttachNetworkInterface", 0, 0)
	if err := n.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := c.Cloud.NetworkInterface(leaked); !ok {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if e, ok := c.Cloud.NetworkInterface(leaked); ok {
		t.Errorf("leaked ENI %s still exists (%s) after the sweep", leaked, e.Status)
	}
	for _, p := range pods {
		if err := n.DelPod(ctx, p); err != nil {
			t.Error(err)
		}
	}
}

// B41: in a subnet with fewer free addresses than a whole ENI's worth, the
// node still uses every address the subnet has (growth asks for less after a
// refusal instead of repeating the refused size), and after a scale-down
// new pods start again.
func TestSmallSubnetIsUsedUp_B41(t *testing.T) {
	// A /27: 32 addresses, 5 reserved by AWS, 2 taken by ENI primaries: 25 for pods.
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.xlarge",
		DaemonEnv: []string{"IP_COOLDOWN_PERIOD=1", "VPCIP_ADD_WAIT=3s"},
		Sim:       vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: netip.MustParsePrefix("100.64.0.0/27"), AvailabilityZone: "us-west-2a"}}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 20, "fill", 5)
	assertPodsOwned(t, c, n, pods, map[netip.Addr]string{})
	for _, p := range pods[:11] {
		if err := n.DelPod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	more := addPods(t, ctx, n, 5, "again", 5)
	assertPodsOwned(t, c, n, append(pods[11:], more...), map[netip.Addr]string{})
}

// fragmentedPrefixNode starts one m5.large in prefix mode whose subnet (a
// /27 whose addresses the ENI primaries scatter) has no free aligned /28,
// with extra daemon settings, and starts 12 pods on it: the fallback to
// single addresses must serve every one. It deletes them and returns the
// cluster and node.
func fragmentedPrefixNode(t *testing.T, ctx context.Context, env ...string) (*cluster.Cluster, *cluster.Node) {
	t.Helper()
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large",
		DaemonEnv: append([]string{"ENABLE_PREFIX_DELEGATION=true", "IP_COOLDOWN_PERIOD=1", "VPCIP_ADD_WAIT=3s",
			"VPCIP_RELEASE_INTERVAL=1s", "VPCIP_ENI_MIN_AGE=1s", "VPCIP_POOL_INTERVAL=500ms"}, env...),
		Sim: vpcsim.Config{Subnets: []vpcsim.SubnetSpec{{CIDR: netip.MustParsePrefix("100.64.0.0/27"), AvailabilityZone: "us-west-2a"}}},
	})
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 12, "frag", 1)
	assertPodsOwned(t, c, n, pods, map[netip.Addr]string{})
	for _, p := range pods {
		if err := n.DelPod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	return c, n
}

// B20: prefix mode in a subnet with no free aligned /28 falls back to single
// addresses: every pod starts, and after a scale-down the node keeps no ENI
// the fallback's address target does not need.
func TestPrefixModeInFragmentedSubnet_B20(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, n := fragmentedPrefixNode(t, ctx, "WARM_PREFIX_TARGET=1")
	deadline := time.Now().Add(45 * time.Second)
	for nodeENIs(c, n) > 2 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	if got := nodeENIs(c, n); got > 2 {
		t.Errorf("after scale-down the node keeps %d ENIs for 16 warm addresses (WARM_PREFIX_TARGET 1), want at most 2", got)
	}
}

// B20 under the default (adaptive) policy: the fallback, bounded so that a
// slot stays open for a /28, still starts every pod.
func TestPrefixModeInFragmentedSubnetAdaptive_B20(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fragmentedPrefixNode(t, ctx)
}

// TestDelWhileDaemonDown is B13 with the real daemon, through libcni: a
// DEL while vpcipd is down (SIGKILL) removes the pod's host route and
// rules and succeeds, so the runtime removes the sandbox and the pod does
// not stay Terminating; the daemon, back, still holds the other pod and
// releases the deleted one's address by its host check (route and netns
// gone for VPCIP_GC_GRACE, here its least, 10 s), and a new pod starts.
func TestDelWhileDaemonDown(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{"IP_COOLDOWN_PERIOD=1", "VPCIP_RECONCILE_INTERVAL=1s", "VPCIP_GC_GRACE=10s"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	gone, err := addWithRetry(ctx, n, "b13-gone")
	if err != nil {
		t.Fatal(err)
	}
	stays, err := addWithRetry(ctx, n, "b13-stays")
	if err != nil {
		t.Fatal(err)
	}
	n.StopDaemon(true)
	if err := n.DelPod(ctx, gone); err != nil {
		t.Fatalf("DEL with the daemon down: %v; want success (B13)", err)
	}
	var routes []hostRoute
	var rules []hostRule
	for _, err := range []error{
		ipJSON(ctx, n.Netns, &routes, "-4", "route", "show", "table", "main", "scope", "link"),
		ipJSON(ctx, n.Netns, &rules, "-4", "rule", "show"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range routes {
		if r.Dst == gone.Address.String() {
			t.Errorf("route to %v left after DEL: %+v", gone.Address, r)
		}
	}
	for _, r := range rules {
		if r.Src == gone.Address.String() || r.Dst == gone.Address.String() {
			t.Errorf("rule of %v left after DEL: %+v", gone.Address, r)
		}
	}
	if err := n.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	var held map[string]netip.Addr
	for wait := time.Now().Add(30 * time.Second); time.Now().Before(wait); time.Sleep(250 * time.Millisecond) {
		if held = checkpointAssignments(t, n); len(held) == 1 {
			break
		}
	}
	if _, ok := held[gone.ContainerID]; ok || held[stays.ContainerID] != stays.Address || len(held) != 1 {
		t.Errorf("daemon holds %v; want only %s's %v (%s's %v released)", held, stays.Name, stays.Address, gone.Name, gone.Address)
	}
	p, err := addWithRetry(ctx, n, "b13-next")
	if err != nil {
		t.Fatal(err)
	}
	if p.Address == stays.Address {
		t.Errorf("new pod got %v, which %s holds", p.Address, stays.Name)
	}
}
