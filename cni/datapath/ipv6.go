package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/routing"
)

// The IPv6 datapath (the daemon's IPv6 mode, the reference's
// ENABLE_IPv6=true: each pod one address of a /80 prefix delegated to the
// node's primary ENI). Per pod:
//
//	pod netns:  <podIP>/128 on CNI_IFNAME (nodad), default via fe80::1 dev CNI_IFNAME,
//	            permanent neighbour fe80::1 → host veth MAC
//	node netns: <podIP>/128 dev <hostVeth> in the main table,
//	            permanent neighbour <podIP> → pod interface MAC on the host veth
//
// No policy rules: every IPv6 pod address lives on the primary ENI, whose
// routes are the main table's, and there is no SNAT mark to steer (the
// pod's own address is routable in the VPC); the IPv4 rules at 512 and 1536
// exist to keep traffic to and from secondary-ENI addresses off the ENI
// tables, which IPv6 pods never use.
//
// Both neighbours are permanent so that no neighbour discovery runs on the
// veth: the host veth's own link-local address is tentative for a second
// after it comes up (duplicate address detection), and until then the
// kernel sends no solicitation through it (ndisc_send_ns needs a usable
// link-local source), so a pod's first second would be unreachable from
// the node. With both entries fixed, the pod is reachable as soon as ADD
// returns, whatever the node's accept_dad.

// GatewayIPv6 is the link-local next hop of every IPv6 pod, as Gateway is
// of IPv4 ones: a permanent neighbour in the pod holds the host veth's MAC,
// so no address is needed on the host. A link-local gateway needs no route
// to itself (the kernel takes a link-local next hop on the named device).
var GatewayIPv6 = netip.MustParseAddr("fe80::1")

// podAddr6 reports whether a can be an IPv6 pod address: unicast and not
// link-local (fe80::/10 is the veth's own).
func podAddr6(a netip.Addr) bool {
	return a.Is6() && !a.Is4In6() && a.IsGlobalUnicast() && !a.IsLinkLocalUnicast()
}

func (a Attachment) validate6() error {
	switch {
	case !podAddr6(a.PodIP):
		return fmt.Errorf("IPv6 pod address %v is not a global or unique-local unicast address", a.PodIP)
	case a.RouteTable != 0:
		// IPv6 mode assigns from the primary ENI's prefix only.
		return fmt.Errorf("IPv6 pod address %v on route table %d: IPv6 addresses live on the primary ENI (table 0)", a.PodIP, a.RouteTable)
	case a.MTU > 0 && a.MTU < ipv6MinMTU:
		// The kernel turns IPv6 off on a link below it (RFC 8200 §5).
		return fmt.Errorf("MTU %d is below IPv6's minimum %d for pod address %v", a.MTU, ipv6MinMTU, a.PodIP)
	case a.IfName != DefaultIfName:
		// A second attachment would need a source rule in the pod, which
		// routing.AttachmentRule defines for IPv4 only.
		return fmt.Errorf("IPv6 pod address %v on %s: IPv6 is wired on the pod's default interface (%s) only", a.PodIP, a.IfName, DefaultIfName)
	}
	return nil
}

// ipv6MinMTU is IPv6's minimum link MTU in bytes (RFC 8200 §5).
const ipv6MinMTU = 1280

// configure6 is Session.Configure for an IPv6 attachment.
func (s *Session) configure6(a Attachment, hostLink netlink.Link) (Wired, error) {
	podLink, err := setupPodSide6(s.pod, a, hostLink.Attrs().HardwareAddr)
	if err != nil {
		return Wired{}, err
	}
	if err := setupHostSide6(s.host, a, hostLink, podLink.Attrs().HardwareAddr); err != nil {
		return Wired{}, err
	}
	if a.Egress4.IsValid() {
		if err := s.configureEgress4(a, hostLink); err != nil {
			return Wired{}, err
		}
	}
	return readBack(s.host, s.pod, a)
}

// setupPodSide6 configures the pod end of an IPv6 attachment: MTU, up,
// /128 without duplicate address detection (so it is usable at once, not
// tentative for a second), default route via GatewayIPv6, permanent
// neighbour. It returns the pod link.
func setupPodSide6(pod netlinksafe.Handle, a Attachment, hostMAC net.HardwareAddr) (netlink.Link, error) {
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		return nil, fmt.Errorf("find pod interface %s: %w", a.IfName, err)
	}
	if link.Attrs().MTU != a.MTU {
		if err := pod.LinkSetMTU(link, a.MTU); err != nil {
			return nil, fmt.Errorf("set %s MTU %d: %w", a.IfName, a.MTU, err)
		}
	}
	if err := pod.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", a.IfName, err)
	}
	addr := &netlink.Addr{IPNet: hostNet(a.PodIP), Flags: unix.IFA_F_NODAD}
	if err := pod.AddrReplace(link, addr); err != nil {
		if errors.Is(err, unix.EACCES) {
			err = fmt.Errorf("%w (IPv6 disabled on the interface: net.ipv6.conf.%s.disable_ipv6=1 in the pod netns)", err, a.IfName)
		}
		return nil, fmt.Errorf("add %v/128 to %s: %w", a.PodIP, a.IfName, err)
	}
	idx := link.Attrs().Index
	gw := net.IP(GatewayIPv6.AsSlice())
	def := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		Gw: gw, Table: routing.MainTable}
	if err := pod.RouteReplace(def); err != nil {
		return nil, fmt.Errorf("add default route via %v dev %s: %w", GatewayIPv6, a.IfName, err)
	}
	neigh := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: gw, HardwareAddr: hostMAC}
	if err := pod.NeighSet(neigh); err != nil {
		return nil, fmt.Errorf("add permanent neighbour %v lladdr %v dev %s: %w", GatewayIPv6, hostMAC, a.IfName, err)
	}
	return link, nil
}

// setupHostSide6 runs in the node netns: MTU, IPv6 forwarding, the /128
// route and the permanent neighbour of the pod address.
func setupHostSide6(h netlinksafe.Handle, a Attachment, host netlink.Link, podMAC net.HardwareAddr) error {
	if host.Attrs().MTU != a.MTU {
		if err := h.LinkSetMTU(host, a.MTU); err != nil {
			return fmt.Errorf("set %s MTU %d: %w", a.HostVeth, a.MTU, err)
		}
	}
	if err := ensureSysctl(ipv6Forward, "1", "IPv6 forwarding"); err != nil {
		return err
	}
	// A node with net.ipv6.conf.default.disable_ipv6=1 creates the host
	// veth without IPv6, and the kernel refuses a route through it
	// (EACCES).
	if err := ensureSysctl("/proc/sys/net/ipv6/conf/"+a.HostVeth+"/disable_ipv6", "0", "IPv6 on "+a.HostVeth); err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: hostNet(a.PodIP), Table: routing.MainTable}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("add host route %v/128 dev %s: %w", a.PodIP, a.HostVeth, err)
	}
	neigh := &netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT,
		IP: net.IP(a.PodIP.AsSlice()), HardwareAddr: podMAC}
	if err := h.NeighSet(neigh); err != nil {
		return fmt.Errorf("add permanent neighbour %v lladdr %v dev %s: %w", a.PodIP, podMAC, a.HostVeth, err)
	}
	return nil
}

// ipv6Forward is the node's IPv6 forwarding switch. Writing "1" to "all"
// turns forwarding on for every interface, which makes the kernel ignore
// router advertisements on interfaces with accept_ra=1: the node's own
// RA-learned default route must be kept by accept_ra=2 on its uplink (the
// daemon's host setup in IPv6 mode, as the reference does).
const ipv6Forward = "/proc/sys/net/ipv6/conf/all/forwarding"

// ensureSysctl sets the sysctl file at path (in the calling thread's
// netns) to value unless it already holds it, so the common case writes
// nothing; what names it in the error.
func ensureSysctl(path, value, what string) error {
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("enable %s: %w", what, err)
	}
	return nil
}

// check6 is the address-family part of Check for an IPv6 attachment: the
// host route and neighbour (host may be nil: the veth is missing), and the
// pod side through h, a socket in the pod netns.
func checkHost6(a Attachment, host, pod netlink.Link) []error {
	var p []error
	routes, err := hostRoutes(a.PodIP)
	if err != nil {
		return []error{err}
	}
	routed := false
	for _, r := range routes {
		if r.LinkIndex == host.Attrs().Index && r.Gw == nil {
			routed = true
		}
	}
	if !routed {
		p = append(p, fmt.Errorf("host route %v/128 dev %s missing", a.PodIP, a.HostVeth))
	}
	var podMAC net.HardwareAddr
	if pod != nil {
		podMAC = pod.Attrs().HardwareAddr
	}
	return append(p, checkNeighbour6(netlinksafe.Handle{Handle: &netlink.Handle{}}, "host veth "+a.HostVeth, host, a.PodIP, podMAC)...)
}

// checkPod6 reads the pod side of an IPv6 attachment through h.
func checkPod6(h netlinksafe.Handle, a Attachment, pod netlink.Link, hostMAC net.HardwareAddr) []error {
	var p []error
	addrs, err := h.AddrList(pod, netlink.FAMILY_V6)
	if err != nil {
		return []error{fmt.Errorf("list addresses of %s: %w", a.IfName, err)}
	}
	found := false
	for _, ad := range addrs {
		if got, ok := hostAddrOf(ad.IPNet); ok && got == a.PodIP {
			found = true
			if ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
				p = append(p, fmt.Errorf("address %v/128 on pod interface %s is tentative or failed duplicate address detection (flags %#x)", a.PodIP, a.IfName, ad.Flags))
			}
		}
	}
	if !found {
		p = append(p, fmt.Errorf("address %v/128 missing on pod interface %s", a.PodIP, a.IfName))
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: pod.Attrs().Index, Table: routing.MainTable},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return append(p, fmt.Errorf("list routes of %s: %w", a.IfName, err))
	}
	defRoute := false
	for _, r := range routes {
		gw, ok := netip.AddrFromSlice(r.Gw)
		if ok && gw == GatewayIPv6 && (r.Dst == nil || r.Dst.String() == "::/0") {
			defRoute = true
		}
	}
	if !defRoute {
		p = append(p, fmt.Errorf("pod default route via %v dev %s missing", GatewayIPv6, a.IfName))
	}
	return append(p, checkNeighbour6(h, "pod interface "+a.IfName, pod, GatewayIPv6, hostMAC)...)
}

// checkNeighbour6 wants a permanent neighbour ip → mac (any MAC when mac is
// nil) on link, read through h.
func checkNeighbour6(h netlinksafe.Handle, what string, link netlink.Link, ip netip.Addr, mac net.HardwareAddr) []error {
	neighs, err := h.NeighList(link.Attrs().Index, netlink.FAMILY_V6)
	if err != nil {
		return []error{fmt.Errorf("list neighbours of %s: %w", what, err)}
	}
	for _, n := range neighs {
		got, ok := netip.AddrFromSlice(n.IP)
		if !ok || got != ip {
			continue
		}
		switch {
		case n.State&netlink.NUD_PERMANENT == 0:
			return []error{fmt.Errorf("neighbour %v on %s is not permanent", ip, what)}
		case mac != nil && !bytes.Equal(n.HardwareAddr, mac):
			return []error{fmt.Errorf("neighbour %v on %s is %v, want %v", ip, what, n.HardwareAddr, mac)}
		}
		return nil
	}
	return []error{fmt.Errorf("permanent neighbour %v on %s missing", ip, what)}
}
