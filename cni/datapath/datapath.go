// Package datapath wires and unwires the routed-veth datapath of docs/design.md §4
// with netlink: a veth pair created inside the pod netns with its host end
// placed directly in the node netns, a /32 on the pod side behind the
// link-local gateway 169.254.1.1, a host /32 route to the veth, and the pod's
// policy rules, whose priorities and shape package routing defines for the
// plugin and the daemon alike. An IPv6 pod address (the daemon's IPv6 mode)
// is wired the same way with a /128 behind the link-local gateway fe80::1,
// a host /128 route and no policy rules (ipv6.go).
//
// Functions take the netns they work in explicitly or run in the calling
// goroutine's current netns (the node netns, where the plugin runs). Removal
// treats anything already gone as success.
package datapath

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"

	"github.com/vpcip/vpcip/routing"
	"golang.org/x/sys/unix"
)

// Gateway is the link-local next hop of every pod. It answers from a
// permanent neighbour entry holding the host veth's MAC, so it never needs an
// address on the host.
var Gateway = netip.MustParseAddr("169.254.1.1")

// HostVethName returns the host-side veth name of a pod's default
// attachment (DefaultIfName): prefix + the first 11 hex characters of
// sha1("<namespace>.<pod>"), or of sha1(containerID) when there is no pod
// name (a runtime without Kubernetes CNI_ARGS). With a prefix of at most 4
// characters it fits the kernel's 15-byte limit; the name is stable across
// sandbox restarts of one pod and is the one Calico-style tooling computes
// from the pod's name (AWS VPC CNI's scheme). Before attachments other than
// the default had names of their own (AttachmentVethName), every attachment
// of a pod was given this name.
func HostVethName(prefix, namespace, pod, containerID string) string {
	key := containerID
	if pod != "" {
		key = namespace + "." + pod
	}
	sum := sha1.Sum([]byte(key))
	return prefix + hex.EncodeToString(sum[:])[:11]
}

// DefaultIfName is the pod interface kubelet asks for on the cluster
// network (CNI_IFNAME); Multus names further attachments net1, net2, ...
const DefaultIfName = "eth0"

// AttachmentVethName returns the host-side veth name of the attachment
// (network, ifName) of a pod: HostVethName for DefaultIfName, and for any
// other interface (a second attachment: Multus net1, a second network)
// prefix + the first 11 hex characters of sha1("<namespace>.<pod>/<network>/<ifName>")
// (containerID for "<namespace>.<pod>" when there is no pod name), so no
// two attachments of one sandbox share a veth. A pod holds one interface
// per name, so (pod, ifName) alone tells its attachments apart; the
// network is in the hash too, so a pod that moves an interface name to
// another network gets a new veth.
func AttachmentVethName(prefix, namespace, pod, containerID, network, ifName string) string {
	if ifName == DefaultIfName || ifName == "" {
		return HostVethName(prefix, namespace, pod, containerID)
	}
	key := containerID
	if pod != "" {
		key = namespace + "." + pod
	}
	sum := sha1.Sum([]byte(key + "/" + network + "/" + ifName))
	return prefix + hex.EncodeToString(sum[:])[:11]
}

// Attachment is what one pod's wiring needs.
type Attachment struct {
	PodIP      netip.Addr // IPv4, used as /32; or IPv6, used as /128 (ipv6.go)
	RouteTable int        // ENI route table of the "from" rule (routing.TableForDevice); 0 = primary ENI (main table, no rule); always 0 for IPv6
	MTU        int        // bytes, both veth ends
	HostVeth   string     // host-side veth name (AttachmentVethName)
	IfName     string     // pod-side name (CNI_IFNAME)
	// Egress4 is an IPv6 pod's IPv4 egress address in Egress4Range
	// (egress4.go); zero for none, always zero for an IPv4 pod.
	Egress4 netip.Addr
}

func (a Attachment) validate() error {
	switch {
	case a.PodIP.Is6():
		if err := a.validate6(); err != nil {
			return err
		}
		if err := a.validateEgress4(); err != nil {
			return err
		}
	case !a.PodIP.Is4():
		return fmt.Errorf("pod address %v is neither IPv4 nor IPv6", a.PodIP)
	case a.Egress4.IsValid():
		return a.validateEgress4()
	}
	switch {
	case a.MTU <= 0:
		return fmt.Errorf("MTU %d is not positive", a.MTU)
	case a.HostVeth == "" || len(a.HostVeth) > unix.IFNAMSIZ-1:
		return fmt.Errorf("host veth name %q is empty or longer than %d bytes", a.HostVeth, unix.IFNAMSIZ-1)
	case a.IfName == "":
		return fmt.Errorf("pod interface name is empty")
	case a.RouteTable < 0 || a.RouteTable == routing.MainTable:
		return fmt.Errorf("route table %d is not an ENI table", a.RouteTable)
	}
	return nil
}

// host32 converts a to the /32 net.IPNet netlink wants (the one place this
// package leaves netip).
func host32(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}
}

// addrOf converts a netlink IP back to netip; ok is false for nil or
// non-IPv4.
func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	return a, a.Is4()
}

// hostNet is a as the host prefix netlink wants: /32 for IPv4, /128 for
// IPv6.
func hostNet(a netip.Addr) *net.IPNet {
	if a.Is4() {
		return host32(a)
	}
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(128, 128)}
}

// hostAddrOf returns the address of n when n is a host prefix (/32 of an
// IPv4 address, /128 of an IPv6 one that is not link-local).
func hostAddrOf(n *net.IPNet) (netip.Addr, bool) {
	if n == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	ones, bits := n.Mask.Size()
	if a.Is4() {
		return a, ones == 32 && bits == 32
	}
	return a, ones == 128 && bits == 128 && podAddr6(a)
}

// isHost32 reports whether n is exactly a/32.
func isHost32(n *net.IPNet, a netip.Addr) bool {
	if n == nil {
		return false
	}
	ones, bits := n.Mask.Size()
	got, ok := addrOf(n.IP)
	return ok && ones == 32 && bits == 32 && got == a
}
