package kubecluster

import (
	"context"
	"testing"
	"time"
)

// TestClusterIPv6: an IPv6 single-stack cluster (Services, node addresses
// and pods IPv6; the API server on [::1]) with vpcip installed by Helm in
// the reference's IPv6 mode: kubelet starts pods through vpcip on both
// nodes, each pod's address lies in the /80 EC2 assigned to its node's
// primary ENI (one assign call per node, none after), pods ping each other
// across nodes over IPv6, and a pod on each node reaches the outside host
// over IPv4 with its node's primary IPv4 address as source.
func TestClusterIPv6(t *testing.T) {
	image, vpcipctl, h := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	c := startClusterWith(t, ctx, "v6", Options{Image: image, IPv6: true})
	values, err := c.WriteIPv6Values()
	if err != nil {
		t.Fatal(err)
	}
	want, err := WantConfigFromValues(values)
	if err != nil {
		t.Fatal(err)
	}
	want["ENABLE_V4_EGRESS"] = "true"
	s := &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Values: values, Logf: t.Logf, WantConfig: want}
	if err := s.RunIPv6(ctx); err != nil {
		for _, n := range c.Nodes {
			t.Logf("kubelet log of %s:\n%s", n.Name, tail(n.KubeletLog(), 30))
		}
		t.Fatal(err)
	}
	if n := c.Cloud.Faults().Calls("AssignIpv6Addresses"); n != len(c.Nodes) {
		t.Errorf("AssignIpv6Addresses called %d times for %d nodes, want one /80 each and no call after", n, len(c.Nodes))
	}
	t.Logf("IPv6 cluster: %s from start to the last check", time.Since(start).Round(time.Second))
}
