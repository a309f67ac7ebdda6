package hostnet

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctEntry serializes a ctnetlink entry as the kernel dumps it: nfgenmsg,
// then the original and reply tuples (addresses only) and a status.
func ctEntry(origSrc, origDst, replySrc, replyDst string) []byte {
	tuple := func(typ int, src, dst string) *nl.RtAttr {
		t := nl.NewRtAttr(typ|int(nl.NLA_F_NESTED), nil)
		ip := t.AddRtAttr(nl.CTA_TUPLE_IP|int(nl.NLA_F_NESTED), nil)
		s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
		ip.AddRtAttr(nl.CTA_IP_V4_SRC, s[:])
		ip.AddRtAttr(nl.CTA_IP_V4_DST, d[:])
		return t
	}
	msg := (&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0}).Serialize()
	msg = append(msg, tuple(nl.CTA_TUPLE_ORIG, origSrc, origDst).Serialize()...)
	msg = append(msg, tuple(nl.CTA_TUPLE_REPLY, replySrc, replyDst).Serialize()...)
	msg = append(msg, nl.NewRtAttr(nl.CTA_STATUS, []byte{0, 0, 0, 8}).Serialize()...)
	return msg
}

func TestConntrackNames(t *testing.T) {
	pod := netip.MustParseAddr("100.64.1.9").As4()
	want := map[[4]byte]bool{pod: true, netip.MustParseAddr("100.64.1.77").As4(): true}
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
		conntrackNames(msg[:n], map[[4]byte]bool{netip.MustParseAddr("100.64.1.9").As4(): true})
	}
}
