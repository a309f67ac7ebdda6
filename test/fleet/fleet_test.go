package fleet_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/fleet"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// envInt reads a positive integer from the environment, or def.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 90s", name, v)
	}
	return d
}

// TestFleet runs the fleet scenarios against EC2's account-level request
// buckets (AWS's documented defaults) and one real API server, and prints
// the table. The default is the short variant `make test` runs (10 nodes,
// 20 pods each within 10 s, 15 s of churn); `make fleet` sets
// VPCIP_FLEET_NODES=200, VPCIP_FLEET_SPREAD=60s and longer churn and
// scale-in windows.
func TestFleet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	kubetest.SkipIfUnavailable(t)
	nodes := envInt(t, "VPCIP_FLEET_NODES", 10)
	podsPerNode := envInt(t, "VPCIP_FLEET_PODS", 20)
	spread := envDuration(t, "VPCIP_FLEET_SPREAD", 10*time.Second)
	churn := envDuration(t, "VPCIP_FLEET_CHURN", 15*time.Second)
	churnInterval := envDuration(t, "VPCIP_FLEET_CHURN_INTERVAL", 5*time.Second)
	settle := envDuration(t, "VPCIP_FLEET_SETTLE", 5*time.Second)
	scaleInSettle := envDuration(t, "VPCIP_FLEET_SCALEIN_SETTLE", 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := cluster.BuildBinaries(ctx, bin); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("fl%d", os.Getpid()%10000)
	f, err := fleet.Start(ctx, fleet.Options{
		Prefix: prefix, Nodes: nodes, BinDir: bin, WorkDir: t.TempDir(),
		CRDFile: "../../charts/vpcip/crds/addressbudgets.vpcip.io.yaml", RulesFile: "../../charts/vpcip/files/clusterrole-rules.yaml",
		RequestLimits: vpcsim.AWSRequestLimits(),
		Logf:          t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("fleet close: %v", err)
		}
		if left := f.Leftovers(); len(left) > 0 {
			t.Errorf("left after close: %v", left)
		}
	})
	report := func(r fleet.Report) {
		var b strings.Builder
		r.Print(&b)
		t.Log("\n" + b.String())
	}

	ra, pods, err := f.ScenarioLaunch(ctx, fleet.LaunchOptions{
		PodsPerNode: podsPerNode, Spread: spread, ReadyTimeout: 5 * time.Minute, PodTimeout: 10 * time.Minute, Settle: settle,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(ra)
	if ra.Failed > 0 {
		t.Errorf("scenario a: %d of %d pods got no address: %v", ra.Failed, ra.Pods, ra.Errors)
	}
	if want := nodes * podsPerNode; ra.Pods != want {
		t.Errorf("scenario a: %d pods asked, want %d", ra.Pods, want)
	}

	rc, err := f.ScenarioChurn(ctx, pods, fleet.ChurnOptions{Duration: churn, Interval: churnInterval, PodTimeout: 5 * time.Minute, Settle: settle})
	if err != nil {
		t.Fatal(err)
	}
	report(rc)
	if rc.Failed > 0 {
		t.Errorf("scenario c: %d of %d pods failed: %v", rc.Failed, rc.Pods, rc.Errors)
	}

	rd, err := f.ScenarioScaleIn(ctx, pods, scaleInSettle)
	if err != nil {
		t.Fatal(err)
	}
	report(rd)
	if rd.Failed > 0 {
		t.Errorf("scenario d: %d deletions failed: %v", rd.Failed, rd.Errors)
	}
}
