package kubecluster

import (
	"context"
	"testing"
	"time"
)

// TestClusterLeadTime measures, on a one-node cluster (m5.xlarge, vpcip
// installed by Helm with the chart's defaults), the lead time from
// kube-scheduler's binding of a pod to the start of kubelet's first CNI ADD
// for it (Scenario.LeadTimes), for pods created one at a time and for a
// burst created at once, and logs p50/p90/max of each: the figures
// test/poolsim's DefaultSandboxLag is set from. It fails when a pod's ADD is
// missing or starts before its binding.
func TestClusterLeadTime(t *testing.T) {
	image, vpcipctl, h := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c := startClusterWith(t, ctx, "lt", Options{Image: image, Nodes: 1, InstanceType: "m5.xlarge"})
	s := &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Logf: t.Logf}
	var figures []LeadTimes
	err := s.runSteps(ctx, []step{
		{"helm install", s.install},
		{"pods one at a time", func(ctx context.Context) error {
			l, err := s.OneAtATime(ctx, "lt-one", 10, 2*time.Second)
			figures = append(figures, l)
			return err
		}},
		{"a burst of pods", func(ctx context.Context) error {
			l, err := s.Burst(ctx, "lt-burst", 24)
			figures = append(figures, l)
			return err
		}},
		{"pods deleted through kubelet", func(ctx context.Context) error {
			// Their DELs run while the daemon does, as users delete pods.
			_, err := c.Kubectl(ctx, "delete", "pods", "-n", "default", "-l", "app in (lt-one,lt-burst)", "--wait=true", "--timeout=3m")
			return err
		}},
	})
	for _, l := range figures {
		t.Logf("%s", l)
		for i, p := range l.Pods {
			t.Logf("   %s bound at +%d ms, first ADD %d ms later", p, l.Bound[i].Milliseconds(), l.Lead[i].Milliseconds())
		}
	}
	if err != nil {
		t.Logf("kubelet log:\n%s", tail(c.Nodes[0].KubeletLog(), 30))
		t.Fatal(err)
	}
	t.Logf("lead-time cluster: %s from start to the last check", time.Since(start).Round(time.Second))
}
