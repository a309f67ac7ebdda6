package plugin

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
//
// The kernel has no index by address: this is one dump of the conntrack
// table (the kernel walks its whole hash, every netns's, ~5 ms of system
// time with 262,144 buckets) whose entries are matched as they stream in,
// reading only their address tuples, and only the matching ones are kept
// and deleted. (netlink.ConntrackDeleteFilters keeps the whole dump and
// decodes every entry: with 20,000 entries in the netns that cost 126 ms of
// CPU per call, against ~7 ms here.)
func flushConntrack(addr netip.Addr) (uint, error) {
	if !addr.Is4() {
		return 0, nil
	}
	want := addr.As4()
	var matched [][]byte
	dump := conntrackRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	err := dump.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if conntrackNames(msg, want) {
			matched = append(matched, append([]byte(nil), msg...))
		}
		return true
	})
	// An interrupted dump (the table changed meanwhile) may have missed
	// entries; the ones seen are still deleted, and the error returned.
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return 0, fmt.Errorf("list conntrack entries of %v: %w", addr, err)
	}
	var n uint
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("list conntrack entries of %v: %w", addr, err))
	}
	for _, msg := range matched {
		del := conntrackRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		// The entry's own attributes (tuples, id) name it; its header is
		// the request's.
		del.AddRawData(msg[nl.SizeofNfgenmsg:])
		if _, derr := del.Execute(unix.NETLINK_NETFILTER, 0); derr != nil && !errors.Is(derr, fs.ErrNotExist) {
			errs = append(errs, derr)
			continue
		}
		n++
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("delete conntrack entries of %v: %w", addr, err)
	}
	return n, nil
}

// conntrackRequest is a ctnetlink request on the IPv4 conntrack table.
func conntrackRequest(op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	return req
}

// conntrackNames reports whether a ctnetlink entry (nfgenmsg, then
// attributes) has addr as source or destination of its original or its
// reply tuple.
func conntrackNames(msg []byte, addr [4]byte) bool {
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
				if (typ == nl.CTA_IP_V4_SRC || typ == nl.CTA_IP_V4_DST) && len(val) == 4 && [4]byte(val) == addr {
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
