package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
	"golang.org/x/sys/unix"
)

// ErrNetnsGone is wrapped by DeletePodInterface when the netns path does not
// exist or is not a network namespace: nothing inside is left to clean up.
var ErrNetnsGone = errors.New("pod netns is gone")

// ErrNotNetns is wrapped by OpenNetns when the path is a namespace of
// another kind (a runtime's bug: /proc/<pid>/ns/uts passes ns.GetNS, which
// checks only for nsfs, and then fails every setns into it).
var ErrNotNetns = errors.New("not a network namespace")

// OpenNetns opens the network namespace at path: ns.GetNS, then the
// kernel's word that it is one (ioctl NS_GET_NSTYPE, Linux 4.11; a kernel
// without it is taken at GetNS's word). Errors wrap ns.NSPathNotExistErr or
// ns.NSPathNotNSErr (GetNS's), ErrNotNetns, or the failure to open it.
func OpenNetns(path string) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, err
	}
	typ, err := unix.IoctlRetInt(int(n.Fd()), unix.NS_GET_NSTYPE)
	if err == nil && typ != unix.CLONE_NEWNET {
		n.Close()
		return nil, fmt.Errorf("%s: %w (namespace type %#x)", path, ErrNotNetns, typ)
	}
	return n, nil
}

// ErrNotOwned is wrapped when the pod netns holds an interface of the
// requested name that is not the given sandbox's: not a veth, or a veth
// whose node end does not carry the sandbox's alias (routing.SandboxAlias;
// another attachment's, another plugin's, or the runtime's own). Neither
// ADD nor DEL removes it (CNI spec 1.1 §ADD: an interface of the requested
// name that already exists is an error; docs/field-failures.md: per-pod
// objects that exist are an error unless they belong to the same owner).
var ErrNotOwned = errors.New("interface is not this sandbox's")

// Teardown undoes Setup for a: the pod interface (when podNSPath is given,
// and only when it is the sandbox owner's: DeletePodInterface), the host
// veth, the host route and the rules of a.PodIP. Anything already gone is
// success, and so is a pod interface of that name that is not owner's
// (left alone). It must be called in the node netns.
func Teardown(podNSPath, owner string, a Attachment) error {
	var errs []error
	if podNSPath != "" {
		if _, err := DeletePodInterface(podNSPath, a.IfName, owner); err != nil && !errors.Is(err, ErrNetnsGone) && !errors.Is(err, ErrNotOwned) {
			errs = append(errs, err)
		}
	}
	if a.HostVeth != "" {
		if _, err := DeleteHostVeth(a.HostVeth); err != nil {
			errs = append(errs, err)
		}
	}
	if a.PodIP.IsValid() {
		if err := RemoveHostRoute(a.PodIP, ""); err != nil {
			errs = append(errs, err)
		}
		if _, err := routing.RemovePodRules(a.PodIP); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeletePodInterface deletes ifName inside the netns at path (which removes
// the host end of its veth too) and returns the pod addresses it held: its
// IPv4 addresses, then its IPv6 addresses other than link-local ones. It
// deletes only the sandbox owner's interface: a veth whose node end (in the
// calling thread's netns) carries the alias owner (routing.SandboxAlias;
// "" for a veth made with none). A missing interface is success; one that
// is not owner's is left untouched and wraps ErrNotOwned, with no
// addresses (they are another sandbox's). A path that is gone or not a
// netns wraps ErrNetnsGone; any other failure to open it (EPERM) is an
// error.
func DeletePodInterface(path, ifName, owner string) ([]netip.Addr, error) {
	podNS, err := OpenNetns(path)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		if errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, ErrNotNetns) {
			return nil, fmt.Errorf("%w: %v", ErrNetnsGone, err)
		}
		return nil, fmt.Errorf("open pod netns %s: %w", path, err)
	}
	defer podNS.Close()
	pod, err := handleAt(podNS)
	if err != nil {
		return nil, err
	}
	defer pod.Close()
	link, err := pod.LinkByName(ifName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, fmt.Errorf("find %s in %s: %w", ifName, path, err)
	}
	if alias, ok := nodeEndAlias(current, link); !ok || alias != owner {
		return nil, fmt.Errorf("%s in %s: %w (%s)", ifName, path, ErrNotOwned, describeOwner(link, alias, ok))
	}
	// Both families in one dump: an IPv6 pod's address is as much the
	// pod's as an IPv4 one (its link-local address is the veth's own).
	list, err := pod.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s in %s: %w", ifName, path, err)
	}
	var addrs, addrs6 []netip.Addr
	for _, a := range list {
		if ip, ok := addrOf(a.IP); ok {
			addrs = append(addrs, ip)
		} else if ip, ok := netip.AddrFromSlice(a.IP); ok && podAddr6(ip) {
			addrs6 = append(addrs6, ip)
		}
	}
	for _, ad := range addrs {
		// A non-default attachment's source rule (routing.AttachmentRule,
		// IPv4 only); its routes go with the link. The default attachment
		// has none, so the pod's usual DEL spends no rule dump on it.
		if ifName == DefaultIfName {
			break
		}
		if err := routing.RemoveAttachmentRulesVia(pod.Handle, ad); err != nil {
			return addrs, fmt.Errorf("%s in %s: %w", ifName, path, err)
		}
	}
	addrs = append(addrs, addrs6...)
	if err := pod.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return addrs, fmt.Errorf("delete %s in %s: %w", ifName, path, err)
	}
	return addrs, nil
}

// nodeEndAlias returns the alias of the node end of link, a pod-side veth:
// the link its IFLA_LINK names in the node netns (read through node), which
// must be a veth naming link back. ok is false when
// link is not a veth, its peer is in the pod netns itself, or no such node
// end exists.
func nodeEndAlias(node netlinksafe.Handle, link netlink.Link) (alias string, ok bool) {
	a := link.Attrs()
	if _, veth := link.(*netlink.Veth); !veth || a.ParentIndex <= 0 || a.NetNsID < 0 {
		return "", false
	}
	peer, err := node.LinkByIndex(a.ParentIndex)
	if err != nil {
		return "", false
	}
	if _, veth := peer.(*netlink.Veth); !veth || peer.Attrs().ParentIndex != a.Index {
		return "", false
	}
	return peer.Attrs().Alias, true
}

// describeOwner says whose link is, for ErrNotOwned's message.
func describeOwner(link netlink.Link, alias string, ok bool) string {
	switch {
	case !ok:
		return "a " + link.Type() + " without a node-side veth end"
	case alias == "":
		return "its node-side veth names no sandbox"
	}
	return "its node-side veth is " + alias + "'s"
}

// DeleteHostVeth deletes the named veth in the node netns; it reports
// whether it existed. A link of that name that is not a veth is left alone
// and reported as an error.
func DeleteHostVeth(name string) (bool, error) {
	existed, err := deleteVeth(current, name)
	if err != nil {
		return existed, fmt.Errorf("host veth: %w", err)
	}
	return existed, nil
}

// current is a handle on the calling thread's netns, like the netlink
// package functions (no socket of its own, nothing to close).
var current = netlinksafe.Handle{Handle: &netlink.Handle{}}

// deleteVeth deletes the named veth through h; a missing link is success
// with false, a link of another type an error.
func deleteVeth(h netlinksafe.Handle, name string) (bool, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("find %s: %w", name, err)
	}
	if _, ok := link.(*netlink.Veth); !ok {
		return false, fmt.Errorf("link %s is a %s, not a veth; not deleting it", name, link.Type())
	}
	if err := h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return true, fmt.Errorf("delete %s: %w", name, err)
	}
	return true, nil
}

// HostRouteLink returns the name of the link the main-table route to
// addr/32 (addr/128 for IPv6) goes through, or "" when there is no such
// route, also when its link went away after the route was listed (the
// kernel removes a link's routes with it: a pod's veth deleted by its
// runtime while a DEL or GC looks).
func HostRouteLink(addr netip.Addr) (string, error) {
	routes, err := hostRoutes(addr)
	if err != nil || len(routes) == 0 {
		return "", err
	}
	name, err := linkNameOf(routes[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("link %d of route %v: %w", routes[0].LinkIndex, hostNet(addr), err)
	}
	return name, nil
}

// linkNameOf is the name of the link with index i in the current netns,
// "" when there is none.
func linkNameOf(i int) (string, error) {
	link, err := netlink.LinkByIndex(i)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return "", nil
		}
		return "", err
	}
	return link.Attrs().Name, nil
}

// RemoveHostRoute deletes the main-table route to addr/32 (addr/128 for
// IPv6) when it goes through hostVeth, or through any link when hostVeth is
// "". A missing route is success. An IPv6 pod's permanent neighbour on the
// host veth goes with the veth.
func RemoveHostRoute(addr netip.Addr, hostVeth string) error {
	routes, err := hostRoutes(addr)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if hostVeth != "" {
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil || link.Attrs().Name != hostVeth {
				continue
			}
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete host route %v: %w", hostNet(addr), err)
		}
	}
	return nil
}

func hostRoutes(addr netip.Addr) ([]netlink.Route, error) {
	family := netlink.FAMILY_V4
	switch {
	case addr.Is6() && podAddr6(addr):
		family = netlink.FAMILY_V6
	case !addr.Is4():
		return nil, nil
	}
	dst := hostNet(addr)
	filter := &netlink.Route{Dst: dst, Table: routing.MainTable}
	routes, err := netlinksafe.RouteListFiltered(family, filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes to %v: %w", dst, err)
	}
	return routes, nil
}
