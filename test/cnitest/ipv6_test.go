package cnitest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The IPv6 datapath through libcni (issue #30): the daemon double hands out
// IPv6 addresses as vpcipd's IPv6 mode does (one /80 of the primary ENI),
// and the plugin wires, checks and removes them the way a runtime calls it.

const gateway6 = "fe80::1"

// FakePool6 returns n IPv6 addresses of one /80 delegated to the primary
// ENI (2600:1f14:ab:cd00:7::/80), the reference's IPv6 mode.
func FakePool6(n int) []FakeAddress {
	out := make([]FakeAddress, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, FakeAddress{Addr: netip.AddrFrom16([16]byte{0x26, 0, 0x1f, 0x14, 0, 0xab, 0xcd, 0, 0, 7, 14: byte(i >> 8), 15: byte(0x10 + i)})})
	}
	return out
}

func ping6(netns string, to netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", netns, "ping", "-6", "-c", "1", "-W", "2", to.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping -6 %s from %s: %v\n%s", to, netns, err, out)
	}
	return nil
}

// assertPodWired6 checks the IPv6 wiring of p as iproute2 shows it: the pod
// interface (up, MTU) holding exactly <addr>/128 besides its link-local
// address, the default route via fe80::1 and that neighbour permanent with
// the host veth's MAC; in the node the /128 route to the host veth, the pod
// address as a permanent neighbour with the pod's MAC, and no policy rule.
func assertPodWired6(t testing.TB, e *Env, p *Pod, mtu int) {
	t.Helper()
	if !p.Address.Is6() {
		t.Fatalf("pod %s has address %v, want IPv6", p.Name, p.Address)
	}
	node, veth := e.Node.Name, e.HostVeth(p)
	host, ok := linkNamed(t, node, veth)
	if !ok {
		t.Fatalf("host veth %s missing in node netns", veth)
	}
	pod, ok := linkNamed(t, p.NetnsName, p.IfName)
	if !ok {
		t.Fatalf("pod interface %s missing in %s", p.IfName, p.NetnsName)
	}
	for _, l := range []ipLink{host, pod} {
		if l.MTU != mtu || !slices.Contains(l.Flags, "UP") {
			t.Errorf("%s: mtu %d flags %v, want mtu %d and UP", l.IfName, l.MTU, l.Flags, mtu)
		}
	}
	var addrs []ipAddr
	ipJSON(t, p.NetnsName, &addrs, "-6", "addr", "show", "dev", p.IfName, "scope", "global")
	var got []string
	for _, a := range addrs {
		for _, ai := range a.AddrInfo {
			if ai.Local != "" { // iproute2 adds an entry of lifetimes alone
				got = append(got, ai.Local+"/"+itoa(ai.PrefixLen))
			}
		}
	}
	if want := []string{p.Address.String() + "/128"}; !slices.Equal(got, want) {
		t.Errorf("pod global addresses %v, want %v", got, want)
	}
	var routes []ipRoute
	ipJSON(t, p.NetnsName, &routes, "-6", "route", "show", "default")
	if len(routes) != 1 || routes[0].Gateway != gateway6 || routes[0].Dev != p.IfName {
		t.Errorf("pod default routes %+v, want one via %s dev %s", routes, gateway6, p.IfName)
	}
	assertNeigh6(t, p.NetnsName, p.IfName, gateway6, host.Address)
	var hr []ipRoute
	ipJSON(t, node, &hr, "-6", "route", "show", "table", "main", "exact", p.Address.String()+"/128")
	if len(hr) != 1 || hr[0].Dev != veth || hr[0].Gateway != "" {
		t.Errorf("host routes to %s/128: %+v, want one dev %s", p.Address, hr, veth)
	}
	assertNeigh6(t, node, veth, p.Address.String(), pod.Address)
	if rs := rules6(t, node); len(rs) != 0 {
		t.Errorf("IPv6 policy rules in the node: %v, want none (IPv6 pods use the main table)", rs)
	}
}

func assertNeigh6(t testing.TB, netns, dev, ip, mac string) {
	t.Helper()
	var neighs []ipNeigh
	ipJSON(t, netns, &neighs, "-6", "neigh", "show", "dev", dev)
	for _, n := range neighs {
		if n.Dst == ip {
			if n.LLAddr != mac || !slices.Contains(n.State, "PERMANENT") {
				t.Errorf("neighbour %s on %s in %s: lladdr %s state %v, want %s PERMANENT", ip, dev, netns, n.LLAddr, n.State, mac)
			}
			return
		}
	}
	t.Errorf("neighbour %s on %s in %s missing (have %+v)", ip, dev, netns, neighs)
}

// rules6 lists the node's IPv6 rules other than the kernel's defaults.
func rules6(t testing.TB, netns string) []ipRule {
	var all, out []ipRule
	ipJSON(t, netns, &all, "-6", "rule", "show")
	for _, r := range all {
		if r.Priority != 0 && r.Priority != 32766 {
			out = append(out, r)
		}
	}
	return out
}

// assertNoHostSide6 checks nothing of addr is left in the node: no /128
// route, no host veth of p.
func assertNoHostSide6(t testing.TB, e *Env, p *Pod, addr netip.Addr) {
	t.Helper()
	if l, ok := linkNamed(t, e.Node.Name, e.HostVeth(p)); ok {
		t.Errorf("host veth %s still present: %+v", l.IfName, l)
	}
	var hr []ipRoute
	ipJSON(t, e.Node.Name, &hr, "-6", "route", "show", "table", "main", "exact", addr.String()+"/128")
	if len(hr) != 0 {
		t.Errorf("host route to %s/128 still present: %+v", addr, hr)
	}
}

// assertNodeClean6 is AssertNodeClean plus the IPv6 main table: no /128
// route through a prefixed veth of a pod not in live.
func assertNodeClean6(t testing.TB, e *Env, live ...*Pod) {
	t.Helper()
	AssertNodeClean(t, e, live...)
	liveAddr := map[string]bool{}
	for _, p := range live {
		liveAddr[p.Address.String()] = true
	}
	var routes []ipRoute
	ipJSON(t, e.Node.Name, &routes, "-6", "route", "show", "table", "main")
	for _, r := range routes {
		if strings.HasPrefix(r.Dev, e.VethPrefix) && !strings.HasPrefix(r.Dst, "fe80:") && !liveAddr[r.Dst] {
			t.Errorf("leftover host route %s dev %s", r.Dst, r.Dev)
		}
	}
}

// TestIPv6AddCheckDel: two IPv6 pods through the full chain (tuning,
// bandwidth, portmap): wired as assertPodWired6 says, results with a /128
// and gateway fe80::1, CHECK passes and names a missing piece, the pods
// ping each other through the host right after ADD, and DEL (twice) leaves
// nothing while the other pod keeps working.
func TestIPv6AddCheckDel(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool6(4))
	a, b := e.NewPod(t, "six-a"), e.NewPod(t, "six-b")
	e.MustAdd(t, a)
	e.MustAdd(t, b)
	for _, p := range []*Pod{a, b} {
		assertPodWired6(t, e, p, 9001)
		mustHeld(t, e, p)
		r := p.Result
		egressOf(t, e, p) // its IPv4 egress address, left out of the result (egress4_test.go)
		if len(r.IPs) != 1 || r.IPs[0].Address.String() != p.Address.String()+"/128" || r.IPs[0].Gateway.String() != gateway6 ||
			r.IPs[0].Interface == nil || *r.IPs[0].Interface != 1 {
			t.Errorf("result IPs %+v, want %s/128 gw %s on interface 1", r.IPs, p.Address, gateway6)
		}
		if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "::/0" || r.Routes[0].GW.String() != gateway6 {
			t.Errorf("result routes %v, want ::/0 via %s", r.Routes, gateway6)
		}
		if err := e.Check(t, p); err != nil {
			t.Errorf("CHECK %s: %v", p.Name, err)
		}
	}
	if err := ping6(a.NetnsName, b.Address); err != nil {
		t.Error(err)
	}
	if err := ping6(b.NetnsName, a.Address); err != nil {
		t.Error(err)
	}
	// A missing piece is named, and CHECK passes again once it is back.
	podMAC := func(p *Pod) string { l, _ := linkNamed(t, p.NetnsName, p.IfName); return l.Address }
	ipCmd(t, "-n", e.Node.Name, "-6", "neigh", "del", a.Address.String(), "dev", e.HostVeth(a))
	if err := e.Check(t, a); err == nil || !strings.Contains(err.Error(), "permanent neighbour "+a.Address.String()+" on host veth "+e.HostVeth(a)+" missing") {
		t.Errorf("CHECK without the host neighbour: %v", err)
	}
	ipCmd(t, "-n", e.Node.Name, "-6", "neigh", "add", a.Address.String(), "lladdr", podMAC(a), "dev", e.HostVeth(a), "nud", "permanent")
	ipCmd(t, "-n", a.NetnsName, "-6", "route", "del", "default")
	if err := e.Check(t, a); err == nil || !strings.Contains(err.Error(), "default route via fe80::1 dev eth0 missing") {
		t.Errorf("CHECK without the pod default route: %v", err)
	}
	ipCmd(t, "-n", a.NetnsName, "-6", "route", "add", "default", "via", gateway6, "dev", a.IfName)
	if err := e.Check(t, a); err != nil {
		t.Errorf("CHECK after repairs: %v", err)
	}
	mustDel(t, e, a)
	mustDel(t, e, a)
	if _, held := d.Held()[e.key(a)]; held {
		t.Errorf("DEL did not release %v", a.Address)
	}
	assertNoHostSide6(t, e, a, a.Address)
	assertPodWired6(t, e, b, 9001)
	if err := e.Check(t, b); err != nil {
		t.Errorf("CHECK of the other pod after DEL: %v", err)
	}
	assertNodeClean6(t, e, b)
	mustDel(t, e, b)
	assertNodeClean6(t, e)
}

// TestIPv6StaleDelKeepsTheNextOwner: the address of a deleted pod goes to
// the next pod at once (a pool of one); a repeated DEL of the old sandbox,
// with its old prevResult naming the address, and a DEL of an unknown
// older sandbox of the new pod (same pod name, so the same veth name) both
// succeed and leave the new pod's wiring exactly as it was.
func TestIPv6StaleDelKeepsTheNextOwner(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool6(1))
	e.Chain = false
	old := e.NewPod(t, "six-old")
	e.MustAdd(t, old)
	mustDel(t, e, old)
	next := e.NewPod(t, "six-next")
	e.MustAdd(t, next)
	if next.Address != old.Address {
		t.Fatalf("setup: next pod got %v, want the released %v", next.Address, old.Address)
	}
	before := snapshot6(t, e, next)
	stale := *old
	stale.NetnsPath = ""
	if stdout, stderr, err := e.Exec(t, e.delEnv(&stale), e.pluginStdin(t, old)); err != nil || len(stdout) != 0 {
		t.Errorf("stale DEL of the address's earlier holder: %v %q %q", err, stdout, stderr)
	}
	sameName := *next
	sameName.ContainerID = randomHex(32)
	sameName.NetnsPath = ""
	if stdout, stderr, err := e.Exec(t, e.delEnv(&sameName), e.pluginStdin(t, next)); err != nil || len(stdout) != 0 {
		t.Errorf("DEL of an unknown sandbox of the same pod: %v %q %q", err, stdout, stderr)
	}
	if diff := cmp.Diff(before, snapshot6(t, e, next)); diff != "" {
		t.Errorf("the next owner's state changed (-before +after):\n%s", diff)
	}
	// host-local keys the IPv4 egress address by sandbox: the stale DELs
	// released nothing of the next owner's.
	assertEgressHeld(t, e, next, egressOf(t, e, next), true)
	assertPodWired6(t, e, next, 9001)
	if err := e.Check(t, next); err != nil {
		t.Errorf("CHECK of the next owner: %v", err)
	}
	mustDel(t, e, next)
	assertNodeClean6(t, e)
}

// snapshot6 is an IPv6 pod's node-side state in comparable form.
func snapshot6(t testing.TB, e *Env, p *Pod) []string {
	t.Helper()
	var out []string
	var hr []ipRoute
	ipJSON(t, e.Node.Name, &hr, "-6", "route", "show", "table", "main", "exact", p.Address.String()+"/128")
	for _, r := range hr {
		out = append(out, "route "+r.Dev)
	}
	if l, ok := linkNamed(t, e.Node.Name, e.HostVeth(p)); ok {
		out = append(out, "veth "+l.IfName+" "+l.Address+" "+l.IfAlias)
	}
	if a, ok := e.Held(t, p); ok {
		out = append(out, "held "+a.Address.String())
	}
	return out
}

// TestIPv6GCRemovesHostSide: an IPv6 attachment the runtime lost (no cached
// result, so libcni's GC sends it no DEL) is removed by the plugin's GC:
// its veth and /128 route go before the daemon releases the address.
func TestIPv6GCRemovesHostSide(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool6(4))
	e.Chain = false
	keep := e.NewPod(t, "six-keep")
	e.MustAdd(t, keep)
	lostEnv := *e
	lostEnv.CacheDir = t.TempDir()
	lost := lostEnv.NewPod(t, "six-lost")
	lostEnv.MustAdd(t, lost)
	if err := e.GC(t, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, held := d.Held()[e.key(lost)]; held {
		t.Errorf("GC left %v held", lost.Address)
	}
	assertNoHostSide6(t, e, lost, lost.Address)
	assertPodWired6(t, e, keep, 9001)
	mustDel(t, e, keep)
	assertNodeClean6(t, e)
}

// TestIPv6ResultVersions: the plugin alone prints an IPv6 pod's result in
// each supported version: 0.4.0's ipConfig says "version": "6", 1.0.0 and
// 1.1.0 have no such field (the family is the address's); every one has
// the /128, gateway fe80::1 and the route ::/0.
func TestIPv6ResultVersions(t *testing.T) {
	RequireRoot(t)
	e, _ := fakeEnv(t, FakePool6(2))
	e.Chain = false
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		ve := *e
		ve.CNIVersion = v
		p := ve.NewPod(t, "six-v"+strings.ReplaceAll(v, ".", ""))
		out, stderr, err := ve.Exec(t, ve.addEnv(p), ve.pluginStdin(t, nil))
		var res struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Version *string `json:"version"`
				Address string  `json:"address"`
				Gateway string  `json:"gateway"`
			} `json:"ips"`
			Routes []struct {
				Dst string `json:"dst"`
				GW  string `json:"gw"`
			} `json:"routes"`
		}
		if err != nil || json.Unmarshal(out, &res) != nil || res.CNIVersion != v || len(res.IPs) != 1 || len(res.Routes) != 1 {
			t.Fatalf("%s: ADD printed %s %s (%v); want a result of version %s with one IP and one route (the IPv4 egress address is left out)", v, out, stderr, err, v)
		}
		ip, r := res.IPs[0], res.Routes[0]
		if !strings.HasSuffix(ip.Address, "/128") || ip.Gateway != gateway6 || r.Dst != "::/0" || r.GW != gateway6 {
			t.Errorf("%s: ip %+v route %+v, want a /128 via %s and ::/0 via %s", v, ip, r, gateway6, gateway6)
		}
		switch {
		case v == "0.4.0" && (ip.Version == nil || *ip.Version != "6"):
			t.Errorf("%s: ipConfig version %v, want \"6\"", v, ip.Version)
		case v != "0.4.0" && ip.Version != nil:
			t.Errorf("%s: ipConfig version %q; the field is gone since 1.0.0", v, *ip.Version)
		}
		if _, _, err := ve.Exec(t, ve.delEnv(p), ve.pluginStdin(t, nil)); err != nil {
			t.Errorf("%s: DEL: %v", v, err)
		}
	}
	assertNodeClean6(t, e)
}

// TestIPv6DelWithoutDaemonOrNetns: a DEL that carries no netns (B01) while
// vpcipd is down learns the IPv6 address from its prevResult alone, removes
// the host veth and /128 route, and succeeds (B13); a DEL with the daemon
// back releases.
func TestIPv6DelWithoutDaemonOrNetns(t *testing.T) {
	RequireRoot(t)
	e, d := fakeEnv(t, FakePool6(2))
	e.Chain = false
	p := e.NewPod(t, "six-down")
	e.MustAdd(t, p)
	d.Stop(t)
	q := *p
	q.NetnsPath = ""
	if out, _, err := e.Exec(t, e.delEnv(&q), e.pluginStdin(t, p)); err != nil {
		t.Errorf("DEL with the daemon down: %v %s; want success (B13)", err, out)
	}
	assertNoHostSide6(t, e, p, p.Address)
	d.Start(t)
	if _, held := d.Held()[e.key(p)]; !held {
		t.Fatalf("the stopped daemon released")
	}
	mustDel(t, e, p)
	if _, held := d.Held()[e.key(p)]; held {
		t.Errorf("a DEL with the daemon back did not release %v", p.Address)
	}
	assertNodeClean6(t, e)
}
