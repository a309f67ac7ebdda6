package monitoring

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/netnsdir"
	"github.com/vpcip/vpcip/test/vpcsim"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

// The scenario's facts. Both nodes are t3.medium: 3 ENIs of 6 addresses, a
// budget of 3 × 5 = 15 pod addresses.
const (
	bigSubnet   = "subnet-obsbig"
	smallSubnet = "subnet-obssmall" // a /28: 11 usable addresses
	budget      = 15
	fullPods    = 15 // node-1 at its ENI limit
	smallPods   = 9  // node-2 when the /28 is used up: 2 ENIs, 6 + 5 addresses, 2 of them ENI primaries
	leaked      = 1  // node-2's pods lost without a CNI DEL, released by CNI GC
)

// run is one scenario: real daemons on vpcsim, scraped by a real
// Prometheus, and the ground truth read from the daemons themselves.
type run struct {
	c          *cluster.Cluster
	prom       *prometheus
	start, end time.Time
	status     map[string]api.Status // by node name, at the end
	bigFree    int                   // EC2's free count of the big subnet at the end
	exprs      []string              // the queries of the panel being checked, variables resolved
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the scenario needs root: vpcsim builds network namespaces")
	}
	for _, tool := range []string{"ip", "iptables", "prometheus"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make test-deps installs it)", tool)
		}
	}
}

// startCluster runs two nodes, node-1 in a /20 and node-2 alone in a /28,
// with the daemons refreshing subnet metrics every 2 s, the awscni_* names
// on, CNI GC with its least grace (config.MinGCGrace) and a cooldown longer
// than the test.
func startCluster(t *testing.T, ctx context.Context) *cluster.Cluster {
	t.Helper()
	bin := t.TempDir()
	if err := cluster.BuildBinaries(ctx, bin); err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Prefix:       fmt.Sprintf("om%d", os.Getpid()%10000),
		Nodes:        2,
		InstanceType: "t3.medium",
		BinDir:       bin,
		WorkDir:      t.TempDir(),
		Logf:         t.Logf,
		Sim: vpcsim.Config{Subnets: []vpcsim.SubnetSpec{
			{ID: bigSubnet, CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"},
			{ID: smallSubnet, CIDR: netip.MustParsePrefix("100.64.16.0/28"), AvailabilityZone: "us-west-2b"},
		}},
		NodeSubnets: []string{bigSubnet, smallSubnet},
		DaemonEnv: []string{
			"WARM_IP_TARGET=2", "IP_COOLDOWN_PERIOD=600", "VPCIP_GC_GRACE=10s", "VPCIP_ADD_WAIT=2s",
			"VPCIP_SUBNET_METRICS_INTERVAL=2s", "VPCIP_METRICS_AWSCNI_NAMES=true",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s vpcipd log (tail):\n%s", n.Name, n.LogTail(20))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("cluster teardown: %v", err)
		}
	})
	return c
}

// fill starts pods on n one at a time, retrying a refused ADD as kubelet
// does, until want run; then checks that one more is refused. pause spaces
// the pods so the subnet's free count is seen draining.
func fill(t *testing.T, ctx context.Context, n *cluster.Node, want int, pause time.Duration) []*podruntime.Pod {
	t.Helper()
	var pods []*podruntime.Pod
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; len(pods) < want; i++ {
		p, err := n.AddPod(ctx, "default", fmt.Sprintf("%s-p%d", n.Name, i))
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d pods after 90s: %v", n.Name, len(pods), want, err)
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		pods = append(pods, p)
		time.Sleep(pause)
	}
	// Refused pods, 2 s apart, as kubelet retries a sandbox.
	for i := range 3 {
		if p, err := n.AddPod(ctx, "default", fmt.Sprintf("%s-over%d", n.Name, i)); err == nil {
			t.Fatalf("%s: pod %d beyond the %d expected got %s", n.Name, want+i+1, want, p.Address)
		}
		time.Sleep(2 * time.Second)
	}
	return pods
}

// scenario: throttle EC2 while node-1 fills to its ENI limit; fill node-2
// until its /28 is used up; then leak one of node-2's pods (its netns goes
// without a CNI DEL) and let CNI GC release the address.
func scenario(t *testing.T) *run {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	c := startCluster(t, ctx)
	var targets []target
	for _, n := range c.Nodes {
		targets = append(targets, target{netip.AddrPortFrom(n.PrimaryIP, 61678).String(), n.Name})
	}
	r := &run{c: c, prom: startPrometheus(t, c.Fabric.RouterNetns(), targets), start: time.Now(), status: map[string]api.Status{}}
	n1, n2 := c.Nodes[0], c.Nodes[1]

	c.Cloud.Faults().SetThrottle(true, 2, 1)
	fill(t, ctx, n1, fullPods, 0)
	c.Cloud.Faults().Reset()
	filled := time.Now()
	pods := fill(t, ctx, n2, smallPods, 1500*time.Millisecond)
	// pods[0] is older than VPCIP_GC_GRACE by the fill's pace; make sure.
	time.Sleep(time.Until(filled.Add(10*time.Second + 100*time.Millisecond)))
	// The daemon exports every repair kind at 0 from the start, so the
	// first GC release shows in increase().
	for i := range leaked {
		leak(t, n2, pods[i])
		if err := n2.Runtime.GC(ctx, pods[i+1:]); err != nil {
			t.Fatalf("CNI GC on %s: %v", n2.Name, err)
		}
		time.Sleep(2 * time.Second)
	}
	time.Sleep(8 * time.Second) // a subnet refresh (≤ 3 s) and scrapes after the last change
	r.end = time.Now()
	for _, n := range c.Nodes {
		st, err := n.Client().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.status[n.Name] = st
	}
	if st := r.status[n1.Name]; st.Assigned != fullPods || st.Budget != budget || st.ENIs != 3 {
		t.Fatalf("node-1 after the scenario: %+v, want %d of %d assigned on 3 ENIs", st, fullPods, budget)
	}
	if st := r.status[n2.Name]; st.Assigned != smallPods-leaked || st.Cooling != leaked {
		t.Fatalf("node-2 after the scenario: %+v, want %d assigned and the %d leaked addresses cooling", st, smallPods-leaked, leaked)
	}
	sub, _ := c.Cloud.Subnet(bigSubnet)
	r.bigFree = sub.FreeAddresses
	if sub, _ := c.Cloud.Subnet(smallSubnet); sub.FreeAddresses != 0 {
		t.Fatalf("the /28 has %d free addresses after the scenario, want 0", sub.FreeAddresses)
	}
	return r
}

// leak loses a pod the way a node does when its runtime state is gone: the
// netns disappears and the runtime's cached result with it, so no CNI DEL
// ever comes; only CNI GC can release the address.
func leak(t *testing.T, n *cluster.Node, p *podruntime.Pod) {
	t.Helper()
	if err := netnsdir.Delete(p.Netns); err != nil {
		t.Fatal(err)
	}
	cached, err := filepath.Glob(filepath.Join(n.Runtime.CacheDir, "results", "*"+p.ContainerID+"*"))
	if err != nil || len(cached) == 0 {
		t.Fatalf("libcni's cached result of %s not found in %s (%v)", p.Name, n.Runtime.CacheDir, err)
	}
	for _, f := range cached {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
}

// metricsBody is one scrape of a node's /metrics, from inside its netns.
func metricsBody(t *testing.T, n *cluster.Node) string {
	t.Helper()
	resp, err := n.HTTPClient().Get("http://127.0.0.1:61678/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// value reads an unlabelled sample from an exposition.
func value(t *testing.T, body, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("%s not in /metrics", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMonitoringScenario runs the scenario once and checks, against it,
// every dashboard panel's queries, the dashboards' and rules' metric names,
// the alerts the rules raise, and the awscni_* opt-in.
func TestMonitoringScenario(t *testing.T) {
	r := scenario(t)
	t.Run("panels", func(t *testing.T) { checkPanels(t, r) })
	t.Run("metric names", func(t *testing.T) { checkMetricNames(t, r) })
	t.Run("alerts", func(t *testing.T) { checkPendingAlerts(t, r) })
	t.Run("awscni names", func(t *testing.T) { checkAWSCNINames(t, r) })
}

// checkMetricNames: every metric a dashboard or alert rule names is in a
// daemon's /metrics, and Prometheus has scraped it.
func checkMetricNames(t *testing.T, r *run) {
	var body string // every node's: a counter vector shows once it has a series
	for _, n := range r.c.Nodes {
		body += metricsBody(t, n)
	}
	scraped, err := r.prom.labelValues(t.Context(), "__name__", "")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	names := metricNames(string(rules))
	for _, d := range loadDashboards(t) {
		for _, p := range d.Panels {
			for _, q := range p.Targets {
				names = append(names, metricNames(q.Expr)...)
			}
		}
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if !regexp.MustCompile(`(?m)^` + name + `[ {]`).MatchString(body) {
			t.Errorf("%s is named by a dashboard or rule but not in vpcipd's /metrics", name)
		}
		if !slices.Contains(scraped, name) {
			t.Errorf("%s is not among the series Prometheus scraped", name)
		}
	}
}

// checkPendingAlerts: the rules, evaluated by the same Prometheus on the
// real series, raise the alerts the scenario calls for (pending: their
// `for` durations are longer than the test).
func checkPendingAlerts(t *testing.T, r *run) {
	want := []map[string]string{
		{"alertname": "VpcipNodeAddressBudgetNearlyUsed", "node": "node-1"},
		{"alertname": "VpcipNodeAtENILimitWithPodsWaiting", "node": "node-1"},
		{"alertname": "VpcipSubnetNearlyFull", "subnet_id": smallSubnet},
		{"alertname": "VpcipPodsRefusedAddress", "node": "node-1", "cause": "eni-limit"},
		{"alertname": "VpcipPodsRefusedAddress", "node": "node-2", "cause": "subnet-full"},
	}
	got, err := r.prom.instant(t.Context(), `ALERTS{alertstate=~"pending|firing"}`, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(s series) bool { return matches(s.labels, w) }) {
			t.Errorf("alert %v not raised; raised: %v", w, got)
		}
	}
	for _, s := range got {
		switch s.labels["alertname"] {
		case "VpcipDaemonNotReady", "VpcipMixedVersions", "VpcipAddressesWithoutPod":
			t.Errorf("alert %v raised, but every daemon is ready, on one version, with no address held without a pod", s.labels)
		}
	}
}

// checkAWSCNINames: with VPCIP_METRICS_AWSCNI_NAMES=true the reference's
// gauges are there with the reference's meanings, equal in one scrape to our
// own gauges and to the daemon's status.
func checkAWSCNINames(t *testing.T, r *run) {
	for _, n := range r.c.Nodes {
		body := metricsBody(t, n)
		st := r.status[n.Name]
		pairs := []struct {
			awscni string
			ours   float64
			status int
		}{
			{"awscni_assigned_ip_addresses", value(t, body, "vpcip_addresses_assigned"), st.Assigned},
			{"awscni_total_ip_addresses", value(t, body, "vpcip_addresses_assigned") + value(t, body, "vpcip_addresses_warm") + value(t, body, "vpcip_addresses_cooling"), st.Assigned + st.Warm + st.Cooling},
			{"awscni_ip_max", value(t, body, "vpcip_addresses_budget"), st.Budget},
			{"awscni_eni_allocated", value(t, body, "vpcip_enis_attached"), st.ENIs},
			{"awscni_eni_max", value(t, body, "vpcip_enis_max"), st.MaxENIs},
		}
		for _, p := range pairs {
			if got := value(t, body, p.awscni); got != p.ours || got != float64(p.status) {
				t.Errorf("%s %s = %v, want %v (our gauges) = %d (status)", n.Name, p.awscni, got, p.ours, p.status)
			}
		}
	}
}

func matches(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}
