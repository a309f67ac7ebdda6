package fabric

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The outside host stands for the internet (RFC 5737 documentation range).
var (
	OutsideAddr   = netip.MustParseAddr("203.0.113.10")
	outsideNet    = netip.MustParsePrefix("203.0.113.0/24")
	outsideRouter = netip.MustParseAddr("203.0.113.1")
)

const (
	// outsideTable holds the only route to the outside host; rules send
	// packets from instances' primary addresses there.
	outsideTable = 203
	// outsideRulePriority is the priority of those rules, before main.
	outsideRulePriority = 100
)

// OutsideNetns returns the name of the outside host's netns
// ("<prefix>-out"), which exists once EnableOutsideHost succeeded.
func (f *Fabric) OutsideNetns() string { return f.outsideNetns() }

func (f *Fabric) outsideNetns() string { return f.prefix + "-out" }

// EnableOutsideHost adds netns "<prefix>-out" with address 203.0.113.10
// (and 2001:db8::10, see setupOutside6), linked to the router, and returns
// the IPv4 address. Only the primary address
// of an instance's primary ENI reaches it, as on EC2 only that address is
// NATed to the instance's public address: the router's main table holds a
// blackhole route for 203.0.113.0/24, and a rule per primary address (from
// <primary> to 203.0.113.0/24, priority 100) selects table 203, which holds
// the real route. Replies and connections from the outside host to any
// routed address of the VPC are forwarded. Calling it again is harmless.
func (f *Fabric) EnableOutsideHost() (netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return netip.Addr{}, errors.New("fabric: outside host: closed")
	}
	if f.outside {
		return OutsideAddr, nil
	}
	if err := f.addOutsideLocked(); err != nil {
		deleteNetns(f.outsideNetns())
		f.delLinkLocked(f.prefix + "out")
		return netip.Addr{}, fmt.Errorf("fabric: outside host: %w", err)
	}
	f.outside = true
	for _, inst := range f.instances {
		if inst.primary.IsValid() {
			if err := f.allowOutsideLocked(inst.primary); err != nil {
				return netip.Addr{}, fmt.Errorf("fabric: outside host: %w", err)
			}
		}
	}
	return OutsideAddr, nil
}

func (f *Fabric) addOutsideLocked() error {
	name := f.outsideNetns()
	if err := createNetns(name); err != nil {
		return err
	}
	out := &instance{netns: name}
	if err := out.open(); err != nil {
		return err
	}
	defer out.close()
	if err := out.sysctls(noDADSysctls); err != nil {
		return err
	}
	link := f.prefix + "out"
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: link, MTU: 1500, Index: f.routerIndexLocked()},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(out.nsh),
	}
	if err := f.rtr.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", link, err)
	}
	if err := f.setupOutsideRouterEnd(link); err != nil {
		return err
	}
	if err := setupOutsideHost(out.h); err != nil {
		return err
	}
	rtrEnd, err := f.rtr.LinkByName(link)
	if err != nil {
		return err
	}
	eth0, err := out.h.LinkByName("eth0")
	if err != nil {
		return err
	}
	return f.setupOutside6(rtrEnd, out.h, eth0)
}

// setupOutsideRouterEnd addresses the router end without a prefix route, so
// that 203.0.113.0/24 is reachable through table 203 only, and turns off
// the ENI checks the router ends inherit: this link is not an ENI.
func (f *Fabric) setupOutsideRouterEnd(name string) error {
	err := f.rtrNS.Do(func(ns.NetNS) error {
		return writeSysctls(map[string]string{
			"net/ipv4/conf/" + name + "/rp_filter": "0",
			"net/ipv4/conf/" + name + "/proxy_arp": "0",
		})
	})
	if err != nil {
		return err
	}
	link, err := f.rtr.LinkByName(name)
	if err != nil {
		return err
	}
	if err := f.rtr.LinkSetUp(link); err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(outsideRouter, outsideNet.Bits())), Flags: unix.IFA_F_NOPREFIXROUTE}
	if err := f.rtr.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s: %w", outsideRouter, err)
	}
	routes := []*netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: ipNet(outsideNet), Scope: netlink.SCOPE_LINK, Table: outsideTable},
		{Dst: ipNet(outsideNet), Type: unix.RTN_BLACKHOLE},
	}
	for _, r := range routes {
		if err := f.rtr.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s table %d: %w", r.Dst, r.Table, err)
		}
	}
	return nil
}

// setupOutsideHost configures eth0 of the outside host: 203.0.113.10/24 and a
// default route via the router.
func setupOutsideHost(h netlinksafe.Handle) error {
	if err := setLoUp(h); err != nil {
		return err
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(OutsideAddr, outsideNet.Bits()))}
	if err := h.AddrReplace(eth0, addr); err != nil {
		return err
	}
	return h.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: outsideRouter.AsSlice()})
}

// outsideRule is the rule letting a primary address reach the outside host.
func outsideRule(primary netip.Addr) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	r.Priority = outsideRulePriority
	r.Src = ipNet(netip.PrefixFrom(primary, 32))
	r.Dst = ipNet(outsideNet)
	r.Table = outsideTable
	return r
}

func (f *Fabric) allowOutsideLocked(primary netip.Addr) error {
	r := outsideRule(primary)
	f.rtr.RuleDel(r) // idempotent: at most one such rule
	if err := f.rtr.RuleAdd(r); err != nil {
		return fmt.Errorf("rule from %s to %s: %w", primary, outsideNet, err)
	}
	return nil
}

func (f *Fabric) denyOutsideLocked(primary netip.Addr) error {
	if err := f.rtr.RuleDel(outsideRule(primary)); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete rule from %s: %w", primary, err)
	}
	return nil
}
