// Package routing is the policy-routing contract between the plugin
// (cni/datapath) and the daemon (ipamd/hostnet) on a vpcip node
// (docs/design.md §4): the rule priorities, the route table of each ENI, and
// the exact shape of a pod's policy rules. Both sides add, find and delete
// pod rules only through this package, so they can never disagree on what a
// pod's rule looks like.
//
// Policy rule priorities on a vpcip node (lower runs first):
//
//	 512  to <pod>/32 lookup main             (plugin, every pod: PriorityToPod)
//	1024  fwmark <mark>/<mark> lookup main     (daemon, SNAT: PriorityMark)
//	1535  from <ENI primary>/32 lookup <d+1>   (daemon, each secondary ENI: PriorityENI)
//	1536  from <pod>/32 lookup <d+1>           (plugin, pods on secondary ENIs: PriorityFromPod)
//
// The ENI at device number d ≥ 1 routes through table d+1 (TableForDevice);
// the primary ENI (d = 0) uses the main table. Inside a pod's netns, an
// attachment other than the pod's default one has a source rule of its own
// (AttachmentRule; attachment.go).
//
// Pod rules are IPv4 only. An IPv6 pod (the daemon's IPv6 mode) has none:
// its address is on the primary ENI, whose routes are the main table's, so
// its /128 host route in the main table is all the node needs
// (cni/datapath, ipv6.go).
//
// It imports the standard library and netlink only, so the plugin stays
// light (test/deps). Functions that touch the kernel work in the network
// namespace of the calling goroutine's OS thread.
package routing

import (
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Policy rule priorities; see the package comment.
const (
	// PriorityToPod is the per-pod rule "to <pod>/32 lookup main", so
	// traffic to a local pod always takes its host veth route, ahead of
	// every rule that could send it out of an ENI.
	PriorityToPod = 512
	// PriorityMark is the rule "fwmark <mark>/<mark> lookup main": marked
	// packets (pod egress leaving the VPC, replies to connections that came
	// in on the primary ENI) leave by the primary ENI, ahead of the per-pod
	// "from" rules.
	PriorityMark = 1024
	// PriorityENI is the rule "from <ENI primary address>/32 lookup <d+1>"
	// for each secondary ENI, so the node's own traffic from that address
	// leaves by that ENI. It is distinct from PriorityFromPod so a scan of
	// the pod rules never sees ENI rules.
	PriorityENI = 1535
	// PriorityFromPod is the rule "from <pod>/32 lookup <d+1>" for a pod
	// whose address lives on the secondary ENI at device number d.
	PriorityFromPod = 1536
)

// MainTable is the kernel's main route table (RT_TABLE_MAIN, 254), used by
// the primary ENI and by every pod's "to" rule.
const MainTable = unix.RT_TABLE_MAIN

// TableForDevice is the route table of the ENI at EC2 device number d: d+1
// for a secondary ENI (d ≥ 1), MainTable for the primary ENI (d = 0).
func TableForDevice(d int) int {
	if d == 0 {
		return MainTable
	}
	return d + 1
}

// host32 is a as the /32 net.IPNet netlink wants.
func host32(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}
}

// host32Addr returns the address of n when n is an IPv4 /32.
func host32Addr(n *net.IPNet) (netip.Addr, bool) {
	if n == nil {
		return netip.Addr{}, false
	}
	ones, bits := n.Mask.Size()
	a, ok := netip.AddrFromSlice(n.IP)
	a = a.Unmap()
	return a, ok && a.Is4() && ones == 32 && bits == 32
}
