package hostnet

import (
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"
)

func needIptables(t *testing.T) {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("needs the iptables command")
	}
}

func testSNATConfig() SNATConfig {
	return SNATConfig{
		VPCCIDRs:     []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16")},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")},
		PrimaryIP:    netip.MustParseAddr("100.64.0.10"),
		PrimaryLink:  "eth0",
		Ports:        SNATPortsRandomFully,
	}
}

// snatState is the node's SNAT setup as iptables -S and ip rule print it,
// vpcip comments stripped.
type snatState struct {
	Nat, Mangle []string
	MarkRules   []string
	RPFilter    string
}

func readSNATState(t *testing.T, n *testNS) snatState {
	t.Helper()
	return snatState{
		Nat:       n.iptRules(t, "nat"),
		Mangle:    n.iptRules(t, "mangle"),
		MarkRules: n.lines(t, "ip", "-4", "rule", "show", "priority", "1024"),
		RPFilter:  strings.TrimSpace(n.run(t, "cat", "/proc/sys/net/ipv4/conf/eth0/rp_filter")),
	}
}

// wantSNATState is the full expected rule set for testSNATConfig with the
// given VPC CIDRs, written out literally.
func wantSNATState(vpc ...string) snatState {
	var natReturns, mangleReturns []string
	for _, c := range append(vpc, "10.10.0.0/16") {
		natReturns = append(natReturns, "-A VPCIP-SNAT -d "+c+" -j RETURN")
		mangleReturns = append(mangleReturns, "-A VPCIP-EGRESS -d "+c+" -j RETURN")
	}
	s := snatState{
		Nat: append(append([]string{"-A POSTROUTING -j VPCIP-SNAT"}, natReturns...),
			"-A VPCIP-SNAT -o eth0 -m addrtype ! --src-type LOCAL -j SNAT --to-source 100.64.0.10 --random-fully"),
		Mangle: []string{
			"-A PREROUTING -j VPCIP-CONNMARK",
			"-A VPCIP-CONNMARK -i eth0 -m addrtype --dst-type LOCAL --limit-iface-in -m conntrack --ctstate NEW -j CONNMARK --set-xmark 0x80/0x80",
			"-A VPCIP-CONNMARK ! -i eth0 -m conntrack --ctstate NEW -j VPCIP-EGRESS",
			"-A VPCIP-CONNMARK ! -i eth0 -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80",
		},
		MarkRules: []string{"1024: from all fwmark 0x80/0x80 lookup main"},
		RPFilter:  "2",
	}
	s.Mangle = append(append(s.Mangle, mangleReturns...), "-A VPCIP-EGRESS -j CONNMARK --set-xmark 0x80/0x80")
	return s
}

func newSNATNode(t *testing.T, role string) *testNS {
	needIptables(t)
	n := newNS(t, role)
	n.addVeth(t, "eth0", "0a:00:00:00:00:01", "eth0peer")
	return n
}

func TestEnsureSNATExactlyOnce(t *testing.T) {
	n := newSNATNode(t, "snat")
	c := testSNATConfig()
	for i := range 3 {
		n.do(t, func() error { return EnsureSNAT(c) })
		if diff := cmp.Diff(wantSNATState("100.64.0.0/16"), readSNATState(t, n)); diff != "" {
			t.Fatalf("after EnsureSNAT #%d (-want +got):\n%s", i+1, diff)
		}
	}

	// A second VPC CIDR (associated later) converges in place.
	c.VPCCIDRs = append(c.VPCCIDRs, netip.MustParsePrefix("100.65.0.0/16"))
	for i := range 2 {
		n.do(t, func() error { return EnsureSNAT(c) })
		if diff := cmp.Diff(wantSNATState("100.64.0.0/16", "100.65.0.0/16"), readSNATState(t, n)); diff != "" {
			t.Fatalf("after EnsureSNAT with two VPC CIDRs #%d (-want +got):\n%s", i+1, diff)
		}
	}

	n.do(t, RemoveSNAT)
	got := readSNATState(t, n)
	want := snatState{Nat: nil, Mangle: nil, MarkRules: nil, RPFilter: "2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("after RemoveSNAT (-want +got):\n%s", diff)
	}
	n.do(t, RemoveSNAT) // nothing left: success
}

// B17: switching external SNAT on removes our SNAT and egress marks but
// keeps the NodePort connection marks; switching it off restores the full
// set, and no rule of the old setting survives either switch.
func TestEnsureSNATExternalToggle(t *testing.T) {
	n := newSNATNode(t, "snatext")
	c := testSNATConfig()
	n.do(t, func() error { return EnsureSNAT(c) })

	c.External = true
	for range 2 {
		n.do(t, func() error { return EnsureSNAT(c) })
	}
	want := snatState{
		Nat: nil,
		Mangle: []string{
			"-A PREROUTING -j VPCIP-CONNMARK",
			"-A VPCIP-CONNMARK -i eth0 -m addrtype --dst-type LOCAL --limit-iface-in -m conntrack --ctstate NEW -j CONNMARK --set-xmark 0x80/0x80",
			"-A VPCIP-CONNMARK ! -i eth0 -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80",
		},
		MarkRules: []string{"1024: from all fwmark 0x80/0x80 lookup main"},
		RPFilter:  "2",
	}
	if diff := cmp.Diff(want, readSNATState(t, n)); diff != "" {
		t.Fatalf("external SNAT (-want +got):\n%s", diff)
	}
	if chains := n.run(t, "iptables", "-w", "-t", "nat", "-S"); strings.Contains(chains, "VPCIP") {
		t.Fatalf("nat table still has a vpcip chain:\n%s", chains)
	}

	c.External = false
	n.do(t, func() error { return EnsureSNAT(c) })
	if diff := cmp.Diff(wantSNATState("100.64.0.0/16"), readSNATState(t, n)); diff != "" {
		t.Fatalf("back to node SNAT (-want +got):\n%s", diff)
	}
}

// A changed mark or port mapping (--random-fully to --random to none,
// AWS_VPC_K8S_CNI_RANDOMIZESNAT prng, hashrandom, none) replaces the old rules.
func TestEnsureSNATChangedSpec(t *testing.T) {
	n := newSNATNode(t, "snatspec")
	c := testSNATConfig()
	n.do(t, func() error { return EnsureSNAT(c) })
	c.Mark = 0x4000
	c.Ports = SNATPortsHashRandom
	n.run(t, "sysctl", "-qw", "net.ipv4.conf.eth0.rp_filter=1") // made strict behind our back (B15)
	n.do(t, func() error { return EnsureSNAT(c) })
	got := readSNATState(t, n)
	if got.RPFilter != "2" {
		t.Errorf("rp_filter on eth0 %s, want loose (2) restored", got.RPFilter)
	}
	if diff := cmp.Diff([]string{"1024: from all fwmark 0x4000/0x4000 lookup main"}, got.MarkRules); diff != "" {
		t.Errorf("mark rules (-want +got):\n%s", diff)
	}
	wantNat := []string{
		"-A POSTROUTING -j VPCIP-SNAT",
		"-A VPCIP-SNAT -d 100.64.0.0/16 -j RETURN",
		"-A VPCIP-SNAT -d 10.10.0.0/16 -j RETURN",
		"-A VPCIP-SNAT -o eth0 -m addrtype ! --src-type LOCAL -j SNAT --to-source 100.64.0.10 --random",
	}
	if diff := cmp.Diff(wantNat, got.Nat); diff != "" {
		t.Errorf("nat with hashrandom (-want +got):\n%s", diff)
	}
	c.Ports = SNATPortsNone
	n.do(t, func() error { return EnsureSNAT(c) })
	wantNat[3] = strings.TrimSuffix(wantNat[3], " --random")
	if diff := cmp.Diff(wantNat, readSNATState(t, n).Nat); diff != "" {
		t.Errorf("nat with none (-want +got):\n%s", diff)
	}
	for _, l := range got.Mangle {
		if strings.Contains(l, "0x80") {
			t.Errorf("mangle rule with the old mark left: %s", l)
		}
	}
}

// B28: concurrent Ensure calls (several goroutines, each on its own thread
// in the node netns) still leave every rule exactly once.
func TestEnsureSNATConcurrent(t *testing.T) {
	n := newSNATNode(t, "snatconc")
	c := testSNATConfig()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			errs <- n.ns.Do(func(ns.NetNS) error { return EnsureSNAT(c) })
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(wantSNATState("100.64.0.0/16"), readSNATState(t, n)); diff != "" {
		t.Fatalf("after concurrent EnsureSNAT (-want +got):\n%s", diff)
	}
}

func TestSNATConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*SNATConfig)
		want   string
	}{
		{"valid", func(*SNATConfig) {}, ""},
		{"external needs no SNAT source", func(c *SNATConfig) { c.External = true; c.PrimaryIP = netip.Addr{}; c.VPCCIDRs = nil }, ""},
		{"no primary link", func(c *SNATConfig) { c.PrimaryLink = "" }, "primary link"},
		{"no SNAT source", func(c *SNATConfig) { c.PrimaryIP = netip.Addr{} }, "primary IP"},
		{"no VPC CIDR", func(c *SNATConfig) { c.VPCCIDRs = nil }, "no VPC CIDR"},
		{"IPv6 exclusion", func(c *SNATConfig) { c.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00::/8")} }, "fd00::/8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testSNATConfig()
			tt.change(&c)
			err := c.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// The SNAT rule's port flag for each AWS_VPC_K8S_CNI_RANDOMIZESNAT value,
// with and without iptables support for --random-fully (≥ 1.6.2). The
// fallback cannot be reached by the root tests on a recent iptables.
func TestSNATPortsFlag(t *testing.T) {
	tests := []struct {
		ports       SNATPorts
		randomFully bool // iptables has --random-fully
		want        string
	}{
		{SNATPortsRandomFully, true, " --random-fully"},
		{SNATPortsRandomFully, false, " --random"}, // prng falls back to hash randomization, not to none
		{"", true, " --random-fully"},              // the zero value is prng
		{SNATPortsHashRandom, true, " --random"},   // AWS documents hashrandom as --random
		{SNATPortsHashRandom, false, " --random"},  // --random predates --random-fully
		{SNATPortsNone, true, ""},                  // the pod's port is kept when free
		{SNATPortsNone, false, ""},                 // likewise
	}
	for _, tt := range tests {
		c := testSNATConfig()
		c.Ports = tt.ports
		var got []string
		for _, r := range snatRules(c, tt.randomFully).chain("nat", ChainSNAT) {
			if len(r.target) > 1 && r.target[1] == "SNAT" {
				got = append(got, strings.Join(r.target, " "))
			}
		}
		want := []string{"-j SNAT --to-source 100.64.0.10" + tt.want}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("ports %q, --random-fully supported %v: SNAT targets (-want +got):\n%s", tt.ports, tt.randomFully, d)
		}
	}
}
