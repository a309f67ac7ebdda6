package main

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/fleetmetrics"
)

// TestDaemonAndClusterMetricsShareARegistry: vpcipd registers the daemon's
// metrics and the Kubernetes part's on one registry, in daemon()'s order; a
// name both claim would panic at start-up, before anything is served.
func TestDaemonAndClusterMetricsShareARegistry(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	ipamd.NewMetrics(reg)
	subnets := fleetmetrics.NewSubnets(reg, nil, time.Minute, log)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("registering the Kubernetes part's metrics beside the daemon's: %v", r)
		}
	}()
	kube := newCluster(config.Config{}, log, reg, subnets, fleetmetrics.NewWithoutPod(reg))
	if kube == nil || kube.Health().Enabled {
		t.Fatalf("without MY_NODE_NAME the Kubernetes part must be built disabled, got %+v", kube.Health())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, want := range []string{"vpcip_leaked_addresses_released_total", "vpcip_kubernetes_connected", "vpcip_addresses_without_pod"} {
		if !names[want] {
			t.Errorf("%s not registered", want)
		}
	}
}

// TestSecureMetricsNeedsTheAPIServer: VPCIP_METRICS_SECURE without any way
// to reach the API server stops vpcipd at start with the variable's name,
// rather than serving everyone or no one; without it no guard is made.
func TestSecureMetricsNeedsTheAPIServer(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	log := slog.New(slog.DiscardHandler)
	if g, err := newMetricsGuard(config.Config{MetricsAddr: ":61678"}, log); g != nil || err != nil {
		t.Fatalf("secure off: guard %v, err %v; want neither", g, err)
	}
	_, err := newMetricsGuard(config.Config{MetricsAddr: ":61678", MetricsSecure: true}, log)
	if err == nil || !strings.Contains(err.Error(), "VPCIP_METRICS_SECURE=true needs the Kubernetes API") {
		t.Fatalf("secure on without an API server: err = %v, want a refusal naming VPCIP_METRICS_SECURE", err)
	}
	_, err = newMetricsGuard(config.Config{MetricsAddr: ":61678", MetricsSecure: true, Kubeconfig: filepath.Join(t.TempDir(), "missing")}, log)
	if err == nil || !strings.Contains(err.Error(), "VPCIP_METRICS_SECURE=true") {
		t.Fatalf("secure on with a missing kubeconfig: err = %v, want a refusal", err)
	}
}

// TestLiveFactsNeedAConnectedPart: the pool counts on seeing pods at their
// binding (liveFacts.Live) only with the Kubernetes part enabled and
// connected: not without it, nor while it is still connecting (its caches
// unsynced). That Connected means synced with no API error outstanding is
// ipamd/cluster's tests' (TestNothingReleasedWithoutATrustworthyView).
func TestLiveFactsNeedAConnectedPart(t *testing.T) {
	if (liveFacts{nil}).Live() {
		t.Error("Live without the Kubernetes part")
	}
	c, err := cluster.New(cluster.Options{NodeName: "node-1", Config: &rest.Config{Host: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Health(); !h.Enabled || h.Connected {
		t.Fatalf("health %+v, want enabled and not yet connected", h)
	}
	if (liveFacts{c}).Live() {
		t.Error("Live while the part is still connecting")
	}
}
