package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// Custom networking's VPC: small node subnets in the primary CIDR, one pod
// subnet per zone in the secondary CIDR 100.66.0.0/16 with its own security
// group, and a second pod subnet in zone a for an ENIConfig change.
const (
	cnNodeA = "subnet-0000000000000c0a1" // 100.64.0.0/27, us-west-2a
	cnNodeB = "subnet-0000000000000c0b1" // 100.64.0.32/27, us-west-2b
	cnPodsA = "subnet-0000000000000c0a2" // 100.66.0.0/24, us-west-2a
	cnPodsB = "subnet-0000000000000c0b2" // 100.66.32.0/24, us-west-2b
	cnAltA  = "subnet-0000000000000c0a3" // 100.66.1.0/24, us-west-2a
	cnSGA   = "sg-0000000000000c0a1"
	cnSGB   = "sg-0000000000000c0b1"
	cnSGAlt = "sg-0000000000000c0a3"

	eniConfigCRD = "../../charts/vpcip/crds/eniconfigs.crd.k8s.amazonaws.com.yaml"
)

func customNetSim() vpcsim.Config {
	p := netip.MustParsePrefix
	return vpcsim.Config{
		SecondaryVPCCIDRs: []netip.Prefix{p("100.66.0.0/16")},
		Subnets: []vpcsim.SubnetSpec{
			{ID: cnNodeA, CIDR: p("100.64.0.0/27"), AvailabilityZone: "us-west-2a"},
			{ID: cnNodeB, CIDR: p("100.64.0.32/27"), AvailabilityZone: "us-west-2b"},
			{ID: cnPodsA, CIDR: p("100.66.0.0/24"), AvailabilityZone: "us-west-2a"},
			{ID: cnPodsB, CIDR: p("100.66.32.0/24"), AvailabilityZone: "us-west-2b"},
			{ID: cnAltA, CIDR: p("100.66.1.0/24"), AvailabilityZone: "us-west-2a"},
		},
		SecurityGroups: []vpcsim.SecurityGroupSpec{{ID: cnSGA, Name: "pods-a"}, {ID: cnSGB, Name: "pods-b"}, {ID: cnSGAlt, Name: "pods-alt"}},
	}
}

// referenceENIConfigs is the AWS VPC CNI's documented ENIConfig shape, one
// per zone named after it, as users apply it with kubectl.
const referenceENIConfigs = `apiVersion: crd.k8s.amazonaws.com/v1alpha1
kind: ENIConfig
metadata:
  name: us-west-2a
spec:
  securityGroups:
    - ` + cnSGA + `
  subnet: ` + cnPodsA + `
---
apiVersion: crd.k8s.amazonaws.com/v1alpha1
kind: ENIConfig
metadata:
  name: us-west-2b
spec:
  securityGroups:
    - ` + cnSGB + `
  subnet: ` + cnPodsB + `
`

// TestCustomNetworkingENIConfigPerZone: with custom networking and one
// ENIConfig per zone (ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone) in a
// secondary CIDR, applied as the reference documents them, pods on two nodes
// in two zones get addresses of their zone's ENIConfig subnet on ENIs with
// its security groups (as EC2 reports them); the primary ENIs hold no pod
// address; pods reach each other and, through SNAT, the outside host. Until
// the ENIConfigs exist the pool waits (no ENI, no crash) and the node's
// AddressBudget says why. Changing a node's ENIConfig places only new ENIs.
func TestCustomNetworkingENIConfigPerZone(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	env := []string{"AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true", "ENI_CONFIG_LABEL_DEF=topology.kubernetes.io/zone",
		"WARM_IP_TARGET=2", "VPCIP_POOL_INTERVAL=1s"}
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", Outside: true, Sim: customNetSim(),
		NodeSubnets: []string{cnNodeA, cnNodeB}, DaemonEnv: env})
	k := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := k.ApplyFiles(ctx, eniConfigCRD); err != nil {
		t.Fatal(err)
	}
	e := joinKube(t, k, c, 20, env)
	for _, n := range c.Nodes {
		inst, _ := c.Cloud.Instance(n.InstanceID)
		node, err := e.admin.CoreV1().Nodes().Get(ctx, e.names[n], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels = map[string]string{"topology.kubernetes.io/zone": inst.AvailabilityZone}
		if _, err := e.admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No ENIConfig yet: the pool waits and says so.
	n1, n2 := c.Nodes[0], c.Nodes[1]
	waitFor(t, 60*time.Second, "node-1's AddressBudget names the missing ENIConfig", func() bool {
		c := podSubnetCondition(e, n1)
		return strings.HasPrefix(c, "False ENIConfigNotFound ") && strings.Contains(c, `ENIConfig "us-west-2a"`)
	})
	// The Event follows the condition through the recorder's queue; on a
	// loaded machine (a cold make test) 30 s was once not enough.
	var events string
	deadline := time.Now().Add(90 * time.Second)
	for {
		events, _ = e.k.Kubectl(ctx, "get", "events", "-A", "--field-selector", "reason=ENIConfigNotFound", "-o", "jsonpath={.items[*].message}")
		if strings.Contains(events, `ENIConfig "us-west-2a"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s no Warning Event on node-1 names the missing ENIConfig; ENIConfigNotFound events: %q", events)
		}
		time.Sleep(time.Second)
	}
	if got := secondaryENIs(c); len(got) != 0 {
		t.Fatalf("ENIs made without an ENIConfig: %v", got)
	}

	path := filepath.Join(t.TempDir(), "eniconfigs.yaml")
	if err := os.WriteFile(path, []byte(referenceENIConfigs), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl(ctx, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply of reference ENIConfigs: %v\n%s", err, out)
	}
	want := map[*cluster.Node]struct {
		subnet, sg string
		cidr       netip.Prefix
	}{
		n1: {cnPodsA, cnSGA, netip.MustParsePrefix("100.66.0.0/24")},
		n2: {cnPodsB, cnSGB, netip.MustParsePrefix("100.66.32.0/24")},
	}
	pods := map[*cluster.Node][]*podruntime.Pod{}
	seen := map[netip.Addr]string{}
	for _, n := range c.Nodes {
		pods[n] = addPods(t, ctx, n, 5, n.Name+"-cn", 3)
		assertPodsOwned(t, c, n, pods[n], seen)
		for _, p := range pods[n] {
			if !want[n].cidr.Contains(p.Address) {
				t.Errorf("%s: pod %s got %s, outside its zone's ENIConfig subnet %s", n.Name, p.Name, p.Address, want[n].cidr)
			}
		}
	}
	for _, n := range c.Nodes {
		for _, en := range c.Cloud.NetworkInterfaces() {
			if en.InstanceID != n.InstanceID {
				continue
			}
			if en.DeviceIndex == 0 && (len(en.SecondaryIPs) > 0 || len(en.Prefixes) > 0) {
				t.Errorf("%s: primary ENI holds %v %v; custom networking gives it no pod address", n.Name, en.SecondaryIPs, en.Prefixes)
			}
			if en.DeviceIndex > 0 && (en.SubnetID != want[n].subnet || !slices.Equal(en.SecurityGroups, []string{want[n].sg})) {
				t.Errorf("%s: ENI %s in %s with %v, want %s with %s", n.Name, en.ID, en.SubnetID, en.SecurityGroups, want[n].subnet, want[n].sg)
			}
		}
	}
	a, b := pods[n1][0], pods[n2][0]
	for _, pr := range [][2]*podruntime.Pod{{a, b}, {b, a}} {
		if err := cluster.Ping(ctx, pr[0], pr[1].Address); err != nil {
			t.Errorf("%s (%s) → %s (%s): %v", pr[0].Name, pr[0].Address, pr[1].Name, pr[1].Address, err)
		}
	}
	if err := c.StartSourceEcho(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		src, err := c.SourceSeenOutside(ctx, pods[n][1])
		if err != nil || src != n.PrimaryIP {
			t.Errorf("%s: outside host saw %v (%v) from %s, want the node's primary %s (SNAT)", n.Name, src, err, pods[n][1].Address, n.PrimaryIP)
		}
	}
	waitFor(t, 40*time.Second, "node-1's AddressBudget shows the ENI placed by its ENIConfig", func() bool {
		c := podSubnetCondition(e, n1)
		return strings.HasPrefix(c, "True ENIPlaced ") && strings.Contains(c, cnPodsA)
	})

	// Change node-1's ENIConfig: only new ENIs go to the new subnet.
	before := secondaryENIs(c)
	alt := strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(referenceENIConfigs[:strings.Index(referenceENIConfigs, "---")],
		"us-west-2a", "alt-a"), cnSGA, cnSGAlt), cnPodsA, cnAltA)
	if err := os.WriteFile(path, []byte(alt), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl(ctx, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply alt-a: %v\n%s", err, out)
	}
	if out, err := k.Kubectl(ctx, "label", "node", e.names[n1], "vpc.amazonaws.com/externalEniConfig=alt-a"); err != nil {
		t.Fatalf("label: %v\n%s", err, out)
	}
	more := addPods(t, ctx, n1, 8, "n1-more", 3) // 13 pods: beyond one ENI's 9
	assertPodsOwned(t, c, n1, more, seen)
	after := secondaryENIs(c)
	for id, subnet := range before {
		if after[id] != subnet {
			t.Errorf("ENI %s moved from %s to %q after the ENIConfig change", id, subnet, after[id])
		}
	}
	newInAlt := 0
	for id, subnet := range after {
		if _, old := before[id]; !old {
			if subnet != cnAltA {
				t.Errorf("new ENI %s in %s, want the changed ENIConfig's %s", id, subnet, cnAltA)
			}
			newInAlt++
		}
	}
	if newInAlt == 0 {
		t.Errorf("no new ENI after the ENIConfig change (ENIs %v)", after)
	}
}

// secondaryENIs maps every non-primary ENI to its subnet.
func secondaryENIs(c *cluster.Cluster) map[string]string {
	out := map[string]string{}
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID != "" && e.DeviceIndex > 0 {
			out[e.ID] = e.SubnetID
		}
	}
	return out
}

// podSubnetCondition is the PodSubnetReady condition of the node's
// AddressBudget as "status reason message".
func podSubnetCondition(e *kubeEnv, n *cluster.Node) string {
	out, _ := e.k.Kubectl(context.Background(), "get", "addressbudget", e.names[n], "-o",
		`jsonpath={range .status.conditions[?(@.type=="PodSubnetReady")]}{.status} {.reason} {.message}{end}`)
	return out
}
