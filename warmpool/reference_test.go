package warmpool

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Instance shapes of the reference's worked tables (EC2 limits: t3.small 3
// ENIs × 4 IPv4; p3dn.24xlarge 15 ENIs × 50 IPv4; max pods by the EKS
// formula ENIs × (IPv4 − 1) + 2, and 110 for t3.small with prefixes).
var (
	t3small       = Limits{MaxENIs: 3, SlotsPerENI: 3, MaxPods: 11, PrefixSupported: true}
	t3smallPrefix = Limits{MaxENIs: 3, SlotsPerENI: 3, MaxPods: 110, PrefixSupported: true}
	p3dn          = Limits{MaxENIs: 15, SlotsPerENI: 49, MaxPods: 737, PrefixSupported: true}
)

// growTo starts a node with only its primary ENI, then adds pods one at a
// time, letting the pool settle after each, as pods arrive on a real node.
func growTo(t *testing.T, lim Limits, cfg Config, pods int) *sim {
	t.Helper()
	s := newSim(lim, cfg)
	if _, err := s.settle(100); err != nil {
		t.Fatalf("settling the empty node: %v", err)
	}
	for i := range pods {
		if !s.addPod() {
			t.Fatalf("pod %d found no free address: %+v", i+1, Summarize(s.in))
		}
		applied, err := s.settle(100)
		if err != nil {
			t.Fatalf("after pod %d: %v", i+1, err)
		}
		for _, p := range applied {
			if p.Action == Release || p.Action == DeleteENI {
				t.Fatalf("after pod %d: shrink while pods only arrive: %v", i+1, p.Reason)
			}
		}
	}
	return s
}

func descending(xs []int) []int {
	out := slices.Clone(xs)
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// TestReferenceSecondaryIPTable replays every row of the reference's
// secondary-IP table (amazon-vpc-cni-k8s docs/eni-and-ip-target.md). The
// doc lists the IPs per ENI in no fixed ENI order ("2,3" for the primary
// holding 3), so that column is compared as a multiset.
func TestReferenceSecondaryIPTable(t *testing.T) {
	tests := []struct {
		name       string
		lim        Limits
		cfg        Config
		pods       int
		wantENIs   int
		wantIPs    int // attached secondary IPs
		wantUnused int
		wantPerENI []int
		reason     string
	}{
		{"t3small/eni1/pods0", t3small, Config{WarmENITarget: 1}, 0, 1, 3, 3, []int{3}, "a whole ENI's worth (3) free on the primary"},
		{"t3small/eni1/pods5", t3small, Config{WarmENITarget: 1}, 5, 3, 9, 4, []int{3, 3, 3}, "free fell below 3 twice: two more whole ENIs"},
		{"t3small/eni1/pods9", t3small, Config{WarmENITarget: 1}, 9, 3, 9, 0, []int{3, 3, 3}, "at the 3-ENI limit the pool cannot stay warm"},
		{"t3small/ip1min1/pods0", t3small, Config{WarmIPTarget: 1, MinimumIPTarget: 1}, 0, 1, 1, 1, []int{1}, "one warm address, floor one"},
		{"t3small/ip1min1/pods5", t3small, Config{WarmIPTarget: 1, MinimumIPTarget: 1}, 5, 2, 6, 1, []int{3, 3}, "one free after five pods: second ENI"},
		{"t3small/ip1min1/pods9", t3small, Config{WarmIPTarget: 1, MinimumIPTarget: 1}, 9, 3, 9, 0, []int{3, 3, 3}, "at the ENI limit"},
		{"t3small/ip2min5/pods0", t3small, Config{WarmIPTarget: 2, MinimumIPTarget: 5}, 0, 2, 5, 5, []int{2, 3}, "floor 5 needs a second ENI"},
		{"t3small/ip2min5/pods5", t3small, Config{WarmIPTarget: 2, MinimumIPTarget: 5}, 5, 3, 7, 2, []int{3, 3, 1}, "two warm on top of five pods"},
		{"t3small/ip2min5/pods9", t3small, Config{WarmIPTarget: 2, MinimumIPTarget: 5}, 9, 3, 9, 0, []int{3, 3, 3}, "at the ENI limit"},
		{"p3dn/eni1/pods0", p3dn, Config{WarmENITarget: 1}, 0, 1, 49, 49, []int{49}, "one ENI of 49 free"},
		{"p3dn/eni1/pods3", p3dn, Config{WarmENITarget: 1}, 3, 2, 98, 95, []int{49, 49}, "46 free < 49: a second whole ENI"},
		{"p3dn/eni1/pods95", p3dn, Config{WarmENITarget: 1}, 95, 3, 147, 52, []int{49, 49, 49}, "third ENI once free < 49"},
		{"p3dn/ip5min10/pods0", p3dn, Config{WarmIPTarget: 5, MinimumIPTarget: 10}, 0, 1, 10, 10, []int{10}, "floor 10"},
		{"p3dn/ip5min10/pods7", p3dn, Config{WarmIPTarget: 5, MinimumIPTarget: 10}, 7, 1, 12, 5, []int{12}, "five warm above seven pods"},
		{"p3dn/ip5min10/pods15", p3dn, Config{WarmIPTarget: 5, MinimumIPTarget: 10}, 15, 1, 20, 5, []int{20}, "five warm above fifteen pods"},
		{"p3dn/ip5min10/pods45", p3dn, Config{WarmIPTarget: 5, MinimumIPTarget: 10}, 45, 2, 50, 5, []int{49, 1}, "primary full at 49: one address on a second ENI"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := growTo(t, tt.lim, tt.cfg, tt.pods)
			c := Summarize(s.in)
			got := []int{c.ENIs, c.Total, c.Available}
			want := []int{tt.wantENIs, tt.wantIPs, tt.wantUnused}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: ENIs, IPs, unused (-want +got):\n%s", tt.reason, diff)
			}
			if diff := cmp.Diff(descending(tt.wantPerENI), descending(s.perENI())); diff != "" {
				t.Errorf("%s: IPs per ENI (-want +got):\n%s", tt.reason, diff)
			}
		})
	}
}

// TestReferencePrefixTable replays every row of the reference's prefix
// table (amazon-vpc-cni-k8s docs/prefix-and-ip-target.md). Where the doc
// disagrees with itself or with its own rules, docDiffers says how and the
// row holds what the rules give.
func TestReferencePrefixTable(t *testing.T) {
	tests := []struct {
		name          string
		lim           Limits
		cfg           Config
		pods          int
		wantENIs      int
		wantPrefixes  int
		wantUnused    int   // addresses
		wantPerENI    []int // prefixes per ENI, primary first
		wantPerPrefix []int // pods per prefix; nil: the doc leaves it blank
		reason        string
		docDiffers    string
	}{
		{"t3small/wp1/pods0", t3smallPrefix, Config{WarmPrefixTarget: 1}, 0, 1, 1, 16, []int{1}, []int{0}, "one whole free prefix", ""},
		{"t3small/wp1/pods5", t3smallPrefix, Config{WarmPrefixTarget: 1}, 5, 1, 2, 27, []int{2}, []int{5, 0}, "a used prefix is not free: one more", ""},
		{"t3small/wp1/pods16", t3smallPrefix, Config{WarmPrefixTarget: 1}, 16, 1, 2, 16, []int{2}, []int{16, 0}, "second prefix still whole", ""},
		{"t3small/wp1/pods17", t3smallPrefix, Config{WarmPrefixTarget: 1}, 17, 1, 3, 31, []int{3}, []int{16, 1, 0}, "pod 17 uses the free prefix: a third", ""},
		{"t3small/wp1/pods58", t3smallPrefix, Config{WarmPrefixTarget: 1}, 58, 2, 5, 22, []int{3, 2}, []int{16, 16, 16, 10, 0}, "primary holds 3 prefixes: second ENI", ""},
		{"t3small/ip1min1/pods0", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 1, MinimumIPTarget: 1}, 0, 1, 1, 16, []int{1}, []int{0}, "one address rounds to one prefix", ""},
		{"t3small/ip1min1/pods5", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 1, MinimumIPTarget: 1}, 5, 1, 1, 11, []int{1}, []int{5}, "11 free >= 1", ""},
		{"t3small/ip1min1/pods17", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 1, MinimumIPTarget: 1}, 17, 1, 2, 15, []int{2}, []int{16, 1}, "second prefix when the first is full", ""},
		{"t3small/ip1min1/pods58", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 1, MinimumIPTarget: 1}, 58, 2, 4, 6, []int{3, 1}, []int{16, 16, 16, 10}, "6 free >= 1", ""},
		{"t3small/ip7min20/pods0", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}, 0, 1, 2, 32, []int{2}, []int{0, 0}, "floor 20 rounds up to 2 prefixes",
			"doc row says 1 attached prefix and 16 unused, but 2 prefixes per ENI and pods per prefix 0,0; its own rule rounds MINIMUM_IP_TARGET 20 to 32"},
		{"t3small/ip7min20/pods5", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}, 5, 1, 2, 27, []int{2}, []int{5, 0}, "27 free, 32 total: at target", ""},
		{"t3small/ip7min20/pods17", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}, 17, 1, 2, 15, []int{2}, []int{16, 1}, "15 free >= 7", ""},
		{"t3small/ip7min20/pods58", t3smallPrefix, Config{PrefixDelegation: true, WarmIPTarget: 7, MinimumIPTarget: 20}, 58, 2, 5, 22, []int{3, 2}, []int{16, 16, 16, 10, 0}, "6 free < 7: fifth prefix; surplus 15 < 16 kept", ""},
		{"p3dn/wp1/pods0", p3dn, Config{PrefixDelegation: true, WarmPrefixTarget: 1}, 0, 1, 1, 16, []int{1}, nil, "one whole free prefix", ""},
		{"p3dn/wp1/pods3", p3dn, Config{PrefixDelegation: true, WarmPrefixTarget: 1}, 3, 1, 2, 29, []int{2}, nil, "second prefix on the primary",
			"doc lists a second ENI holding no prefix (2 ENIs, prefixes 2,0); an ENI without prefixes gives no address, so none is attached"},
		{"p3dn/wp1/pods95", p3dn, Config{PrefixDelegation: true, WarmPrefixTarget: 1}, 95, 1, 7, 17, []int{7}, nil, "seven prefixes fit the primary",
			"doc lists two extra ENIs holding no prefix (prefixes 7,0,0)"},
		{"p3dn/ip5min10/pods0", p3dn, Config{PrefixDelegation: true, WarmIPTarget: 5, MinimumIPTarget: 10}, 0, 1, 1, 16, []int{1}, nil, "floor 10 rounds to one prefix", ""},
		{"p3dn/ip5min10/pods7", p3dn, Config{PrefixDelegation: true, WarmIPTarget: 5, MinimumIPTarget: 10}, 7, 1, 1, 9, []int{1}, nil, "9 free >= 5", ""},
		{"p3dn/ip5min10/pods15", p3dn, Config{PrefixDelegation: true, WarmIPTarget: 5, MinimumIPTarget: 10}, 15, 1, 2, 17, []int{2}, nil, "4 free < 5 at pod 12: second prefix", ""},
		{"p3dn/ip5min10/pods45", p3dn, Config{PrefixDelegation: true, WarmIPTarget: 5, MinimumIPTarget: 10}, 45, 1, 4, 19, []int{4}, nil, "four prefixes on the primary",
			"doc lists a second ENI holding no prefix (prefixes 4,0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.PrefixDelegation = true
			s := growTo(t, tt.lim, cfg, tt.pods)
			c := Summarize(s.in)
			got := []int{c.ENIs, c.Prefixes, c.Available}
			want := []int{tt.wantENIs, tt.wantPrefixes, tt.wantUnused}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: ENIs, prefixes, unused addresses (-want +got):\n%s", tt.reason, diff)
			}
			if diff := cmp.Diff(tt.wantPerENI, s.perENI()); diff != "" {
				t.Errorf("%s: prefixes per ENI (-want +got):\n%s", tt.reason, diff)
			}
			if tt.wantPerPrefix != nil {
				if diff := cmp.Diff(tt.wantPerPrefix, s.perPrefix()); diff != "" {
					t.Errorf("%s: pods per prefix (-want +got):\n%s", tt.reason, diff)
				}
			}
			if c.Prefixes != c.Slots {
				t.Errorf("%d slots, %d of them prefixes: single addresses in prefix mode", c.Slots, c.Prefixes)
			}
		})
	}
}
