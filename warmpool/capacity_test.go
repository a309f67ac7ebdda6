package warmpool

import (
	"net/netip"
	"testing"
)

// TestSummarizeCapacityAndBudget: Summarize counts capacity with ENICapacity
// (slots at their real size, free slots at the mode's size) and the budget
// with Budget (room for the ENIs still allowed).
func TestSummarizeCapacityAndBudget(t *testing.T) {
	p28 := netip.MustParsePrefix("100.64.0.16/28")
	a := func(s string) Slot { return Slot{Prefix: netip.MustParsePrefix(s)} }
	tests := []struct {
		name           string
		prefix         bool
		slots          []Slot
		capacity, budg int
	}{
		// 3 ENIs allowed, 4 slots each; one ENI attached.
		{"secondary IPs, two held", false, []Slot{a("100.64.0.5/32"), a("100.64.0.6/32")}, 4, 12},
		{"prefix mode, one /28 held", true, []Slot{{Prefix: p28}}, 64, 192},
		{"a /28 kept after prefix mode was turned off", false, []Slot{{Prefix: p28}}, 19, 27},
		{"a fallback /32 in prefix mode", true, []Slot{a("100.64.0.5/32")}, 49, 177},
	}
	for _, tc := range tests {
		in := Input{
			ENIs:   []ENI{{ID: "eni-1", Primary: true, Slots: tc.slots}},
			Limits: Limits{MaxENIs: 3, SlotsPerENI: 4, PrefixSupported: true},
			Config: Config{PrefixDelegation: tc.prefix},
		}
		c := Summarize(in)
		if c.Capacity != tc.capacity || c.Budget != tc.budg {
			t.Errorf("%s: capacity %d, budget %d; want %d, %d", tc.name, c.Capacity, c.Budget, tc.capacity, tc.budg)
		}
	}
}
