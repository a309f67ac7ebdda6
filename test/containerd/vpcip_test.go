package containerd_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/containerd/crinode"
	"github.com/vpcip/vpcip/test/e2e/cluster"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	clusterN  atomic.Int32
)

// TestMain removes the binaries built for the vpcip scenarios.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds vpcipd, vpcip-cni and vpcipctl once per test run.
func binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", netnsPrefix+"bin-")
		if buildErr != nil {
			return
		}
		buildErr = cluster.BuildBinaries(context.Background(), binDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// vpcipNode is one vpcsim instance: its vpcipd (cluster.Node) and the
// containerd running in its netns on the CNI dirs install-cni writes to.
type vpcipNode struct {
	*cluster.Node
	cri   *crinode.Node
	spawn keptThread // every vpcipd of the node is started from it
}

// StartDaemon (re)starts the node's vpcipd from the kept thread.
func (n *vpcipNode) StartDaemon(ctx context.Context) error {
	return n.spawn.do(func() error { return n.Node.StartDaemon(ctx) })
}

// keptThread runs functions on one OS thread that no other goroutine uses
// and that lives until the test ends. cluster.Node.StartDaemon sets
// Pdeathsig, which the kernel sends when the thread that forked the daemon
// exits, and Go ends a thread whenever a goroutine locked to it returns
// without unlocking (the fabric does that after creating an instance
// netns): a daemon forked from an ordinary thread can be killed at random.
type keptThread chan func()

// newKeptThread starts the thread; it exits (and the daemons started from it
// get SIGKILL) when the test's cleanups reach it, after those registered
// later, such as the cluster's graceful Close.
func newKeptThread(t testing.TB) keptThread {
	k := make(keptThread)
	go func() {
		runtime.LockOSThread()
		for fn := range k {
			fn()
		}
	}()
	t.Cleanup(func() { close(k) })
	return k
}

// do runs fn on the kept thread and returns its error.
func (k keptThread) do(fn func() error) error {
	errc := make(chan error, 1)
	k <- func() { errc <- fn() }
	return <-errc
}

// startVPCIPCluster starts a vpcsim cluster of nodes instances of the EC2
// instance type, each with vpcipd ready (daemonEnv added to its
// environment), and a containerd per instance in its netns. The conflist
// install-cni wrote at start is removed again before containerd starts, so
// the scenarios see the node before and after `vpcipd install-cni`. The
// conflist asks for the newest CNI version the runtime accepts.
func startVPCIPCluster(t testing.TB, tools crinode.Tools, nodes int, instanceType string, daemonEnv ...string) []*vpcipNode {
	t.Helper()
	major, err := crinode.ContainerdMajor(context.Background(), tools.Containerd)
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("", netnsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spawn := newKeptThread(t)
	var cl *cluster.Cluster
	err = spawn.do(func() (err error) {
		cl, err = cluster.Start(ctx, cluster.Options{
			// Fabric names are [a-z0-9], so "vcr" without the dash.
			Prefix:       fmt.Sprintf("vcr%d%d", os.Getpid()%100, clusterN.Add(1)),
			Nodes:        nodes,
			InstanceType: instanceType,
			BinDir:       binaries(t),
			PluginDir:    tools.PluginDir,
			WorkDir:      work,
			DaemonEnv:    append([]string{"VPCIP_CNI_VERSION=" + crinode.MaxCNIVersion(major)}, daemonEnv...),
			Logf:         t.Logf,
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range cl.Nodes {
				t.Logf("vpcipd log of %s (last lines):\n%s", n.Name, tailFile(n.LogFile(), 30))
				t.Logf("plugin log of %s (last lines):\n%s", n.Name, tailFile(filepath.Join(n.Dir, "plugin.log"), 30))
			}
		}
		if err := cl.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	var out []*vpcipNode
	for _, n := range cl.Nodes {
		confDir, binDir := filepath.Join(n.Dir, "net.d"), filepath.Join(n.Dir, "bin")
		removeConflists(t, confDir)
		dir, err := os.MkdirTemp("", netnsPrefix)
		if err != nil {
			t.Fatal(err)
		}
		cn, err := crinode.Start(context.Background(), crinode.Config{
			Dir: dir, Netns: n.Netns, Tools: tools, CNIBinDir: binDir, CNIConfDir: confDir,
		})
		if err != nil {
			os.RemoveAll(dir)
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("containerd log of %s (last lines):\n%s", n.Name, cn.LogTail(30))
			}
			if err := cn.Close(); err != nil {
				t.Errorf("close containerd on %s: %v", n.Name, err)
			}
			os.RemoveAll(dir)
		})
		out = append(out, &vpcipNode{Node: n, cri: cn, spawn: spawn})
	}
	return out
}

func removeConflists(t testing.TB, dir string) {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}
}

// tailFile returns the last lines of a file.
func tailFile(path string, lines int) string {
	data, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// vpcipNetwork is the conflist `vpcipd install-cni` writes, judged by the
// daemon's record (introspection, read with vpcipctl inside the node netns)
// and by the node's routes and rules.
type vpcipNetwork struct{ node *vpcipNode }

func (v vpcipNetwork) Install(t testing.TB, n *crinode.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.node.InstallCNI(ctx); err != nil {
		t.Fatal(err)
	}
	// The conflist must ask for the version this runtime accepts (1.0.0 for
	// containerd 1.6, 1.1.0 for containerd 2), or every ADD fails.
	data, err := os.ReadFile(filepath.Join(n.CNIConfDir, "10-vpcip.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	if want := crinode.MaxCNIVersion(n.Major); conf.CNIVersion != want {
		t.Fatalf("install-cni wrote cniVersion %q, want %q for containerd %d", conf.CNIVersion, want, n.Major)
	}
}

// state is the daemon's view: `vpcipctl status -o json` in the node netns.
func (v vpcipNetwork) state(t testing.TB) introspect.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := v.node.Ctl(ctx, "status", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st introspect.State
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("vpcipctl status -o json: %v: %s", err, out)
	}
	return st
}

func (v vpcipNetwork) CheckAttached(t *testing.T, n *crinode.Node, sb crinode.Sandbox) {
	t.Helper()
	st := v.state(t)
	i := slices.IndexFunc(st.Assignments, func(a introspect.Assignment) bool { return a.Address == sb.IP })
	if i < 0 {
		t.Errorf("%s: CRI reports %s, the daemon on %s has no assignment for it", sb.Pod.Name, sb.IP, v.node.Name)
		return
	}
	a := st.Assignments[i]
	if a.Key.ContainerID != sb.ID || a.Key.IfName != "eth0" || a.Pod.Name != sb.Pod.Name || a.Pod.Namespace != sb.Pod.Namespace {
		t.Errorf("%s: daemon assigned %s to key %+v pod %+v, want sandbox %s eth0 pod %s/%s",
			sb.Pod.Name, sb.IP, a.Key, a.Pod, sb.ID, sb.Pod.Namespace, sb.Pod.Name)
	}
	if !slices.ContainsFunc(st.ENIs, func(e introspect.ENI) bool { return e.ID == a.ENIID && slices.Contains(e.Addresses, sb.IP) }) {
		t.Errorf("%s: %s is not among the addresses of ENI %s of %s", sb.Pod.Name, sb.IP, a.ENIID, v.node.Name)
	}
	if got := linkAddrs(t, podNetnsPath(sb), "eth0"); !slices.Contains(got, sb.IP) {
		t.Errorf("%s: eth0 in the sandbox has %v, CRI reports %s", sb.Pod.Name, got, sb.IP)
	}
	if routes := hostRoutesTo(t, v.node.Netns, sb.IP); len(routes) == 0 {
		t.Errorf("%s: the node has no route to %s", sb.Pod.Name, sb.IP)
	}
	// docs/design.md §4: "to <pod>/32 lookup main" for every pod; "from <pod>/32
	// lookup <d+1>" for an address on a secondary ENI of device number d.
	rules := hostRulesFor(t, v.node.Netns, sb.IP)
	if !slices.ContainsFunc(rules, func(r netlink.Rule) bool { return r.Dst != nil && r.Table == unix.RT_TABLE_MAIN }) {
		t.Errorf("%s: no rule \"to %s lookup main\" on the node: %v", sb.Pod.Name, sb.IP, rules)
	}
	if d, ok := deviceOf(st, sb.IP); ok && d > 0 {
		if !slices.ContainsFunc(rules, func(r netlink.Rule) bool { return r.Src != nil && r.Table == d+1 }) {
			t.Errorf("%s: %s is on device %d, but the node has no rule \"from %s lookup %d\": %v", sb.Pod.Name, sb.IP, d, sb.IP, d+1, rules)
		}
	}
}

// deviceOf returns the device number of the node's ENI holding a.
func deviceOf(st introspect.State, a netip.Addr) (int, bool) {
	for _, e := range st.ENIs {
		if slices.Contains(e.Addresses, a) {
			return e.DeviceNumber, true
		}
	}
	return 0, false
}

// sandboxOn returns a sandbox whose address is on the primary ENI
// (secondary false) or on a secondary ENI (secondary true).
func (v vpcipNetwork) sandboxOn(t testing.TB, sbs []crinode.Sandbox, secondary bool) crinode.Sandbox {
	t.Helper()
	st := v.state(t)
	for _, sb := range sbs {
		if d, ok := deviceOf(st, sb.IP); ok && (d > 0) == secondary {
			return sb
		}
	}
	t.Fatalf("%s: no sandbox on a secondary ENI = %v among %d", v.node.Name, secondary, len(sbs))
	return crinode.Sandbox{}
}

func (v vpcipNetwork) CheckReleased(t *testing.T, n *crinode.Node, gone []crinode.Sandbox) {
	t.Helper()
	st := v.state(t)
	for _, sb := range gone {
		if slices.ContainsFunc(st.Assignments, func(a introspect.Assignment) bool {
			return a.Address == sb.IP || a.Key.ContainerID == sb.ID
		}) {
			t.Errorf("%s: the daemon still holds %s", sb.Pod.Name, sb.IP)
		}
		inPool := slices.ContainsFunc(st.ENIs, func(e introspect.ENI) bool { return slices.Contains(e.Addresses, sb.IP) })
		if !inPool {
			t.Errorf("%s: %s is no longer among the node's ENI addresses (released to EC2 already, or lost)", sb.Pod.Name, sb.IP)
		}
		if routes := hostRoutesTo(t, v.node.Netns, sb.IP); len(routes) > 0 {
			t.Errorf("%s: routes to %s left on the node: %v", sb.Pod.Name, sb.IP, routes)
		}
		if rules := hostRulesFor(t, v.node.Netns, sb.IP); len(rules) > 0 {
			t.Errorf("%s: rules for %s left on the node: %v", sb.Pod.Name, sb.IP, rules)
		}
		if name := hostVethName(sb.Pod); linkExists(t, v.node.Netns, name) {
			t.Errorf("%s: host veth %s left on the node", sb.Pod.Name, name)
		}
	}
}

// hostVethName is the host end of a pod's veth (docs/design.md §4): "eni" and the
// first 11 hex digits of sha1("<namespace>.<pod>").
func hostVethName(p crinode.Pod) string {
	sum := sha1.Sum([]byte(p.Namespace + "." + p.Name))
	return "eni" + hex.EncodeToString(sum[:])[:11]
}

// nodeHandle opens a netlink handle in the named netns.
func nodeHandle(t testing.TB, netnsName string) *netlinksafe.Handle {
	t.Helper()
	h, err := netns.GetFromName(netnsName)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlinksafe.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	return &nl
}

// hostRoutesTo lists the routes, in any table, whose destination is a/32.
func hostRoutesTo(t testing.TB, netnsName string, a netip.Addr) []string {
	t.Helper()
	nl := nodeHandle(t, netnsName)
	defer nl.Close()
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		if r.Dst == nil || !r.Dst.IP.Equal(a.AsSlice()) {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 32 {
			out = append(out, r.String())
		}
	}
	return out
}

// hostRulesFor lists the policy rules from or to a/32.
func hostRulesFor(t testing.TB, netnsName string, a netip.Addr) []netlink.Rule {
	t.Helper()
	nl := nodeHandle(t, netnsName)
	defer nl.Close()
	rules, err := nl.RuleList(netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []netlink.Rule
	for _, r := range rules {
		if (r.Src != nil && r.Src.IP.Equal(a.AsSlice())) || (r.Dst != nil && r.Dst.IP.Equal(a.AsSlice())) {
			out = append(out, r)
		}
	}
	return out
}

func linkExists(t testing.TB, netnsName, name string) bool {
	t.Helper()
	nl := nodeHandle(t, netnsName)
	defer nl.Close()
	_, err := nl.LinkByName(name)
	return err == nil
}

// vpcipBenchTargets returns the vpcip conflist on a one-node vpcsim cluster
// as a benchmark target. The m5.4xlarge node keeps at least benchSandboxes
// addresses warm and reuses released ones at once (IP_COOLDOWN_PERIOD=0), so
// RunPodSandbox measures the plugin path, not EC2 calls.
func vpcipBenchTargets(b *testing.B, tools crinode.Tools) []benchTarget {
	nodes := startVPCIPCluster(b, tools, 1, "m5.4xlarge",
		fmt.Sprintf("MINIMUM_IP_TARGET=%d", benchSandboxes), "IP_COOLDOWN_PERIOD=0")
	return []benchTarget{{name: "vpcip", node: nodes[0].cri, net: vpcipNetwork{node: nodes[0]}}}
}

// waitWarm waits until the daemon has at least n addresses ready to assign.
func (v vpcipNetwork) waitWarm(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := v.state(t)
		if st.Pool.Warm >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d warm addresses after %v, want %d", v.node.Name, st.Pool.Warm, timeout, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
