package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/routing"
)

// PodRoute is one host route to a pod as the node shows it: the plugin's
// "<pod>/32 dev <host veth> scope link" in the main table (docs/design.md §4),
// or in IPv6 mode "<pod>/128 dev <host veth>".
type PodRoute struct {
	Address  netip.Addr // the pod's address (IPv4, or IPv6 in IPv6 mode)
	HostVeth string     // name of the host end of the pod's veth pair
	// Sandbox is the attachment the veth's alias names
	// (routing.SandboxAlias); zero when the veth carries none.
	Sandbox Sandbox
}

// Sandbox is a CNI attachment key as a host veth records it.
type Sandbox struct {
	Network, ContainerID, IfName string
}

// Known reports whether the veth named its sandbox.
func (s Sandbox) Known() bool { return s.ContainerID != "" }

// PodRoutes lists the host routes to pod veths in the current netns:
// main-table routes without a gateway whose device is a veth, with an IPv4
// /32 destination of scope link or an IPv6 /128 destination. Link-local
// destinations (fe80::/10 too) (169.254.0.0/16, such as the instance
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
	sandboxes := map[int]Sandbox{}
	for _, l := range links {
		if l.Type() == "veth" {
			veths[l.Attrs().Index] = l.Attrs().Name
			if n, id, ifn, ok := routing.ParseSandboxAlias(l.Attrs().Alias); ok {
				sandboxes[l.Attrs().Index] = Sandbox{Network: n, ContainerID: id, IfName: ifn}
			}
		}
	}
	var out []PodRoute
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlinksafe.RouteList(nil, family)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			name, ok := veths[r.LinkIndex]
			if !ok || r.Gw != nil {
				continue
			}
			dst, err := toPrefix(r.Dst)
			if err != nil || !podRoute(dst, r.Scope) {
				continue
			}
			out = append(out, PodRoute{Address: dst.Addr(), HostVeth: name, Sandbox: sandboxes[r.LinkIndex]})
		}
	}
	slices.SortFunc(out, func(a, b PodRoute) int { return a.Address.Compare(b.Address) })
	return out, nil
}

// podRoute reports whether a gateway-less main-table route to dst on a veth
// is a pod's: an IPv4 /32 of scope link, or an IPv6 /128 (IPv6 routes have
// no scope; the kernel reports universe), never link-local.
func podRoute(dst netip.Prefix, scope netlink.Scope) bool {
	a := dst.Addr()
	switch {
	case a.IsLinkLocalUnicast() || a.Is4In6():
		return false
	case a.Is4():
		return dst.Bits() == 32 && scope == netlink.SCOPE_LINK
	default:
		return dst.Bits() == 128
	}
}

// LinkExists reports whether the current netns has a link named name. A
// pod's host veth is destroyed with its sandbox's netns, so its absence
// confirms a sandbox is gone. An error other than "not found" is returned:
// the answer is then unknown.
func LinkExists(name string) (bool, error) {
	_, err := netlinksafe.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &nf):
		return false, nil
	default:
		return false, fmt.Errorf("look up link %s: %w", name, err)
	}
}
