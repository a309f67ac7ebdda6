package e2e

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// A VPC with node subnets in its primary CIDR and pod subnets in a secondary
// CIDR, one of each per zone, plus a larger pod subnet tagged
// kubernetes.io/role/cni=0 in zone a.
const (
	e2eNodeA = "subnet-0000000000000e0a1" // 100.64.0.0/27, us-west-2a: 27 usable
	e2eNodeB = "subnet-0000000000000e0b1" // 100.64.0.32/27, us-west-2b
	e2ePodsA = "subnet-0000000000000e0a2" // 100.65.0.0/24, us-west-2a, kubernetes.io/role/cni=1
	e2ePodsB = "subnet-0000000000000e0b2" // 100.65.32.0/24, us-west-2b, kubernetes.io/role/cni=1
	e2eOffA  = "subnet-0000000000000e0a3" // 100.65.4.0/22, us-west-2a, kubernetes.io/role/cni=0
)

func podSubnetsSim() vpcsim.Config {
	p := netip.MustParsePrefix
	cni := func(v string) map[string]string { return map[string]string{"kubernetes.io/role/cni": v} }
	return vpcsim.Config{
		SecondaryVPCCIDRs: []netip.Prefix{p("100.65.0.0/16")},
		Subnets: []vpcsim.SubnetSpec{
			{ID: e2eNodeA, CIDR: p("100.64.0.0/27"), AvailabilityZone: "us-west-2a"},
			{ID: e2eNodeB, CIDR: p("100.64.0.32/27"), AvailabilityZone: "us-west-2b"},
			{ID: e2ePodsA, CIDR: p("100.65.0.0/24"), AvailabilityZone: "us-west-2a", Tags: cni("1")},
			{ID: e2ePodsB, CIDR: p("100.65.32.0/24"), AvailabilityZone: "us-west-2b", Tags: cni("1")},
			{ID: e2eOffA, CIDR: p("100.65.4.0/22"), AvailabilityZone: "us-west-2a", Tags: cni("0")},
		},
	}
}

// Subnet discovery on two nodes in two zones whose own subnets are small:
// the secondary ENIs go to their zone's tagged subnet in the secondary CIDR
// (never to the larger cni=0 one), with the primary ENI's security groups;
// pods there reach pods on the other node and, through SNAT, the outside
// host; each daemon logs its choice with the free counts.
func TestSubnetDiscoveryAcrossZones(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", Outside: true,
		Sim: podSubnetsSim(), NodeSubnets: []string{e2eNodeA, e2eNodeB}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	want := map[string]struct {
		subnet string
		cidr   netip.Prefix
	}{
		c.Nodes[0].InstanceID: {e2ePodsA, netip.MustParsePrefix("100.65.0.0/24")},
		c.Nodes[1].InstanceID: {e2ePodsB, netip.MustParsePrefix("100.65.32.0/24")},
	}
	onPodSubnet := map[*cluster.Node]*podruntime.Pod{}
	seen := map[netip.Addr]string{}
	for _, n := range c.Nodes {
		pods := addPods(t, ctx, n, 12, n.Name+"-d", 4) // 12 > 9 on the primary ENI: a secondary ENI serves some
		assertPodsOwned(t, c, n, pods, seen)
		for _, p := range pods {
			if want[n.InstanceID].cidr.Contains(p.Address) {
				onPodSubnet[n] = p
			}
		}
		if onPodSubnet[n] == nil {
			t.Fatalf("%s: no pod got an address of %s", n.Name, want[n.InstanceID].cidr)
		}
	}
	for _, e := range c.Cloud.NetworkInterfaces() {
		inst, ok := c.Cloud.Instance(e.InstanceID)
		if !ok || e.DeviceIndex == 0 {
			continue
		}
		if w := want[e.InstanceID]; e.SubnetID != w.subnet {
			t.Errorf("secondary ENI %s of %s is in %s, want the zone's tagged subnet %s", e.ID, e.InstanceID, e.SubnetID, w.subnet)
		}
		if !slices.Equal(e.SecurityGroups, inst.PrimaryENI.SecurityGroups) {
			t.Errorf("ENI %s has groups %v, want the primary ENI's %v", e.ID, e.SecurityGroups, inst.PrimaryENI.SecurityGroups)
		}
		if e.SubnetID == e2eOffA {
			t.Errorf("ENI %s went to the subnet tagged kubernetes.io/role/cni=0", e.ID)
		}
	}
	a, b := onPodSubnet[c.Nodes[0]], onPodSubnet[c.Nodes[1]]
	for _, pr := range [][2]*podruntime.Pod{{a, b}, {b, a}} {
		if err := cluster.Ping(ctx, pr[0], pr[1].Address); err != nil {
			t.Errorf("%s (%s) → %s (%s): %v", pr[0].Name, pr[0].Address, pr[1].Name, pr[1].Address, err)
		}
	}
	if err := c.StartSourceEcho(ctx); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*podruntime.Pod{a, b} {
		src, err := c.SourceSeenOutside(ctx, p)
		if err != nil {
			t.Errorf("pod %s (%s) → outside host: %v", p.Name, p.Address, err)
		} else if src != c.Nodes[i].PrimaryIP {
			t.Errorf("outside host saw %s from %s, want the node's primary address %s (SNAT)", src, p.Address, c.Nodes[i].PrimaryIP)
		}
	}
	for i, n := range c.Nodes {
		log, _ := os.ReadFile(n.LogFile())
		line := ""
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, `"msg":"ENI placement"`) {
				line = l
			}
		}
		w := want[n.InstanceID].subnet
		if !strings.Contains(line, `"subnet":"`+w+`"`) || !strings.Contains(line, "free") || !strings.Contains(line, "node subnet") {
			t.Errorf("node %d: the placement is not logged with its subnet and free counts: %q", i+1, line)
		}
		if out, err := n.Ctl(ctx, "status"); err != nil || !strings.Contains(out, "New ENIs:    subnet-discovery: most free addresses: "+w) {
			t.Errorf("node %d: vpcipctl status does not show the placement (%v):\n%s", i+1, err, out)
		}
	}
}

// Custom networking without the node's ENIConfig (here: no Kubernetes part
// to read it from): the daemon runs and answers, makes no ENI, gives the
// primary ENI no address, an ADD fails with a retryable error, and the log
// says why the pool waits.
func TestCustomNetworkingWithoutENIConfigWaits(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", Sim: podSubnetsSim(), NodeSubnets: []string{e2eNodeA},
		DaemonEnv: []string{"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true", "VPCIP_ADD_WAIT=1s", "VPCIP_POOL_INTERVAL=200ms"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := c.Nodes[0]
	_, err := n.AddPod(ctx, "default", "waits")
	if err == nil {
		t.Fatal("a pod got an address without an ENIConfig")
	}
	if !strings.Contains(err.Error(), "no free address: no new ENI can be placed (ENIConfig not found") {
		t.Errorf("ADD error: %v, want one naming the missing ENIConfig", err)
	}
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == n.InstanceID && (e.DeviceIndex > 0 || len(e.SecondaryIPs) > 0) {
			t.Errorf("ENI %s (device %d) with %d secondaries: custom networking without an ENIConfig must make nothing", e.ID, e.DeviceIndex, len(e.SecondaryIPs))
		}
	}
	log, _ := os.ReadFile(n.LogFile())
	if !strings.Contains(string(log), "no ENI can be placed: the pool waits") || !strings.Contains(string(log), "ENIConfig not found") {
		t.Errorf("the log does not say why the pool waits:\n%s", lastLines(string(log), 20))
	}
	if w := strings.Count(string(log), "no ENI can be placed"); w > 2 {
		t.Errorf("the unchanged problem is logged %d times within a minute, want once", w)
	}
	if out, err := n.Ctl(ctx, "status"); err != nil || !strings.Contains(out, "custom-networking: no ENI can be placed: ENIConfig not found") {
		t.Errorf("vpcipctl status does not say why no ENI is placed (%v):\n%s", err, out)
	}
}
