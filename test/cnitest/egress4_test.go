package cnitest

import (
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// IPv4 egress of IPv6 pods (issue #30, docs/design.md §4): each IPv6 pod
// also gets an IPv4 address of 169.254.172.0/22 from host-local, and its
// IPv4 traffic leaves the node SNATed to the node's address.

const (
	gateway4     = "169.254.1.1"
	nodeUplinkIP = "198.51.100.1" // TEST-NET-2, only inside the test's netns
	outsideIP    = "198.51.100.2"
)

// newOutside creates a netns "outside" the node, joined to it by a veth
// (node 198.51.100.1/24, outside 198.51.100.2/24). The outside has no route
// to 169.254.172.0/22: it can answer an IPv6 pod's IPv4 only once the node
// SNATed it to its own address.
func newOutside(t testing.TB, e *Env) string {
	t.Helper()
	out := NewNetns(t, "vct-out-")
	ipCmd(t, "-n", e.Node.Name, "link", "add", "vct-up", "type", "veth", "peer", "name", "eth0", "netns", out)
	ipCmd(t, "-n", e.Node.Name, "addr", "add", nodeUplinkIP+"/24", "dev", "vct-up")
	ipCmd(t, "-n", e.Node.Name, "link", "set", "vct-up", "up")
	ipCmd(t, "-n", out, "addr", "add", outsideIP+"/24", "dev", "eth0")
	ipCmd(t, "-n", out, "link", "set", "eth0", "up")
	ipCmd(t, "-n", out, "link", "set", "lo", "up")
	return out
}

// udpEcho sends one datagram from netns from to to:7777 (a socket bound in
// netns at), retrying for 3 s, and returns the source address the receiver
// saw; the receiver echoes it and the reply must arrive back.
func udpEcho(t testing.TB, from, at string, to netip.Addr) (netip.Addr, error) {
	t.Helper()
	inNS := func(name string, fn func() error) error {
		h, err := ns.GetNS(filepath.Join(NetnsDir, name))
		if err != nil {
			return err
		}
		defer h.Close()
		return h.Do(func(ns.NetNS) error { return fn() })
	}
	var srv *net.UDPConn
	if err := inNS(at, func() (err error) {
		srv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(to.AsSlice()), Port: 7777})
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", at, err)
	}
	defer srv.Close()
	seen := make(chan netip.Addr, 8)
	go func() {
		buf := make([]byte, 64)
		for {
			n, src, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			seen <- src.Addr().Unmap()
			_, _ = srv.WriteToUDPAddrPort(buf[:n], src)
		}
	}()
	var cl *net.UDPConn
	if err := inNS(from, func() (err error) {
		cl, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IP(to.AsSlice()), Port: 7777})
		return err
	}); err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	defer cl.Close()
	var lastErr error
	for i := 0; i < 6; i++ {
		if _, err := cl.Write([]byte("egress")); err != nil {
			lastErr = err
			time.Sleep(500 * time.Millisecond)
			continue
		}
		_ = cl.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 64)
		if _, err := cl.Read(buf); err != nil {
			lastErr = err
			continue
		}
		return <-seen, nil
	}
	select {
	case src := <-seen:
		return src, errors.New("the receiver saw " + src.String() + " but its reply never came back: " + lastErr.Error())
	default:
		return netip.Addr{}, errors.New("nothing arrived: " + lastErr.Error())
	}
}

// egressOf returns p's IPv4 egress address, the one host-local's store in
// e records for p's container and interface, after checking that p's
// result lists the IPv6 address alone with one route: a runtime reports
// every address of the result as a pod IP, and the egress address is
// nobody's to reach the pod by (its wiring: assertEgressWired).
func egressOf(t testing.TB, e *Env, p *Pod) netip.Addr {
	t.Helper()
	r := p.Result
	if len(r.IPs) != 1 || len(r.Routes) != 1 || r.IPs[0].Address.IP.To4() != nil {
		t.Errorf("%s: result IPs %v routes %v, want the IPv6 address and its route alone", p.Name, r.IPs, r.Routes)
	}
	dir := filepath.Join(e.EgressDir, Network)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%s: host-local's store: %v", p.Name, err)
	}
	var found []netip.Addr
	for _, f := range entries {
		a, err := netip.ParseAddr(f.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, f.Name())); err == nil && string(b) == p.ContainerID+"\r\n"+p.IfName {
			found = append(found, a)
		}
	}
	if len(found) != 1 || !netip.MustParsePrefix(egressRange).Contains(found[0]) {
		t.Fatalf("%s: host-local's store records %v for it, want one address in %s", p.Name, found, egressRange)
	}
	return found[0]
}

// egressFile is host-local's record of addr in e's store.
func egressFile(e *Env, addr netip.Addr) string {
	return filepath.Join(e.EgressDir, Network, addr.String())
}

func assertEgressHeld(t testing.TB, e *Env, p *Pod, addr netip.Addr, held bool) {
	t.Helper()
	b, err := os.ReadFile(egressFile(e, addr))
	switch {
	case held && err != nil:
		t.Errorf("host-local has no record of %s's egress address %v: %v", p.Name, addr, err)
	case held && !strings.Contains(string(b), p.ContainerID):
		t.Errorf("host-local's record of %v is %q, want %s's container", addr, b, p.Name)
	case !held && err == nil:
		t.Errorf("host-local still holds %v (%q)", addr, b)
	}
}

// assertEgressWired checks the pod's IPv4 egress wiring as iproute2 shows
// it: exactly <egress>/32 on the pod interface, default via 169.254.1.1,
// and the node's /32 route to the host veth.
func assertEgressWired(t testing.TB, e *Env, p *Pod, egress netip.Addr) {
	t.Helper()
	var addrs []ipAddr
	ipJSON(t, p.NetnsName, &addrs, "-4", "addr", "show", "dev", p.IfName)
	var got []string
	for _, a := range addrs {
		for _, ai := range a.AddrInfo {
			if ai.Local != "" {
				got = append(got, ai.Local+"/"+itoa(ai.PrefixLen))
			}
		}
	}
	if want := egress.String() + "/32"; len(got) != 1 || got[0] != want {
		t.Errorf("pod IPv4 addresses %v, want [%s]", got, want)
	}
	var routes []ipRoute
	ipJSON(t, p.NetnsName, &routes, "-4", "route", "show", "default")
	if len(routes) != 1 || routes[0].Gateway != gateway4 || routes[0].Dev != p.IfName {
		t.Errorf("pod IPv4 default routes %+v, want one via %s dev %s", routes, gateway4, p.IfName)
	}
	var hr []ipRoute
	ipJSON(t, e.Node.Name, &hr, "-4", "route", "show", "table", "main", "exact", egress.String()+"/32")
	if len(hr) != 1 || hr[0].Dev != e.HostVeth(p) {
		t.Errorf("host routes to %v/32: %+v, want one dev %s", egress, hr, e.HostVeth(p))
	}
}

// TestIPv6PodIPv4Egress: an IPv6 pod gets an IPv4 egress address from
// host-local and reaches an IPv4 address outside the node, which sees the
// node's address (SNAT), while another pod reached at its egress address
// sees the pod's own (no SNAT between pods); CHECK names a missing IPv4
// default route; DEL (twice) releases the address in host-local's store and
// removes its route.
func TestIPv6PodIPv4Egress(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool6(4))
	out := newOutside(t, e)
	a, b := e.NewPod(t, "egress-a"), e.NewPod(t, "egress-b")
	e.MustAdd(t, a)
	e.MustAdd(t, b)
	ea, eb := egressOf(t, e, a), egressOf(t, e, b)
	if ea == eb {
		t.Fatalf("both pods got egress address %v", ea)
	}
	for _, p := range []*Pod{a, b} {
		assertPodWired6(t, e, p, 9001)
		assertEgressWired(t, e, p, egressOf(t, e, p))
		assertEgressHeld(t, e, p, egressOf(t, e, p), true)
		if err := e.Check(t, p); err != nil {
			t.Errorf("CHECK %s: %v", p.Name, err)
		}
	}
	src, err := udpEcho(t, a.NetnsName, out, netip.MustParseAddr(outsideIP))
	if err != nil {
		t.Errorf("IPv4 from IPv6 pod %s to %s outside the node: %v", a.Name, outsideIP, err)
	} else if src.String() != nodeUplinkIP {
		t.Errorf("the outside saw source %v, want the node's %s (SNAT)", src, nodeUplinkIP)
	}
	src, err = udpEcho(t, b.NetnsName, a.NetnsName, ea)
	if err != nil {
		t.Errorf("IPv4 from pod %s to pod %s's egress address: %v", b.Name, a.Name, err)
	} else if src != eb {
		t.Errorf("pod %s saw source %v, want pod %s's egress address %v (no SNAT between pods)", a.Name, src, b.Name, eb)
	}
	ipCmd(t, "-n", a.NetnsName, "-4", "route", "del", "default")
	if err := e.Check(t, a); err == nil || !strings.Contains(err.Error(), "default route via "+gateway4+" dev eth0 missing") {
		t.Errorf("CHECK without the IPv4 default route: %v", err)
	}
	mustDel(t, e, a)
	assertEgressHeld(t, e, a, ea, false)
	var hr []ipRoute
	ipJSON(t, e.Node.Name, &hr, "-4", "route", "show", "table", "main", "exact", ea.String()+"/32")
	if len(hr) != 0 {
		t.Errorf("host route to %v/32 left after DEL: %+v", ea, hr)
	}
	mustDel(t, e, a)
	assertEgressHeld(t, e, b, eb, true)
	if err := e.Check(t, b); err != nil {
		t.Errorf("CHECK of the other pod after DEL: %v", err)
	}
	if _, err := udpEcho(t, b.NetnsName, out, netip.MustParseAddr(outsideIP)); err != nil {
		t.Errorf("the other pod's IPv4 egress after DEL: %v", err)
	}
	mustDel(t, e, b)
	assertEgressHeld(t, e, b, eb, false)
	assertNodeClean6(t, e)
}

// TestIPv6PodIPv4EgressGC: the IPv4 egress address of an attachment the
// runtime lost is released by the plugin's GC; a valid one's stays.
func TestIPv6PodIPv4EgressGC(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool6(4))
	e.Chain = false
	keep := e.NewPod(t, "egress-keep")
	e.MustAdd(t, keep)
	lostEnv := *e
	lostEnv.CacheDir = t.TempDir()
	lost := lostEnv.NewPod(t, "egress-lost")
	lostEnv.MustAdd(t, lost)
	ek, el := egressOf(t, e, keep), egressOf(t, e, lost)
	assertEgressHeld(t, e, lost, el, true)
	if err := e.GC(t, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	assertEgressHeld(t, e, lost, el, false)
	assertEgressHeld(t, e, keep, ek, true)
	if err := e.Check(t, keep); err != nil {
		t.Errorf("CHECK of the kept pod after GC: %v", err)
	}
	mustDel(t, e, keep)
	assertEgressHeld(t, e, keep, ek, false)
}

// TestIPv4PodHasNoEgressAddress: IPv4 mode is unchanged: one IP in the
// result, and host-local is never run.
func TestIPv4PodHasNoEgressAddress(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool(2))
	e.Chain = false
	p := e.NewPod(t, "four")
	e.MustAdd(t, p)
	if len(p.Result.IPs) != 1 || !p.Address.Is4() || netip.MustParsePrefix(egressRange).Contains(p.Address) {
		t.Errorf("IPv4 pod result IPs %v, want its one pod address", p.Result.IPs)
	}
	mustDel(t, e, p)
	if _, err := os.Stat(filepath.Join(e.EgressDir, Network)); err == nil {
		t.Errorf("host-local's store %s exists for an IPv4 pod", filepath.Join(e.EgressDir, Network))
	}
}

// TestIPv6PodIPv4EgressNeedsHostLocal: on a node whose CNI bin dir has no
// host-local, an IPv6 pod's ADD fails naming it and leaves nothing held or
// wired; with "enableV4Egress": false the pod is added with its IPv6
// address alone.
func TestIPv6PodIPv4EgressNeedsHostLocal(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool6(2))
	e.Chain = false
	bin := t.TempDir()
	if err := os.Symlink(filepath.Join(e.BinDir, "vpcip-cni"), filepath.Join(bin, "vpcip-cni")); err != nil {
		t.Fatal(err)
	}
	e.BinDir = bin
	p := e.NewPod(t, "egress-nohl")
	if err := e.Add(t, p); err == nil || !strings.Contains(err.Error(), "needs the reference host-local IPAM plugin in CNI_PATH") {
		t.Errorf("ADD without host-local: %v, want an error naming host-local", err)
	}
	if len(d.Held()) != 0 {
		t.Errorf("failed ADD left %v held", d.Held())
	}
	assertNodeClean6(t, e)
	conf := e.PluginConf()
	conf["enableV4Egress"] = false
	e.RawConfList, _ = json.Marshal(map[string]any{"cniVersion": e.CNIVersion, "name": Network, "plugins": []any{conf}})
	q := e.NewPod(t, "egress-off")
	e.MustAdd(t, q)
	if len(q.Result.IPs) != 1 || !q.Address.Is6() {
		t.Errorf("ADD with enableV4Egress false: IPs %v, want the IPv6 address alone", q.Result.IPs)
	}
	if err := e.Check(t, q); err != nil {
		t.Errorf("CHECK with enableV4Egress false: %v", err)
	}
	mustDel(t, e, q)
	assertNodeClean6(t, e)
}

// TestIPv6ReplacedSandboxReleasesEgress: a new sandbox of the same pod
// ADDed while the old sandbox's veth exists replaces it, and the old
// sandbox's IPv4 egress address is released in host-local's store with
// its IPv6 address (no DEL of it ever comes).
func TestIPv6ReplacedSandboxReleasesEgress(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool6(4))
	e.Chain = false
	old := e.NewPod(t, "egress-recreated")
	e.MustAdd(t, old)
	eo := egressOf(t, e, old)
	nu := sameSandboxPod(t, e, old)
	e.MustAdd(t, nu)
	if _, held := d.Held()[e.key(old)]; held {
		t.Errorf("the replaced sandbox still holds %v", old.Address)
	}
	assertEgressHeld(t, e, old, eo, false)
	en := egressOf(t, e, nu)
	assertEgressHeld(t, e, nu, en, true)
	assertEgressWired(t, e, nu, en)
	if err := e.Check(t, nu); err != nil {
		t.Errorf("CHECK of the new sandbox: %v", err)
	}
	mustDel(t, e, nu)
	assertEgressHeld(t, e, nu, en, false)
	assertNodeClean6(t, e)
}

// TestIPv6PodIPv4EgressConcurrentAdds: six IPv6 pods ADDed at once get six
// distinct egress addresses, and the node holds the SNAT rules once: one
// POSTROUTING jump, the chain's RETURN and MASQUERADE.
func TestIPv6PodIPv4EgressConcurrentAdds(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool6(6))
	e.Chain = false
	pods := make([]*Pod, 6)
	for i := range pods {
		pods[i] = e.NewPod(t, "egress-c")
	}
	errs := make(chan error, len(pods))
	for _, p := range pods {
		go func() { errs <- e.Add(t, p) }()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent ADD: %v", err)
		}
	}
	seen := map[netip.Addr]bool{}
	for _, p := range pods {
		a := egressOf(t, e, p)
		if seen[a] {
			t.Errorf("egress address %v given twice", a)
		}
		seen[a] = true
	}
	out, err := exec.Command("ip", "netns", "exec", e.Node.Name, "iptables-save", "-t", "nat").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-save: %v %s", err, out)
	}
	var jumps, rules int
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "-A POSTROUTING ") && strings.Contains(l, "-j VPCIP-EGRESS4"):
			jumps++
			if !strings.Contains(l, "-s "+egressRange) {
				t.Errorf("jump %q, want it for source %s", l, egressRange)
			}
		case strings.HasPrefix(l, "-A VPCIP-EGRESS4 "):
			rules++
		}
	}
	if jumps != 1 || rules != 2 {
		t.Errorf("nat table has %d jumps to VPCIP-EGRESS4 and %d rules in it, want 1 and 2:\n%s", jumps, rules, out)
	}
	for _, p := range pods {
		mustDel(t, e, p)
	}
	assertNodeClean6(t, e)
}

// TestDELOfAttachmentWithoutEgressRunsNoHostLocal: on a node whose
// host-local store exists (it once ran IPv6 pods, or another attachment
// holds an egress address) but whose CNI bin dir has no host-local, the
// DEL of an attachment host-local holds nothing for succeeds and releases
// its address; it used to run host-local for every DEL and fail, leaving
// the pod Terminating for good.
func TestDELOfAttachmentWithoutEgressRunsNoHostLocal(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool(2))
	e.Chain = false
	store := filepath.Join(e.EgressDir, Network)
	if err := os.MkdirAll(store, 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(store, "169.254.172.9")
	if err := os.WriteFile(other, []byte("another-sandbox\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(filepath.Join(e.BinDir, "vpcip-cni"), filepath.Join(bin, "vpcip-cni")); err != nil {
		t.Fatal(err)
	}
	e.BinDir = bin
	p := e.NewPod(t, "four-after-six")
	e.MustAdd(t, p)
	if err := e.Del(t, p); err != nil {
		t.Fatalf("DEL of an IPv4 pod on a node with a host-local store and no host-local: %v", err)
	}
	if len(d.Held()) != 0 {
		t.Errorf("DEL left %v held", d.Held())
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "another-sandbox\r\neth0" {
		t.Errorf("another attachment's egress record: %q, %v; want it untouched", b, err)
	}
}
