package ipamd

import (
	"net/netip"
	"testing"

	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/warmpool"
)

// TestENICapacityCountsSlotsAtTheirSize: a /28 held from prefix mode counts
// 16 addresses after the mode is turned off, a fallback /32 counts 1 in
// prefix mode, and free slots count at the current mode's size — so the
// reported capacity never falls below what the ENI holds.
func TestENICapacityCountsSlotsAtTheirSize(t *testing.T) {
	lim := warmpool.Limits{SlotsPerENI: 3}
	p28, p32 := netip.MustParsePrefix("100.64.0.16/28"), netip.MustParsePrefix("100.64.0.5/32")
	tests := []struct {
		name  string
		slots []netip.Prefix
		unit  int
		want  int
	}{
		{"empty, secondary-IP mode", nil, 1, 3},
		{"empty, prefix mode", nil, 16, 48},
		{"two /28s held, mode turned off", []netip.Prefix{p28, p28}, 1, 33},
		{"a fallback /32 in prefix mode", []netip.Prefix{p32}, 16, 33},
	}
	for _, tc := range tests {
		if got := eniCapacity(datastore.ENI{Slots: tc.slots}, lim, tc.unit); got != tc.want {
			t.Errorf("%s: capacity %d, want %d", tc.name, got, tc.want)
		}
	}
}
