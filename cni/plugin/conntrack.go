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
	n, err := dumpAndDelete(map[[4]byte]uint{addr.As4(): 0})
	if err != nil {
		return n[addr.As4()], fmt.Errorf("conntrack entries of %v: %w", addr, err)
	}
	return n[addr.As4()], nil
}

// dumpAndDelete deletes the entries of the node netns's conntrack table
// that name any address of want, in one dump, and returns how many it
// deleted per address.
func dumpAndDelete(want map[[4]byte]uint) (map[[4]byte]uint, error) {
	type match struct {
		addr [4]byte
		msg  []byte
	}
	var matched []match
	dump := conntrackRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	err := dump.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if a, ok := conntrackNames(msg, want); ok {
			matched = append(matched, match{a, append([]byte(nil), msg...)})
		}
		return true
	})
	// An interrupted dump (the table changed meanwhile) may have missed
	// entries; the ones seen are still deleted, and the error returned.
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return want, fmt.Errorf("list: %w", err)
	}
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("list: %w", err))
	}
	for _, m := range matched {
		del := conntrackRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		// The entry's own attributes (tuples, id) name it; its header is
		// the request's.
		del.AddRawData(m.msg[nl.SizeofNfgenmsg:])
		if _, derr := del.Execute(unix.NETLINK_NETFILTER, 0); derr != nil && !errors.Is(derr, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete: %w", derr))
			continue
		}
		want[m.addr]++
	}
	return want, errors.Join(errs...)
}

// conntrackRequest is a ctnetlink request on the IPv4 conntrack table.
func conntrackRequest(op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	return req
}

// conntrackNames reports which address of want a ctnetlink entry
// (nfgenmsg, then attributes) has as source or destination of its original
// or its reply tuple, if any.
func conntrackNames(msg []byte, want map[[4]byte]uint) ([4]byte, bool) {
	var addr [4]byte
	if len(msg) < nl.SizeofNfgenmsg {
		return addr, false
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
				if found || (typ != nl.CTA_IP_V4_SRC && typ != nl.CTA_IP_V4_DST) || len(val) != 4 {
					return
				}
				if _, ok := want[[4]byte(val)]; ok {
					addr, found = [4]byte(val), true
				}
			})
		})
	})
	return addr, found
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
