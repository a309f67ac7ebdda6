package plugin

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// flushConntrack deletes the node netns's connection-tracking entries of a
// pod address: those the pod opened (original source), those sent to it
// (original destination), and those NATed to or from it (reply source or
// destination: a Service's DNAT to the pod, SNAT of its traffic). It runs on
// DEL, so a client's retransmitted SYN to a deleted backend is looked up
// afresh instead of following the old entry, which lives up to the kernel's
// SYN_SENT timeout (120 s, nf_conntrack_tcp_timeout_syn_sent) and would
// deliver it to whichever pod gets the address next; and again on ADD,
// before the address is wired, for entries made while it cooled down. It
// returns how many entries it deleted. The same is done through netlink by
// the reference portmap plugin.
func flushConntrack(addr netip.Addr) (uint, error) {
	if !addr.Is4() {
		return 0, nil
	}
	ip := net.IP(addr.AsSlice())
	var filters []netlink.CustomConntrackFilter
	for _, tp := range []netlink.ConntrackFilterType{netlink.ConntrackOrigSrcIP, netlink.ConntrackOrigDstIP, netlink.ConntrackReplyAnyIP} {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(tp, ip); err != nil {
			return 0, err
		}
		filters = append(filters, f)
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filters...)
	if err != nil {
		return n, fmt.Errorf("delete conntrack entries of %v: %w", addr, err)
	}
	return n, nil
}
