package fabric

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcip/vpcip/test/vpcsim"
)

// ENIAttached mirrors an attachment: it creates the instance's netns when
// this is its first ENI, a veth from the router to the instance (instance end
// "eth<device index>" with the ENI's MAC), and a route in the router for the
// ENI's primary address, secondary addresses and prefixes, IPv6 addresses
// and /80 prefixes. The primary ENI (device index 0) is configured as eth0
// (with IPv6 when its subnet has a /64); a secondary ENI is left down and
// unaddressed. Attaching again is harmless; an ENI seen attached to another
// instance is moved.
func (f *Fabric) ENIAttached(instanceID string, eni vpcsim.ENIInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.attachLocked(instanceID, eni); err != nil {
		f.failLocked(fmt.Errorf("fabric: attach %s to %s: %w", eni.ID, instanceID, err))
	}
}

func (f *Fabric) attachLocked(instanceID string, eni vpcsim.ENIInfo) error {
	if f.closed {
		return errors.New("fabric closed")
	}
	mac, err := net.ParseMAC(eni.MAC)
	if err != nil {
		return fmt.Errorf("MAC: %w", err)
	}
	if a, ok := f.enis[eni.ID]; ok && a.instanceID != instanceID {
		if err := f.detachLocked(eni.ID); err != nil {
			return err
		}
	}
	inst, err := f.ensureInstanceLocked(instanceID)
	if err != nil {
		return err
	}
	a, ok := f.enis[eni.ID]
	if !ok {
		if a, err = f.addVethLocked(instanceID, inst, eni, mac); err != nil {
			return err
		}
		f.enis[eni.ID] = a
	}
	if eni.DeviceIndex == 0 {
		if err := configurePrimary(inst.h, eni); err != nil {
			return fmt.Errorf("configure eth0 in %s: %w", inst.netns, err)
		}
		inst.primary = eni.PrimaryIP
		if eni.SubnetIPv6CIDR.IsValid() && len(eni.IPv6Addresses) > 0 {
			a.addr6 = eni.IPv6Addresses[0]
		}
		if f.outside {
			if err := f.allowOutsideLocked(eni.PrimaryIP); err != nil {
				return err
			}
		}
	}
	routes := []netip.Prefix{netip.PrefixFrom(eni.PrimaryIP, 32)}
	for _, ip := range eni.SecondaryIPs {
		routes = append(routes, netip.PrefixFrom(ip, 32))
	}
	routes = append(routes, eni.Prefixes...)
	for _, ip := range eni.IPv6Addresses {
		routes = append(routes, netip.PrefixFrom(ip, 128))
	}
	return f.routeLocked(a, append(routes, eni.IPv6Prefixes...))
}

// ensureInstanceLocked returns the instance's netns, creating it with its
// loopback up.
func (f *Fabric) ensureInstanceLocked(instanceID string) (*instance, error) {
	if inst, ok := f.instances[instanceID]; ok {
		return inst, nil
	}
	name := f.instanceNetnsLocked(instanceID)
	if err := createNetns(name); err != nil {
		return nil, err
	}
	inst := &instance{netns: name}
	err := inst.open()
	if err == nil {
		err = setLoUp(inst.h)
	}
	if err == nil {
		err = inst.sysctls(noDADSysctls)
	}
	if err != nil {
		inst.close()
		deleteNetns(name)
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	f.instances[instanceID] = inst
	return inst, nil
}

func (inst *instance) open() error {
	var err error
	if inst.nsh, err = netns.GetFromPath(netnsPath(inst.netns)); err != nil {
		return err
	}
	inst.h, err = netlinksafe.NewHandleAt(inst.nsh)
	return err
}

// sysctls writes sysctls inside the instance's netns.
func (inst *instance) sysctls(kv map[string]string) error {
	return ns.WithNetNSPath(netnsPath(inst.netns), func(ns.NetNS) error { return writeSysctls(kv) })
}

func (inst *instance) close() {
	inst.h.Close()
	if inst.nsh.IsOpen() {
		inst.nsh.Close()
	}
}

func setLoUp(h netlinksafe.Handle) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

// addVethLocked creates the ENI's veth: the router end, up, with the subnet
// gateway as a /32 (so the router answers ARP for the gateway on every end,
// and sources its own ARP requests from it) and the IPv6 gateway fe80::1,
// and the instance end with the ENI's MAC, created directly inside the
// instance netns.
func (f *Fabric) addVethLocked(instanceID string, inst *instance, eni vpcsim.ENIInfo, mac net.HardwareAddr) (*attached, error) {
	name := f.routerLinkName(eni.ID)
	if old, err := f.rtr.LinkByName(name); err == nil {
		// Left by an attempt that failed half-way: start again.
		if err := f.rtr.LinkDel(old); err != nil {
			return nil, fmt.Errorf("delete stale %s: %w", name, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: name, MTU: ENIMTU, Index: f.routerIndexLocked()},
		PeerName:         fmt.Sprintf("eth%d", eni.DeviceIndex),
		PeerHardwareAddr: mac,
		PeerNamespace:    netlink.NsFd(inst.nsh),
		PeerMTU:          ENIMTU,
	}
	if err := f.rtr.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("add veth %s/%s: %w", name, veth.PeerName, err)
	}
	link, err := f.rtr.LinkByName(name)
	if err == nil {
		err = f.rtrNS.Do(func(ns.NetNS) error { return writeSysctls(routerEndSysctls(name)) })
	}
	if err == nil {
		err = f.rtr.LinkSetUp(link)
	}
	if err == nil && eni.Gateway.IsValid() {
		err = f.rtr.AddrReplace(link, hostAddr(eni.Gateway))
	}
	if err == nil {
		// EC2 delivers to the ENI by its MAC, with no ARP for the addresses
		// it holds (they may sit behind the instance, on pod veths): a
		// permanent neighbour entry for the ENI's primary address, the next
		// hop of every other route to this ENI, does the same.
		err = f.rtr.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: eni.PrimaryIP.AsSlice(), HardwareAddr: mac})
	}
	if err == nil {
		err = f.setupRouterEnd6(link, mac)
	}
	if err != nil {
		f.rtr.LinkDel(veth)
		return nil, fmt.Errorf("router end %s: %w", name, err)
	}
	return &attached{instanceID: instanceID, routerLink: name, primary: eni.PrimaryIP, ll: eui64LinkLocal(mac)}, nil
}

// configurePrimary sets up eth0 as an EC2 instance's DHCP client would: up,
// the primary address with the subnet's mask (which adds the subnet route),
// a default route via the subnet gateway and a route to the metadata
// address; and IPv6 when the subnet has it (configurePrimary6).
func configurePrimary(h netlinksafe.Handle, eni vpcsim.ENIInfo) error {
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return err
	}
	addr := netip.PrefixFrom(eni.PrimaryIP, eni.SubnetCIDR.Bits())
	if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: ipNet(addr)}); err != nil {
		return fmt.Errorf("address %s: %w", addr, err)
	}
	idx := eth0.Attrs().Index
	md := &netlink.Route{LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(metadataIP, 32)), Scope: netlink.SCOPE_LINK}
	if err := h.RouteReplace(md); err != nil {
		return fmt.Errorf("route %s: %w", MetadataAddr, err)
	}
	def := &netlink.Route{LinkIndex: idx, Gw: eni.Gateway.AsSlice()}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("default route via %s: %w", eni.Gateway, err)
	}
	return configurePrimary6(h, eth0, eni)
}

// routeLocked routes each prefix to the ENI's router end, replacing a route
// that pointed elsewhere.
func (f *Fabric) routeLocked(a *attached, ps []netip.Prefix) error {
	link, err := f.rtr.LinkByName(a.routerLink)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if err := f.rtr.RouteReplace(a.route(link, p)); err != nil {
			return fmt.Errorf("route %s dev %s: %w", p, a.routerLink, err)
		}
	}
	return nil
}

// route is the router's route for p to this ENI: the primary address on
// link, everything else via the primary address (resolved by the permanent
// neighbour entry to the ENI's MAC); IPv6 addresses and prefixes via the
// ENI's EUI-64 link-local address (likewise resolved).
func (a *attached) route(link netlink.Link, p netip.Prefix) *netlink.Route {
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipNet(p.Masked())}
	if p.Addr().Is6() {
		r.Gw = a.ll.AsSlice()
		return r
	}
	if p == netip.PrefixFrom(a.primary, 32) || !a.primary.IsValid() {
		r.Scope = netlink.SCOPE_LINK
		return r
	}
	r.Gw = a.primary.AsSlice()
	r.Flags = int(netlink.FLAG_ONLINK)
	return r
}

// AddressesAssigned routes each /32 secondary address or /28 prefix, /128
// IPv6 address or /80 IPv6 prefix to the ENI's router end. It configures no
// address in the instance: a primary IPv6 address assigned after the
// attachment is left to the instance's daemon, as secondary addresses are. An ENI that is not attached has no router end: EC2's
// model keeps the addresses and ENIAttached routes them later.
func (f *Fabric) AddressesAssigned(eniID string, ps []netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.enis[eniID]
	if !ok || f.closed {
		return
	}
	if err := f.routeLocked(a, ps); err != nil {
		f.failLocked(fmt.Errorf("fabric: assign to %s: %w", eniID, err))
	}
}

// AddressesUnassigned removes the routes of these addresses or prefixes to
// the ENI's router end, and the primary IPv6 address from eth0 when the
// fabric put it there. A route already gone, or pointing at another ENI,
// is left alone.
func (f *Fabric) AddressesUnassigned(eniID string, ps []netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.enis[eniID]
	if !ok || f.closed {
		return
	}
	link, err := f.rtr.LinkByName(a.routerLink)
	if err != nil {
		f.failLocked(fmt.Errorf("fabric: unassign from %s: %w", eniID, err))
		return
	}
	for _, p := range ps {
		if err := f.rtr.RouteDel(a.route(link, p)); err != nil && !errors.Is(err, syscall.ESRCH) {
			f.failLocked(fmt.Errorf("fabric: unassign %s from %s: %w", p, eniID, err))
		}
		if a.addr6.IsValid() && p == netip.PrefixFrom(a.addr6, 128) {
			if err := dropPrimary6(f.instances[a.instanceID], a.addr6); err != nil {
				f.failLocked(fmt.Errorf("fabric: unassign %s from %s: %w", p, eniID, err))
			}
			a.addr6 = netip.Addr{}
		}
	}
}

// ENIDetached deletes the ENI's veth, which takes its routes and the
// instance's ethN with it. Detaching an unknown ENI is harmless.
func (f *Fabric) ENIDetached(instanceID string, eniID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if err := f.detachLocked(eniID); err != nil {
		f.failLocked(fmt.Errorf("fabric: detach %s from %s: %w", eniID, instanceID, err))
	}
}

func (f *Fabric) detachLocked(eniID string) error {
	a, ok := f.enis[eniID]
	if !ok {
		return nil
	}
	if err := f.delLinkLocked(a.routerLink); err != nil {
		return err
	}
	delete(f.enis, eniID)
	return nil
}

// delLinkLocked deletes a router link; a missing one is success.
func (f *Fabric) delLinkLocked(name string) error {
	link, err := f.rtr.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return f.rtr.LinkDel(link)
}

// InstanceTerminated removes the instance's ENIs from the router and its
// netns. Terminating an unknown instance is harmless.
func (f *Fabric) InstanceTerminated(instanceID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if err := f.removeInstanceLocked(instanceID); err != nil {
		f.failLocked(fmt.Errorf("fabric: terminate %s: %w", instanceID, err))
	}
}

func (f *Fabric) removeInstanceLocked(instanceID string) error {
	inst, ok := f.instances[instanceID]
	if !ok {
		return nil
	}
	var errs []error
	for id, a := range f.enis {
		if a.instanceID == instanceID {
			errs = append(errs, f.detachLocked(id))
		}
	}
	if inst.primary.IsValid() && f.outside {
		errs = append(errs, f.denyOutsideLocked(inst.primary))
	}
	inst.close()
	errs = append(errs, deleteNetns(inst.netns))
	delete(f.instances, instanceID)
	return errors.Join(errs...)
}
