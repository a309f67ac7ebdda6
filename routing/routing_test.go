package routing

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/vpcip/vpcip/test/netnsdir"
)

func TestTableForDevice(t *testing.T) {
	for _, tc := range []struct{ device, table int }{
		{0, 254}, // the primary ENI routes by the main table
		{1, 2},
		{2, 3},
		{14, 15},
	} {
		if got := TableForDevice(tc.device); got != tc.table {
			t.Errorf("TableForDevice(%d) = %d, want %d", tc.device, got, tc.table)
		}
	}
}

func TestPodRulesShape(t *testing.T) {
	addr := netip.MustParseAddr("10.0.1.7")
	for _, tc := range []struct {
		name  string
		table int
		want  []string
	}{
		{"primary ENI (0)", 0, []string{"512: to 10.0.1.7/32 lookup main"}},
		{"primary ENI (main)", MainTable, []string{"512: to 10.0.1.7/32 lookup main"}},
		{"secondary ENI", 3, []string{"512: to 10.0.1.7/32 lookup main", "1536: from 10.0.1.7/32 lookup 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range PodRules(addr, tc.table) {
				got = append(got, Describe(r))
				if a, ok := PodRuleAddr(r); !ok || a != addr {
					t.Errorf("PodRuleAddr(%s) = %v, %v: a rule PodRules makes is not recognised", Describe(r), a, ok)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("PodRules (-want +got):\n%s", d)
			}
		})
	}
}

func TestPodRuleAddrRejectsOtherShapes(t *testing.T) {
	n24 := &net.IPNet{IP: net.IPv4(10, 0, 1, 0).To4(), Mask: net.CIDRMask(24, 32)}
	h := host32(netip.MustParseAddr("10.0.1.7"))
	rule := func(prio int, src, dst *net.IPNet) netlink.Rule {
		r := netlink.NewRule()
		r.Priority, r.Src, r.Dst, r.Table = prio, src, dst, 2
		return *r
	}
	for _, tc := range []struct {
		name string
		r    netlink.Rule
	}{
		{"ENI rule at 1535", rule(PriorityENI, h, nil)},
		{"mark rule", rule(PriorityMark, nil, nil)},
		{"to rule without an address (wildcard)", rule(PriorityToPod, nil, nil)},
		{"from rule without an address (wildcard)", rule(PriorityFromPod, nil, nil)},
		{"to rule of a /24", rule(PriorityToPod, nil, n24)},
		{"to rule with a source too", rule(PriorityToPod, h, h)},
		{"from rule with a destination too", rule(PriorityFromPod, h, h)},
		{"from selector at the to priority", rule(PriorityToPod, h, nil)},
	} {
		if a, ok := PodRuleAddr(tc.r); ok {
			t.Errorf("%s: PodRuleAddr = %v, want not a pod rule", tc.name, a)
		}
	}
}

var nsSeq atomic.Int64

// inNetns runs f in a throwaway netns ("vrt-...") after setup, a list of
// `ip` argument lists run inside it; it returns `ip rule show` afterwards.
func inNetns(t *testing.T, setup [][]string, f func() error) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	name := fmt.Sprintf("vrt-%d-%d", os.Getpid(), nsSeq.Add(1))
	ip := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if err := netnsdir.Create(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netnsdir.Delete(name) })
	for _, args := range setup {
		ip(args...)
	}
	h, err := ns.GetNS("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
	return ip("rule", "show")
}

// TestRemovePodRules deletes exactly the pod rules of one address and
// leaves every other rule, including another pod's and an ENI rule for the
// same address, alone.
func TestRemovePodRules(t *testing.T) {
	setup := [][]string{
		{"rule", "add", "to", "10.0.0.50/32", "lookup", "main", "priority", "512"},
		{"rule", "add", "from", "10.0.0.50/32", "lookup", "2", "priority", "1536"},
		{"rule", "add", "to", "10.0.0.51/32", "lookup", "main", "priority", "512"},
		{"rule", "add", "from", "10.0.0.51/32", "lookup", "3", "priority", "1536"},
		{"rule", "add", "from", "10.0.0.50/32", "lookup", "2", "priority", "1535"}, // an ENI rule, not a pod's
	}
	var listed []netip.Addr
	var removed, again int
	got := inNetns(t, setup, func() (err error) {
		if listed, err = PodRuleAddresses(); err != nil {
			return err
		}
		if removed, err = RemovePodRules(netip.MustParseAddr("10.0.0.50")); err != nil {
			return err
		}
		again, err = RemovePodRules(netip.MustParseAddr("10.0.0.50"))
		return err
	})
	if want := []netip.Addr{netip.MustParseAddr("10.0.0.50"), netip.MustParseAddr("10.0.0.51")}; !slices.Equal(listed, want) {
		t.Errorf("PodRuleAddresses = %v, want %v", listed, want)
	}
	if removed != 2 || again != 0 {
		t.Errorf("removed %d rules, then %d; want 2, then 0", removed, again)
	}
	for _, want := range []string{"512:\tfrom all to 10.0.0.51 lookup main", "1536:\tfrom 10.0.0.51 lookup 3", "1535:\tfrom 10.0.0.50 lookup 2"} {
		if !strings.Contains(got, want) {
			t.Errorf("rule %q gone:\n%s", want, got)
		}
	}
	if strings.Contains(got, "to 10.0.0.50 ") || strings.Contains(got, "1536:\tfrom 10.0.0.50 ") {
		t.Errorf("a rule of 10.0.0.50 is left:\n%s", got)
	}
}

// TestEnsurePodRulesReplacesStale (B28): a "from" rule of the address into
// another table, left by an earlier owner, is replaced; a second call
// changes nothing.
func TestEnsurePodRulesReplacesStale(t *testing.T) {
	addr := netip.MustParseAddr("10.0.0.50")
	setup := [][]string{{"rule", "add", "from", "10.0.0.50/32", "lookup", "7", "priority", "1536"}}
	var missing, stale []netlink.Rule
	got := inNetns(t, setup, func() (err error) {
		if err := EnsurePodRules(addr, 2); err != nil {
			return err
		}
		if err := EnsurePodRules(addr, 2); err != nil {
			return err
		}
		missing, stale, err = DiffPodRules(addr, 2)
		return err
	})
	if len(missing)+len(stale) != 0 {
		t.Errorf("after EnsurePodRules: missing %v, stale %v", missing, stale)
	}
	want := "512:\tfrom all to 10.0.0.50 lookup main\n1536:\tfrom 10.0.0.50 lookup 2\n"
	if !strings.Contains(got, want) || strings.Contains(got, "lookup 7") || strings.Count(got, "10.0.0.50") != 2 {
		t.Errorf("rules:\n%s\nwant exactly\n%s", got, want)
	}
}

func TestSandboxAliasRoundTrip(t *testing.T) {
	tests := []struct {
		network, id, ifName string
		ok                  bool
	}{
		{"vpcip", "c1", "eth0", true},
		{"team/net", "0123abcd", "net1", true}, // a "/" in the network name
		{"vpcip", strings.Repeat("a", 300), "eth0", false},
	}
	for _, tt := range tests {
		alias := SandboxAlias(tt.network, tt.id, tt.ifName)
		if len(alias) > 255 {
			t.Errorf("alias of %s is %d bytes, over the kernel's 255", tt.id, len(alias))
		}
		n, id, ifn, ok := ParseSandboxAlias(alias)
		if ok != tt.ok || (ok && (n != tt.network || id != tt.id || ifn != tt.ifName)) {
			t.Errorf("ParseSandboxAlias(%q) = %q %q %q %v", alias, n, id, ifn, ok)
		}
	}
	for _, bad := range []string{"", "other", "vpcip ", "vpcip a/b", "vpcip /c/eth0", "vpcip n//eth0", "vpcip n/c/"} {
		if _, _, _, ok := ParseSandboxAlias(bad); ok {
			t.Errorf("ParseSandboxAlias(%q) accepted", bad)
		}
	}
}
