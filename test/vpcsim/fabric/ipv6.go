package fabric

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// IPv6 addresses served inside the fabric, as seen from every instance
// netns (see the package documentation for the whole scheme).
const (
	// MetadataAddr6 is IMDS's IPv6 address on Nitro instances, and the
	// EC2 API's inside the fabric. It is on the router's loopback.
	MetadataAddr6 = "fd00:ec2::254"
	// IMDSAddr6 and EC2Addr6 are where IMDS (port 80) and the EC2 Query
	// API (port 8080) listen on it inside the router netns.
	IMDSAddr6 = "[" + MetadataAddr6 + "]:80"
	EC2Addr6  = "[" + MetadataAddr6 + "]:8080"
	// IMDSURL6 and EC2URL6 are those endpoints for a client inside an
	// instance netns (IMDSURL6 is the AWS SDKs' default endpoint in
	// AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6).
	IMDSURL6 = "http://[" + MetadataAddr6 + "]"
	EC2URL6  = "http://" + EC2Addr6
)

var (
	metadataIP6 = netip.MustParseAddr(MetadataAddr6)
	// GatewayIPv6 is the VPC router's address on every ENI link: each
	// router end holds it, and each instance's eth0 has its IPv6 default
	// route via it (ip -6 route: default via fe80::1 dev eth0).
	GatewayIPv6 = netip.MustParseAddr("fe80::1")
	// OutsideAddr6 is the outside host's IPv6 address (RFC 3849
	// documentation range), beside OutsideAddr.
	OutsideAddr6   = netip.MustParseAddr("2001:db8::10")
	outsideNet6    = netip.MustParsePrefix("2001:db8::/64")
	outsideRouter6 = netip.MustParseAddr("2001:db8::1")
)

// noDADSysctls turns off IPv6 duplicate address detection in the calling
// thread's netns, for its links and those made later: addresses the fabric
// (or a daemon) adds are usable at once instead of "tentative" for about a
// second. Every fabric netns is the only user of its addresses.
var noDADSysctls = map[string]string{
	"net/ipv6/conf/all/accept_dad":     "0",
	"net/ipv6/conf/default/accept_dad": "0",
}

// routerSysctls6 makes the router netns an IPv6 router that sends no
// router advertisements of its own accord (the kernel never does) and
// accepts none.
var routerSysctls6 = map[string]string{
	"net/ipv6/conf/all/forwarding":     "1",
	"net/ipv6/conf/default/forwarding": "1",
	"net/ipv6/conf/default/accept_ra":  "0",
}

// eui64LinkLocal is the link-local address the kernel derives from mac
// (modified EUI-64, RFC 4291 appendix A): fe80::<mac[0]^2><mac[1]>:<mac[2]>ff:fe<mac[3]>:<mac[4]><mac[5]>.
// The router uses it, with a permanent neighbour entry, as the next hop of
// every IPv6 address and prefix of the ENI with that MAC.
func eui64LinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9], b[10] = mac[0]^0x02, mac[1], mac[2]
	b[11], b[12] = 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}

// addrNoDAD is p as an interface address used at once (IFA_F_NODAD).
func addrNoDAD(p netip.Prefix) *netlink.Addr {
	return &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
}

// setupRouterEnd6 gives a router end the gateway fe80::1/64 and a
// permanent neighbour entry for the ENI's EUI-64 link-local address with
// its MAC: the router then delivers IPv6 to the ENI by MAC, with no
// neighbour discovery, as for IPv4.
func (f *Fabric) setupRouterEnd6(link netlink.Link, mac net.HardwareAddr) error {
	if err := f.rtr.AddrReplace(link, addrNoDAD(netip.PrefixFrom(GatewayIPv6, 64))); err != nil {
		return fmt.Errorf("address %s: %w", GatewayIPv6, err)
	}
	return f.rtr.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V6,
		State: netlink.NUD_PERMANENT, IP: eui64LinkLocal(mac).AsSlice(), HardwareAddr: mac})
}

// configurePrimary6 gives eth0 IPv6 as EC2 does when the ENI's subnet has
// an IPv6 CIDR block (router advertisement and DHCPv6): a default route
// via fe80::1, a route to fd00:ec2::254 via fe80::1 (kept should a daemon
// change the default route), and the ENI's primary IPv6 address (its first
// IPv6 address, if any) as a /128: with no on-link /64 every packet, also
// to the same subnet, goes through the router.
func configurePrimary6(h netlinksafe.Handle, eth0 netlink.Link, eni vpcsim.ENIInfo) error {
	if !eni.SubnetIPv6CIDR.IsValid() {
		return nil
	}
	idx := eth0.Attrs().Index
	routes := []*netlink.Route{
		{LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(metadataIP6, 128)), Gw: GatewayIPv6.AsSlice()},
		{LinkIndex: idx, Dst: ipNet(netip.MustParsePrefix("::/0")), Gw: GatewayIPv6.AsSlice()},
	}
	for _, r := range routes {
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s: %w", r.Dst, GatewayIPv6, err)
		}
	}
	if len(eni.IPv6Addresses) == 0 {
		return nil
	}
	a := netip.PrefixFrom(eni.IPv6Addresses[0], 128)
	if err := h.AddrReplace(eth0, addrNoDAD(a)); err != nil {
		return fmt.Errorf("address %s: %w", a, err)
	}
	return nil
}

// dropPrimary6 removes an unassigned primary IPv6 address from eth0 of the
// instance, as a DHCPv6 client would when its lease is withdrawn.
func dropPrimary6(inst *instance, a netip.Addr) error {
	eth0, err := inst.h.LinkByName("eth0")
	if err != nil {
		return err
	}
	err = inst.h.AddrDel(eth0, addrNoDAD(netip.PrefixFrom(a, 128)))
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("delete %s from eth0 of %s: %w", a, inst.netns, err)
	}
	return nil
}

// setupOutside6 gives the outside link IPv6: 2001:db8::1/64 on the router
// end (its prefix route in the main table: every IPv6 address of the VPC
// reaches the outside host, as EC2 routes IPv6 to an internet gateway
// without NAT) and 2001:db8::10/64 with a default route via 2001:db8::1 on
// the outside host's eth0.
func (f *Fabric) setupOutside6(rtrEnd netlink.Link, h netlinksafe.Handle, eth0 netlink.Link) error {
	if err := f.rtr.AddrReplace(rtrEnd, addrNoDAD(netip.PrefixFrom(outsideRouter6, outsideNet6.Bits()))); err != nil {
		return fmt.Errorf("address %s: %w", outsideRouter6, err)
	}
	if err := h.AddrReplace(eth0, addrNoDAD(netip.PrefixFrom(OutsideAddr6, outsideNet6.Bits()))); err != nil {
		return fmt.Errorf("address %s: %w", OutsideAddr6, err)
	}
	def := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(netip.MustParsePrefix("::/0")), Gw: outsideRouter6.AsSlice()}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route via %s: %w", outsideRouter6, err)
	}
	return nil
}
