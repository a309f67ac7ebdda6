package e2e

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
)

// The running daemon's /metrics passes `promtool check metrics` and answers
// the capacity questions of docs/design.md §8 with the node's real numbers.
func TestMetricsOfTheRunningDaemon(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (scripts/deps.sh promtool installs Debian's prometheus)")
	}
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "t3.small"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := c.Nodes[0]
	pods := addPods(t, ctx, n, 5, "m", 5)
	resp, err := n.HTTPClient().Get("http://127.0.0.1:61678/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	want := map[string]float64{
		"vpcip_addresses_assigned": 5,
		"vpcip_enis_max":           3, // t3.small
		"vpcip_addresses_budget":   9, // 3 ENIs × (4 − 1)
		"vpcip_ready":              1,
	}
	for name, v := range want {
		if got, ok := sample(body, name); !ok || got != v {
			t.Errorf("%s = %v (found %v), want %v", name, got, ok, v)
		}
	}
	if bytes.Contains(body, []byte("\nawscni_")) {
		t.Error("awscni_* gauges exported without VPCIP_METRICS_AWSCNI_NAMES=true")
	}
	if got, ok := sample(body, "vpcip_addresses_without_pod"); !ok || got != 0 {
		t.Errorf("vpcip_addresses_without_pod = %v (found %v), want 0 without the Kubernetes part", got, ok)
	}
	if !regexp.MustCompile(`(?m)^vpcip_build_info\{.*version="dev".*\} 1$`).Match(body) {
		t.Error("vpcip_build_info{version=\"dev\"} 1 missing")
	}
	if got, ok := sample(body, `vpcip_provider_calls_total{operation="CreateNetworkInterface",outcome="ok"}`); !ok || got < 1 {
		t.Errorf("no successful CreateNetworkInterface counted though 5 pods need a second ENI on a t3.small (got %v)", got)
	}
	for _, p := range pods {
		if err := n.DelPod(ctx, p); err != nil {
			t.Error(err)
		}
	}
}

// sample returns the value of the exposition line starting with name.
func sample(body []byte, name string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` ([0-9.e+-]+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}
