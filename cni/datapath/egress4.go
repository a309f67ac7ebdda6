package datapath

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/routing"
)

// IPv4 egress of IPv6 pods (docs/design.md §4, the reference's
// ENABLE_V4_EGRESS in IPv6 mode). An IPv6 pod also gets one node-local
// IPv4 address of Egress4Range, used only to reach IPv4 destinations: the
// node SNATs it to its own address (egress4_snat.go), so nothing outside
// the node ever sees it and every node reuses the same range. Per pod:
//
//	pod netns:  <egress>/32 on CNI_IFNAME, 169.254.1.1 scope link,
//	            default via 169.254.1.1, permanent neighbour 169.254.1.1 → host veth MAC
//	            (the IPv4 datapath's gateway scheme, setupPodSide)
//	node netns: <egress>/32 dev <hostVeth> scope link in the main table,
//	            permanent neighbour <egress> → pod interface MAC on the host veth
//
// A /32 rather than the range's /22 on the pod interface: with a /22 the
// pod would take every other pod's egress address as on-link and ARP for
// it on its veth, where nobody answers; with a /32 all IPv4 leaves by the
// gateway as in the IPv4 datapath. No policy rules: the address is routed
// by the main table alone and never leaves the node unSNATed.

// Egress4Range is the node-local range IPv6 pods' IPv4 egress addresses are
// taken from (the reference's choice): link-local, so no VPC route or
// other node ever knows it.
var Egress4Range = netip.MustParsePrefix("169.254.172.0/22")

// IsEgress4 reports whether a is in Egress4Range: an IPv6 pod's IPv4
// egress address, never a pod address the daemon assigns.
func IsEgress4(a netip.Addr) bool { return Egress4Range.Contains(a.Unmap()) }

func (a Attachment) validateEgress4() error {
	switch {
	case !a.Egress4.IsValid():
		return nil
	case !a.PodIP.Is6():
		return fmt.Errorf("IPv4 egress address %v for IPv4 pod address %v: only IPv6 pods get one", a.Egress4, a.PodIP)
	case !IsEgress4(a.Egress4):
		return fmt.Errorf("IPv4 egress address %v is not in %v", a.Egress4, Egress4Range)
	}
	return nil
}

// configureEgress4 wires a.Egress4 (see above) on both ends of the veth.
func (s *Session) configureEgress4(a Attachment, hostLink netlink.Link) error {
	v4 := a
	v4.PodIP = a.Egress4
	if err := setupPodSide(s.pod, v4, hostLink.Attrs().HardwareAddr); err != nil {
		return fmt.Errorf("IPv4 egress: %w", err)
	}
	podLink, err := s.pod.LinkByName(a.IfName)
	if err != nil {
		return fmt.Errorf("find pod interface %s: %w", a.IfName, err)
	}
	if err := ensureForwarding(); err != nil {
		return err
	}
	idx := hostLink.Attrs().Index
	r := &netlink.Route{LinkIndex: idx, Dst: host32(a.Egress4), Scope: netlink.SCOPE_LINK, Table: routing.MainTable}
	if err := s.host.RouteReplace(r); err != nil {
		return fmt.Errorf("add host route %v/32 dev %s: %w", a.Egress4, a.HostVeth, err)
	}
	neigh := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.IP(a.Egress4.AsSlice()), HardwareAddr: podLink.Attrs().HardwareAddr}
	if err := s.host.NeighSet(neigh); err != nil {
		return fmt.Errorf("add permanent neighbour %v lladdr %v dev %s: %w", a.Egress4, podLink.Attrs().HardwareAddr, a.HostVeth, err)
	}
	return nil
}

// checkEgress4 is Check's part for a.Egress4: the host /32 route (host may
// be nil: the veth is missing) and the pod's address, gateway routes and
// neighbour read through h.
func checkEgress4(h netlinksafe.Handle, a Attachment, host, pod netlink.Link, hostMAC net.HardwareAddr) []error {
	v4 := a
	v4.PodIP = a.Egress4
	var p []error
	if host != nil {
		p = append(p, checkHostRoute(v4, host)...)
	}
	for _, err := range checkPodSide(h, v4, pod, hostMAC) {
		p = append(p, fmt.Errorf("IPv4 egress: %w", err))
	}
	return p
}
