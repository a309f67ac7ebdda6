package hostnet

import (
	"net/netip"
	"slices"
	"strings"
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
	for _, r := range [][]string{
		{"10.0.0.51/32", "dev", "enib2c3d4e5f60", "scope", "link"},
		{"10.0.0.50/32", "dev", "eni0123456789a", "scope", "link"},
		{"10.0.0.0/24", "dev", "eth0", "scope", "link"},                          // a /24, not a pod /32
		{"169.254.169.254/32", "dev", "eth0", "scope", "link"},                   // metadata, link-local
		{"10.0.0.60/32", "dev", "lo", "scope", "link"},                           // not a veth
		{"10.0.0.70/32", "via", "10.0.0.1", "dev", "eth0"},                       // via a gateway, not scope link
		{"10.0.0.80/32", "dev", "enib2c3d4e5f60", "scope", "link", "table", "7"}, // not the main table
	} {
		n.run(t, append([]string{"ip", "route", "add"}, r...)...)
	}
	var got []PodRoute
	n.do(t, func() (err error) { got, err = PodRoutes(); return err })
	want := []PodRoute{
		{Address: netip.MustParseAddr("10.0.0.50"), HostVeth: "eni0123456789a"},
		{Address: netip.MustParseAddr("10.0.0.51"), HostVeth: "enib2c3d4e5f60"},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("PodRoutes (-want +got):\n%s", diff)
	}
}

// TestRemovePodRules deletes exactly the plugin's rules of one address and
// leaves every other rule, including another pod's, alone.
func TestRemovePodRules(t *testing.T) {
	needRoot(t)
	n := newNS(t, "podrules")
	for _, r := range [][]string{
		{"to", "10.0.0.50/32", "lookup", "main", "priority", "512"},
		{"from", "10.0.0.50/32", "lookup", "2", "priority", "1536"},
		{"to", "10.0.0.51/32", "lookup", "main", "priority", "512"},
		{"from", "10.0.0.51/32", "lookup", "3", "priority", "1536"},
		{"from", "10.0.0.50/32", "lookup", "2", "priority", "1535"}, // an ENI rule, not a pod's
	} {
		n.run(t, append([]string{"ip", "rule", "add"}, r...)...)
	}
	var listed []netip.Addr
	n.do(t, func() (err error) { listed, err = PodRuleAddresses(); return err })
	if want := []netip.Addr{netip.MustParseAddr("10.0.0.50"), netip.MustParseAddr("10.0.0.51")}; !slices.Equal(listed, want) {
		t.Errorf("PodRuleAddresses = %v, want %v", listed, want)
	}
	var removed int
	n.do(t, func() (err error) { removed, err = RemovePodRules(netip.MustParseAddr("10.0.0.50")); return err })
	if removed != 2 {
		t.Errorf("removed %d rules, want 2", removed)
	}
	got := n.run(t, "ip", "rule", "show")
	for _, want := range []string{"512:\tfrom all to 10.0.0.51 lookup main", "1536:\tfrom 10.0.0.51 lookup 3", "1535:\tfrom 10.0.0.50 lookup 2"} {
		if !strings.Contains(got, want) {
			t.Errorf("rule %q gone:\n%s", want, got)
		}
	}
	if strings.Contains(got, "to 10.0.0.50 ") || strings.Contains(got, "1536:\tfrom 10.0.0.50 ") {
		t.Errorf("a rule of 10.0.0.50 is left:\n%s", got)
	}
	n.do(t, func() (err error) { removed, err = RemovePodRules(netip.MustParseAddr("10.0.0.50")); return err })
	if removed != 0 {
		t.Errorf("second call removed %d rules, want 0", removed)
	}
}
