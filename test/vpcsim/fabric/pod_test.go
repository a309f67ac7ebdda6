package fabric

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// podGateway is the pod's next hop, as in the CNI plugin's datapath.
var podGateway = netip.MustParseAddr("169.254.1.1")

// addPod wires a pod netns "<prefix>-pod" behind instance A the way the
// plugin does: a veth from A, the pod address on the pod end, a /32 route to
// it in A, the pod's default route via 169.254.1.1 resolved by a permanent
// neighbour entry, and a rule sending the pod's packets out by eth1. The
// pod address is not on any of A's links, so A never answers ARP for it.
func addPod(t *testing.T, f *Fabric, nsA string, pod netip.Addr) string {
	t.Helper()
	name := f.Prefix() + "-pod"
	if err := createNetns(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetns(name) })
	podNS, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	a, p := handleIn(t, nsA), handleIn(t, name)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "podh"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(podNS)}
	if err := a.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	host, err := a.LinkByName("podh")
	if err != nil {
		t.Fatal(err)
	}
	podEth, err := p.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		a.LinkSetUp(host),
		a.RouteReplace(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(netip.PrefixFrom(pod, 32)), Scope: netlink.SCOPE_LINK}),
		p.LinkSetUp(podEth),
		p.AddrAdd(podEth, hostAddr(pod)),
		p.RouteReplace(&netlink.Route{LinkIndex: podEth.Attrs().Index, Dst: ipNet(netip.PrefixFrom(podGateway, 32)), Scope: netlink.SCOPE_LINK}),
		p.RouteReplace(&netlink.Route{LinkIndex: podEth.Attrs().Index, Gw: podGateway.AsSlice()}),
		p.NeighSet(&netlink.Neigh{LinkIndex: podEth.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: podGateway.AsSlice(), HardwareAddr: host.Attrs().HardwareAddr}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	doIn(t, nsA, func() error { return writeSysctls(map[string]string{"net/ipv4/ip_forward": "1"}) })
	return name
}

// TestPodBehindInstance: an address assigned to A's secondary ENI but living
// in a pod netns behind A is reached by B (EC2 delivers to the ENI by MAC,
// without ARP), and the pod's packets pass the source/dest check when they
// leave by that ENI and are dropped when they leave by eth0.
func TestPodBehindInstance(t *testing.T) {
	f := newTestFabric(t)
	twoInstances(t, f)
	f.AddressesAssigned(eniA1, []netip.Prefix{netip.PrefixFrom(assigned, 32)})
	nsA, nsB := f.NodeNetns(instA), f.NodeNetns(instB)
	configureSecondary(t, handleIn(t, nsA))
	pod := addPod(t, f, nsA, assigned)

	atPod := listenUDP(t, pod, netip.AddrPortFrom(assigned, 9002))
	sendUDP(t, nsB, primaryB, "", netip.AddrPortFrom(assigned, 9002), "to pod")
	if !receive(t, atPod, "to pod", 5*time.Second) {
		t.Error("B's packet to the pod address did not reach the pod")
	}

	// From the pod: by eth1 through a "from <pod> lookup 2" rule in A.
	atB := listenUDP(t, nsB, netip.AddrPortFrom(primaryB, 9003))
	a := handleIn(t, nsA)
	rule := netlink.NewRule()
	rule.Src, rule.Table, rule.Priority = ipNet(netip.PrefixFrom(assigned, 32)), 2, 1536
	if err := a.RuleAdd(rule); err != nil {
		t.Fatal(err)
	}
	sendUDP(t, pod, assigned, "", netip.AddrPortFrom(primaryB, 9003), "pod by eth1")
	if !receive(t, atB, "pod by eth1", 5*time.Second) {
		t.Error("the pod's packet leaving by its ENI did not reach B")
	}
	// Without the rule the pod's packet leaves by eth0, the wrong ENI.
	if err := a.RuleDel(rule); err != nil {
		t.Fatal(err)
	}
	before := rpFilterDrops(t, f)
	sendUDP(t, pod, assigned, "", netip.AddrPortFrom(primaryB, 9003), "pod by eth0")
	if receive(t, atB, "pod by eth0", wait) {
		t.Error("the pod's packet leaving by the wrong ENI reached B")
	}
	if rpFilterDrops(t, f) == before {
		t.Error("router's IPReversePathFilter count did not grow")
	}
}
