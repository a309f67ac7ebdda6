package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// Pods land on primary and secondary ENIs on both nodes, get addresses the
// cloud assigned to their own node, reach each other across nodes through
// the fabric, and reach the outside host with the node's primary address.
func TestPodsOnPrimaryAndSecondaryENIsAcrossNodes(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", Outside: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	seen := map[netip.Addr]string{}
	byNode := map[*cluster.Node][]*podruntime.Pod{}
	for _, n := range c.Nodes {
		// 12 pods: m5.large ENIs give 9 pod addresses each, so a second ENI is needed.
		byNode[n] = addPods(t, ctx, n, 12, n.Name+"-web", 4)
		assertPodsOwned(t, c, n, byNode[n], seen)
	}
	onDevice := func(n *cluster.Node, primary bool) *podruntime.Pod {
		for _, p := range byNode[n] {
			if e, ok := eniOf(c.Cloud, p.Address); ok && (e.DeviceIndex == 0) == primary {
				return p
			}
		}
		t.Fatalf("%s has no pod on a %s ENI", n.Name, map[bool]string{true: "primary", false: "secondary"}[primary])
		return nil
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	pairs := [][2]*podruntime.Pod{
		{onDevice(n1, true), onDevice(n2, true)},
		{onDevice(n1, false), onDevice(n2, false)},
		{onDevice(n1, true), onDevice(n2, false)},
		{onDevice(n2, false), onDevice(n1, true)},
		{onDevice(n1, false), onDevice(n1, true)}, // same node
	}
	for _, pr := range pairs {
		if err := cluster.Ping(ctx, pr[0], pr[1].Address); err != nil {
			t.Errorf("%s (%s) → %s (%s): %v", pr[0].Name, pr[0].Address, pr[1].Name, pr[1].Address, err)
		}
	}
	if err := c.StartSourceEcho(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*podruntime.Pod{onDevice(n1, true), onDevice(n1, false)} {
		src, err := c.SourceSeenOutside(ctx, p)
		if err != nil {
			t.Errorf("pod %s (%s) → outside host: %v", p.Name, p.Address, err)
			continue
		}
		if src != n1.PrimaryIP {
			t.Errorf("outside host saw %s from pod %s, want the node's primary address %s (SNAT)", src, p.Address, n1.PrimaryIP)
		}
	}
	for _, n := range c.Nodes {
		for _, p := range byNode[n] {
			if err := n.DelPod(ctx, p); err != nil {
				t.Errorf("DEL %s: %v", p.Name, err)
			}
		}
	}
}

// A t3.small (3 ENIs × 4 addresses: 9 pod addresses) grows from one ENI to its
// limit and refuses the next pod with an error that names the cause.
func TestNodeGrowsToENILimitAndRefusesBeyond(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "t3.small", DaemonEnv: []string{"VPCIP_ADD_WAIT=2s"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 9, "fill", 3)
	assertPodsOwned(t, c, n, pods, map[netip.Addr]string{})
	enis := 0
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.InstanceID {
			enis++
		}
	}
	if enis != 3 {
		t.Errorf("node has %d ENIs with 9 pods, want its limit 3", enis)
	}
	_, err := n.AddPod(ctx, "default", "one-too-many")
	if err == nil {
		t.Fatal("a 10th pod got an address on a full t3.small")
	}
	if msg := err.Error(); !strings.Contains(msg, "ENI limit") {
		t.Errorf("refusal does not name the cause: %v", err)
	}
}

// After a burst is deleted the pool gives surplus addresses back and deletes
// the ENI it no longer needs.
func TestScaleDownReturnsAddressesAndDeletesEmptyENI(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{
		"WARM_IP_TARGET=2", "MINIMUM_IP_TARGET=4", "IP_COOLDOWN_PERIOD=1",
		"VPCIP_RELEASE_INTERVAL=1s", "VPCIP_ENI_MIN_AGE=1s", "VPCIP_POOL_INTERVAL=500ms",
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 14, "burst", 4)
	if got := nodeENIs(c, n); got < 2 {
		t.Fatalf("14 pods on an m5.large should need 2 ENIs, node has %d", got)
	}
	for _, p := range pods {
		if err := n.DelPod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	var enis, addrs int
	for time.Now().Before(deadline) {
		enis, addrs = nodeENIs(c, n), nodeAddresses(c, n)
		if enis == 1 && addrs <= 4 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if enis != 1 || addrs > 4 {
		t.Errorf("after scale-down the node holds %d ENIs and %d secondary addresses, want 1 ENI and ≤ MINIMUM_IP_TARGET 4", enis, addrs)
	}
	st, err := n.Client().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Assigned != 0 {
		t.Errorf("daemon reports %d assigned addresses with no pods", st.Assigned)
	}
}

func nodeENIs(c *cluster.Cluster, n *cluster.Node) int {
	k := 0
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.InstanceID {
			k++
		}
	}
	return k
}

func nodeAddresses(c *cluster.Cluster, n *cluster.Node) int {
	k := 0
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.InstanceID {
			k += len(e.SecondaryIPs) + 16*len(e.Prefixes)
		}
	}
	return k
}
