package awsprovider

import (
	"errors"
	"testing"

	"github.com/vpcip/vpcip/provider"
)

func TestLimitsTable(t *testing.T) {
	tests := []struct {
		typ  string
		want provider.Limits
		why  string
	}{
		{"m5.large", provider.Limits{MaxENIs: 3, IPv4PerENI: 10, PrefixDelegation: true, Hypervisor: "nitro"}, "published 3 × 10"},
		{"t3.nano", provider.Limits{MaxENIs: 2, IPv4PerENI: 2, PrefixDelegation: true, Hypervisor: "nitro"}, "published 2 × 2"},
		{"c5.18xlarge", provider.Limits{MaxENIs: 15, IPv4PerENI: 50, PrefixDelegation: true, Hypervisor: "nitro"}, "published 15 × 50"},
		{"m4.large", provider.Limits{MaxENIs: 2, IPv4PerENI: 10, Hypervisor: "xen"}, "Xen: no prefix delegation"},
		{"m5.metal", provider.Limits{MaxENIs: 15, IPv4PerENI: 50, PrefixDelegation: true, BareMetal: true}, "bare metal has no hypervisor but delegates prefixes"},
		{"c6in.32xlarge", provider.Limits{MaxENIs: 8, IPv4PerENI: 50, PrefixDelegation: true, Hypervisor: "nitro"}, "two cards of 8: only the default card counts, not 16"},
		{"p5.48xlarge", provider.Limits{MaxENIs: 2, IPv4PerENI: 50, PrefixDelegation: true, Hypervisor: "nitro"}, "32 cards of 2: only the default card counts, not 64"},
	}
	c := &Client{table: limitsTable}
	for _, tt := range tests {
		got, err := c.Limits(t.Context(), tt.typ)
		if err != nil || got != tt.want {
			t.Errorf("Limits(%s) = %+v, %v; want %+v (%s)", tt.typ, got, err, tt.want, tt.why)
		}
	}
	if got := (provider.Limits{MaxENIs: 3, IPv4PerENI: 10}).MaxPods(); got != 29 {
		t.Errorf("m5.large max pods = %d, want 29", got)
	}
}

// TestLimitsDescribeFallback empties the built-in table so that every type
// goes to EC2 DescribeInstanceTypes, and checks the answers agree with the
// table, are cached, and that an unknown type is ErrNotFound.
func TestLimitsDescribeFallback(t *testing.T) {
	s := startSim(t)
	c := s.client(t, testOptions(), "")
	c.table = nil
	types := []string{"m5.large", "m4.large", "m5.metal", "c6in.32xlarge", "p5.48xlarge"}
	for round := range 2 {
		for _, typ := range types {
			got, err := c.Limits(t.Context(), typ)
			if err != nil || got != limitsTable[typ] {
				t.Errorf("round %d: Limits(%s) from DescribeInstanceTypes = %+v, %v; table says %+v", round, typ, got, err, limitsTable[typ])
			}
		}
	}
	if n := s.local.Cloud.Faults().Calls("DescribeInstanceTypes"); n != len(types) {
		t.Errorf("%d DescribeInstanceTypes calls for %d types asked twice, want %d (cached)", n, len(types), len(types))
	}
	if _, err := c.Limits(t.Context(), "zz9.plural"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("Limits(zz9.plural) err = %v, want ErrNotFound", err)
	}
	if _, err := c.Limits(t.Context(), ""); err == nil {
		t.Errorf("Limits(\"\") succeeded")
	}
}
