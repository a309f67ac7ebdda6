package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// The release values files of test/chart/testdata: the AWS VPC CNI v1.23
// default env block and the two feature files layered over it.
const (
	defaultsValues  = "../chart/testdata/aws-node-values.yaml"
	customNetValues = "../chart/testdata/custom-networking-values.yaml"
	prefixValues    = "../chart/testdata/prefix-delegation-values.yaml"
)

// Node subnets of the release-values cluster, one per zone in the VPC's
// primary CIDR (nodes start in the first).
var rvNodeSubnets = []vpcsim.SubnetSpec{
	{ID: "subnet-000000000000a0a01", CIDR: netip.MustParsePrefix("100.64.0.0/20"), AvailabilityZone: "us-west-2a"},
	{ID: "subnet-000000000000a0b01", CIDR: netip.MustParsePrefix("100.64.16.0/20"), AvailabilityZone: "us-west-2b"},
}

// eniConfigValues is the eniConfig block of a values file.
type eniConfigValues struct {
	EniConfig struct {
		Create  bool   `yaml:"create"`
		Region  string `yaml:"region"`
		Subnets map[string]struct {
			ID             string   `yaml:"id"`
			SecurityGroups []string `yaml:"securityGroups"`
		} `yaml:"subnets"`
	} `yaml:"eniConfig"`
}

// releaseValuesSim is the VPC the custom networking file expects: its
// subnets (by the file's ids, one /20 per zone in the secondary CIDR
// 100.66.0.0/16, as custom networking puts pods in a secondary CIDR) and
// security groups exist, beside the node subnets.
func releaseValuesSim(t *testing.T, cn eniConfigValues) vpcsim.Config {
	t.Helper()
	cfg := vpcsim.Config{Region: cn.EniConfig.Region, SecondaryVPCCIDRs: []netip.Prefix{netip.MustParsePrefix("100.66.0.0/16")}}
	cfg.Subnets = append(cfg.Subnets, rvNodeSubnets...)
	zones := slices.Sorted(maps.Keys(cn.EniConfig.Subnets))
	groups := map[string]bool{}
	for i, z := range zones {
		s := cn.EniConfig.Subnets[z]
		cfg.Subnets = append(cfg.Subnets, vpcsim.SubnetSpec{ID: s.ID, AvailabilityZone: z,
			CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 66, byte(16 * i), 0}), 20)})
		for _, g := range s.SecurityGroups {
			if !groups[g] {
				groups[g] = true
				cfg.SecurityGroups = append(cfg.SecurityGroups, vpcsim.SecurityGroupSpec{ID: g, Name: "pods-" + g})
			}
		}
	}
	return cfg
}

// TestClusterReleaseValues: an aws-node user's values files, installed
// unchanged with Helm on the real cluster, one after the other on one
// cluster as a user moves through them: the AWS VPC CNI v1.23 default env
// block (helm install), then custom networking and then prefix delegation
// (each helm upgrade, layered over the defaults with -f as the files say).
// After each, the DaemonSet is rolled and ready on every node and each
// daemon's effective configuration (vpcipctl status, the introspection
// endpoint's config) shows every variable of the merged env block that
// vpcipd reads, and a pod started on each node gets an address EC2 assigns
// to that node.
//
// Both features change where new addresses come from, not the addresses a
// node already holds, so the AWS VPC CNI's documentation says to replace
// (or add) nodes after turning them on; the test adds one fresh node after
// each upgrade, as a node group scaling out, and checks what the feature
// promises there: under custom networking, the pod's address is in its
// zone's ENIConfig subnet, on an ENI with the ENIConfig's security groups
// and the primary ENI holds none; under prefix delegation, it is in a /28
// prefix EC2 assigned to the node. On the older nodes the check is the
// effective configuration and an EC2-assigned address.
//
// Not exercised, and why:
//   - the us-west-2c ENIConfig of the custom networking file: rendered and
//     created, but no node runs in that zone (one more node costs a node's
//     start-up in make test; zone a's and b's are exercised);
//   - AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS's effect on traffic: it shows in the
//     effective configuration; the SNAT rules it makes are tested in test/e2e
//     (the fabric's outside host), not here;
//   - the env keys vpcip accepts at their default values without reading
//     them (ADDITIONAL_ENI_TAGS, VPC_CNI_VERSION, NETWORK_POLICY_ENFORCING_MODE
//     and the others of files/env.yaml's awsOnly): no daemon setting to show;
//     the NOTES Helm prints name them, and test/chart checks each.
//
// Every value the three files set can be installed on vpcsim.
func TestClusterReleaseValues(t *testing.T) {
	image, vpcipctl, h := need(t)
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	defaults, custom, prefix := abs(defaultsValues), abs(customNetValues), abs(prefixValues)
	var cn eniConfigValues
	data, err := os.ReadFile(custom)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &cn); err != nil {
		t.Fatal(err)
	}
	if !cn.EniConfig.Create || len(cn.EniConfig.Subnets) == 0 {
		t.Fatalf("%s creates no ENIConfigs", custom)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	c := startClusterWith(t, ctx, "vr", Options{Image: image, Nodes: 1, Sim: releaseValuesSim(t, cn)})
	r := &releaseValuesRun{t: t, s: &Scenario{C: c, Helm: h, Vpcipctl: vpcipctl, Logf: t.Logf}}
	r.timings = append(r.timings, fmt.Sprintf("cluster of 1 node %s", time.Since(start).Round(100*time.Millisecond)))
	fail := func(err error) {
		t.Helper()
		logs, _ := c.Kubectl(ctx, "logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=vpcip", "-c", "vpcipd", "--tail=30", "--prefix")
		t.Fatalf("%v\nvpcipd logs:\n%s", err, logs)
	}

	// 1. The v1.23 defaults: secondary IPs, one warm ENI.
	step := time.Now()
	if err := r.install(ctx, false, defaults); err != nil {
		fail(err)
	}
	if err := r.checkDaemons(ctx, introspect.ModeSecondaryIP, defaults); err != nil {
		fail(err)
	}
	pods, err := r.podPerNode(ctx, "defaults")
	if err != nil {
		fail(err)
	}
	for _, p := range pods {
		if a := r.owner(p); a.prefix.Bits() != 32 {
			t.Errorf("v1.23 defaults: pod %s on %s has %s from %s, want a secondary IP", p.Name, p.Node, p.IP, a.prefix)
		}
	}
	r.timings = append(r.timings, fmt.Sprintf("v1.23 defaults %s", time.Since(step).Round(100*time.Millisecond)))

	// 2. Custom networking: an ENIConfig per zone, chosen by the node's
	// zone label; a new node in us-west-2b.
	step = time.Now()
	if err := r.install(ctx, true, defaults, custom); err != nil {
		fail(err)
	}
	out, err := c.Kubectl(ctx, "get", "eniconfigs", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.subnet} {end}`)
	if err != nil {
		fail(err)
	}
	for z, sn := range cn.EniConfig.Subnets {
		if !containsWord(out, z+"="+sn.ID) {
			t.Errorf("ENIConfigs %q lack %s=%s", out, z, sn.ID)
		}
	}
	fresh, err := r.addNode(ctx, rvNodeSubnets[1].ID)
	if err != nil {
		fail(err)
	}
	if err := r.checkDaemons(ctx, introspect.ModeSecondaryIP, defaults, custom); err != nil {
		fail(err)
	}
	if pods, err = r.podPerNode(ctx, "customnet"); err != nil {
		fail(err)
	}
	want := cn.EniConfig.Subnets[fresh.Zone]
	wantSubnet, _ := c.Cloud.Subnet(want.ID)
	for _, p := range pods {
		if p.Node != fresh.Name {
			continue
		}
		a := r.owner(p)
		if !wantSubnet.CIDR.Contains(a.addr) || a.eni.SubnetID != want.ID || a.eni.DeviceIndex == 0 ||
			!slices.Equal(slices.Sorted(slices.Values(a.eni.SecurityGroups)), slices.Sorted(slices.Values(want.SecurityGroups))) {
			t.Errorf("custom networking: pod %s on %s (%s) has %s on ENI %s (device %d, %s, %v); want an address of ENIConfig %s's subnet %s %s with %v",
				p.Name, p.Node, fresh.Zone, p.IP, a.eni.ID, a.eni.DeviceIndex, a.eni.SubnetID, a.eni.SecurityGroups, fresh.Zone, want.ID, wantSubnet.CIDR, want.SecurityGroups)
		}
	}
	for _, e := range c.Cloud.NetworkInterfaces() {
		if e.InstanceID == fresh.InstanceID && e.DeviceIndex == 0 && len(e.SecondaryIPs)+len(e.Prefixes) > 0 {
			t.Errorf("custom networking: %s's primary ENI holds %v %v", fresh.Name, e.SecondaryIPs, e.Prefixes)
		}
	}
	st, err := r.state(ctx, fresh)
	if err != nil {
		fail(err)
	}
	if pl := st.Placement; pl == nil || pl.Mode != "custom-networking" || pl.ENIConfig != fresh.Zone || pl.SubnetID != want.ID {
		t.Errorf("custom networking: %s's latest ENI placement %+v, want mode custom-networking, ENIConfig %s, subnet %s", fresh.Name, pl, fresh.Zone, want.ID)
	}
	r.timings = append(r.timings, fmt.Sprintf("custom networking %s", time.Since(step).Round(100*time.Millisecond)))

	// 3. Prefix delegation: /28 prefixes; a new node in us-west-2a.
	step = time.Now()
	if err := r.install(ctx, true, defaults, prefix); err != nil {
		fail(err)
	}
	if out, err := c.Kubectl(ctx, "get", "eniconfigs", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("after the upgrade without eniConfig.create the chart's ENIConfigs remain: %q %v", out, err)
	}
	if fresh, err = r.addNode(ctx, rvNodeSubnets[0].ID); err != nil {
		fail(err)
	}
	if err := r.checkDaemons(ctx, introspect.ModePrefix, defaults, prefix); err != nil {
		fail(err)
	}
	if pods, err = r.podPerNode(ctx, "prefix"); err != nil {
		fail(err)
	}
	for _, p := range pods {
		if a := r.owner(p); p.Node == fresh.Name && a.prefix.Bits() != 28 {
			t.Errorf("prefix delegation: pod %s on %s has %s from %s, want an address of a /28 prefix", p.Name, p.Node, p.IP, a.prefix)
		}
	}
	r.timings = append(r.timings, fmt.Sprintf("prefix delegation %s", time.Since(step).Round(100*time.Millisecond)))
	t.Logf("timings: %s; total %s", strings.Join(r.timings, "; "), time.Since(start).Round(100*time.Millisecond))
}

// releaseValuesRun is TestClusterReleaseValues's state: the pods it started
// and what each step took.
type releaseValuesRun struct {
	t       *testing.T
	s       *Scenario
	pods    []Pod // every pod started so far, with its address at start
	timings []string
}

// install runs helm install (or upgrade) with the files layered in order,
// waits for the DaemonSet's pods to be new (after an upgrade), Running and
// Ready on every node, and every node Ready.
func (r *releaseValuesRun) install(ctx context.Context, upgrade bool, files ...string) error {
	c := r.s.C
	old, err := c.Pods(ctx, "kube-system", "app.kubernetes.io/name=vpcip")
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := c.InstallChartFiles(r.s.Helm, upgrade, files)
	if err != nil {
		return fmt.Errorf("helm with %v: %w: %s", baseNames(files), err, out)
	}
	r.t.Logf("helm %s with %v:\n%s", map[bool]string{false: "install", true: "upgrade"}[upgrade], baseNames(files), indent(strings.TrimSpace(out)))
	if _, err := c.WaitPods(ctx, "kube-system", "app.kubernetes.io/name=vpcip", 4*time.Minute, "vpcip DaemonSet rolled and ready", func(p []Pod) bool {
		return AllRunning(len(c.Nodes))(p) && disjoint(p, old)
	}); err != nil {
		return fmt.Errorf("%w; kubelet log of %s:\n%s", err, c.Nodes[0].Name, tail(c.Nodes[0].KubeletLog(), 15))
	}
	if err := r.s.waitNodesReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	r.t.Logf("   DaemonSet ready on %d nodes %s after helm", len(c.Nodes), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// addNode adds a node in subnetID and waits for its daemon and for it to be
// Ready.
func (r *releaseValuesRun) addNode(ctx context.Context, subnetID string) (*Node, error) {
	start := time.Now()
	n, err := r.s.C.AddNode(ctx, subnetID)
	if err != nil {
		return nil, err
	}
	if err := r.s.waitDaemons(ctx, 3*time.Minute); err != nil {
		return nil, err
	}
	if err := r.s.waitNodesReady(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	r.t.Logf("   %s added in %s, its daemon ready, after %s", n.Name, n.Zone, time.Since(start).Round(100*time.Millisecond))
	return n, nil
}

// state reads a node's daemon state (vpcipctl status -o json on the node).
func (r *releaseValuesRun) state(ctx context.Context, n *Node) (introspect.State, error) {
	var st introspect.State
	out, err := n.InNetns(ctx, r.s.Vpcipctl, "status", "-o", "json")
	if err != nil {
		return st, err
	}
	if err := jsonUnmarshal(out, &st); err != nil {
		return st, fmt.Errorf("vpcipctl status on %s: %w: %.200s", n.Name, err, out)
	}
	return st, nil
}

// checkDaemons checks every node's daemon: ready, in the address mode, with
// the files' merged env block as its effective configuration, and (when the
// block sets AWS_VPC_K8S_CNI_LOG_FILE under the host's
// /var/log/aws-routed-eni) writing its log there on the node.
func (r *releaseValuesRun) checkDaemons(ctx context.Context, mode string, files ...string) error {
	want, err := WantConfigFromValues(files...)
	if err != nil {
		return err
	}
	if len(want) < 10 {
		return fmt.Errorf("the env blocks of %v give %d daemon settings", baseNames(files), len(want))
	}
	var errs []error
	for _, n := range r.s.C.Nodes {
		st, err := r.state(ctx, n)
		if err != nil {
			return err
		}
		if !st.Ready || st.Node.Mode != mode {
			errs = append(errs, fmt.Errorf("%s: ready=%v (%s), mode %q, want ready in mode %q", n.Name, st.Ready, st.Reason, st.Node.Mode, mode))
		}
		var shown []string
		for _, k := range slices.Sorted(maps.Keys(want)) {
			shown = append(shown, k+"="+st.Config[k])
			if got, ok := st.Config[k]; !ok || got != want[k] {
				errs = append(errs, fmt.Errorf("%s: effective %s=%q (set: %v), want %q from %v", n.Name, k, got, ok, want[k], baseNames(files)))
			}
		}
		r.t.Logf("   %s (%s) mode %s, effective config: %s", n.Name, n.Zone, st.Node.Mode, strings.Join(shown, " "))
		if rel, ok := strings.CutPrefix(want["AWS_VPC_K8S_CNI_LOG_FILE"], "/host/var/log/aws-routed-eni/"); ok {
			if fi, err := os.Stat(filepath.Join(n.Dir, "log-aws-routed-eni", rel)); err != nil || fi.Size() == 0 {
				errs = append(errs, fmt.Errorf("%s: AWS_VPC_K8S_CNI_LOG_FILE=%s: no log on the node's /var/log/aws-routed-eni (%v)", n.Name, want["AWS_VPC_K8S_CNI_LOG_FILE"], err))
			}
		}
	}
	return errors.Join(errs...)
}

// podPerNode starts one pause pod on each node (label step=name), waits for
// all to run with an address, and checks every pod started so far still
// runs with its address and EC2 assigns it to an ENI of its node. It
// returns the new pods.
func (r *releaseValuesRun) podPerNode(ctx context.Context, name string) ([]Pod, error) {
	c := r.s.C
	image, err := r.s.pauseImage()
	if err != nil {
		return nil, err
	}
	var m strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Pod
metadata: {name: %[1]s-%[2]s, namespace: default, labels: {app: release-values, step: %[1]s}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  containers:
    - {name: pause, image: %[3]q, imagePullPolicy: Never}
`, name, n.Name, image)
	}
	if err := c.Apply(ctx, m.String()); err != nil {
		return nil, err
	}
	pods, err := c.WaitPods(ctx, "default", "step="+name, 2*time.Minute, name+" pods Running", AllRunning(len(c.Nodes)))
	if err != nil {
		return nil, err
	}
	all, err := c.Pods(ctx, "default", "app=release-values")
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, before := range r.pods {
		i := slices.IndexFunc(all, func(p Pod) bool { return p.UID == before.UID })
		if i < 0 || all[i].Phase != "Running" || all[i].IP != before.IP {
			errs = append(errs, fmt.Errorf("pod %s (%s) did not keep running with its address through the upgrade", before.Name, before.IP))
		}
	}
	r.pods = append(r.pods, pods...)
	owners := ownersFromEC2(c.Cloud)
	var shown []string
	for _, p := range pods {
		ip, _ := netip.ParseAddr(p.IP)
		a, ok := owners[ip]
		n := c.Node(p.Node)
		if !ok || n == nil || a.eni.InstanceID != n.InstanceID {
			errs = append(errs, fmt.Errorf("pod %s on %s has %s, which EC2 assigns to %q", p.Name, p.Node, p.IP, a.eni.InstanceID))
		}
		shown = append(shown, fmt.Sprintf("%s %s (%s of %s)", p.Node, p.IP, a.prefix, a.eni.ID))
	}
	sort.Strings(shown)
	r.t.Logf("   %s pods: %s", name, strings.Join(shown, ", "))
	return pods, errors.Join(errs...)
}

// addrOwner is where EC2 holds an address: the ENI and the secondary IP
// (a /32) or /28 prefix it comes from.
type addrOwner struct {
	addr   netip.Addr
	prefix netip.Prefix
	eni    vpcsim.ENIInfo
}

// ownersFromEC2 maps every secondary IP and every address of an assigned
// /28 prefix to its ENI, as vpcsim's EC2 model holds them now.
func ownersFromEC2(cloud *vpcsim.Cloud) map[netip.Addr]addrOwner {
	out := map[netip.Addr]addrOwner{}
	for _, e := range cloud.NetworkInterfaces() {
		for _, a := range e.SecondaryIPs {
			out[a] = addrOwner{a, netip.PrefixFrom(a, 32), e}
		}
		for _, p := range e.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				out[a] = addrOwner{a, p, e}
			}
		}
	}
	return out
}

// owner is where EC2 holds pod p's address now.
func (r *releaseValuesRun) owner(p Pod) addrOwner {
	a, _ := netip.ParseAddr(p.IP)
	o, ok := ownersFromEC2(r.s.C.Cloud)[a]
	if !ok {
		o.addr = a
	}
	return o
}

func baseNames(files []string) []string {
	var out []string
	for _, f := range files {
		out = append(out, filepath.Base(f))
	}
	return out
}
