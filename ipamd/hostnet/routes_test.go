package hostnet

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPodRoutes(t *testing.T) {
	needRoot(t)
	n := newNS(t, "podroutes")
	n.addVeth(t, "enib2c3d4e5f60", "0a:00:00:00:02:01", "podpeer1")
	n.addVeth(t, "eni0123456789a", "0a:00:00:00:02:02", "podpeer2")
	n.addVeth(t, "eth0", "0a:00:00:00:00:01", "eth0peer")
	for _, l := range []string{"enib2c3d4e5f60", "eni0123456789a", "eth0"} {
		n.run(t, "ip", "link", "set", l, "up")
	}
	n.run(t, "ip", "link", "set", "enib2c3d4e5f60", "alias", "vpcip vpcip/c51/eth0") // the plugin marks its veths
	for _, r := range [][]string{
		{"10.0.0.51/32", "dev", "enib2c3d4e5f60", "scope", "link"},
		{"10.0.0.50/32", "dev", "eni0123456789a", "scope", "link"},
		{"10.0.0.0/24", "dev", "eth0", "scope", "link"},                          // a /24, not a pod /32
		{"169.254.169.254/32", "dev", "eth0", "scope", "link"},                   // metadata, link-local
		{"10.0.0.60/32", "dev", "lo", "scope", "link"},                           // not a veth
		{"10.0.0.70/32", "via", "10.0.0.1", "dev", "eth0"},                       // via a gateway, not scope link
		{"10.0.0.80/32", "dev", "enib2c3d4e5f60", "scope", "link", "table", "7"}, // not the main table
		{"-6", "2600:1f14:1:2:3::5/128", "dev", "enib2c3d4e5f60"},                // an IPv6 pod (IPv6 mode)
		{"-6", "2600:1f14:1:2:3::/80", "dev", "eth0"},                            // a /80, not a pod /128
		{"-6", "fe80::5/128", "dev", "eni0123456789a"},                           // link-local
		{"-6", "2600:1f14:1:2:3::7/128", "dev", "enib2c3d4e5f60", "table", "7"},  // not the main table
	} {
		cmd := []string{"ip", "route", "add"}
		if r[0] == "-6" {
			cmd, r = []string{"ip", "-6", "route", "add"}, r[1:]
		}
		n.run(t, append(cmd, r...)...)
	}
	var got []PodRoute
	n.do(t, func() (err error) { got, err = PodRoutes(); return err })
	want := []PodRoute{
		{Address: netip.MustParseAddr("10.0.0.50"), HostVeth: "eni0123456789a"},
		{Address: netip.MustParseAddr("10.0.0.51"), HostVeth: "enib2c3d4e5f60", Sandbox: Sandbox{"vpcip", "c51", "eth0"}},
		{Address: netip.MustParseAddr("2600:1f14:1:2:3::5"), HostVeth: "enib2c3d4e5f60", Sandbox: Sandbox{"vpcip", "c51", "eth0"}},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("PodRoutes (-want +got):\n%s", diff)
	}
}
