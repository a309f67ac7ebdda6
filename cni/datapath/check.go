package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vpcip/vpcip/routing"
)

// Check verifies that a's wiring is all present, reading only (CNI CHECK
// must change nothing). It must be called in the node netns. It returns what
// it read (for comparison with a prevResult) and one error per missing or
// wrong item, joined, each saying what was expected.
func Check(podNS ns.NetNS, a Attachment) (Wired, error) {
	var w Wired
	if err := a.validate(); err != nil {
		return w, err
	}
	var problems []error
	host, err := netlinksafe.LinkByName(a.HostVeth)
	if err != nil {
		problems = append(problems, fmt.Errorf("host veth %s missing: %v", a.HostVeth, err))
	} else {
		w.Host = toInterface(host)
		problems = append(problems, checkLink("host veth "+a.HostVeth, host, a.MTU)...)
		if !a.PodIP.Is6() {
			problems = append(problems, checkHostRoute(a, host)...)
		}
	}
	if !a.PodIP.Is6() { // IPv6 pods have no policy rules (ipv6.go)
		problems = append(problems, checkRules(a)...)
	}
	pod, err := handleAt(podNS)
	if err != nil {
		return w, errors.Join(append(problems, err)...)
	}
	defer pod.Close()
	link, err := pod.LinkByName(a.IfName)
	if err != nil {
		problems = append(problems, fmt.Errorf("pod interface %s missing in %s: %v", a.IfName, podNS.Path(), err))
		return w, errors.Join(problems...)
	}
	w.Pod = toInterface(link)
	problems = append(problems, checkLink("pod interface "+a.IfName, link, a.MTU)...)
	if host != nil && link.Attrs().ParentIndex != host.Attrs().Index {
		problems = append(problems, fmt.Errorf("pod interface %s is not the peer of host veth %s (peer index %d, host veth index %d)",
			a.IfName, a.HostVeth, link.Attrs().ParentIndex, host.Attrs().Index))
	}
	if a.PodIP.Is6() {
		if host != nil {
			problems = append(problems, checkHost6(a, host, link)...)
		}
		problems = append(problems, checkPod6(pod, a, link, w.Host.HardwareAddr)...)
		if a.Egress4.IsValid() {
			problems = append(problems, checkEgress4(pod, a, host, link, w.Host.HardwareAddr)...)
		}
		return w, errors.Join(problems...)
	}
	problems = append(problems, checkPodSide(pod, a, link, w.Host.HardwareAddr)...)
	return w, errors.Join(problems...)
}

func checkLink(what string, l netlink.Link, mtu int) []error {
	var p []error
	if _, ok := l.(*netlink.Veth); !ok {
		p = append(p, fmt.Errorf("%s is a %s, want a veth", what, l.Type()))
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		p = append(p, fmt.Errorf("%s is down", what))
	}
	if l.Attrs().MTU != mtu {
		p = append(p, fmt.Errorf("%s MTU is %d, want %d", what, l.Attrs().MTU, mtu))
	}
	return p
}

func checkHostRoute(a Attachment, host netlink.Link) []error {
	routes, err := hostRoutes(a.PodIP)
	if err != nil {
		return []error{err}
	}
	for _, r := range routes {
		if r.LinkIndex == host.Attrs().Index && r.Scope == netlink.SCOPE_LINK && r.Gw == nil {
			return nil
		}
	}
	return []error{fmt.Errorf("host route %v/32 dev %s scope link missing", a.PodIP, a.HostVeth)}
}

func checkRules(a Attachment) []error {
	missing, stale, err := routing.DiffPodRules(a.PodIP, a.RouteTable)
	if err != nil {
		return []error{err}
	}
	var p []error
	for _, r := range missing {
		p = append(p, fmt.Errorf("rule %q missing", routing.Describe(r)))
	}
	for _, r := range stale {
		p = append(p, fmt.Errorf("unexpected rule %q", routing.Describe(r)))
	}
	return p
}

// checkPodSide reads the pod side through h, a socket in the pod netns.
func checkPodSide(h netlinksafe.Handle, a Attachment, pod netlink.Link, hostMAC net.HardwareAddr) []error {
	var p []error
	addrs, err := h.AddrList(pod, netlink.FAMILY_V4)
	if err != nil {
		return []error{fmt.Errorf("list addresses of %s: %w", a.IfName, err)}
	}
	found := false
	for _, ad := range addrs {
		if isHost32(ad.IPNet, a.PodIP) {
			found = true
		}
	}
	if !found {
		p = append(p, fmt.Errorf("address %v/32 missing on pod interface %s", a.PodIP, a.IfName))
	}
	table := podTable(a, pod.Attrs().Index)
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: pod.Attrs().Index, Table: table},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return append(p, fmt.Errorf("list routes of %s table %d: %w", a.IfName, table, err))
	}
	var gwRoute, defRoute bool
	for _, r := range routes {
		if isHost32(r.Dst, Gateway) && r.Scope == netlink.SCOPE_LINK {
			gwRoute = true
		}
		if gw, ok := addrOf(r.Gw); ok && gw == Gateway && (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") {
			defRoute = true
		}
	}
	in := ""
	if table != routing.MainTable {
		in = fmt.Sprintf(" table %d", table)
		if ok, err := routing.HasAttachmentRuleVia(h.Handle, a.PodIP, table); err != nil {
			p = append(p, fmt.Errorf("pod rules: %w", err))
		} else if !ok {
			p = append(p, fmt.Errorf("pod rule %s missing", routing.Describe(routing.AttachmentRule(a.PodIP, table))))
		}
	}
	if !gwRoute {
		p = append(p, fmt.Errorf("pod route %v dev %s scope link%s missing", Gateway, a.IfName, in))
	}
	if !defRoute {
		p = append(p, fmt.Errorf("pod default route via %v dev %s%s missing", Gateway, a.IfName, in))
	}
	return append(p, checkNeighbour(h, a, pod, hostMAC)...)
}

func checkNeighbour(h netlinksafe.Handle, a Attachment, pod netlink.Link, hostMAC net.HardwareAddr) []error {
	neighs, err := h.NeighList(pod.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return []error{fmt.Errorf("list neighbours of %s: %w", a.IfName, err)}
	}
	for _, n := range neighs {
		ip, ok := addrOf(n.IP)
		if !ok || ip != Gateway {
			continue
		}
		switch {
		case n.State&netlink.NUD_PERMANENT == 0:
			return []error{fmt.Errorf("pod neighbour %v on %s is not permanent", Gateway, a.IfName)}
		case hostMAC != nil && !bytes.Equal(n.HardwareAddr, hostMAC):
			return []error{fmt.Errorf("pod neighbour %v on %s is %v, want host veth MAC %v", Gateway, a.IfName, n.HardwareAddr, hostMAC)}
		}
		return nil
	}
	return []error{fmt.Errorf("pod permanent neighbour %v on %s missing", Gateway, a.IfName)}
}
