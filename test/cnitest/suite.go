package cnitest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
)

// Setup makes the world one suite test runs in.
type Setup struct {
	// NewEnv returns a fresh runtime on a node whose daemon is running and
	// ready. Each call may share the node and daemon with earlier ones: the
	// suite only asserts about its own pods.
	NewEnv func(t *testing.T) *Env
}

// RunSuite runs the plugin contract (issue #6, field failures B01, B13, B14,
// B16, B25, B28, B29, B30, B32, B33, B34, B36, B37) as subtests. After each one the
// node must hold no veth, route or rule of a removed pod.
func RunSuite(t *testing.T, s Setup) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *Env)
	}{
		{"AddCheckDel", testAddCheckDel},
		{"Concurrent30", testConcurrentAdds},
		{"PodToPod", testPodToPod},
		{"DelTwice", testDelTwice},
		{"DelNetnsGone", testDelNetnsGone},
		{"DelEmptyNetns", testDelEmptyNetns},
		{"DelUnknownContainer", testDelUnknown},
		{"DelDaemonStoppedThenGC", testDelDaemonStopped},
		{"DelDaemonStoppedNoPrevResult", testDelDaemonStoppedNoPrevResult},
		{"DelCorruptCachedResult", testDelCorruptCache},
		{"GCValidAttachments", testGC},
		{"Versions", testVersions},
		{"MalformedConfig", testMalformed},
		{"MTU", testMTU},
		{"CheckFaults", testCheckFaults},
		{"AddFailureReleases", testAddFailureReleases},
		{"AddTwiceSameKey", testAddTwice},
		{"Status", testStatus},
		{"ChainedPlugins", testChain},
		{"PluginLog", testLog},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			RequireRoot(t)
			e := s.NewEnv(t)
			tt.fn(t, e)
			AssertNodeClean(t, e)
		})
	}
}

// client talks to e's daemon directly, as an operator with curl would.
func (e *Env) client() *api.Client { return api.NewClient(e.Daemon.Socket(), 10*time.Second) }

func (e *Env) key(p *Pod) api.Key {
	return api.Key{Network: Network, ContainerID: p.ContainerID, IfName: p.IfName}
}

// Held returns the daemon's assignment for p, if it holds one.
func (e *Env) Held(t testing.TB, p *Pod) (api.Assignment, bool) {
	t.Helper()
	a, err := e.client().Check(context.Background(), api.CheckRequest{Key: e.key(p)})
	var ae *api.Error
	switch {
	case err == nil:
		return a, true
	case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		return api.Assignment{}, false
	default:
		t.Fatalf("daemon check %s: %v", e.key(p), err)
		return api.Assignment{}, false
	}
}

// mustHeld returns p's assignment and checks it matches the result.
func mustHeld(t testing.TB, e *Env, p *Pod) api.Assignment {
	t.Helper()
	a, ok := e.Held(t, p)
	if !ok {
		t.Fatalf("daemon holds no address for %s after ADD", p.Name)
	}
	if a.Address != p.Address {
		t.Fatalf("daemon holds %v for %s, the result says %v", a.Address, p.Name, p.Address)
	}
	return a
}

func mustDel(t testing.TB, e *Env, p *Pod) {
	t.Helper()
	if err := e.Del(t, p); err != nil {
		t.Fatalf("DEL %s: %v", p.Name, err)
	}
}

func testAddCheckDel(t *testing.T, e *Env) {
	p := e.NewPod(t, "web")
	e.MustAdd(t, p)
	a := mustHeld(t, e, p)
	AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
	assertResult(t, e, p)
	if err := e.Check(t, p); err != nil {
		t.Errorf("CHECK on a healthy pod: %v", err)
	}
	mustDel(t, e, p)
	if _, ok := e.Held(t, p); ok {
		t.Errorf("daemon still holds %s after DEL", p.Name)
	}
	AssertHostSideGone(t, e, p, p.Address)
	if l, ok := linkNamed(t, p.NetnsName, p.IfName); ok {
		t.Errorf("pod interface still present after DEL: %+v", l)
	}
}

// mtuOf is the MTU the plugin must use: the config's, else the daemon's.
func mtuOf(e *Env, a api.Assignment) int {
	if e.MTU != 0 {
		return e.MTU
	}
	if a.MTU != 0 {
		return a.MTU
	}
	return 9001
}

// assertResult checks the printed result against the kernel: host veth and
// pod interface with their MACs and sandbox, the /32 with gateway, default route.
func assertResult(t testing.TB, e *Env, p *Pod) {
	t.Helper()
	r := p.Result
	if r == nil || len(r.Interfaces) < 2 || len(r.IPs) != 1 {
		t.Fatalf("result %+v: want 2 interfaces and 1 IP", r)
	}
	host, _ := linkNamed(t, e.Node.Name, e.HostVeth(p))
	pod, _ := linkNamed(t, p.NetnsName, p.IfName)
	if r.Interfaces[0].Name != host.IfName || r.Interfaces[0].Mac != host.Address || r.Interfaces[0].Sandbox != "" {
		t.Errorf("result host interface %+v, kernel has %s %s", r.Interfaces[0], host.IfName, host.Address)
	}
	if r.Interfaces[1].Name != p.IfName || r.Interfaces[1].Mac != pod.Address || r.Interfaces[1].Sandbox != p.NetnsPath {
		t.Errorf("result pod interface %+v, kernel has %s %s in %s", r.Interfaces[1], p.IfName, pod.Address, p.NetnsPath)
	}
	ip := r.IPs[0]
	if ip.Interface == nil || *ip.Interface != 1 || ip.Address.String() != p.Address.String()+"/32" || ip.Gateway.String() != gateway {
		t.Errorf("result IP %+v, want %s/32 gw %s on interface 1", ip, p.Address, gateway)
	}
	if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" || r.Routes[0].GW.String() != gateway {
		t.Errorf("result routes %v, want default via %s", r.Routes, gateway)
	}
}

// testConcurrentAdds is B28: 30 ADDs at once all succeed with distinct
// addresses, each wired; then 30 DELs at once.
func testConcurrentAdds(t *testing.T, e *Env) {
	const n = 30
	pods := make([]*Pod, n)
	for i := range pods {
		pods[i] = e.NewPod(t, fmt.Sprintf("burst%d", i))
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() { errs[i] = e.Add(t, p) })
	}
	wg.Wait()
	seen := map[netip.Addr]string{}
	var onPrimary, onSecondary int
	for i, p := range pods {
		if errs[i] != nil {
			t.Errorf("ADD %s: %v", p.Name, errs[i])
			continue
		}
		if other, dup := seen[p.Address]; dup {
			t.Errorf("%s and %s both got %v", other, p.Name, p.Address)
		}
		seen[p.Address] = p.Name
		a := mustHeld(t, e, p)
		AssertPodWired(t, e, p, a.RouteTable, mtuOf(e, a))
		if a.RouteTable == 0 {
			onPrimary++
		} else {
			onSecondary++
		}
	}
	// 30 addresses exceed one ENI of the suite's nodes: both rule sets
	// (main table only, and 1536 into an ENI table) must have been wired.
	if onPrimary == 0 || onSecondary == 0 {
		t.Errorf("%d pods on the primary ENI, %d on secondary ENIs; want both", onPrimary, onSecondary)
	}
	for i, p := range pods {
		wg.Go(func() { errs[i] = e.Del(t, p) })
	}
	wg.Wait()
	for i, p := range pods {
		if errs[i] != nil {
			t.Errorf("DEL %s: %v", p.Name, errs[i])
		}
		if _, ok := e.Held(t, p); ok {
			t.Errorf("daemon still holds %s after DEL", p.Name)
		}
	}
}

func ping(netns string, to netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", netns, "ping", "-c", "1", "-W", "2", to.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v\n%s", to, netns, err, out)
	}
	return nil
}

// testPodToPod: two pods on the node reach each other through the host.
func testPodToPod(t *testing.T, e *Env) {
	a, b := e.NewPod(t, "ping-a"), e.NewPod(t, "ping-b")
	e.MustAdd(t, a)
	e.MustAdd(t, b)
	if err := ping(a.NetnsName, b.Address); err != nil {
		t.Error(err)
	}
	if err := ping(b.NetnsName, a.Address); err != nil {
		t.Error(err)
	}
	mustDel(t, e, a)
	mustDel(t, e, b)
}

func testDelTwice(t *testing.T, e *Env) {
	p := e.NewPod(t, "twice")
	e.MustAdd(t, p)
	mustDel(t, e, p)
	mustDel(t, e, p)
	AssertHostSideGone(t, e, p, p.Address)
}
