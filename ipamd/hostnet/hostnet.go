// Package hostnet sets up the node side of the vpcip datapath (docs/design.md §4):
// the link, route table, address and policy rule of each secondary ENI, the
// SNAT and connection-mark rules that send pod traffic leaving the VPC out of
// the primary ENI, the filter keeping pods from IMDS, and a read of the host routes to pod veths for
// reconciliation.
//
// Every function works on the network namespace of the calling goroutine's
// OS thread (the daemon runs in the node netns; tests lock a goroutine into a
// throwaway netns). Every Ensure function converges the host to one spec and
// may be re-run at any time, after a crash included: what already matches is
// left alone, what differs is replaced, nothing is ever added twice. Every
// Remove function treats what is already gone as success.
//
// Rule priorities and ENI route table numbers are package routing's, the
// contract shared with the plugin: EnsureENI uses routing.PriorityENI and
// routing.TableForDevice, EnsureSNAT routing.PriorityMark.
//
// iptables chains, all vpcip's own and rewritten to spec by EnsureSNAT:
// mangle ChainConnmark (from PREROUTING) and ChainEgress, nat ChainSNAT (from
// POSTROUTING); by EnsureIMDSBlock: filter ChainIMDS (from FORWARD and
// INPUT), which keeps pods from the instance metadata service. Every rule
// carries the comment "vpcip:<hash of the rule>".
package hostnet

import (
	"fmt"
	"net"
	"net/netip"
)

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
