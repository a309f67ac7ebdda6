package provider

import "testing"

// TestPodENIs: B19's small type (3 ENIs × 10 addresses) gives pods 3 ENIs
// (29 pods), 2 under custom networking (20 pods); MAX_ENI caps before the
// primary is taken off.
func TestPodENIs(t *testing.T) {
	small := Limits{MaxENIs: 3, IPv4PerENI: 10}
	tests := []struct {
		maxENI   int
		custom   bool
		enis     int
		wantPods int // ENIs × (IPv4 per ENI − 1) + 2
	}{
		{0, false, 3, 29},
		{0, true, 2, 20},
		{2, false, 2, 20},
		{2, true, 1, 11},
		{5, true, 2, 20},
		{1, true, 0, 2},
	}
	for _, tt := range tests {
		got := small.PodENIs(tt.maxENI, tt.custom)
		if got != tt.enis || got*small.PodAddressesPerENI()+2 != tt.wantPods {
			t.Errorf("PodENIs(maxENI %d, custom %v) = %d (%d pods), want %d (%d pods)", tt.maxENI, tt.custom, got, got*small.PodAddressesPerENI()+2, tt.enis, tt.wantPods)
		}
	}
}
