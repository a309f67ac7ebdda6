package datapath

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/routing"
	"github.com/vpcip/vpcip/test/netnsdir"
)

// uniqueNetns makes a throwaway netns "vct-dp6-<8 hex>" removed at cleanup.
func uniqueNetns(t *testing.T) (string, ns.NetNS) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("vct-dp6-%x", b)
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	h, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		_ = netnsdir.Delete(name)
	})
	return name, h
}

// pod6 is one IPv6 pod of the prefix 2600:1f14:ab:cd00:5::/80 (a /80 of
// the primary ENI, as in the reference's IPv6 mode).
func pod6(host byte, name string) Attachment {
	return Attachment{PodIP: netip.AddrFrom16([16]byte{0x26, 0, 0x1f, 0x14, 0, 0xab, 0xcd, 0, 0, 5, 15: host}),
		MTU: 9001, HostVeth: HostVethName("eni", "default", name, ""), IfName: DefaultIfName}
}

// ping6 sends one echo from the named netns to addr, failing fast.
func ping6(netnsName string, to netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", netnsName, "ping", "-6", "-c", "1", "-W", "2", to.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping -6 %v from %s: %v\n%s", to, netnsName, err, out)
	}
	return nil
}

// TestIPv6SetupPingCheckTeardown: two IPv6 pods wired on one node reach
// each other through the host at once (no wait for duplicate address
// detection on either end, and on a node whose new links come without
// IPv6), the node reaches them from its own address,
// Check passes, and Teardown removes the veth and /128 routes, twice.
func TestIPv6SetupPingCheckTeardown(t *testing.T) {
	nodeName, node := uniqueNetns(t)
	nameA, podA := uniqueNetns(t)
	nameB, podB := uniqueNetns(t)
	a, b := pod6(0x0a, "v6a"), pod6(0x0b, "v6b")
	nodeAddr := netip.MustParseAddr("2600:1f14:ab:cd00::100")
	err := node.Do(func(ns.NetNS) error {
		// The node's own address (its primary ENI's, here on lo), so the
		// node's echo has a source the pods route back to.
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: hostNet(nodeAddr), Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		// A hardened node: new links come without IPv6 (the host veths).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0o644); err != nil {
			return err
		}
		for _, p := range []struct {
			ns ns.NetNS
			a  Attachment
		}{{podA, a}, {podB, b}} {
			if _, err := setup(node, p.ns, p.a); err != nil {
				return fmt.Errorf("setup %v: %w", p.a.PodIP, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Right after ADD: no neighbour discovery and no tentative address.
	for _, c := range []struct {
		from string
		to   netip.Addr
	}{{nameA, b.PodIP}, {nameB, a.PodIP}, {nodeName, a.PodIP}, {nameA, nodeAddr}} {
		if err := ping6(c.from, c.to); err != nil {
			t.Error(err)
		}
	}
	_ = node.Do(func(ns.NetNS) error {
		for _, p := range []struct {
			ns ns.NetNS
			a  Attachment
		}{{podA, a}, {podB, b}} {
			if _, err := Check(p.ns, p.a); err != nil {
				t.Errorf("Check %v: %v", p.a.PodIP, err)
			}
			if rs, err := netlinksafe.RuleList(netlink.FAMILY_V6); err != nil {
				t.Error(err)
			} else if n := slices.IndexFunc(rs, func(r netlink.Rule) bool {
				return r.Priority == routing.PriorityToPod || r.Priority == routing.PriorityFromPod
			}); n >= 0 {
				t.Errorf("IPv6 pod rule %v; IPv6 pods have none", rs[n])
			}
			if l, _ := HostRouteLink(p.a.PodIP); l != p.a.HostVeth {
				t.Errorf("host route to %v via %q, want %s", p.a.PodIP, l, p.a.HostVeth)
			}
		}
		if err := Teardown(podA.Path(), "", a); err != nil {
			t.Fatalf("Teardown: %v", err)
		}
		if l, _ := HostRouteLink(a.PodIP); l != "" {
			t.Errorf("host route to %v left via %s", a.PodIP, l)
		}
		if _, err := netlinksafe.LinkByName(a.HostVeth); err == nil {
			t.Errorf("host veth %s left", a.HostVeth)
		}
		if err := Teardown(podA.Path(), "", a); err != nil {
			t.Errorf("second Teardown: %v", err)
		}
		if _, err := Check(podB, b); err != nil {
			t.Errorf("the other pod after Teardown: %v", err)
		}
		return nil
	})
	if err := ping6(nameB, a.PodIP); err == nil {
		t.Errorf("ping to the removed pod %v answered", a.PodIP)
	}
}

// TestIPv6CheckNamesFaults: each broken piece of an IPv6 pod is named.
func TestIPv6CheckNamesFaults(t *testing.T) {
	_, node := uniqueNetns(t)
	_, pod := uniqueNetns(t)
	a := pod6(0x21, "v6faults")
	_ = node.Do(func(ns.NetNS) error {
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		host, err := netlinksafe.LinkByName(a.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V6, IP: net.IP(a.PodIP.AsSlice())}); err != nil {
			t.Fatal(err)
		}
		if err := netlink.RouteDel(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: hostNet(a.PodIP), Table: routing.MainTable}); err != nil {
			t.Fatal(err)
		}
		_ = pod.Do(func(ns.NetNS) error {
			l, _ := netlinksafe.LinkByName("eth0")
			if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V6, IP: net.IP(GatewayIPv6.AsSlice())}); err != nil {
				t.Fatal(err)
			}
			if err := netlink.AddrDel(l, &netlink.Addr{IPNet: hostNet(a.PodIP)}); err != nil {
				t.Fatal(err)
			}
			return nil
		})
		_, err = Check(pod, a)
		for _, want := range []string{
			"host route 2600:1f14:ab:cd00:5::21/128 dev " + a.HostVeth + " missing",
			"permanent neighbour 2600:1f14:ab:cd00:5::21 on host veth " + a.HostVeth + " missing",
			"address 2600:1f14:ab:cd00:5::21/128 missing on pod interface eth0",
			"permanent neighbour fe80::1 on pod interface eth0 missing",
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Check: %v; want it to say %q", err, want)
			}
		}
		// The default route is the link's, not the address's: remove it
		// too and expect it named.
		_ = pod.Do(func(ns.NetNS) error {
			l, _ := netlinksafe.LinkByName("eth0")
			return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
				Gw: net.IP(GatewayIPv6.AsSlice()), Table: routing.MainTable})
		})
		if _, err := Check(pod, a); err == nil || !strings.Contains(err.Error(), "pod default route via fe80::1 dev eth0 missing") {
			t.Errorf("Check without the default route: %v", err)
		}
		// Setup again repairs all of it.
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		if _, err := Check(pod, a); err != nil {
			t.Errorf("Check after a second Setup: %v", err)
		}
		return Teardown(pod.Path(), "", a)
	})
}

// TestIPv6ReplacedVethReportsRoutedAddress: a new sandbox of the same pod
// replaces the old veth and learns the IPv6 address routed to it (the
// plugin releases that address by the old sandbox's key).
func TestIPv6ReplacedVethReportsRoutedAddress(t *testing.T) {
	_, node := uniqueNetns(t)
	_, oldPod := uniqueNetns(t)
	_, newPod := uniqueNetns(t)
	a := pod6(0x31, "v6replaced")
	_ = node.Do(func(ns.NetNS) error {
		if _, err := setup(node, oldPod, a); err != nil {
			t.Fatal(err)
		}
		rep, err := CreatePair(node, newPod, a.HostVeth, a.IfName, a.MTU, "")
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Veth || !slices.Equal(rep.Routed, []netip.Addr{a.PodIP}) {
			t.Errorf("Replaced %+v, want the veth and routed [%v]", rep, a.PodIP)
		}
		if l, _ := HostRouteLink(a.PodIP); l != "" {
			t.Errorf("route to %v left via %s", a.PodIP, l)
		}
		return Teardown(newPod.Path(), "", a)
	})
}

// TestIPv6DeletePodInterfaceReturnsAddress: the pod's IPv6 address, not its
// link-local one, is what DEL learns from the pod interface.
func TestIPv6DeletePodInterfaceReturnsAddress(t *testing.T) {
	_, node := uniqueNetns(t)
	_, pod := uniqueNetns(t)
	a := pod6(0x41, "v6del")
	_ = node.Do(func(ns.NetNS) error {
		if _, err := setup(node, pod, a); err != nil {
			t.Fatal(err)
		}
		got, err := DeletePodInterface(pod.Path(), a.IfName, "")
		if err != nil || !slices.Equal(got, []netip.Addr{a.PodIP}) {
			t.Errorf("DeletePodInterface = %v, %v; want [%v]", got, err, a.PodIP)
		}
		return Teardown("", "", a)
	})
}

func TestIPv6Validate(t *testing.T) {
	ok := pod6(1, "v")
	tests := []struct {
		name string
		a    func(Attachment) Attachment
		want string // "" valid
	}{
		{"primary ENI, eth0", func(a Attachment) Attachment { return a }, ""},
		{"link-local", func(a Attachment) Attachment { a.PodIP = netip.MustParseAddr("fe80::5"); return a }, "not a global"},
		{"ENI table", func(a Attachment) Attachment { a.RouteTable = 2; return a }, "primary ENI"},
		{"second attachment", func(a Attachment) Attachment { a.IfName = "net1"; return a }, "default interface"},
		{"MTU below 1280", func(a Attachment) Attachment { a.MTU = 1279; return a }, "below IPv6's minimum 1280"},
		{"MTU 1280", func(a Attachment) Attachment { a.MTU = 1280; return a }, ""},
	}
	for _, tt := range tests {
		err := tt.a(ok).validate()
		if (tt.want == "" && err != nil) || (tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want))) {
			t.Errorf("%s: validate = %v, want %q", tt.name, err, tt.want)
		}
	}
}
