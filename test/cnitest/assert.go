package cnitest

import (
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const gateway = "169.254.1.1"

// AssertPodWired checks docs/design.md §4 for p as the kernel shows it: the pod
// interface (up, MTU, /32), its gateway and default routes and permanent
// neighbour holding the host veth's MAC; the host veth (up, MTU), the host
// /32 route and the rules for routeTable (0: primary ENI, no 1536 rule).
func AssertPodWired(t testing.TB, e *Env, p *Pod, routeTable, mtu int) {
	t.Helper()
	node := e.Node.Name
	host, ok := linkNamed(t, node, e.HostVeth(p))
	if !ok {
		t.Fatalf("host veth %s missing in node netns", e.HostVeth(p))
	}
	if host.MTU != mtu || !slices.Contains(host.Flags, "UP") {
		t.Errorf("host veth %s: mtu %d flags %v, want mtu %d and UP", host.IfName, host.MTU, host.Flags, mtu)
	}
	pod, ok := linkNamed(t, p.NetnsName, p.IfName)
	if !ok {
		t.Fatalf("pod interface %s missing in %s", p.IfName, p.NetnsName)
	}
	if pod.MTU != mtu || !slices.Contains(pod.Flags, "UP") {
		t.Errorf("pod %s: mtu %d flags %v, want mtu %d and UP", p.IfName, pod.MTU, pod.Flags, mtu)
	}
	var addrs []ipAddr
	ipJSON(t, p.NetnsName, &addrs, "-4", "addr", "show", "dev", p.IfName)
	var got []string
	for _, a := range addrs {
		for _, ai := range a.AddrInfo {
			got = append(got, ai.Local+"/"+itoa(ai.PrefixLen))
		}
	}
	if want := []string{p.Address.String() + "/32"}; !slices.Equal(got, want) {
		t.Errorf("pod addresses %v, want %v", got, want)
	}
	var routes []ipRoute
	ipJSON(t, p.NetnsName, &routes, "-4", "route", "show")
	var gotRoutes []string
	for _, r := range routes {
		gotRoutes = append(gotRoutes, strings.TrimSpace(r.Dst+" "+r.Gateway+" "+r.Dev+" "+r.Scope))
	}
	slices.Sort(gotRoutes)
	wantRoutes := []string{gateway + "  " + p.IfName + " link", "default " + gateway + " " + p.IfName}
	slices.Sort(wantRoutes)
	if diff := cmp.Diff(wantRoutes, gotRoutes); diff != "" {
		t.Errorf("pod routes (-want +got):\n%s", diff)
	}
	var neighs []ipNeigh
	ipJSON(t, p.NetnsName, &neighs, "-4", "neigh", "show", "dev", p.IfName)
	foundNeigh := false
	for _, n := range neighs {
		if n.Dst == gateway {
			foundNeigh = true
			if n.LLAddr != host.Address || !slices.Contains(n.State, "PERMANENT") {
				t.Errorf("pod neighbour %s: lladdr %s state %v, want host veth MAC %s PERMANENT", gateway, n.LLAddr, n.State, host.Address)
			}
		}
	}
	if !foundNeigh {
		t.Errorf("pod neighbour %s missing", gateway)
	}
	r, ok := HostRoute(t, node, p.Address)
	if !ok || r.Dev != host.IfName || r.Scope != "link" || r.Gateway != "" {
		t.Errorf("host route to %s/32: %+v (present %v), want dev %s scope link", p.Address, r, ok, host.IfName)
	}
	if diff := cmp.Diff(WantRules(p.Address, routeTable), PodRules(t, node, p.Address)); diff != "" {
		t.Errorf("node rules for %s (-want +got):\n%s", p.Address, diff)
	}
}

// AssertHostSideGone checks that nothing of addr's host side is left: no
// route to addr/32 and no 512/1536 rule; and no host veth of p.
func AssertHostSideGone(t testing.TB, e *Env, p *Pod, addr netip.Addr) {
	t.Helper()
	if l, ok := linkNamed(t, e.Node.Name, e.HostVeth(p)); ok {
		t.Errorf("host veth %s still present: %+v", l.IfName, l)
	}
	if r, ok := HostRoute(t, e.Node.Name, addr); ok {
		t.Errorf("host route to %s/32 still present: %+v", addr, r)
	}
	if rs := PodRules(t, e.Node.Name, addr); len(rs) != 0 {
		t.Errorf("rules for %s still present: %v", addr, rs)
	}
}

// egressRange is the node-local range of IPv6 pods' IPv4 egress addresses
// (the plugin's datapath.Egress4Range).
const egressRange = "169.254.172.0/22"

// AssertNodeClean checks the node netns holds pod state only for live: no
// other host veth with the prefix, no other /32 main route through such a
// veth, no other rule at priority 512 or 1536, no bandwidth ifb and no
// portmap DNAT chain when nothing is live.
func AssertNodeClean(t testing.TB, e *Env, live ...*Pod) {
	t.Helper()
	node := e.Node.Name
	liveVeth := map[string]bool{}
	liveAddr := map[string]bool{}
	for _, p := range live {
		liveVeth[e.HostVeth(p)] = true
		liveAddr[p.Address.String()] = true
	}
	for _, l := range links(t, node) {
		if strings.HasPrefix(l.IfName, e.VethPrefix) && !liveVeth[l.IfName] {
			t.Errorf("leftover host veth %s in node netns %s", l.IfName, node)
		}
		if strings.HasPrefix(l.IfName, "bwp") && len(live) == 0 {
			t.Errorf("leftover bandwidth ifb %s", l.IfName)
		}
	}
	var routes []ipRoute
	ipJSON(t, node, &routes, "-4", "route", "show", "table", "main")
	for _, r := range routes {
		// A live IPv6 pod's IPv4 egress address (not in its result) is
		// routed to its veth too.
		dst, _ := netip.ParseAddr(r.Dst)
		egress := liveVeth[r.Dev] && netip.MustParsePrefix(egressRange).Contains(dst)
		if strings.HasPrefix(r.Dev, e.VethPrefix) && !liveAddr[r.Dst] && !egress {
			t.Errorf("leftover host route %s dev %s", r.Dst, r.Dev)
		}
	}
	for _, r := range rules(t, node) {
		if r.Priority != 512 && r.Priority != 1536 {
			continue
		}
		a := r.Dst
		if r.Priority == 1536 {
			a = r.Src
		}
		if !liveAddr[a] {
			t.Errorf("leftover rule %+v", r)
		}
	}
	if len(live) == 0 {
		out, err := exec.Command("ip", "netns", "exec", node, "iptables-save", "-t", "nat").CombinedOutput()
		if err == nil && strings.Contains(string(out), ":CNI-DN-") {
			t.Errorf("leftover portmap chain in node netns:\n%s", out)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
