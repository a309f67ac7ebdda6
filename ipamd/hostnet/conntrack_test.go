package hostnet

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctEntry serializes a ctnetlink entry as the kernel dumps it: nfgenmsg,
// then the original and reply tuples (addresses only) and a status.
func ctEntry(origSrc, origDst, replySrc, replyDst string) []byte {
	tuple := func(typ int, src, dst string) *nl.RtAttr {
		t := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
		ip := t.AddRtAttr(nl.CTA_TUPLE_IP|int(nl.NLA_F_NESTED), nil)
		s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
		if s.Is4() {
			ip.AddRtAttr(nl.CTA_IP_V4_SRC, s.AsSlice())
			ip.AddRtAttr(nl.CTA_IP_V4_DST, d.AsSlice())
		} else {
			ip.AddRtAttr(nl.CTA_IP_V6_SRC, s.AsSlice())
			ip.AddRtAttr(nl.CTA_IP_V6_DST, d.AsSlice())
		}
		return t
	}
	family := uint8(unix.AF_INET)
	if netip.MustParseAddr(origSrc).Is6() {
		family = unix.AF_INET6
	}
	msg := (&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0}).Serialize()
	msg = append(msg, tuple(nl.CTA_TUPLE_ORIG, origSrc, origDst).Serialize()...)
	msg = append(msg, tuple(nl.CTA_TUPLE_REPLY, replySrc, replyDst).Serialize()...)
	msg = append(msg, nl.NewRtAttr(nl.CTA_STATUS, []byte{0, 0, 0, 8}).Serialize()...)
	return msg
}

func TestConntrackNames(t *testing.T) {
	want := map[netip.Addr]bool{netip.MustParseAddr("100.64.1.9"): true, netip.MustParseAddr("100.64.1.77"): true,
		netip.MustParseAddr("2600:1f14:0:1:2::9"): true}
	tests := []struct {
		name string
		msg  []byte
		want bool
	}{
		{"pod opened it", ctEntry("100.64.1.9", "1.1.1.1", "1.1.1.1", "100.64.1.9"), true},
		{"sent to the pod", ctEntry("10.0.0.5", "100.64.1.9", "100.64.1.9", "10.0.0.5"), true},
		{"Service DNAT to the pod (reply source)", ctEntry("10.0.0.5", "10.96.0.10", "100.64.1.9", "10.0.0.5"), true},
		{"pod's traffic SNATed (reply destination is the node)", ctEntry("100.64.1.9", "8.8.8.8", "8.8.8.8", "100.64.0.4"), true},
		{"another pod", ctEntry("100.64.1.10", "1.1.1.1", "1.1.1.1", "100.64.1.10"), false},
		{"DNAT to another backend", ctEntry("10.0.0.5", "10.96.0.10", "100.64.200.200", "10.0.0.5"), false},
		{"IPv6 pod opened it", ctEntry("2600:1f14:0:1:2::9", "2001:db8::10", "2001:db8::10", "2600:1f14:0:1:2::9"), true},
		{"sent to the IPv6 pod", ctEntry("2001:db8::10", "2600:1f14:0:1:2::9", "2600:1f14:0:1:2::9", "2001:db8::10"), true},
		{"another IPv6 pod", ctEntry("2600:1f14:0:1:2::a", "2001:db8::10", "2001:db8::10", "2600:1f14:0:1:2::a"), false},
		{"truncated", ctEntry("100.64.1.9", "1.1.1.1", "1.1.1.1", "100.64.1.9")[:9], false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := conntrackNames(tt.msg, want); got != tt.want {
				t.Errorf("conntrackNames = %v, want %v", got, tt.want)
			}
		})
	}
}

// Every truncation of an entry is read without panicking.
func TestConntrackNamesTruncated(t *testing.T) {
	msg := ctEntry("10.0.0.5", "10.96.0.10", "100.64.1.9", "10.0.0.5")
	for n := range len(msg) {
		conntrackNames(msg[:n], map[netip.Addr]bool{netip.MustParseAddr("100.64.1.9"): true})
	}
}

// FlushConntrack deletes, in a netns's real tables, the IPv4 and IPv6
// entries naming the given addresses (IPv6 mode's pods) and leaves the
// others.
func TestFlushConntrackBothFamilies(t *testing.T) {
	needRoot(t)
	n := newNS(t, "ct")
	flow := func(family uint8, src, dst string, sport uint16) *netlink.ConntrackFlow {
		s, d := net.IP(netip.MustParseAddr(src).AsSlice()), net.IP(netip.MustParseAddr(dst).AsSlice())
		return &netlink.ConntrackFlow{FamilyType: family,
			Forward:   netlink.IPTuple{SrcIP: s, DstIP: d, Protocol: unix.IPPROTO_TCP, SrcPort: sport, DstPort: 80},
			Reverse:   netlink.IPTuple{SrcIP: d, DstIP: s, Protocol: unix.IPPROTO_TCP, SrcPort: 80, DstPort: sport},
			TimeOut:   120,
			ProtoInfo: &netlink.ProtoInfoTCP{State: 1}}
	}
	flows := []*netlink.ConntrackFlow{
		flow(unix.AF_INET6, "2600:1f14:0:1:2::9", "2001:db8::10", 40001),
		flow(unix.AF_INET6, "2001:db8::10", "2600:1f14:0:1:2::9", 40002),
		flow(unix.AF_INET6, "2600:1f14:0:1:2::a", "2001:db8::10", 40003),
		flow(unix.AF_INET, "100.64.1.9", "203.0.113.10", 40004),
		flow(unix.AF_INET, "100.64.1.10", "203.0.113.10", 40005),
	}
	n.do(t, func() error {
		for _, f := range flows {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType), f); err != nil {
				return err
			}
		}
		return nil
	})
	var deleted uint
	n.do(t, func() (err error) {
		deleted, err = FlushConntrack([]netip.Addr{netip.MustParseAddr("2600:1f14:0:1:2::9"), netip.MustParseAddr("100.64.1.9")})
		return err
	})
	var left []string
	n.do(t, func() error {
		for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			fs, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
			if err != nil {
				return err
			}
			for _, f := range fs {
				left = append(left, f.Forward.SrcIP.String())
			}
		}
		return nil
	})
	slices.Sort(left)
	if want := []string{"100.64.1.10", "2600:1f14:0:1:2::a"}; deleted != 3 || !slices.Equal(left, want) {
		t.Errorf("FlushConntrack deleted %d, left entries from %v; want 3 deleted, %v left", deleted, left, want)
	}
}
