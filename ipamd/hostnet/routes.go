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
// "<pod>/32 dev <host veth> scope link" in the main table (docs/design.md §4).
type PodRoute struct {
	Address  netip.Addr // the pod's IPv4 address
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
	sandboxes := map[int]Sandbox{}
	for _, l := range links {
		if l.Type() == "veth" {
			veths[l.Attrs().Index] = l.Attrs().Name
			if n, id, ifn, ok := routing.ParseSandboxAlias(l.Attrs().Alias); ok {
				sandboxes[l.Attrs().Index] = Sandbox{Network: n, ContainerID: id, IfName: ifn}
			}
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
		out = append(out, PodRoute{Address: dst.Addr(), HostVeth: name, Sandbox: sandboxes[r.LinkIndex]})
	}
	slices.SortFunc(out, func(a, b PodRoute) int { return a.Address.Compare(b.Address) })
	return out, nil
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
