package hostnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
	"golang.org/x/sys/unix"
)

// ErrLinkNotFound: no link in the current netns carries the ENI's MAC. After
// EC2 AttachNetworkInterface the link appears asynchronously, so the caller
// retries later.
var ErrLinkNotFound = errors.New("no link with the ENI's MAC")

// eniMu serializes ENI setup within the process, so two concurrent
// EnsureENI calls for one ENI never both find an object missing and race to
// add it (B28).
var eniMu sync.Mutex

// MTU bounds accepted by EnsureENI, in bytes: 576 is the IPv4 minimum
// reassembly size (RFC 791), 9001 the largest MTU EC2 supports.
const (
	MinMTU = 576
	MaxMTU = 9001
)

// rpFilterLoose is the rp_filter value for loose reverse-path filtering
// (kernel Documentation/networking/ip-sysctl.rst): a packet passes if its
// source is reachable by any interface. Pod traffic on secondary ENIs and
// replies steered by connection mark are asymmetric by design (B15).
const rpFilterLoose = "2"

// ENI is one secondary ENI as the node must see it.
type ENI struct {
	MAC          string       // MAC of the ENI ("0a:1b:2c:3d:4e:5f", any case); its link is found by it
	DeviceNumber int          // EC2 attachment device number, ≥ 1; route table routing.TableForDevice(DeviceNumber)
	PrimaryIP    netip.Addr   // the ENI's primary private IPv4 address
	SubnetCIDR   netip.Prefix // IPv4 CIDR of the ENI's subnet
	Gateway      netip.Addr   // subnet gateway, by EC2 convention the subnet's first address + 1
	MTU          int          // link MTU in bytes (AWS_VPC_ENI_MTU), MinMTU..MaxMTU; 0 leaves it as it is
	SysctlNet    string       // the node's net sysctl directory (VPCIP_SYSCTL_NET_DIR); "" is DefaultSysctlNet
}

func (e ENI) validate() error {
	var errs []error
	if _, err := net.ParseMAC(e.MAC); err != nil {
		errs = append(errs, fmt.Errorf("MAC %q: %w", e.MAC, err))
	}
	if e.DeviceNumber < 1 {
		errs = append(errs, fmt.Errorf("device number %d: a secondary ENI has device number ≥ 1", e.DeviceNumber))
	}
	if !e.SubnetCIDR.IsValid() || !e.SubnetCIDR.Addr().Is4() {
		errs = append(errs, fmt.Errorf("subnet CIDR %v: want an IPv4 prefix", e.SubnetCIDR))
	}
	for _, a := range []struct {
		name string
		addr netip.Addr
	}{{"primary IP", e.PrimaryIP}, {"gateway", e.Gateway}} {
		if !a.addr.Is4() {
			errs = append(errs, fmt.Errorf("%s %v: want an IPv4 address", a.name, a.addr))
		} else if e.SubnetCIDR.IsValid() && !e.SubnetCIDR.Contains(a.addr) {
			errs = append(errs, fmt.Errorf("%s %v is outside subnet %v", a.name, a.addr, e.SubnetCIDR))
		}
	}
	if e.MTU != 0 && (e.MTU < MinMTU || e.MTU > MaxMTU) {
		errs = append(errs, fmt.Errorf("MTU %d: want %d..%d bytes", e.MTU, MinMTU, MaxMTU))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ENI %s: %w", e.MAC, err)
	}
	return nil
}

// EnsureENI makes the node side of a secondary ENI match e and returns the
// name of its link. In the current netns it:
//   - finds the link whose MAC is e.MAC (ErrLinkNotFound if none yet),
//   - sets its MTU to e.MTU and brings it up,
//   - sets rp_filter loose (2) on it,
//   - puts e.PrimaryIP/<subnet bits> on it without a prefix route
//     (IFA_F_NOPREFIXROUTE: the subnet route lives in the ENI's table only,
//     so pods on the primary ENI never reach the subnet by this link),
//   - fills the ENI's table (routing.TableForDevice) with exactly "<gateway>/32 scope link",
//     "<subnet> scope link src <primary>" and "default via <gateway>", all on
//     the link, removing any other route there,
//   - adds the rule "from <primary>/32 lookup <table>" at routing.PriorityENI,
//     removing any other rule at that priority for the same table.
//
// Re-running it changes nothing when the host already matches. Bad input
// returns an error naming the field and changes nothing.
func EnsureENI(e ENI) (linkName string, err error) {
	if err := e.validate(); err != nil {
		return "", err
	}
	eniMu.Lock()
	defer eniMu.Unlock()
	link, err := linkByMAC(e.MAC)
	if err != nil {
		return "", err
	}
	name := link.Attrs().Name
	steps := []struct {
		what string
		do   func() error
	}{
		{"set MTU", func() error { return ensureMTU(link, e.MTU) }},
		{"set up", func() error { return ensureUp(link) }},
		{"set rp_filter", func() error { return ensureLooseRPFilter(e.SysctlNet, name) }},
		{"add address", func() error { return ensureENIAddr(link, e) }},
		{"fill route table", func() error { return ensureENIRoutes(link, e) }},
		{"add rule", func() error { return ensureENIRule(e) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return name, fmt.Errorf("ENI %s (%s, device %d): %s: %w", e.MAC, name, e.DeviceNumber, s.what, err)
		}
	}
	return name, nil
}

// RemoveENI undoes EnsureENI for the ENI at e.DeviceNumber: it deletes every
// route in the ENI's table, every rule at routing.PriorityENI that looks up that
// table, and e.PrimaryIP from the link if the link is still there. Link MTU
// and state are left alone (the link usually disappears on detach). What is
// already gone is success, so it is safe before or after EC2
// DetachNetworkInterface.
func RemoveENI(e ENI) error {
	if e.DeviceNumber < 1 {
		return fmt.Errorf("ENI %s: device number %d: a secondary ENI has device number ≥ 1", e.MAC, e.DeviceNumber)
	}
	table := routing.TableForDevice(e.DeviceNumber)
	eniMu.Lock()
	defer eniMu.Unlock()
	var errs []error
	rules, err := eniRules(table)
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range rules {
		if err := netlink.RuleDel(&r); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("delete rule %v: %w", r, err))
		}
	}
	routes, err := tableRoutes(table)
	if err != nil {
		errs = append(errs, err)
	}
	for _, r := range routes {
		if err := netlink.RouteDel(&r); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("delete route %v: %w", r, err))
		}
	}
	if e.PrimaryIP.Is4() {
		link, err := linkByMAC(e.MAC)
		switch {
		case errors.Is(err, ErrLinkNotFound):
		case err != nil:
			errs = append(errs, err)
		default:
			if err := removeAddr(link, e.PrimaryIP); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove ENI %s (device %d): %w", e.MAC, e.DeviceNumber, err)
	}
	return nil
}

// linkByMAC finds the link carrying mac in the current netns.
func linkByMAC(mac string) (netlink.Link, error) {
	want, err := net.ParseMAC(mac)
	if err != nil {
		return nil, fmt.Errorf("MAC %q: %w", mac, err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if strings.EqualFold(l.Attrs().HardwareAddr.String(), want.String()) {
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w %s", ErrLinkNotFound, want)
}

func ensureMTU(link netlink.Link, mtu int) error {
	if mtu == 0 || link.Attrs().MTU == mtu {
		return nil
	}
	return netlink.LinkSetMTU(link, mtu)
}

func ensureUp(link netlink.Link) error {
	if link.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	return netlink.LinkSetUp(link)
}

// DefaultSysctlNet is where the kernel shows the calling process's
// network namespace's net.* sysctls.
const DefaultSysctlNet = "/proc/sys/net"

// ensureLooseRPFilter sets net.ipv4.conf.<link>.rp_filter to loose, through
// dir ("" is DefaultSysctlNet: a container that is not privileged has it
// read-only, so the chart mounts the host's /proc/sys/net elsewhere; the
// files under it always show the writer's own netns). The kernel uses the
// larger of conf.all and conf.<link>, so 2 is loose whatever the
// distribution's default for all.
func ensureLooseRPFilter(dir, linkName string) error {
	return ensureLinkSysctl(dir, "ipv4", linkName, "rp_filter", rpFilterLoose)
}

// ensureLinkSysctl sets net.<family>.conf.<link>.<key> to value through
// dir ("" is DefaultSysctlNet); a file already holding value is not
// written. Errors name the link or the file.
func ensureLinkSysctl(dir, family, linkName, key, value string) error {
	if dir == "" {
		dir = DefaultSysctlNet
	}
	if strings.ContainsAny(linkName, "/") || linkName == "" || linkName == "." || linkName == ".." {
		return fmt.Errorf("link name %q", linkName)
	}
	file := filepath.Join(dir, family, "conf", linkName, key)
	if v, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(v)) == value {
		return nil
	}
	if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}

// acceptRAWithForwarding is accept_ra's value that keeps router
// advertisements in effect while IPv6 forwarding is on (the kernel's
// ip-sysctl documentation: 2 "overrule forwarding behaviour").
const acceptRAWithForwarding = "2"

// EnsureAcceptRA sets net.ipv6.conf.<link>.accept_ra to 2 through dir (""
// is DefaultSysctlNet, as for rp_filter): an IPv6-mode node forwards IPv6
// for its pods (the plugin turns conf.all.forwarding on), which makes the
// kernel ignore router advertisements on links with accept_ra=1, and the
// node's uplink (the primary ENI) would lose its RA-learned default route
// when it expires. Already 2 writes nothing; errors name the file.
func EnsureAcceptRA(dir, linkName string) error {
	return ensureLinkSysctl(dir, "ipv6", linkName, "accept_ra", acceptRAWithForwarding)
}

// ensureENIAddr puts the ENI's primary address on its link, replacing the
// same address with another prefix length.
func ensureENIAddr(link netlink.Link, e ENI) error {
	want := netip.PrefixFrom(e.PrimaryIP, e.SubnetCIDR.Bits())
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		p, err := toPrefix(a.IPNet)
		if err != nil || p.Addr() != e.PrimaryIP {
			continue
		}
		if p.Bits() == want.Bits() && a.Flags&unix.IFA_F_NOPREFIXROUTE != 0 {
			return nil
		}
		if err := netlink.AddrDel(link, &a); err != nil && !isGone(err) {
			return err
		}
	}
	err = netlink.AddrAdd(link, &netlink.Addr{
		IPNet: &net.IPNet{IP: net.IP(e.PrimaryIP.AsSlice()), Mask: net.CIDRMask(want.Bits(), 32)},
		Flags: unix.IFA_F_NOPREFIXROUTE,
	})
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("address %v exists on %s with other attributes: %w", want, link.Attrs().Name, err)
	}
	return err
}

func removeAddr(link netlink.Link, a netip.Addr) error {
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, x := range addrs {
		if toAddr(x.IP) == a {
			if err := netlink.AddrDel(link, &x); err != nil && !isGone(err) {
				return fmt.Errorf("delete address %v: %w", a, err)
			}
		}
	}
	return nil
}

// eniRoutes is the spec of an ENI's route table.
func eniRoutes(link netlink.Link, e ENI) []netlink.Route {
	idx, table := link.Attrs().Index, routing.TableForDevice(e.DeviceNumber)
	return []netlink.Route{
		{LinkIndex: idx, Table: table, Scope: netlink.SCOPE_LINK, Dst: hostPrefix(e.Gateway)},
		{LinkIndex: idx, Table: table, Scope: netlink.SCOPE_LINK, Dst: ipNet(e.SubnetCIDR), Src: net.IP(e.PrimaryIP.AsSlice())},
		{LinkIndex: idx, Table: table, Scope: netlink.SCOPE_UNIVERSE, Gw: net.IP(e.Gateway.AsSlice())},
	}
}

// sameRoute compares the fields eniRoutes sets.
func sameRoute(a, b netlink.Route) bool {
	pa, _ := toPrefix(a.Dst)
	pb, _ := toPrefix(b.Dst)
	return pa == pb && a.LinkIndex == b.LinkIndex && a.Table == b.Table && a.Scope == b.Scope &&
		toAddr(a.Gw) == toAddr(b.Gw) && toAddr(a.Src) == toAddr(b.Src)
}

// ensureENIRoutes makes the ENI's table hold exactly eniRoutes: missing or
// different routes are replaced (RouteReplace), then whatever else the table
// holds, read again, is deleted. Reading again matters: a replaced route's
// old version is gone already, and deleting it by its old attributes could
// match the new one (the kernel treats attributes left out of a delete as
// wildcards). The gateway /32 comes first so the default route's gateway is
// always reachable.
func ensureENIRoutes(link netlink.Link, e ENI) error {
	want := eniRoutes(link, e)
	table := routing.TableForDevice(e.DeviceNumber)
	have, err := tableRoutes(table)
	if err != nil {
		return err
	}
	changed := false
	for _, w := range want {
		if containsRoute(have, w) {
			continue
		}
		if err := netlink.RouteReplace(&w); err != nil {
			return fmt.Errorf("replace route %v: %w", w, err)
		}
		changed = true
	}
	if changed {
		if have, err = tableRoutes(table); err != nil {
			return err
		}
	}
	for _, h := range have {
		if containsRoute(want, h) {
			continue
		}
		if err := netlink.RouteDel(&h); err != nil && !isGone(err) {
			return fmt.Errorf("delete stale route %v: %w", h, err)
		}
	}
	return nil
}

func containsRoute(rs []netlink.Route, r netlink.Route) bool {
	for _, x := range rs {
		if sameRoute(x, r) {
			return true
		}
	}
	return false
}

// tableRoutes lists the IPv4 routes of one table.
func tableRoutes(table int) ([]netlink.Route, error) {
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes of table %d: %w", table, err)
	}
	return rs, nil
}

// eniRules lists the IPv4 rules at routing.PriorityENI that look up table.
func eniRules(table int) ([]netlink.Rule, error) {
	rs, err := netlinksafe.RuleListFiltered(netlink.FAMILY_V4,
		&netlink.Rule{Priority: routing.PriorityENI, Table: table}, netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list rules of table %d: %w", table, err)
	}
	return rs, nil
}

// ensureENIRule keeps exactly one rule at routing.PriorityENI for the ENI's table,
// "from <primary>/32 lookup <table>"; rules there for the same table with
// another source (a former ENI at this device number) are deleted.
func ensureENIRule(e ENI) error {
	table := routing.TableForDevice(e.DeviceNumber)
	have, err := eniRules(table)
	if err != nil {
		return err
	}
	want := netlink.NewRule()
	want.Family = netlink.FAMILY_V4
	want.Priority = routing.PriorityENI
	want.Table = table
	want.Src = hostPrefix(e.PrimaryIP)
	return keepOneRule(have, want, func(r netlink.Rule) bool {
		src, _ := toPrefix(r.Src)
		return src == netip.PrefixFrom(e.PrimaryIP, 32) && r.Mark == 0 && r.Dst == nil && r.IifName == "" && r.OifName == ""
	})
}

// keepOneRule leaves the first rule of have that is the wanted one, deletes
// every other (stale specs at the same priority), and adds want when none
// matched. "Exists" from the kernel is success: the rule is the spec.
func keepOneRule(have []netlink.Rule, want *netlink.Rule, matches func(netlink.Rule) bool) error {
	found := false
	for _, r := range have {
		if !found && matches(r) {
			found = true
			continue
		}
		if err := netlink.RuleDel(&r); err != nil && !isGone(err) {
			return fmt.Errorf("delete stale rule %v: %w", r, err)
		}
	}
	if found {
		return nil
	}
	if err := netlink.RuleAdd(want); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// isGone reports whether a delete failed only because the object is
// already absent.
func isGone(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENODEV)
}
