package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcip/vpcip/routing"
)

// Wired describes the interfaces Setup made, read back after the last change
// so a CHECK comparing against them sees what the kernel holds.
type Wired struct {
	Host net.Interface // in the node netns
	Pod  net.Interface // in the pod netns
	// ReplacedHostVeth is true when a veth of the same host name existed and
	// was removed first (a previous sandbox of the same pod whose DEL never
	// came, or a retried ADD).
	ReplacedHostVeth bool
}

// Session is the two route netlink sockets one ADD works through: one in
// the node netns (the calling thread's when Open ran) and one opened in the
// pod netns. Opening a socket costs a few system calls and, for the pod's,
// two namespace switches of the thread; an ADD makes about twenty requests.
// A Session is not safe for concurrent use; Close releases both sockets.
type Session struct {
	host, pod netlinksafe.Handle
	podNS     ns.NetNS
}

// Open opens a Session for an ADD into podNS. It must be called in the node
// netns. Errors: either socket cannot be opened (podNS closed or gone).
func Open(podNS ns.NetNS) (*Session, error) {
	pod, err := handleAt(podNS)
	if err != nil {
		return nil, err
	}
	host, err := hostHandle()
	if err != nil {
		pod.Close()
		return nil, err
	}
	return &Session{host: host, pod: pod, podNS: podNS}, nil
}

// Close closes both sockets.
func (s *Session) Close() {
	s.host.Close()
	s.pod.Close()
}

// Replaced is what CreatePair found under the host veth's name and removed
// before making the new pair.
type Replaced struct {
	// Veth is true when a veth of that name existed (an earlier sandbox of
	// the same pod, or a retried ADD) and was deleted.
	Veth bool
	// Routed are the pod addresses the node routed to that veth (main-table
	// /32 routes through it), in the kernel's order. Their routes went with
	// the veth; their pod rules (routing.PodRuleAddr, both priorities) were
	// deleted before it, so an address the caller then gives back to
	// vpcipd keeps nothing in the node netns that could catch the traffic
	// of the next pod to get it (docs/field-failures.md B13).
	Routed []netip.Addr
	// Rules is how many pod rules of Routed were deleted.
	Rules int
	// Alias is the deleted veth's alias (IFLA_IFALIAS), which names the
	// sandbox that wired it (routing.SandboxAlias); "" when it had none.
	Alias string
}

// CreatePair creates the veth pair inside podNS with the peer placed directly
// in hostNS (so the host end never changes namespace), records alias on the
// host end (IFLA_IFALIAS; none when "") and sets it up. It needs no address, so ADD runs it while the daemon answers. A veth of
// either name left by an earlier sandbox of the same pod or by a retried ADD
// is removed first, with the host routes and pod rules of the addresses
// routed to it (Replaced); a link of another type is refused. The pod side is
// reached through a netlink socket opened in podNS, so the calling thread
// never switches namespaces. It opens a Session for the one call; an ADD
// uses Session.CreatePair. Errors: the old veth's routes or rules cannot be
// read or deleted (the veth is then left), or any step of the new pair fails.
func CreatePair(hostNS, podNS ns.NetNS, hostVeth, ifName string, mtu int, alias string) (Replaced, error) {
	s, err := Open(podNS)
	if err != nil {
		return Replaced{}, err
	}
	defer s.Close()
	return s.CreatePair(hostNS, hostVeth, ifName, mtu, alias)
}

// CreatePair is the package's CreatePair through the Session's sockets.
func (s *Session) CreatePair(hostNS ns.NetNS, hostVeth, ifName string, mtu int, alias string) (Replaced, error) {
	probe := Attachment{PodIP: Gateway, MTU: mtu, HostVeth: hostVeth, IfName: ifName}
	if err := probe.validate(); err != nil {
		return Replaced{}, err
	}
	rep, err := s.replaceHostVeth(hostVeth)
	if err != nil {
		return rep, fmt.Errorf("remove stale host veth %s: %w", hostVeth, err)
	}
	if err := s.removeOwnPodInterface(ifName, alias); err != nil {
		return rep, err
	}
	if err := createVeth(s.pod, probe, hostNS); err != nil {
		return rep, err
	}
	link, err := s.host.LinkByName(hostVeth)
	if err != nil {
		return rep, fmt.Errorf("find host veth %s: %w", hostVeth, err)
	}
	if alias != "" {
		if err := s.host.LinkSetAlias(link, alias); err != nil {
			return rep, fmt.Errorf("set alias of host veth %s: %w", hostVeth, err)
		}
	}
	if err := s.host.LinkSetUp(link); err != nil {
		return rep, fmt.Errorf("set host veth %s up: %w", hostVeth, err)
	}
	return rep, nil
}

// removeOwnPodInterface deletes ifName in the pod netns when it is a veth
// whose node end carries alias (a sandbox's own, left by an earlier try);
// any other interface of that name is an error wrapping ErrNotOwned and
// stays (CNI spec 1.1 §ADD: an interface of the requested name that
// already exists is an error). A missing one is success.
func (s *Session) removeOwnPodInterface(ifName, alias string) error {
	link, err := s.pod.LinkByName(ifName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s in the pod netns: %w", ifName, err)
	}
	if own, ok := nodeEndAlias(s.host, link); !ok || own != alias {
		return fmt.Errorf("interface %s already exists in the pod netns: %w (%s)", ifName, ErrNotOwned, describeOwner(link, own, ok))
	}
	if err := s.pod.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete stale pod interface %s: %w", ifName, err)
	}
	return nil
}

// replaceHostVeth deletes the host veth named name, if any, after the pod
// rules of every address routed to it. The rules go first: the kernel drops
// the routes with the link but knows nothing of rules, and once the caller
// gives such an address back, nothing would tell them from the rules of the
// address's next pod. While the link routes the address, the rules are the
// old sandbox's (a new owner's ADD routes the address to its own veth
// before it adds rules).
func (s *Session) replaceHostVeth(name string) (Replaced, error) {
	var rep Replaced
	link, err := s.host.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return rep, nil
		}
		return rep, fmt.Errorf("find %s: %w", name, err)
	}
	if _, ok := link.(*netlink.Veth); !ok {
		return rep, fmt.Errorf("link %s is a %s, not a veth; not deleting it", name, link.Type())
	}
	rep.Alias = link.Attrs().Alias
	if rep.Routed, err = routedTo(s.host, link); err != nil {
		return rep, err
	}
	for _, a := range rep.Routed {
		n, err := routing.RemovePodRulesVia(s.host.Handle, a)
		rep.Rules += n
		if err != nil {
			return rep, fmt.Errorf("remove the rules of %v, routed to %s: %w", a, name, err)
		}
	}
	if err := s.host.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return rep, fmt.Errorf("delete %s: %w", name, err)
	}
	rep.Veth = true
	return rep, nil
}

// routedTo lists the addresses whose main-table host route (/32, or /128
// of an IPv6 pod address) goes through link (a pod's host route,
// docs/design.md §4), IPv4 first. One dump of both families.
func routedTo(h netlinksafe.Handle, link netlink.Link) ([]netip.Addr, error) {
	filter := &netlink.Route{LinkIndex: link.Attrs().Index, Table: routing.MainTable}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes through %s: %w", link.Attrs().Name, err)
	}
	var v4, v6 []netip.Addr
	for _, r := range routes {
		a, ok := hostAddrOf(r.Dst)
		switch {
		case !ok:
		case a.Is4():
			v4 = append(v4, a)
		default:
			v6 = append(v6, a)
		}
	}
	return append(v4, v6...), nil
}

// Configure completes the wiring of a pair made by CreatePair: the MTU when
// it differs from the pair's, the pod side (up, /32, gateway and default
// routes, permanent neighbour) and the host side (forwarding, route, rules),
// then reads both ends back. It must be called in the node netns. It opens
// a Session for the one call; an ADD uses Session.Configure.
func Configure(podNS ns.NetNS, a Attachment) (Wired, error) {
	s, err := Open(podNS)
	if err != nil {
		return Wired{}, err
	}
	defer s.Close()
	return s.Configure(a)
}

// Configure is the package's Configure through the Session's sockets.
func (s *Session) Configure(a Attachment) (Wired, error) {
	if err := a.validate(); err != nil {
		return Wired{}, err
	}
	hostLink, err := s.host.LinkByName(a.HostVeth)
	if err != nil {
		return Wired{}, fmt.Errorf("find host veth %s: %w", a.HostVeth, err)
	}
	if a.PodIP.Is6() {
		return s.configure6(a, hostLink)
	}
	if err := setupPodSide(s.pod, a, hostLink.Attrs().HardwareAddr); err != nil {
		return Wired{}, err
	}
	if err := setupHostSide(s.host, a, hostLink); err != nil {
		return Wired{}, err
	}
	return readBack(s.host, s.pod, a)
}

// handleAt opens a route netlink socket in the given netns. Only
// NETLINK_ROUTE: by default a handle opens one socket per family the
// netlink package knows (route, xfrm, netfilter), each by switching the
// thread into the netns and back.
func handleAt(n ns.NetNS) (netlinksafe.Handle, error) {
	h, err := netlinksafe.NewHandleAt(netns.NsHandle(int(n.Fd())), unix.NETLINK_ROUTE)
	if err != nil {
		return h, fmt.Errorf("netlink socket in %s: %w", n.Path(), err)
	}
	return h, nil
}

// hostHandle opens a route netlink socket in the calling thread's netns
// (the node's), so a sequence of requests shares one socket; the netlink
// package's functions open and close a socket per request.
func hostHandle() (netlinksafe.Handle, error) {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return h, fmt.Errorf("netlink socket in the node netns: %w", err)
	}
	return h, nil
}

// createVeth creates the pair in the pod netns (the handle's) with its peer
// placed directly in hostNS (IFLA_NET_NS_FD), so the host end is never moved
// between namespaces after creation.
func createVeth(pod netlinksafe.Handle, a Attachment, hostNS ns.NetNS) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = a.IfName
	attrs.MTU = a.MTU
	// One TX and one RX queue per end, asked for at creation (both ends
	// take these: IFLA_NUM_TX_QUEUES / IFLA_NUM_RX_QUEUES). Left unset,
	// the kernel creates each end with a queue per possible CPU and then
	// cuts it to one (veth_init_queues → netif_set_real_num_tx_queues),
	// which waits for an expedited RCU grace period while holding the
	// rtnl lock: ~2 ms per ADD during which no other netlink change on the
	// node, such as the other ADDs of a burst, can proceed.
	attrs.NumTxQueues = 1
	attrs.NumRxQueues = 1
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: a.HostVeth, PeerMTU: uint32(a.MTU),
		PeerNamespace: netlink.NsFd(int(hostNS.Fd()))}
	if err := pod.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s (pod) / %s (host): %w", a.IfName, a.HostVeth, err)
	}
	return nil
}

// podTable is the route table, inside the pod netns, of a's gateway and
// default routes: the main table for the pod's default attachment
// (DefaultIfName), else the attachment's own table (routing.AttachmentTable
// of its pod interface's index, chosen by a source rule), so a second
// attachment never replaces the pod's default route (docs/design.md §4).
func podTable(a Attachment, ifindex int) int {
	if a.IfName == DefaultIfName {
		return routing.MainTable
	}
	return routing.AttachmentTable(ifindex)
}

// setupPodSide configures the pod end: MTU, up, /32, routes (and, for an
// attachment other than the default, its source rule), neighbour.
func setupPodSide(pod netlinksafe.Handle, a Attachment, hostMAC net.HardwareAddr) error {
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		return fmt.Errorf("find pod interface %s: %w", a.IfName, err)
	}
	if link.Attrs().MTU != a.MTU {
		if err := pod.LinkSetMTU(link, a.MTU); err != nil {
			return fmt.Errorf("set %s MTU %d: %w", a.IfName, a.MTU, err)
		}
	}
	if err := pod.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", a.IfName, err)
	}
	if err := pod.AddrReplace(link, &netlink.Addr{IPNet: host32(a.PodIP)}); err != nil {
		return fmt.Errorf("add %v/32 to %s: %w", a.PodIP, a.IfName, err)
	}
	idx := link.Attrs().Index
	table := podTable(a, idx)
	gw := &netlink.Route{LinkIndex: idx, Dst: host32(Gateway), Scope: netlink.SCOPE_LINK, Table: table}
	if err := pod.RouteReplace(gw); err != nil {
		return fmt.Errorf("add route %v scope link dev %s table %d: %w", Gateway, a.IfName, table, err)
	}
	def := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw: host32(Gateway).IP, Table: table}
	if err := pod.RouteReplace(def); err != nil {
		return fmt.Errorf("add default route via %v dev %s table %d: %w", Gateway, a.IfName, table, err)
	}
	if table != routing.MainTable {
		if err := routing.EnsureAttachmentRuleVia(pod.Handle, a.PodIP, table); err != nil {
			return fmt.Errorf("%s: %w", a.IfName, err)
		}
	}
	neigh := &netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: host32(Gateway).IP, HardwareAddr: hostMAC}
	if err := pod.NeighSet(neigh); err != nil {
		return fmt.Errorf("add permanent neighbour %v lladdr %v dev %s: %w", Gateway, hostMAC, a.IfName, err)
	}
	return nil
}

// setupHostSide runs in the node netns: MTU and up (already done by
// SetupVethWithName, re-asserted), the /32 route, the rules.
func setupHostSide(h netlinksafe.Handle, a Attachment, host netlink.Link) error {
	if host.Attrs().MTU != a.MTU {
		if err := h.LinkSetMTU(host, a.MTU); err != nil {
			return fmt.Errorf("set %s MTU %d: %w", a.HostVeth, a.MTU, err)
		}
	}
	if err := ensureForwarding(); err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: host32(a.PodIP), Scope: netlink.SCOPE_LINK, Table: routing.MainTable}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("add host route %v/32 dev %s: %w", a.PodIP, a.HostVeth, err)
	}
	return routing.EnsurePodRulesVia(h.Handle, a.PodIP, a.RouteTable)
}

// readBack reads both ends after the last change (B33).
func readBack(hostH, pod netlinksafe.Handle, a Attachment) (Wired, error) {
	var w Wired
	host, err := hostH.LinkByName(a.HostVeth)
	if err != nil {
		return w, fmt.Errorf("read back host veth %s: %w", a.HostVeth, err)
	}
	w.Host = toInterface(host)
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		return w, fmt.Errorf("read back pod interface %s: %w", a.IfName, err)
	}
	w.Pod = toInterface(link)
	return w, nil
}

func toInterface(l netlink.Link) net.Interface {
	at := l.Attrs()
	return net.Interface{Index: at.Index, MTU: at.MTU, Name: at.Name, HardwareAddr: at.HardwareAddr, Flags: at.Flags}
}

// ipForward is the node's IPv4 forwarding switch (all interfaces).
const ipForward = "/proc/sys/net/ipv4/ip_forward"

// ensureForwarding turns on IPv4 forwarding in the node netns: a routed veth
// carries nothing without it (the reference ptp and bridge plugins do the
// same). It reads first, so the common case writes nothing.
func ensureForwarding() error {
	b, err := os.ReadFile(ipForward)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(ipForward, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	return nil
}
