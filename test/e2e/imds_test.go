package e2e

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// TestIMDSBlockedForPods: on vpcsim, whose IMDS sits behind each node's
// primary ENI as EC2's does, a pod cannot get an IMDS token (connection
// refused, measured) unless its namespace is in VPCIP_IMDS_ALLOW_NAMESPACES;
// the node (where vpcipd runs) still can, and pods' other traffic (pings
// across nodes, SNAT to the outside) is unchanged. DEL removes the allowed
// pod's rule.
func TestIMDSBlockedForPods(t *testing.T) {
	c := start(t, cluster.Options{Nodes: 2, Outside: true, DaemonEnv: []string{"VPCIP_IMDS_ALLOW_NAMESPACES=trusted"}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.StartSourceEcho(ctx); err != nil {
		t.Fatal(err)
	}
	n1, n2 := c.Nodes[0], c.Nodes[1]
	add := func(n *cluster.Node, ns, name string) *podruntime.Pod {
		p, err := n.AddPod(ctx, ns, name)
		if err != nil {
			t.Fatalf("ADD %s/%s on %s: %v", ns, name, n.Name, err)
		}
		return p
	}
	plain := add(n1, "default", "plain")
	trusted := add(n1, "trusted", "agent")
	remote := add(n2, "default", "remote")

	start := time.Now()
	err := fabric.IMDSToken(ctx, fabric.NetnsPath(plain.Netns))
	took := time.Since(start)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod default/plain -> IMDS: %v, want connection refused", err)
	}
	t.Logf("pod default/plain -> IMDS: %v after %v", err, took.Round(time.Millisecond))
	if err := fabric.IMDSToken(ctx, fabric.NetnsPath(remote.Netns)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod default/remote -> IMDS: %v, want connection refused", err)
	}
	if err := fabric.IMDSToken(ctx, fabric.NetnsPath(trusted.Netns)); err != nil {
		t.Errorf("pod trusted/agent -> IMDS: %v, want a token", err)
	}
	for _, n := range c.Nodes {
		if err := fabric.IMDSToken(ctx, fabric.NetnsPath(n.Netns)); err != nil {
			t.Errorf("%s itself -> IMDS: %v, want a token", n.Name, err)
		}
		if st, err := n.Client().Status(ctx); err != nil || !st.Ready {
			t.Errorf("%s vpcipd status: %+v, %v; want ready", n.Name, st, err)
		}
	}

	// Other traffic is unchanged: pod to pod across nodes, and SNAT to the
	// node's primary address on the way out of the VPC.
	for _, p := range []*podruntime.Pod{plain, trusted} {
		if err := cluster.Ping(ctx, p, remote.Address); err != nil {
			t.Errorf("ping %s -> %s: %v", p.Name, remote.Name, err)
		}
		seen, err := c.SourceSeenOutside(ctx, p)
		if err != nil || seen != n1.PrimaryIP {
			t.Errorf("%s seen outside as %v (%v), want %v", p.Name, seen, err, n1.PrimaryIP)
		}
	}
	if err := cluster.Ping(ctx, remote, plain.Address); err != nil {
		t.Errorf("ping remote -> plain: %v", err)
	}

	rules := func() string {
		out, err := n1.Run(ctx, "iptables", "-w", "-S", "VPCIP-IMDS")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if r := rules(); !strings.Contains(r, trusted.Address.String()+"/32") {
		t.Fatalf("VPCIP-IMDS lacks the trusted pod's address %s:\n%s", trusted.Address, r)
	}
	if err := n1.DelPod(ctx, trusted); err != nil {
		t.Fatal(err)
	}
	if r := rules(); strings.Contains(r, trusted.Address.String()+"/32") {
		t.Errorf("VPCIP-IMDS still allows %s after its pod's DEL:\n%s", trusted.Address, r)
	}
	for _, p := range []*podruntime.Pod{plain} {
		if err := n1.DelPod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := n2.DelPod(ctx, remote); err != nil {
		t.Fatal(err)
	}
}
