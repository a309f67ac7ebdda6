package fabric

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// Two instances on one subnet: A (primary 100.64.0.10, secondary ENI
// 100.64.0.11 as eth1) and B (primary 100.64.0.20).
const (
	instA, instB = "i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2"
	eniA0, eniA1 = "eni-0aaaaaaaaaaaaaa00", "eni-0aaaaaaaaaaaaaa01"
	eniB0        = "eni-0bbbbbbbbbbbbbb00"
)

var (
	primaryA  = netip.MustParseAddr("100.64.0.10")
	primaryA1 = netip.MustParseAddr("100.64.0.11")
	primaryB  = netip.MustParseAddr("100.64.0.20")
	assigned  = netip.MustParseAddr("100.64.0.50") // a secondary IP of eni-A1
	stranger  = netip.MustParseAddr("100.64.0.51") // on A's eth1, never assigned
)

// wait bounds how long a packet that must not arrive is waited for.
const wait = 300 * time.Millisecond

// twoInstances launches A with two ENIs and B with one into f.
func twoInstances(t *testing.T, f *Fabric) {
	t.Helper()
	f.ENIAttached(instA, testENI(eniA0, 0, primaryA.String(), "02:aa:00:00:00:00"))
	f.ENIAttached(instA, testENI(eniA1, 1, primaryA1.String(), "02:aa:00:00:00:01"))
	f.ENIAttached(instB, testENI(eniB0, 0, primaryB.String(), "02:bb:00:00:00:00"))
	if err := f.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestSourceDestCheck(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	f.AddressesAssigned(eniA1, []netip.Prefix{netip.PrefixFrom(assigned, 32)})
	nsA, nsB := f.NodeNetns(instA), f.NodeNetns(instB)
	configureSecondary(t, handleIn(t, nsA), assigned, stranger)
	atB := listenUDP(t, nsB, netip.AddrPortFrom(primaryB, 9000))
	toB := netip.AddrPortFrom(primaryB, 9000)

	// Each step sends a distinct payload; order matters, as each step also
	// leaves the gateway's neighbour entry resolved for the next one.
	steps := []struct {
		name     string
		src      netip.Addr
		dev      string // "" = as the instance's rules route it
		arrives  bool
		unassign bool // unassign src from eni-A1 first
	}{
		{"primary address by eth0", primaryA, "", true, false},
		{"assigned secondary address by its ENI", assigned, "", true, false},
		{"unassigned address by eth1", stranger, "", false, false},
		{"assigned address by the wrong ENI", assigned, "eth0", false, false},
		{"address after unassign", assigned, "", false, true},
	}
	for _, s := range steps {
		if s.unassign {
			f.AddressesUnassigned(eniA1, []netip.Prefix{netip.PrefixFrom(s.src, 32)})
			if err := f.Err(); err != nil {
				t.Fatal(err)
			}
		}
		before := rpFilterDrops(t, f)
		sendUDP(t, nsA, s.src, s.dev, toB, s.name)
		limit := wait
		if s.arrives {
			limit = 5 * time.Second
		}
		got := receive(t, atB, s.name, limit)
		if got != s.arrives {
			t.Errorf("%s: arrived = %v, want %v", s.name, got, s.arrives)
		}
		if dropped := rpFilterDrops(t, f) - before; !s.arrives && dropped == 0 {
			t.Errorf("%s: router's IPReversePathFilter count did not grow", s.name)
		}
	}
}

func TestReplyFollowsRoute(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	f.AddressesAssigned(eniA1, []netip.Prefix{netip.MustParsePrefix("100.64.0.48/28")})
	nsA, nsB := f.NodeNetns(instA), f.NodeNetns(instB)
	configureSecondary(t, handleIn(t, nsA), assigned)
	atA := listenUDP(t, nsA, netip.AddrPortFrom(assigned, 9001))
	toA := netip.AddrPortFrom(assigned, 9001)

	sendUDP(t, nsB, primaryB, "", toA, "to prefix")
	if !receive(t, atA, "to prefix", 5*time.Second) {
		t.Fatal("packet to an address of an assigned /28 did not arrive")
	}
	f.AddressesUnassigned(eniA1, []netip.Prefix{netip.MustParsePrefix("100.64.0.48/28")})
	sendUDP(t, nsB, primaryB, "", toA, "after unassign")
	if receive(t, atA, "after unassign", wait) {
		t.Fatal("packet to an unassigned prefix arrived")
	}
	if rs := routesTo(t, f, netip.MustParsePrefix("100.64.0.48/28")); len(rs) != 0 {
		t.Errorf("route left after unassign: %v", rs)
	}
}

func TestAttachLayout(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	twoInstances(t, f) // attaching again changes nothing
	nsA := f.NodeNetns(instA)
	if want := f.Prefix() + "-aaaaaaa1"; nsA != want {
		t.Errorf("NodeNetns(A) = %q, want %q", nsA, want)
	}
	h := handleIn(t, nsA)

	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if got := eth0.Attrs().HardwareAddr.String(); got != "02:aa:00:00:00:00" {
		t.Errorf("eth0 MAC = %s", got)
	}
	if eth0.Attrs().MTU != ENIMTU || eth0.Attrs().Flags&netlinkUp == 0 {
		t.Errorf("eth0 MTU %d flags %v, want %d and up", eth0.Attrs().MTU, eth0.Attrs().Flags, ENIMTU)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "100.64.0.10/20" {
		t.Errorf("eth0 addresses = %v, %v; want 100.64.0.10/20", addrs, err)
	}
	routes, err := h.RouteList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var sawDefault, sawMetadata bool
	for _, r := range routes {
		sawDefault = sawDefault || (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == "100.64.0.1"
		sawMetadata = sawMetadata || r.Dst != nil && r.Dst.String() == "169.254.169.254/32"
	}
	if !sawDefault || !sawMetadata {
		t.Errorf("eth0 routes %v: default via gateway %v, metadata %v", routes, sawDefault, sawMetadata)
	}

	eth1, err := h.LinkByName("eth1")
	if err != nil {
		t.Fatal(err)
	}
	if got := eth1.Attrs().HardwareAddr.String(); got != "02:aa:00:00:00:01" {
		t.Errorf("eth1 MAC = %s", got)
	}
	if eth1.Attrs().Flags&netlinkUp != 0 {
		t.Error("secondary ENI eth1 is up; EC2 leaves it to the instance")
	}
	if addrs, _ := h.AddrList(eth1, netlink.FAMILY_V4); len(addrs) != 0 {
		t.Errorf("eth1 addresses = %v, want none", addrs)
	}

	end := f.routerLinkName(eniA1)
	for key, want := range map[string]string{
		"net/ipv4/ip_forward":                      "1",
		"net/ipv4/conf/" + end + "/rp_filter":      "1",
		"net/ipv4/conf/" + end + "/proxy_arp":      "1",
		"net/ipv4/conf/" + end + "/send_redirects": "0",
		"net/ipv4/neigh/" + end + "/proxy_delay":   "0",
	} {
		if got := sysctlIn(t, f.RouterNetns(), key); got != want {
			t.Errorf("router %s = %s, want %s", key, got, want)
		}
	}
	for _, a := range []netip.Addr{primaryA, primaryA1, primaryB} {
		rs := routesTo(t, f, netip.PrefixFrom(a, 32))
		if len(rs) != 1 {
			t.Errorf("router routes to %s: %v, want one", a, rs)
		}
	}
	if rs := routesTo(t, f, netip.PrefixFrom(primaryA1, 32)); len(rs) == 1 {
		link, _ := handleIn(t, f.RouterNetns()).LinkByName(end)
		if link == nil || rs[0].LinkIndex != link.Attrs().Index {
			t.Errorf("route to %s not via %s", primaryA1, end)
		}
	}
	rtr := handleIn(t, f.RouterNetns())
	if rs, _ := rtr.RouteList(nil, netlink.FAMILY_V4); hasDefault(rs) {
		t.Errorf("router has a default route: %v", rs)
	}
}

const netlinkUp = 1 // net.FlagUp

func hasDefault(rs []netlink.Route) bool {
	for _, r := range rs {
		if ones, _ := r.Dst.Mask.Size(); r.Dst == nil || ones == 0 {
			return true
		}
	}
	return false
}

func TestDetachAndTerminate(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	f.AddressesAssigned(eniA1, []netip.Prefix{netip.PrefixFrom(assigned, 32)})
	nsA := f.NodeNetns(instA)

	f.ENIDetached(instA, eniA1)
	f.ENIDetached(instA, eniA1) // twice is harmless
	if err := f.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := handleIn(t, nsA).LinkByName("eth1"); err == nil {
		t.Error("eth1 still in the instance after detach")
	}
	for _, a := range []netip.Addr{primaryA1, assigned} {
		if rs := routesTo(t, f, netip.PrefixFrom(a, 32)); len(rs) != 0 {
			t.Errorf("route to %s left after detach: %v", a, rs)
		}
	}

	f.InstanceTerminated(instA)
	f.InstanceTerminated(instA)
	if err := f.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(netnsPath(nsA)); !os.IsNotExist(err) {
		t.Errorf("netns %s after terminate: %v", nsA, err)
	}
	if rs := routesTo(t, f, netip.PrefixFrom(primaryA, 32)); len(rs) != 0 {
		t.Errorf("route to A's primary left after terminate: %v", rs)
	}
	if f.NodeNetns(instA) != "" || f.NodeNetns(instB) == "" {
		t.Errorf("NodeNetns after terminating A: A %q, B %q", f.NodeNetns(instA), f.NodeNetns(instB))
	}
}
