package fleet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
// buckets (AWS's documented defaults) and one real API server, once per
// model of sharing the account's EC2 budget, each on a fresh fleet, and
// prints each scenario's table as it is measured and, at the end, the
// models side by side:
//
//   - per-node backoff: each daemon paces its EC2 calls alone (the default,
//     VPCIP_EC2_BUDGET=node);
//   - coordinated budget: the daemons share the account's buckets through
//     Leases (VPCIP_EC2_BUDGET=fleet, package ipamd/ec2budget), at
//     VPCIP_FLEET_BUDGET_SHARE percent of them (default 80, the daemon's);
//   - central operator: the daemons as in per-node backoff, but every
//     mutating EC2 request of the fleet waits in one queue at the rate and
//     burst of Cilium's operator by default (--limit-ipam-api-qps 4,
//     --limit-ipam-api-burst 20; VPCIP_FLEET_OPERATOR_QPS and
//     VPCIP_FLEET_OPERATOR_BURST change them), as if one process made
//     them all: its rate limit, not its allocation logic (docs/design.md §9).
//
// Scenarios: (a) every daemon started at once, each node given its pods
// within the spread; (b) a rollout replacing every pod in waves; (c) steady
// churn; (d) scale-in of half the pods. VPCIP_FLEET_MODELS (default "node,fleet"; make fleet: "node,fleet,operator")
// and VPCIP_FLEET_SCENARIOS ("abcd") pick a part. The default is the short
// variant `make test` runs (6 nodes per model, 10 pods each within 5 s,
// short windows); `make fleet` sets VPCIP_FLEET_NODES=200 and a minute's
// spread with longer windows. VPCIP_FLEET_KEEP=dir keeps each model's
// daemon logs and state under dir/<prefix>/node-N. VPCIP_FLEET_ACCOUNT_SCALE
// (percent, default 100) shrinks the account's EC2 buckets, and the
// coordinated budget's share with them, so that a small fleet meets the
// contention of a larger one (15 with 30 nodes: EC2's buckets as 200 nodes
// see them) without 200 daemons' CPU. A failed CNI ADD is tried again after
// VPCIP_FLEET_ADD_RETRY (default 10 s, kubelet's pod worker back-off) and
// up to half as long more. The control plane, the daemons and the harness
// run in CPU groups of their own (package fleet, cpugroup.go);
// VPCIP_FLEET_SHARED_CPU=1 runs them without.
func TestFleet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	kubetest.SkipIfUnavailable(t)
	nodes := envInt(t, "VPCIP_FLEET_NODES", 6)
	podsPerNode := envInt(t, "VPCIP_FLEET_PODS", 10)
	spread := envDuration(t, "VPCIP_FLEET_SPREAD", 5*time.Second)
	churn := envDuration(t, "VPCIP_FLEET_CHURN", 8*time.Second)
	churnInterval := envDuration(t, "VPCIP_FLEET_CHURN_INTERVAL", 4*time.Second)
	settle := envDuration(t, "VPCIP_FLEET_SETTLE", 3*time.Second)
	scaleInSettle := envDuration(t, "VPCIP_FLEET_SCALEIN_SETTLE", 3*time.Second)
	waves := envInt(t, "VPCIP_FLEET_WAVES", 2)
	share := envInt(t, "VPCIP_FLEET_BUDGET_SHARE", 80)
	scale := envInt(t, "VPCIP_FLEET_ACCOUNT_SCALE", 100)
	addRetry := envDuration(t, "VPCIP_FLEET_ADD_RETRY", 10*time.Second)
	sharedCPU := os.Getenv("VPCIP_FLEET_SHARED_CPU") == "1"
	if scale < 1 || scale > 100 || share*scale < 100 {
		t.Fatalf("VPCIP_FLEET_ACCOUNT_SCALE=%d with VPCIP_FLEET_BUDGET_SHARE=%d: want 1 to 100 and a budget share of at least 1 %% of AWS's buckets", scale, share)
	}
	scenarios := os.Getenv("VPCIP_FLEET_SCENARIOS")
	if scenarios == "" {
		scenarios = "abcd"
	}
	if strings.Trim(scenarios, "abcd") != "" || !strings.Contains(scenarios, "a") {
		t.Fatalf("VPCIP_FLEET_SCENARIOS=%q: want letters of abcd, a included (it gives the nodes their pods)", scenarios)
	}
	operatorQPS := envInt(t, "VPCIP_FLEET_OPERATOR_QPS", 4)
	operatorBurst := envInt(t, "VPCIP_FLEET_OPERATOR_BURST", 20)
	models := []struct {
		key, name string
		env       []string
		qps       int // the central operator's queue; 0: none
	}{
		{"node", "per-node backoff", nil, 0},
		{"fleet", "coordinated budget", []string{"VPCIP_EC2_BUDGET=fleet", fmt.Sprintf("VPCIP_EC2_BUDGET_SHARE=%d", share*scale/100)}, 0},
		{"operator", "central operator", nil, operatorQPS},
	}
	// make test's short variant runs two models (the operator model adds
	// about 51 s there; vpcsim's caller queue it rests on has its own
	// test); make fleet sets all three.
	picked := os.Getenv("VPCIP_FLEET_MODELS")
	if picked == "" {
		picked = "node,fleet"
	}

	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := cluster.BuildBinaries(ctx, bin); err != nil {
		t.Fatal(err)
	}
	var results []fleet.Model
	for i, m := range models {
		if !slices.Contains(strings.Split(picked, ","), m.key) {
			continue
		}
		ok := t.Run(m.key, func(t *testing.T) {
			opts := fleet.Options{DaemonEnv: m.env, OperatorQPS: float64(m.qps), OperatorBurst: operatorBurst, ADDRetry: addRetry, SharedCPU: sharedCPU}
			r := runModel(ctx, t, fmt.Sprintf("f%d%c", os.Getpid()%10000, 'a'+i), bin, nodes, scale, opts, func(f *fleet.Fleet) []fleet.Report {
				return runScenarios(ctx, t, f, scenarios, scenarioOptions{podsPerNode, spread, churn, churnInterval, settle, scaleInSettle, waves})
			})
			results = append(results, fleet.Model{Name: m.name, Reports: r})
		})
		if !ok {
			break
		}
	}
	var b strings.Builder
	fleet.PrintComparison(&b, results)
	t.Logf("\n%d nodes per model; AB st/n/m: AddressBudget status writes per node and minute; lease/n/m: Lease requests per node and minute (the shared budget's; the API server's own lease renewals included); central operator: every mutating EC2 request in one queue at %d/s, burst %d\n%s", nodes, operatorQPS, operatorBurst, b.String())
}

// checkCPUGroups checks that, when the fleet has CPU groups, etcd and the
// API server are in the control plane's and every daemon in the nodes'.
func checkCPUGroups(t *testing.T, f *fleet.Fleet) {
	t.Helper()
	cp, in, ok := f.CPUGroups()
	if !ok {
		t.Logf("fleet: no CPU groups on this machine (or VPCIP_FLEET_SHARED_CPU)")
		return
	}
	if len(cp) != 2 {
		t.Errorf("control plane's CPU group holds %v, want etcd and kube-apiserver", cp)
	}
	for _, n := range f.Nodes {
		if pid := n.PID(); pid != 0 && !slices.Contains(in, pid) {
			t.Errorf("vpcipd on %s (pid %d) is not in the nodes' CPU group %v", n.Name, pid, in)
		}
	}
}

// checkBudgetFlowSchema checks that the daemons' Lease requests, when the
// fleet shares its EC2 budget, went to the chart's FlowSchema for them and
// none to the API server's system-leader-election, where kube-system
// ServiceAccounts' Lease requests go by default.
func checkBudgetFlowSchema(ctx context.Context, t *testing.T, f *fleet.Fleet) {
	t.Helper()
	if !slices.Contains(f.DaemonEnv, "VPCIP_EC2_BUDGET=fleet") {
		return
	}
	d, err := f.DispatchedByFlowSchema(ctx)
	if err != nil {
		t.Errorf("flow control metrics: %v", err)
		return
	}
	if d["vpcipd-ec2-budget"] == 0 {
		t.Errorf("no request dispatched through FlowSchema vpcipd-ec2-budget; by FlowSchema: %v", d)
	}
	if n := d["system-leader-election"]; n > 0 {
		t.Errorf("%v requests went to system-leader-election, beside the control plane's leader renewals; want the budget's own FlowSchema", n)
	}
}

type scenarioOptions struct {
	podsPerNode                  int
	spread, churn, churnInterval time.Duration
	settle, scaleInSettle        time.Duration
	waves                        int
}

// runModel starts a fleet of n nodes with the model's options (the
// daemons' environment, the operator's queue), runs fn on it, and checks
// that it closes cleanly.
func runModel(ctx context.Context, t *testing.T, prefix, bin string, n, scale int, model fleet.Options, fn func(*fleet.Fleet) []fleet.Report) []fleet.Report {
	model.Prefix, model.Nodes, model.BinDir, model.WorkDir = prefix, n, bin, t.TempDir()
	if keep := os.Getenv("VPCIP_FLEET_KEEP"); keep != "" {
		// The daemons' logs and state outlive the run, for reading after.
		model.WorkDir = filepath.Join(keep, prefix)
		if err := os.MkdirAll(model.WorkDir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Logf("fleet: daemons' logs and state kept under %s", model.WorkDir)
	}
	model.CRDFile, model.RulesFile = "../../charts/vpcip/crds/addressbudgets.vpcip.io.yaml", "../../charts/vpcip/files/clusterrole-rules.yaml"
	model.ChartDir = "../../charts/vpcip"
	model.RequestLimits, model.Logf = vpcsim.AWSRequestLimits(), t.Logf
	if scale != 100 {
		model.RequestLimits = model.RequestLimits.Scaled(float64(scale) / 100)
	}
	f, err := fleet.Start(ctx, model)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			t.Errorf("fleet close: %v", err)
		}
		if left := f.Leftovers(); len(left) > 0 {
			t.Errorf("left after close: %v", left)
		}
	}()
	return fn(f)
}

func runScenarios(ctx context.Context, t *testing.T, f *fleet.Fleet, scenarios string, o scenarioOptions) []fleet.Report {
	var out []fleet.Report
	report := func(r fleet.Report) {
		var b strings.Builder
		r.Print(&b)
		t.Log("\n" + b.String())
		out = append(out, r)
	}
	nodes := len(f.Nodes)
	ra, pods, err := f.ScenarioLaunch(ctx, fleet.LaunchOptions{
		PodsPerNode: o.podsPerNode, Spread: o.spread, ReadyTimeout: 5 * time.Minute, PodTimeout: 10 * time.Minute, Settle: o.settle,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(ra)
	if ra.Failed > 0 {
		t.Errorf("scenario a: %d of %d pods got no address: %v", ra.Failed, ra.Pods, ra.Errors)
	}
	if want := nodes * o.podsPerNode; ra.Pods != want {
		t.Errorf("scenario a: %d pods asked, want %d", ra.Pods, want)
	}
	checkCPUGroups(t, f)
	checkBudgetFlowSchema(ctx, t, f)
	if strings.Contains(scenarios, "b") {
		rb, err := f.ScenarioRollout(ctx, pods, fleet.RolloutOptions{Waves: o.waves, Pause: o.settle, PodTimeout: 10 * time.Minute, Settle: o.settle})
		if err != nil {
			t.Fatal(err)
		}
		report(rb)
		if rb.Failed > 0 {
			t.Errorf("scenario b: %d of %d pods or deletions failed: %v", rb.Failed, rb.Pods, rb.Errors)
		}
	}
	if strings.Contains(scenarios, "c") {
		rc, err := f.ScenarioChurn(ctx, pods, fleet.ChurnOptions{Duration: o.churn, Interval: o.churnInterval, PodTimeout: 5 * time.Minute, Settle: o.settle})
		if err != nil {
			t.Fatal(err)
		}
		report(rc)
		if rc.Failed > 0 {
			t.Errorf("scenario c: %d of %d pods failed: %v", rc.Failed, rc.Pods, rc.Errors)
		}
	}
	if strings.Contains(scenarios, "d") {
		rd, err := f.ScenarioScaleIn(ctx, pods, o.scaleInSettle)
		if err != nil {
			t.Fatal(err)
		}
		report(rd)
		if rd.Failed > 0 {
			t.Errorf("scenario d: %d deletions failed: %v", rd.Failed, rd.Errors)
		}
	}
	return out
}
