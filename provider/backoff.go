package provider

import (
	"context"
	"math/rand/v2"
	"time"
)

// RetryWait is the wait before retry n (n ≥ 1; smaller counts as 1) of a
// cloud call the cloud refused or failed: d = min(limit, base·2^(n-1)),
// drawn uniformly from [d/2, d] so that nodes refused together do not
// retry in lock-step (B08: a fleet retrying at the same instants keeps EC2
// throttling it). A non-positive base gives limit; a negative limit gives 0.
// The AWS backend's throttling retries and the daemon's pool backoff after
// a refusal both use it.
func RetryWait(base, limit time.Duration, n int) time.Duration {
	d := max(limit, 0)
	if n < 1 {
		n = 1
	}
	if n <= 31 {
		if e := base << (n - 1); e > 0 && e < d {
			d = e
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits d (at once for d ≤ 0) or until ctx ends, whichever comes
// first, and returns ctx.Err(): nil when the wait ran out with ctx still
// live. The waits between retries, polls and budget turns use it.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}
