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
// the next pod given the address. It returns how many entries it deleted.
// IPv4 and IPv6 addresses (IPv6 mode's pods) are both flushed, each family
// from its own table.
//
// The kernel has no index by address, so this is one dump of the conntrack
// table per family asked for (the kernel walks its whole hash, ~5 ms of
// system time with 262,144 buckets) for all of addrs, whose entries are
// matched as they stream in, reading only their address tuples; only
// matching ones are kept and deleted. (netlink.ConntrackDeleteFilters keeps
// and decodes the whole dump: with 20,000 entries that cost 126 ms of CPU
// per call, ~7 ms here.) An interrupted dump (the table changed meanwhile)
// still deletes what it saw and returns an error, so the caller dumps again.
func FlushConntrack(addrs []netip.Addr) (uint, error) {
	want := map[netip.Addr]bool{}
	families := map[uint8]bool{}
	for _, a := range addrs {
		a = a.Unmap()
		want[a] = true
		if a.Is4() {
			families[unix.AF_INET] = true
		} else {
			families[unix.AF_INET6] = true
		}
	}
	var n uint
	var errs []error
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if !families[family] {
			continue
		}
		got, err := flushConntrackFamily(family, want)
		n += got
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// flushConntrackFamily is FlushConntrack on one family's table.
func flushConntrackFamily(family uint8, want map[netip.Addr]bool) (uint, error) {
	var matched [][]byte
	dump := conntrackRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP, family)
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
		del := conntrackRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK, family)
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

// conntrackRequest is a ctnetlink request on the conntrack table of family
// (AF_INET or AF_INET6).
func conntrackRequest(op, flags int, family uint8) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	return req
}

// conntrackNames reports whether a ctnetlink entry (nfgenmsg, then
// attributes) has an address of want as source or destination of its
// original or its reply tuple.
func conntrackNames(msg []byte, want map[netip.Addr]bool) bool {
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
				switch {
				case (typ == nl.CTA_IP_V4_SRC || typ == nl.CTA_IP_V4_DST) && len(val) == 4:
					found = found || want[netip.AddrFrom4([4]byte(val))]
				case (typ == nl.CTA_IP_V6_SRC || typ == nl.CTA_IP_V6_DST) && len(val) == 16:
					found = found || want[netip.AddrFrom16([16]byte(val))]
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
