package pool

import (
	"testing"
	"time"
)

// TestBackoffIsJitteredAndFloored: retry waits grow, stay within [d/2, d]
// and differ between nodes (B08).
func TestBackoffIsJitteredAndFloored(t *testing.T) {
	b := [2]time.Duration{time.Second, time.Minute}
	seen := map[time.Duration]bool{}
	for n := 1; n <= 10; n++ {
		d := min(time.Second<<(n-1), time.Minute)
		for range 20 {
			w := backoff(b, n)
			if w < d/2 || w > d {
				t.Fatalf("backoff(n=%d) = %s, want within [%s, %s]", n, w, d/2, d)
			}
			seen[w] = true
		}
	}
	if len(seen) < 150 {
		t.Errorf("only %d distinct waits in 200 draws: not jittered", len(seen))
	}
}
