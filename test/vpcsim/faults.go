package vpcsim

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// AnyOp, as the op of SetLatency, SetErrorRate or FailNext, applies the fault
// to every EC2 action that has no fault of its own.
const AnyOp = "*"

// IMDSOp is the name Calls counts IMDS metadata GETs under.
const IMDSOp = "imds"

// Faults injects latency, errors and throttling into the EC2 API and lag into
// IMDS, and counts calls. All methods are safe for concurrent use; changes
// apply to the next request.
type Faults struct {
	mu       sync.Mutex // guards the fields below
	rnd      *rand.Rand
	latency  map[string]latencyFault
	errRate  map[string]errorFault
	failNext map[string][]string
	buckets  [2]bucket // [describe, mutating], SetThrottle's class buckets
	account  accountBuckets
	imdsLag  time.Duration
	// imdsStatus, when not 0, is the HTTP status every IMDS metadata GET
	// answers (SetIMDSStatus).
	imdsStatus int
	calls      map[string]int
	// imdsEdits are per-instance IMDS answers set by SetIMDSOverride and
	// HideIMDS (nil value = hidden), by path under /latest/.
	imdsEdits   map[string]map[string]*string
	describeLag time.Duration
	// onDescribeLag is the cloud's hook run after SetDescribeLag; it takes
	// the cloud's lock, so it runs with mu released.
	onDescribeLag func()
	// queue is SetCallerQueue's limiter; nil: none.
	queue *rate.Limiter
}

type latencyFault struct{ fixed, jitter time.Duration }

type errorFault struct {
	rate float64
	code string
}

// bucket is a token bucket: perSecond tokens a second up to burst; 0 = off.
type bucket struct {
	perSecond float64
	burst     float64
	tokens    float64
	last      time.Time
}

// newFaults returns the faults of a cloud; now is the clock of the
// throttling buckets (nil: time.Now).
func newFaults(seed int64, now func() time.Time) *Faults {
	if now == nil {
		now = time.Now
	}
	f := &Faults{account: accountBuckets{now: now, limits: RequestLimits{}, buckets: map[string]*bucket{}}}
	if seed != 0 {
		f.rnd = rand.New(rand.NewPCG(uint64(seed), 0x6661756c7473))
	} else {
		f.rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	f.resetLocked()
	return f
}

func (f *Faults) resetLocked() {
	f.latency = map[string]latencyFault{}
	f.errRate = map[string]errorFault{}
	f.failNext = map[string][]string{}
	f.buckets = [2]bucket{}
	f.imdsLag = 0
	f.imdsStatus = 0
	f.calls = map[string]int{}
	f.account.resetCounts()
	f.account.buckets = map[string]*bucket{}
	f.imdsEdits = map[string]map[string]*string{}
	f.describeLag = 0
}

// Reset removes every fault, IMDS override and lag, zeroes the call and
// request counters and refills the account's request buckets; the limits of
// SetRequestLimits stay (they describe the account, not a fault).
func (f *Faults) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resetLocked()
}

// SetLatency delays every call of the EC2 action op (or AnyOp) by fixed plus
// a uniformly random duration in [0, jitter). Zero durations remove it.
func (f *Faults) SetLatency(op string, fixed, jitter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fixed <= 0 && jitter <= 0 {
		delete(f.latency, op)
		return
	}
	f.latency[op] = latencyFault{fixed: max(fixed, 0), jitter: max(jitter, 0)}
}

// SetErrorRate fails the given fraction (0..1) of calls of op (or AnyOp) with
// the EC2 error code, e.g. "InsufficientFreeAddressesInSubnet", answered with
// the code's HTTP status. A rate of 0 removes it.
func (f *Faults) SetErrorRate(op string, rate float64, code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rate <= 0 || code == "" {
		delete(f.errRate, op)
		return
	}
	f.errRate[op] = errorFault{rate: min(rate, 1), code: code}
}

// FailNext fails the next call of op (or, with AnyOp, the next call of any
// action) with the EC2 error code. Calls queue: two FailNext fail two calls.
func (f *Faults) FailNext(op string, code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[op] = append(f.failNext[op], code)
}

// SetThrottle sets the account-wide token bucket of mutating calls (mutating
// true) or of Describe calls: perSecond tokens a second, up to burst. A call
// that finds the bucket empty gets RequestLimitExceeded (HTTP 503), as EC2's
// request-rate limits answer. perSecond 0 turns the bucket off.
func (f *Faults) SetThrottle(mutating bool, perSecond float64, burst int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := &f.buckets[bucketIndex(mutating)]
	*b = bucket{}
	if perSecond > 0 {
		burst = max(burst, 1)
		*b = bucket{perSecond: perSecond, burst: float64(burst), tokens: float64(burst), last: f.account.now()}
	}
}

// SetCallerQueue puts one client-side rate limiter in front of every
// mutating EC2 action, shared by all callers: a request waits, in arrival
// order, for a token of perSecond a second up to burst before the account's
// buckets see it, as when one process alone calls EC2 for the whole fleet
// through its own limiter (a central IPAM operator: Cilium's
// --limit-ipam-api-qps and --limit-ipam-api-burst, 4 and 20 by default).
// Describes do not wait (such an operator describes for the whole fleet at
// once). The wait ends early when the request's context ends (the caller
// gave up: RequestCanceled). perSecond 0 removes the queue.
func (f *Faults) SetCallerQueue(perSecond float64, burst int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = nil
	if perSecond > 0 {
		f.queue = rate.NewLimiter(rate.Limit(perSecond), max(burst, 1))
	}
}

// SetIMDSLag makes IMDS show each change d after the API made it.
func (f *Faults) SetIMDSLag(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.imdsLag = max(d, 0)
}

// SetIMDSStatus makes every IMDS metadata GET answer the HTTP status code
// (e.g. 503, as an IMDS too loaded to answer; SDK clients retry it and
// fail) until it is set to 0. Token requests are still answered.
func (f *Faults) SetIMDSStatus(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.imdsStatus = code
}

func (f *Faults) imdsFailure() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.imdsStatus
}

// IMDSLag returns the lag set with SetIMDSLag.
func (f *Faults) IMDSLag() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.imdsLag
}

// Calls returns how many requests of the EC2 action op were received (throttled
// and failed ones included), or, for IMDSOp, how many IMDS GETs.
func (f *Faults) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *Faults) count(op string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
}

func bucketIndex(mutating bool) int {
	if mutating {
		return 1
	}
	return 0
}

// isMutating reports whether an EC2 action changes state; EC2 meters
// Describe calls and mutating calls in separate buckets.
func isMutating(action string) bool { return !strings.HasPrefix(action, "Describe") }

// before applies the faults of one call of action from caller (an IP
// address): it counts the call, sleeps the injected latency (or until ctx
// ends), waits its turn in SetCallerQueue's queue (mutating actions), then takes a token of the account's bucket key (see bucketKey) and
// of SetThrottle's class bucket, and applies one-shot and random errors. A
// non-nil *Error is the answer to send instead of doing the action.
func (f *Faults) before(ctx context.Context, action, key, caller string) *Error {
	f.mu.Lock()
	f.calls[action]++
	lat, ok := f.latency[action]
	if !ok {
		lat = f.latency[AnyOp]
	}
	delay := lat.fixed
	if lat.jitter > 0 {
		delay += time.Duration(f.rnd.Int64N(int64(lat.jitter)))
	}
	queue := f.queue
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errorf("RequestCanceled", "The request was canceled.")
		}
	}
	if queue != nil && isMutating(action) {
		if err := queue.Wait(ctx); err != nil {
			return errorf("RequestCanceled", "The request was canceled.")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.account.now()
	// A request needs a token of its action's bucket and, when SetThrottle
	// set one, of its class bucket; either empty refuses it.
	if !f.account.takeLocked(key, now) || !f.buckets[bucketIndex(isMutating(action))].take(now) {
		f.account.countLocked(action, caller, true)
		return errorf("RequestLimitExceeded", "Request limit exceeded.")
	}
	f.account.countLocked(action, caller, false)
	for _, op := range []string{action, AnyOp} {
		if q := f.failNext[op]; len(q) > 0 {
			f.failNext[op] = q[1:]
			return injected(q[0], action)
		}
	}
	e, ok := f.errRate[action]
	if !ok {
		e = f.errRate[AnyOp]
	}
	if e.rate > 0 && f.rnd.Float64() < e.rate {
		return injected(e.code, action)
	}
	return nil
}

func injected(code, action string) *Error {
	return errorf(code, "Injected failure of %s.", action)
}

// take removes one token, refilling first; it reports false when empty.
func (b *bucket) take(now time.Time) bool {
	if b.perSecond <= 0 {
		return true
	}
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.perSecond)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// CallCounts returns a copy of every call counter: EC2 actions by name, and
// IMDS GETs under IMDSOp.
func (f *Faults) CallCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}
