package hostnet

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// PodRoute is one host route to a pod as the node shows it: the plugin's
// "<pod>/32 dev <host veth> scope link" in the main table (docs/design.md §4).
type PodRoute struct {
	Address  netip.Addr // the pod's IPv4 address
	HostVeth string     // name of the host end of the pod's veth pair
}

// PodRoutes lists the host routes to pod veths in the current netns: IPv4
// main-table routes with a /32 destination, scope link, whose device is a
// veth. Link-local destinations (169.254.0.0/16, such as the instance
// metadata address routed on-link where ENIs are veths, as under vpcsim) are
// never pod addresses and are left out. Sorted by address. Reconciliation reads it as "what the node shows":
// an assigned address without a route has lost its pod (the netns went away
// and took the veth with it).
func PodRoutes() ([]PodRoute, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	veths := map[int]string{}
	for _, l := range links {
		if l.Type() == "veth" {
			veths[l.Attrs().Index] = l.Attrs().Name
		}
	}
	routes, err := netlinksafe.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []PodRoute
	for _, r := range routes {
		name, ok := veths[r.LinkIndex]
		if !ok || r.Scope != netlink.SCOPE_LINK || r.Gw != nil {
			continue
		}
		dst, err := toPrefix(r.Dst)
		if err != nil || dst.Bits() != 32 || !dst.Addr().Is4() || dst.Addr().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, PodRoute{Address: dst.Addr(), HostVeth: name})
	}
	slices.SortFunc(out, func(a, b PodRoute) int { return a.Address.Compare(b.Address) })
	return out, nil
}

// RemovePodRules deletes the plugin's policy rules for a pod address that no
// pod holds any more: "to <addr>/32" at PriorityToPod and "from <addr>/32" at
// PriorityFromPod (whatever table). The daemon calls it when it releases an
// address whose pod vanished without a DEL (the netns took the veth and host
// route with it, but rules live in the node netns until someone deletes
// them). It returns how many rules it deleted; none found is success.
func RemovePodRules(addr netip.Addr) (int, error) {
	if !addr.Is4() {
		return 0, fmt.Errorf("pod address %v is not IPv4", addr)
	}
	rs, err := netlinksafe.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("list rules: %w", err)
	}
	host := netip.PrefixFrom(addr, 32)
	n := 0
	for _, r := range rs {
		var match bool
		switch r.Priority {
		case PriorityToPod:
			dst, err := toPrefix(r.Dst)
			match = err == nil && dst == host
		case PriorityFromPod:
			src, err := toPrefix(r.Src)
			match = err == nil && src == host
		}
		if !match {
			continue
		}
		if err := netlink.RuleDel(&r); err != nil && !isGone(err) {
			return n, fmt.Errorf("delete rule %v: %w", r, err)
		}
		n++
	}
	return n, nil
}

// PodRuleAddresses lists the pod addresses the node has per-pod policy rules
// for (the plugin's PriorityToPod "to" and PriorityFromPod "from" rules),
// sorted and without repeats. Reconciliation removes those of addresses no
// pod holds: leftovers of pods that vanished without a DEL (docs/design.md
// §4; docs/field-failures.md B13).
func PodRuleAddresses() ([]netip.Addr, error) {
	rs, err := netlinksafe.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	seen := map[netip.Addr]bool{}
	for _, r := range rs {
		var p netip.Prefix
		switch r.Priority {
		case PriorityToPod:
			p, err = toPrefix(r.Dst)
		case PriorityFromPod:
			p, err = toPrefix(r.Src)
		default:
			continue
		}
		if err == nil && p.Bits() == 32 && p.Addr().Is4() {
			seen[p.Addr()] = true
		}
	}
	out := make([]netip.Addr, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}
