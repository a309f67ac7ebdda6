package awsprovider

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// wireLog records when each EC2 API request reached the cloud.
type wireLog struct {
	next http.Handler

	mu    sync.Mutex // guards times
	times []time.Time
}

func (w *wireLog) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	w.times = append(w.times, time.Now())
	w.mu.Unlock()
	w.next.ServeHTTP(rw, r)
}

func (w *wireLog) since(t0 time.Time) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Time
	for _, t := range w.times {
		if !t.Before(t0) {
			out = append(out, t)
		}
	}
	return out
}

// TestThrottledBurst offers 200 concurrent AssignAddresses against an
// account bucket of 40 mutating calls a second (burst 10), with the client's
// mutating budget at 50 a second (burst 10): above the bucket, so EC2 refuses
// some attempts and the retry path runs. Every request must be served, none
// may fail for throttling, and the requests on the wire must keep within
// the client's budget in every two-second window.
func TestThrottledBurst(t *testing.T) {
	const (
		requests     = 200
		budgetRate   = 50.0
		budgetBurst  = 10
		accountRate  = 40.0
		accountBurst = 10
	)
	s := startSim(t)
	wire := &wireLog{next: s.local.Cloud.EC2Handler()}
	srv := httptest.NewServer(wire)
	t.Cleanup(srv.Close)
	opts := testOptions()
	opts.MutatingRate, opts.MutatingBurst = budgetRate, budgetBurst
	opts.RetryBase, opts.RetryMax = 20*time.Millisecond, 500*time.Millisecond
	opts.MaxThrottleWait = time.Minute
	var mu sync.Mutex
	outcomes := map[string]int{}
	opts.Observe = func(op, outcome string, _ time.Duration) {
		if op == "AssignPrivateIpAddresses" {
			mu.Lock()
			outcomes[outcome]++
			mu.Unlock()
		}
	}
	c := s.client(t, opts, srv.URL)

	// Room for 200 addresses: the primary ENI plus 7 more, 29 slots each.
	enis := []string{s.inst.PrimaryENI.ID}
	for range 7 {
		eni, err := c.CreateENI(t.Context(), provider.CreateENIRequest{})
		if err != nil {
			t.Fatal(err)
		}
		enis = append(enis, eni.ID)
	}
	s.local.Cloud.Faults().SetThrottle(true, accountRate, accountBurst)
	callsBefore := s.local.Cloud.Faults().Calls("AssignPrivateIpAddresses")

	start := time.Now()
	var wg sync.WaitGroup
	results := make([][]netip.Prefix, requests)
	errs := make([]error, requests)
	for i := range requests {
		wg.Go(func() {
			results[i], errs[i] = c.AssignAddresses(t.Context(), enis[i%len(enis)], 1, false)
		})
	}
	wg.Wait()

	seen := map[netip.Prefix]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v (throttled: %t)", i, err, errors.Is(err, provider.ErrThrottled))
			continue
		}
		for _, p := range results[i] {
			seen[p] = true
		}
	}
	if len(seen) != requests {
		t.Errorf("%d distinct addresses served, want %d", len(seen), requests)
	}
	held := 0
	for _, id := range enis {
		e, _ := s.local.Cloud.NetworkInterface(id)
		for _, a := range e.SecondaryIPs {
			if seen[netip.PrefixFrom(a, 32)] {
				held++
			}
		}
	}
	if held != requests {
		t.Errorf("the cloud holds %d of the %d served addresses", held, requests)
	}

	attempts := s.local.Cloud.Faults().Calls("AssignPrivateIpAddresses") - callsBefore
	refused := attempts - requests
	t.Logf("%d requests in %s: %d attempts, %d refused for rate; observer outcomes %v",
		requests, time.Since(start).Round(time.Millisecond), attempts, refused, outcomes)
	if refused <= 0 {
		t.Errorf("no attempt was refused for rate; the test did not exercise throttling")
	}
	if outcomes["throttled"] != refused || outcomes["ok"] != requests {
		t.Errorf("observer saw %v, want %d ok and %d throttled", outcomes, requests, refused)
	}
	checkBudget(t, wire.since(start), budgetRate, budgetBurst)
}

// checkBudget checks that no window of two seconds holds more requests than
// a token bucket of rate and burst lets through (plus one for clock
// granularity between the limiter and the transport). The times are taken
// where requests reach the cloud, so a CPU-starved machine delivers requests
// the limiter released apart in clumps; a two-second window absorbs that
// delivery jitter (a clump of ~10 requests late by a few hundred ms) while a
// client without a budget (200 requests at once) still fails it by far.
func checkBudget(t *testing.T, times []time.Time, rate float64, burst int) {
	t.Helper()
	const window = 2 * time.Second
	limit := burst + int(rate*window.Seconds()) + 1
	worst := 0
	for i, t0 := range times {
		n := 0
		for _, t1 := range times[i:] {
			if t1.Sub(t0) < window {
				n++
			}
		}
		worst = max(worst, n)
	}
	if worst > limit {
		t.Errorf("%d EC2 requests within %s, budget allows %d", worst, window, limit)
	}
	if len(times) > 1 {
		span := times[len(times)-1].Sub(times[0]).Seconds()
		if avg := float64(len(times)-burst) / span; avg > rate*1.05 {
			t.Errorf("average rate %.1f requests/s over %.1fs, budget %.0f/s", avg, span, rate)
		}
		t.Logf("wire: %d requests over %.2fs, busiest two seconds %d (budget %d)", len(times), span, worst, limit)
	}
}
