package hostnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// FlushConntrack deletes, in the current netns, the connection-tracking
// entries of pod addresses the daemon is about to hand out again: those an
// address opened (original source), those sent to it (original
// destination), and those NATed to or from it (reply source or
// destination: a Service's DNAT to the pod). An entry outlives its pod (an
// unanswered connection 120 s, nf_conntrack_tcp_timeout_syn_sent; an
// established one days) and would deliver a client's retransmissions to
// the next pod given the address. It returns how many entries it deleted;
// IPv6 addresses are ignored (the datapath is IPv4).
//
// The kernel has no index by address, so this is one dump of the conntrack
// table (the kernel walks its whole hash, ~5 ms of system time with 262,144
// buckets) for all of addrs, whose entries are matched as they stream in,
// reading only their address tuples; only matching ones are kept and
// deleted. (netlink.ConntrackDeleteFilters keeps and decodes the whole dump:
// with 20,000 entries that cost 126 ms of CPU per call, ~7 ms here.) An
// interrupted dump (the table changed meanwhile) still deletes what it saw
// and returns an error, so the caller dumps again.
func FlushConntrack(addrs []netip.Addr) (uint, error) {
	want := map[[4]byte]bool{}
	for _, a := range addrs {
		if a.Is4() {
			want[a.As4()] = true
		}
	}
	if len(want) == 0 {
		return 0, nil
	}
	var matched [][]byte
	dump := conntrackRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	err := dump.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if conntrackNames(msg, want) {
			matched = append(matched, append([]byte(nil), msg...))
		}
		return true
	})
	var errs []error
	switch {
	case errors.Is(err, netlink.ErrDumpInterrupted):
		errs = append(errs, fmt.Errorf("list conntrack: %w", err))
	case err != nil:
		return 0, fmt.Errorf("list conntrack: %w", err)
	}
	var n uint
	for _, msg := range matched {
		del := conntrackRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		// The entry's own attributes (tuples, id) name it; its header is
		// the request's.
		del.AddRawData(msg[nl.SizeofNfgenmsg:])
		if _, derr := del.Execute(unix.NETLINK_NETFILTER, 0); derr != nil && !errors.Is(derr, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete conntrack entry: %w", derr))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// conntrackRequest is a ctnetlink request on the IPv4 conntrack table.
func conntrackRequest(op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	return req
}

// conntrackNames reports whether a ctnetlink entry (nfgenmsg, then
// attributes) has an address of want as source or destination of its
// original or its reply tuple.
func conntrackNames(msg []byte, want map[[4]byte]bool) bool {
	if len(msg) < nl.SizeofNfgenmsg {
		return false
	}
	found := false
	eachAttr(msg[nl.SizeofNfgenmsg:], func(typ uint16, val []byte) {
		if typ != nl.CTA_TUPLE_ORIG && typ != nl.CTA_TUPLE_REPLY {
			return
		}
		eachAttr(val, func(typ uint16, val []byte) {
			if typ != nl.CTA_TUPLE_IP {
				return
			}
			eachAttr(val, func(typ uint16, val []byte) {
				if (typ == nl.CTA_IP_V4_SRC || typ == nl.CTA_IP_V4_DST) && len(val) == 4 && want[[4]byte(val)] {
					found = true
				}
			})
		})
	})
	return found
}

// eachAttr calls fn with the type (flags masked off) and value of each
// netlink attribute in b; a truncated attribute ends the walk.
func eachAttr(b []byte, fn func(typ uint16, val []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) & nl.NLA_TYPE_MASK
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		fn(typ, b[unix.SizeofRtAttr:l])
		next := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if next > len(b) {
			return
		}
		b = b[next:]
	}
}
