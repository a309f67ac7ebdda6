package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// imdsToken asks vpcsim's IMDS for an IMDSv2 session token from inside the
// netns (PUT /latest/api/token, as the AWS SDKs do first) and returns the
// error of the attempt, nil when a token came back.
func imdsToken(ctx context.Context, netns string) error {
	client := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: fabric.DialContext(netns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, fabric.IMDSURL+"/latest/api/token", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || len(b) == 0 {
		return errors.New("IMDS answered " + resp.Status)
	}
	return nil
}

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
	err := imdsToken(ctx, plain.Netns)
	took := time.Since(start)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod default/plain -> IMDS: %v, want connection refused", err)
	}
	t.Logf("pod default/plain -> IMDS: %v after %v", err, took.Round(time.Millisecond))
	if err := imdsToken(ctx, remote.Netns); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod default/remote -> IMDS: %v, want connection refused", err)
	}
	if err := imdsToken(ctx, trusted.Netns); err != nil {
		t.Errorf("pod trusted/agent -> IMDS: %v, want a token", err)
	}
	for _, n := range c.Nodes {
		if err := imdsToken(ctx, n.Netns); err != nil {
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
