// Package hostnet sets up the node side of the vpcip datapath (docs/design.md §4):
// the link, route table, address and policy rule of each secondary ENI, the
// SNAT and connection-mark rules that send pod traffic leaving the VPC out of
// the primary ENI, and a read of the host routes to pod veths for
// reconciliation.
//
// Every function works on the network namespace of the calling goroutine's
// OS thread (the daemon runs in the node netns; tests lock a goroutine into a
// throwaway netns). Every Ensure function converges the host to one spec and
// may be re-run at any time, after a crash included: what already matches is
// left alone, what differs is replaced, nothing is ever added twice. Every
// Remove function treats what is already gone as success.
//
// Policy rule priorities on a vpcip node (lower runs first):
//
//	 512  to <pod>/32 lookup main             (plugin, per pod: PriorityToPod)
//	1024  fwmark <mark>/<mark> lookup main     (EnsureSNAT: PriorityMark)
//	1535  from <ENI primary>/32 lookup <d+1>   (EnsureENI: PriorityENI)
//	1536  from <pod>/32 lookup <d+1>           (plugin, pods on secondary ENIs: PriorityFromPod)
//
// Route table of the ENI at device number d is d+1 (TableForDevice).
//
// iptables chains, all vpcip's own and rewritten to spec by EnsureSNAT:
// mangle ChainConnmark (from PREROUTING) and ChainEgress, nat ChainSNAT (from
// POSTROUTING). Every rule carries the comment "vpcip:<hash of the rule>".
package hostnet

import (
	"fmt"
	"net"
	"net/netip"
)

// Policy rule priorities used on a vpcip node; see the package comment.
const (
	// PriorityToPod is the plugin's per-pod rule "to <pod>/32 lookup main",
	// so traffic to a local pod always takes its host veth route.
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
	// PriorityFromPod is the plugin's rule "from <pod>/32 lookup <d+1>" for
	// a pod whose address lives on the secondary ENI at device number d.
	PriorityFromPod = 1536
)

// TableForDevice is the route table of the ENI at device number d: d+1
// (docs/design.md §4). Device number 0, the primary ENI, uses the main table.
func TableForDevice(deviceNumber int) int { return deviceNumber + 1 }

// ipNet converts a prefix to the net.IPNet netlink expects; the one place
// where netip meets net for this package.
func ipNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	return &net.IPNet{
		IP:   net.IP(p.Addr().AsSlice()),
		Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
	}
}

// hostPrefix is a /32 around an IPv4 address.
func hostPrefix(a netip.Addr) *net.IPNet { return ipNet(netip.PrefixFrom(a, 32)) }

// toPrefix converts a netlink destination back to a netip.Prefix; a nil
// destination is the IPv4 default route 0.0.0.0/0.
func toPrefix(n *net.IPNet) (netip.Prefix, error) {
	if n == nil {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0), nil
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("bad address %v", n.IP)
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), nil
}

// toAddr converts a netlink address to netip, the zero Addr for nil.
func toAddr(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}
	}
	return a.Unmap()
}
