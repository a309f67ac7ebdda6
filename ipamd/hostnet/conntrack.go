package hostnet

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// FlushPodConntrack deletes the connection-tracking entries of a pod address
// in the current netns: those it opened (original source), those sent to it
// (original destination), and those NATed to or from it (reply source or
// destination: a Service's DNAT to the pod). The daemon calls it when it
// releases an address whose pod went without a DEL (its entries outlive the
// pod: an unanswered connection 120 s, nf_conntrack_tcp_timeout_syn_sent, an
// established one days), so the next pod given the address does not receive
// the old pod's connections. The plugin does the same on DEL. It returns
// how many entries it deleted.
func FlushPodConntrack(addr netip.Addr) (uint, error) {
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
