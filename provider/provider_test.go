package provider

import (
	"context"
	"errors"
	"testing"
	"time"
)

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

// TestRetryWait: waits double from base up to limit, stay within [d/2, d]
// and differ between draws (B08), without overflow at large n.
func TestRetryWait(t *testing.T) {
	base, limit := 100*time.Millisecond, 2*time.Second
	seen := map[time.Duration]bool{}
	for n := -1; n <= 70; n++ {
		d := min(base<<min(max(n, 1)-1, 20), limit)
		for range 20 {
			got := RetryWait(base, limit, n)
			if got < d/2 || got > d {
				t.Fatalf("RetryWait(n=%d) = %v, want within [%v, %v]", n, got, d/2, d)
			}
			seen[got] = true
		}
	}
	if len(seen) < 1000 {
		t.Errorf("only %d distinct waits in %d draws: not jittered", len(seen), 72*20)
	}
	if got := RetryWait(0, limit, 1); got < limit/2 || got > limit {
		t.Errorf("RetryWait with base 0 = %v, want within [%v, %v]", got, limit/2, limit)
	}
	if got := RetryWait(base, -time.Second, 3); got != 0 {
		t.Errorf("RetryWait with a negative limit = %v, want 0", got)
	}
}

// TestSleep: a wait ends with the context's error when the context ends
// first, with nil when it runs out, and at once for a non-positive wait.
func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on a canceled context = %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), -time.Second); err != nil {
		t.Errorf("Sleep(-1s) = %v, want nil", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep(1ms) = %v, want nil", err)
	}
}
