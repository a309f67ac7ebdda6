package plugin

import (
	"bytes"
	"net"
	"reflect"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// TestAppendResultIsPrintTo: the plugin's result printer writes exactly
// the bytes libcni's PrintTo writes, for results using every field, none,
// nil elements, and strings JSON must escape.
func TestAppendResultIsPrintTo(t *testing.T) {
	ipn := func(s string) net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return *n
	}
	one, minus := 1, -3
	results := map[string]*current.Result{
		"empty":        {},
		"version only": {CNIVersion: "1.1.0"},
		"plugin's own": {
			CNIVersion: "1.1.0",
			Interfaces: []*current.Interface{
				{Name: "eni0123456789a", Mac: "0a:1b:2c:3d:4e:5f", Mtu: 9001},
				{Name: "eth0", Mac: "aa:bb:cc:dd:ee:ff", Mtu: 9001, Sandbox: "/var/run/netns/cni-1234"},
			},
			IPs:    []*current.IPConfig{{Interface: current.Int(1), Address: ipn("100.64.7.9/32"), Gateway: net.ParseIP("169.254.1.1").To4()}},
			Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: net.ParseIP("169.254.1.1")}},
		},
		"every field": {
			CNIVersion: "1.0.0",
			Interfaces: []*current.Interface{nil, {Name: `a"b\c<d>&é` + "\x01\u2028", Mac: "m", Mtu: -1, Sandbox: "s", SocketPath: "/run/x.sock", PciID: "0000:00:1f.6"}},
			IPs: []*current.IPConfig{
				{Address: ipn("2600:1f14::5/128")},
				nil,
				{Interface: &one, Address: ipn("10.0.0.1/24"), Gateway: net.ParseIP("10.0.0.254")},
			},
			Routes: []*types.Route{
				{Dst: ipn("10.1.0.0/16"), GW: net.ParseIP("fe80::1"), MTU: 1500, AdvMSS: 1460, Priority: 7, Table: &one, Scope: &minus},
				nil,
				{Dst: ipn("0.0.0.0/0")},
			},
			DNS: types.DNS{Nameservers: []string{"10.0.0.2", "fd00::2"}, Domain: "cluster.local", Search: []string{"a.svc", "b"}, Options: []string{"ndots:5"}},
		},
		"dns domain only":  {CNIVersion: "1.1.0", DNS: types.DNS{Domain: "x"}},
		"empty lists kept": {CNIVersion: "1.1.0", Interfaces: []*current.Interface{}, IPs: []*current.IPConfig{}, Routes: []*types.Route{}, DNS: types.DNS{Search: []string{}}},
	}
	for name, r := range results {
		var want bytes.Buffer
		if err := r.PrintTo(&want); err != nil {
			t.Fatalf("%s: PrintTo: %v", name, err)
		}
		got, err := appendResult(nil, r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
}

// TestAppendResultKnowsEveryField fails when libcni's result types gain a
// field the printer does not write (update appendResult, and the
// every-field case above).
func TestAppendResultKnowsEveryField(t *testing.T) {
	for typ, n := range map[reflect.Type]int{
		reflect.TypeFor[current.Result]():    5,
		reflect.TypeFor[current.Interface](): 6,
		reflect.TypeFor[current.IPConfig]():  3,
		reflect.TypeFor[types.Route]():       7,
		reflect.TypeFor[types.DNS]():         4,
	} {
		if typ.NumField() != n {
			t.Errorf("%s has %d fields; appendResult writes %d", typ, typ.NumField(), n)
		}
	}
}
