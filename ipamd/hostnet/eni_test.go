package hostnet

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"
)

// eniState is what the node shows for the ENI link "eth1" and table 2, read
// with the ip command so the check does not share code with hostnet.
type eniState struct {
	Link     string   // "ip -o link show eth1" fields that matter
	RPFilter string   // net.ipv4.conf.eth1.rp_filter
	Addrs    []string // ip -4 addr show dev eth1
	Table    []string // ip -4 route show table 2
	Main     []string // ip -4 route show table main
	Rules    []string // ip -4 rule show priority 1535
}

func readENIState(t *testing.T, n *testNS) eniState {
	t.Helper()
	link := n.run(t, "ip", "-o", "link", "show", "eth1")
	f := strings.Fields(link)
	mtu := ""
	for i := range f {
		if f[i] == "mtu" && i+1 < len(f) {
			mtu = f[i+1]
		}
	}
	up := strings.Contains(f[2], ",UP")
	var addrs []string
	for _, l := range n.lines(t, "ip", "-4", "-o", "addr", "show", "dev", "eth1") {
		fs := strings.Fields(l)
		a := strings.Join(fs[2:4], " ")
		if strings.Contains(l, "noprefixroute") {
			a += " noprefixroute"
		}
		addrs = append(addrs, a)
	}
	return eniState{
		Link:     "mtu " + mtu + map[bool]string{true: " up", false: " down"}[up],
		RPFilter: strings.TrimSpace(n.run(t, "cat", "/proc/sys/net/ipv4/conf/eth1/rp_filter")),
		Addrs:    addrs,
		Table:    n.lines(t, "ip", "-4", "route", "show", "table", "2"),
		Main:     n.lines(t, "ip", "-4", "route", "show", "table", "main"),
		Rules:    n.lines(t, "ip", "-4", "rule", "show", "priority", "1535"),
	}
}

func testENI() ENI {
	return ENI{
		MAC:          "0A:00:00:00:01:01", // upper case on purpose: match is case-insensitive
		DeviceNumber: 1,
		PrimaryIP:    netip.MustParseAddr("10.0.1.10"),
		SubnetCIDR:   netip.MustParsePrefix("10.0.1.0/24"),
		Gateway:      netip.MustParseAddr("10.0.1.1"),
		MTU:          9001,
	}
}

func TestEnsureENISetsUpLinkTableAndRule(t *testing.T) {
	needRoot(t)
	n := newNS(t, "eni")
	n.addVeth(t, "eth1", "0a:00:00:00:01:01", "eni1peer")
	e := testENI()

	want := eniState{
		Link:     "mtu 9001 up",
		RPFilter: "2",
		Addrs:    []string{"inet 10.0.1.10/24 noprefixroute"},
		Table: []string{
			"default via 10.0.1.1 dev eth1",
			"10.0.1.0/24 dev eth1 scope link src 10.0.1.10",
			"10.0.1.1 dev eth1 scope link",
		},
		Main:  nil, // no prefix route for the ENI subnet in main
		Rules: []string{"1535: from 10.0.1.10 lookup 2"},
	}
	for i := range 3 {
		var name string
		n.do(t, func() (err error) { name, err = EnsureENI(e); return err })
		if name != "eth1" {
			t.Fatalf("run %d: link name %q, want eth1", i, name)
		}
		if diff := cmp.Diff(want, readENIState(t, n)); diff != "" {
			t.Fatalf("run %d: node state (-want +got):\n%s", i, diff)
		}
	}

	n.do(t, func() error { return RemoveENI(e) })
	got := readENIState(t, n)
	if len(got.Table) != 0 || len(got.Rules) != 0 || len(got.Addrs) != 0 {
		t.Fatalf("after RemoveENI: table %q, rules %q, addresses %q; want all empty", got.Table, got.Rules, got.Addrs)
	}
	n.do(t, func() error { return RemoveENI(e) }) // already gone: success
}

// A table or rule left by another spec (a former ENI at this device number,
// an operator's edit) is replaced, not kept alongside (B28: "exists" is only
// success when it matches).
func TestEnsureENIReplacesStaleState(t *testing.T) {
	needRoot(t)
	n := newNS(t, "enistale")
	n.addVeth(t, "eth1", "0a:00:00:00:01:01", "eni1peer")
	n.run(t, "ip", "link", "set", "eth1", "up")
	n.run(t, "ip", "route", "add", "192.0.2.0/24", "dev", "eth1", "table", "2")
	n.run(t, "ip", "route", "add", "default", "dev", "eth1", "table", "2")
	n.run(t, "ip", "route", "add", "10.0.1.0/24", "dev", "eth1", "table", "2") // no src: replaced, and its delete must not hit the new one
	n.run(t, "ip", "route", "add", "10.0.1.0/24", "dev", "eth1", "table", "2", "metric", "50")
	n.run(t, "ip", "rule", "add", "from", "10.0.1.99", "lookup", "2", "priority", "1535")
	n.run(t, "ip", "rule", "add", "from", "10.0.1.10", "lookup", "2", "priority", "1535")
	n.run(t, "ip", "addr", "add", "10.0.1.10/16", "dev", "eth1")
	n.run(t, "sysctl", "-qw", "net.ipv4.conf.eth1.rp_filter=1") // someone made it strict again (B15)

	e := testENI()
	n.do(t, func() error { _, err := EnsureENI(e); return err })
	got := readENIState(t, n)
	wantTable := []string{
		"default via 10.0.1.1 dev eth1",
		"10.0.1.0/24 dev eth1 scope link src 10.0.1.10",
		"10.0.1.1 dev eth1 scope link",
	}
	if diff := cmp.Diff(wantTable, got.Table); diff != "" {
		t.Errorf("table 2 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"1535: from 10.0.1.10 lookup 2"}, got.Rules); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if len(got.Addrs) != 1 || got.Addrs[0] != "inet 10.0.1.10/24 noprefixroute" {
		t.Errorf("addresses %q, want only 10.0.1.10/24", got.Addrs)
	}
	if got.RPFilter != "2" {
		t.Errorf("rp_filter %s, want loose (2) restored", got.RPFilter)
	}
}

// B28: concurrent EnsureENI calls for one ENI (each goroutine on its own
// thread in the node netns) all succeed and leave every object once.
func TestEnsureENIConcurrent(t *testing.T) {
	needRoot(t)
	n := newNS(t, "eniconc")
	n.addVeth(t, "eth1", "0a:00:00:00:01:01", "eni1peer")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			errs <- n.ns.Do(func(ns.NetNS) error { _, err := EnsureENI(testENI()); return err })
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := readENIState(t, n)
	if len(got.Table) != 3 || len(got.Rules) != 1 || len(got.Addrs) != 1 {
		t.Fatalf("after concurrent EnsureENI: table %q, rules %q, addresses %q; want 3 routes, 1 rule, 1 address", got.Table, got.Rules, got.Addrs)
	}
}

// B16: a changed AWS_VPC_ENI_MTU reaches ENIs already set up.
func TestEnsureENIAppliesChangedMTU(t *testing.T) {
	needRoot(t)
	n := newNS(t, "enimtu")
	n.addVeth(t, "eth1", "0a:00:00:00:01:01", "eni1peer")
	for _, mtu := range []int{9001, 1500, 9001} {
		e := testENI()
		e.MTU = mtu
		n.do(t, func() error { _, err := EnsureENI(e); return err })
		var got int
		n.do(t, func() error {
			l, err := netlinksafe.LinkByName("eth1")
			if err == nil {
				got = l.Attrs().MTU
			}
			return err
		})
		if got != mtu {
			t.Fatalf("MTU %d after EnsureENI with MTU %d", got, mtu)
		}
	}
}

func TestEnsureENILinkNotFound(t *testing.T) {
	needRoot(t)
	n := newNS(t, "eninolink")
	var err error
	n.do(t, func() error { _, err = EnsureENI(testENI()); return nil })
	if !errors.Is(err, ErrLinkNotFound) {
		t.Fatalf("EnsureENI without the link: %v, want ErrLinkNotFound", err)
	}
	if rules := n.lines(t, "ip", "-4", "rule", "show", "priority", "1535"); len(rules) != 0 {
		t.Fatalf("rules added for a missing link: %q", rules)
	}
	// The link is gone (ENI detached): RemoveENI still clears table and rule.
	n.run(t, "ip", "rule", "add", "from", "10.0.1.10", "lookup", "2", "priority", "1535")
	n.do(t, func() error { return RemoveENI(testENI()) })
	if rules := n.lines(t, "ip", "-4", "rule", "show", "priority", "1535"); len(rules) != 0 {
		t.Fatalf("rules left after RemoveENI: %q", rules)
	}
}

func TestENIValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*ENI)
		want   string // substring of the error; "" for valid
	}{
		{"valid", func(*ENI) {}, ""},
		{"MTU 0 keeps the link's", func(e *ENI) { e.MTU = 0 }, ""},
		{"primary ENI has no table of its own", func(e *ENI) { e.DeviceNumber = 0 }, "device number 0"},
		{"MTU below IPv4 minimum", func(e *ENI) { e.MTU = 500 }, "MTU 500"},
		{"MTU above EC2 maximum", func(e *ENI) { e.MTU = 9216 }, "MTU 9216"},
		{"bad MAC", func(e *ENI) { e.MAC = "0a:00" }, "MAC"},
		{"gateway outside subnet", func(e *ENI) { e.Gateway = netip.MustParseAddr("10.0.2.1") }, "gateway 10.0.2.1 is outside"},
		{"IPv6 primary", func(e *ENI) { e.PrimaryIP = netip.MustParseAddr("fd00::1") }, "primary IP fd00::1"},
		{"missing subnet", func(e *ENI) { e.SubnetCIDR = netip.Prefix{} }, "subnet CIDR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := testENI()
			tt.change(&e)
			err := e.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// The rp_filter write goes through the configured sysctl directory (the
// chart's mount of the host's /proc/sys/net), not the container's own
// read-only /proc/sys.
func TestLooseRPFilterThroughSysctlDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ipv4", "conf", "eth1", "rp_filter")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ensureLooseRPFilter(dir, "eth1"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != rpFilterLoose {
		t.Errorf("rp_filter = %q, want %q", b, rpFilterLoose)
	}
	if err := ensureLooseRPFilter(dir, "../x"); err == nil {
		t.Error("a link name with / was accepted")
	}
	if err := ensureLooseRPFilter(dir, "eth9"); err == nil {
		t.Error("a link without a sysctl file: no error")
	}
}
