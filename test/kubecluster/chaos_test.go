package kubecluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/introspect"
)

// Chaos campaign settings: VPCIP_CHAOS_FAULTS sets the number of faults of
// TestChaosCampaign (`make chaos` runs 100; unset, the test is skipped and
// make test runs the short campaign in TestClusterScenario's cluster), and
// VPCIP_CHAOS_SEED the seed of the fault plan (default: the time).
const (
	ChaosFaultsEnv = "VPCIP_CHAOS_FAULTS"
	ChaosSeedEnv   = "VPCIP_CHAOS_SEED"
	// ChaosKindsEnv narrows TestChaosCampaign to some fault kinds, named
	// as in AllFaults or by their short names in chaosKindNames
	// ("reboot,kill"); unset, every kind.
	ChaosKindsEnv = "VPCIP_CHAOS_KINDS"
	// ChaosUpgradeImageEnv names a second image archive, built with another
	// version string, for the helm upgrade and rollback fault; without it
	// that kind is left out.
	ChaosUpgradeImageEnv = "VPCIP_CHAOS_UPGRADE_IMAGE"
)

// TestChaosCampaign runs Chaos with VPCIP_CHAOS_FAULTS faults on a cluster
// of its own: the chart's DaemonSet, pods churning through kubelet, and
// faults of every kind at random moments; it fails when an invariant stays
// broken after a fault, an address is on two live pods, or anything is
// left once churn stopped.
func TestChaosCampaign(t *testing.T) {
	v := os.Getenv(ChaosFaultsEnv)
	if v == "" {
		t.Skip("set " + ChaosFaultsEnv + " (make chaos); make test runs the short campaign in TestClusterScenario")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number of faults", ChaosFaultsEnv, v)
	}
	image, vpcipctl, h := need(t)
	kinds, err := chaosKinds(os.Getenv(ChaosKindsEnv))
	if err != nil {
		t.Fatal(err)
	}
	ch := &Chaos{Faults: n, Kinds: kinds, APIDownMax: time.Minute, EC2Window: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute+time.Duration(n)*4*time.Minute)
	defer cancel()
	// kubelet's restart back-off capped at 1 s: the campaign kills vpcipd
	// tens of times, and the default back-off (10 s doubling to 5 min)
	// would make each kill after the fifth cost 5 min. make test's short
	// campaign keeps the default.
	c := startClusterWith(t, ctx, "vc", Options{Image: image, RestartBackOffMax: time.Second})
	runChaos(t, ctx, ch, &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Logf: t.Logf})
}

// chaosKindNames are the fault kinds' short names for VPCIP_CHAOS_KINDS.
var chaosKindNames = map[string]string{"kill": FaultKillDaemon, "containerd": FaultRestartContainerd,
	"kubelet": FaultRestartKubelet, "apiserver": FaultStopAPIServer, "ec2": FaultEC2, "reboot": FaultReboot,
	"upgrade": FaultUpgrade}

// chaosKinds reads a comma-separated VPCIP_CHAOS_KINDS: each item a kind
// of AllFaults, by its whole name or its short name. Empty means all (nil).
func chaosKinds(v string) ([]string, error) {
	var kinds []string
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		kind, ok := chaosKindNames[strings.ToLower(item)]
		if i := slices.IndexFunc(AllFaults, func(k string) bool { return strings.EqualFold(k, item) }); i >= 0 {
			kind, ok = AllFaults[i], true
		}
		if !ok {
			names := slices.Sorted(maps.Keys(chaosKindNames))
			return nil, fmt.Errorf("%s: unknown fault kind %q; kinds: %s", ChaosKindsEnv, item, strings.Join(names, ", "))
		}
		if !slices.Contains(kinds, kind) {
			kinds = append(kinds, kind)
		}
	}
	return kinds, nil
}

// runChaos runs a campaign on the cluster of s with the seed and upgrade
// image from the environment, and fails t with the kubelets' logs.
func runChaos(t *testing.T, ctx context.Context, ch *Chaos, s *Scenario) {
	t.Helper()
	ch.Seed = uint64(time.Now().UnixNano())
	if v := os.Getenv(ChaosSeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", ChaosSeedEnv, v)
		}
		ch.Seed = seed
	}
	if p := os.Getenv(ChaosUpgradeImageEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", ChaosUpgradeImageEnv, err)
		}
		ch.UpgradeImage = p
	} else {
		t.Logf("%s unset: no helm upgrade and rollback faults", ChaosUpgradeImageEnv)
	}
	ch.S, ch.Logf = s, t.Logf
	if err := ch.Run(ctx); err != nil {
		for _, n := range s.C.Nodes {
			t.Logf("kubelet log of %s:\n%s", n.Name, tail(n.KubeletLog(), 20))
		}
		t.Fatalf("chaos campaign (seed %d): %v", ch.Seed, err)
	}
}

func TestChaosKinds(t *testing.T) {
	got, err := chaosKinds(" reboot, kill,node reboot ,")
	if err != nil || !slices.Equal(got, []string{FaultReboot, FaultKillDaemon}) {
		t.Errorf("chaosKinds: %q, %v; want reboot and kill", got, err)
	}
	if got, err := chaosKinds(""); err != nil || got != nil {
		t.Errorf("chaosKinds(\"\"): %q, %v; want nil (all kinds)", got, err)
	}
	for _, k := range AllFaults {
		if !slices.Contains(slices.Collect(maps.Values(chaosKindNames)), k) {
			t.Errorf("fault kind %q has no short name in chaosKindNames", k)
		}
	}
	if _, err := chaosKinds("reboot,meteor"); err == nil || !strings.Contains(err.Error(), `"meteor"`) {
		t.Errorf("chaosKinds with an unknown kind: %v; want an error naming it", err)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{flow_schema="vpcip-daemons",priority_level="workload-high"} 12
apiserver_flowcontrol_dispatched_requests_total{flow_schema="global-default",priority_level="global-default"} 99
apiserver_flowcontrol_dispatched_requests_total{flow_schema="vpcip-daemons",priority_level="exempt"} 3
`
	got, err := sumMetric(text, "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="vpcip-daemons"`)
	if err != nil || got != 15 {
		t.Errorf("sumMetric = %v, %v; want 15", got, err)
	}
	if _, err := sumMetric(text, "apiserver_flowcontrol_dispatched_requests_total", `flow_schema="none"`); err == nil {
		t.Error("sumMetric found a sample of a flow schema that has none")
	}
}

func TestChaosViolations(t *testing.T) {
	ch := &Chaos{S: &Scenario{C: &Cluster{Nodes: []*Node{{Name: "node-1", InstanceID: "i-1"}, {Name: "node-2", InstanceID: "i-2"}}}}}
	a, b, c := netip.MustParseAddr("10.0.1.5"), netip.MustParseAddr("10.0.2.6"), netip.MustParseAddr("10.0.1.7")
	rec := func(id, pod string, addr netip.Addr) introspect.Assignment {
		return introspect.Assignment{Key: api.Key{ContainerID: id}, Pod: api.Pod{Name: pod}, Address: addr}
	}
	healthy := func() clusterView {
		return clusterView{
			Sandboxes: []liveSandbox{{Node: "node-1", ID: "s1", Pod: "default/p1", UID: "u1", Addr: a}, {Node: "node-2", ID: "s2", Pod: "default/p2", UID: "u2", Addr: b}},
			At:        time.Now(),
			EC2:       map[netip.Addr]string{a: "i-1", b: "i-2", c: "i-1"},
			Daemon: map[string]map[netip.Addr]introspect.Assignment{
				"node-1": {a: rec("s1", "p1", a)}, "node-2": {b: rec("s2", "p2", b)}},
			APIPods: []Pod{{Name: "p1", UID: "u1", Node: "node-1", IP: a.String(), Phase: "Running"}, {Name: "p3", Node: "node-2", Phase: "Pending"}},
		}
	}
	checks := map[string]int{}
	if bad := ch.violations(healthy(), checks); len(bad) != 0 {
		t.Errorf("healthy cluster: %v", bad)
	}
	if checks["one address, one live pod"] != 2 || checks["Running pod's address assigned by EC2 to its node"] != 1 {
		t.Errorf("checks = %v", checks)
	}
	tests := []struct {
		name    string
		breakIt func(*clusterView)
		want    []string // the violations' keys
	}{
		{"an address on two live pods", func(v *clusterView) {
			v.Sandboxes = append(v.Sandboxes, liveSandbox{Node: "node-1", ID: "s3", Pod: "default/p3", Addr: a})
		}, []string{"dup 10.0.1.5", "daemon s3"}},
		{"EC2 assigns the address to the other node", func(v *clusterView) { v.EC2[b] = "i-1" }, []string{"ec2 s2"}},
		{"EC2 no longer assigns it", func(v *clusterView) { delete(v.EC2, a) }, []string{"ec2 s1", "api u1"}},
		{"a live pod without an address", func(v *clusterView) { v.Sandboxes[1].Addr = netip.Addr{} }, []string{"noaddr s2"}},
		{"the daemon records the address for another sandbox", func(v *clusterView) {
			v.Daemon["node-1"][a] = rec("gone", "p0", a)
		}, []string{"daemon s1"}},
		{"the daemon released the address of a live pod", func(v *clusterView) { delete(v.Daemon["node-2"], b) }, []string{"daemon s2"}},
		{"a Running pod's address not on its node", func(v *clusterView) { v.APIPods[0].IP = b.String() }, []string{"api u1"}},
		{"a deleted pod stays past its grace", func(v *clusterView) {
			v.Deleting = []deletingPod{{Name: "p4", UID: "u4", Node: "node-1", Deadline: v.At.Add(-StuckDeleting - time.Second)},
				{Name: "p5", UID: "u5", Node: "node-2", Deadline: v.At.Add(-time.Minute)}}
		}, []string{"stuck u4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := healthy()
			tt.breakIt(&v)
			bad := ch.violations(v, map[string]int{})
			got := sortedKeys(bad)
			slices.Sort(tt.want)
			if !slices.Equal(got, tt.want) {
				t.Errorf("violations = %v, want keys %q", bad, tt.want)
			}
		})
	}
}
