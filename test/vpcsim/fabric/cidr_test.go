package fabric

import (
	"net/netip"
	"testing"
	"time"
)

// TestSecondaryCIDR: A's secondary ENI lives in a pod subnet of the VPC's
// secondary CIDR (100.65.0.0/20, gateway 100.65.0.1), B in the primary CIDR.
// The router routes the secondary CIDR's addresses like any other and applies
// the same source/destination check to them.
func TestSecondaryCIDR(t *testing.T) {
	f := newTestFabric(t)
	podSubnet := netip.MustParsePrefix("100.65.0.0/20")
	eniPrimary := netip.MustParseAddr("100.65.0.10")
	podAddr := netip.MustParseAddr("100.65.0.50")
	strangerAddr := netip.MustParseAddr("100.65.0.51")
	e1 := testENI(eniA1, 1, eniPrimary.String(), "02:aa:00:00:00:01")
	e1.SubnetCIDR, e1.Gateway = podSubnet, netip.MustParseAddr("100.65.0.1")
	f.ENIAttached(instA, testENI(eniA0, 0, primaryA.String(), "02:aa:00:00:00:00"))
	f.ENIAttached(instA, e1)
	f.ENIAttached(instB, testENI(eniB0, 0, primaryB.String(), "02:bb:00:00:00:00"))
	f.AddressesAssigned(eniA1, []netip.Prefix{netip.PrefixFrom(podAddr, 32)})
	if err := f.Err(); err != nil {
		t.Fatal(err)
	}
	nsA, nsB := f.NodeNetns(instA), f.NodeNetns(instB)
	configureENI(t, handleIn(t, nsA), eniLink{primary: eniPrimary, subnet: podSubnet, gateway: e1.Gateway}, podAddr, strangerAddr)

	atA := listenUDP(t, nsA, netip.AddrPortFrom(podAddr, 9002))
	sendUDP(t, nsB, primaryB, "", netip.AddrPortFrom(podAddr, 9002), "to the secondary CIDR")
	if !receive(t, atA, "to the secondary CIDR", 5*time.Second) {
		t.Fatal("packet from B to an assigned address of the secondary CIDR did not arrive")
	}

	atB := listenUDP(t, nsB, netip.AddrPortFrom(primaryB, 9000))
	toB := netip.AddrPortFrom(primaryB, 9000)
	for _, s := range []struct {
		name    string
		src     netip.Addr
		dev     string
		arrives bool
	}{
		// Resolves B's neighbour entry on eth0, so that the last step's
		// packet reaches the router rather than waiting on ARP.
		{"primary address by eth0", primaryA, "", true},
		{"assigned secondary-CIDR address by its ENI", podAddr, "", true},
		{"unassigned secondary-CIDR address by its ENI", strangerAddr, "", false},
		{"assigned secondary-CIDR address by eth0", podAddr, "eth0", false},
	} {
		before := rpFilterDrops(t, f)
		sendUDP(t, nsA, s.src, s.dev, toB, s.name)
		limit := wait
		if s.arrives {
			limit = 5 * time.Second
		}
		if got := receive(t, atB, s.name, limit); got != s.arrives {
			t.Errorf("%s: arrived %v, want %v", s.name, got, s.arrives)
		}
		if dropped := rpFilterDrops(t, f) - before; !s.arrives && dropped == 0 {
			t.Errorf("%s: router's IPReversePathFilter count did not grow", s.name)
		}
	}
}
