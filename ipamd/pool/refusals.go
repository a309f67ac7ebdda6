package pool

import (
	"errors"
	"slices"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// Backoff after a cloud refusal, by kind: first wait and cap. Each wait is
// jittered over [d/2, d] so nodes do not retry in lock-step (B08).
var refusalBackoff = map[warmpool.RefusalKind][2]time.Duration{
	warmpool.RefusedThrottled:    {time.Second, time.Minute},
	warmpool.RefusedSubnetFull:   {5 * time.Second, 2 * time.Minute},
	warmpool.RefusedNoPrefix:     {30 * time.Second, 5 * time.Minute},
	warmpool.RefusedENILimit:     {30 * time.Second, 10 * time.Minute},
	warmpool.RefusedAddressLimit: {10 * time.Second, 2 * time.Minute},
}

// genericBackoff is the backoff after an unclassified cloud error.
var genericBackoff = [2]time.Duration{time.Second, 2 * time.Minute}

// RetryBackoff is the n-th (n ≥ 1) wait after an unclassified cloud error:
// 1 s doubling up to 2 m, jittered over [d/2, d].
func RetryBackoff(n int) time.Duration { return backoff(genericBackoff, n) }

// backoff is the n-th (n ≥ 1) jittered wait of the series b (first wait,
// cap): provider.RetryWait.
func backoff(b [2]time.Duration, n int) time.Duration { return provider.RetryWait(b[0], b[1], n) }

// shrinkFailures is the strikes key of unclassified release and ENI
// deletion failures (no warmpool.RefusalKind).
const shrinkFailures warmpool.RefusalKind = -1

// prefixRefusals is what the pool knows of EC2's /28 refusals.
type prefixRefusals struct {
	// at is when EC2 last refused a /28 (InsufficientCidrBlocks), or the
	// subnet view last stood in for that refusal; zero once a /28 was
	// assigned since.
	at   time.Time
	held int // /28 requests not sent: the subnet view showed no whole /28 after a refusal
	sent int // /28 requests sent that EC2 refused, InsufficientCidrBlocks
}

// holds are the pool's own backoffs, beyond warmpool's refusals (which
// hold growth only, and only for the errors warmpool plans around).
type holds struct {
	// shrink: no release or ENI deletion before it, the backoff of a
	// refused or failed one or of throttling.
	shrink time.Time
	// grow: no assign or ENI creation before it, the backoff of one that
	// failed with an error that is no refusal (UnauthorizedOperation,
	// InternalError, an invalid parameter: warmpool would plan the same
	// call again).
	grow time.Time
}

// Failure is a growth that failed with a cloud error that is no refusal
// warmpool plans around, and the end of its backoff (a failed release only
// holds releases: it is logged, and pods are not told of it).
type Failure struct {
	Action string    // warmpool action: assign or create_eni
	Err    error     // the provider's error (EC2's code and message)
	Until  time.Time // no such action is sent before it
}

// LastFailure is the latest unclassified failure of a growth whose backoff
// has not ended at now (ok false: none), for ADD errors and status.
func (p *Pool) LastFailure(now time.Time) (Failure, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure, p.failure.Err != nil && p.failure.Until.After(now)
}

// refusalKinds maps the provider's refusal errors to warmpool's kinds.
var refusalKinds = []struct {
	err  error
	kind warmpool.RefusalKind
}{
	{provider.ErrThrottled, warmpool.RefusedThrottled},
	{provider.ErrSubnetFull, warmpool.RefusedSubnetFull},
	{provider.ErrInsufficientCIDR, warmpool.RefusedNoPrefix},
	{provider.ErrENILimit, warmpool.RefusedENILimit},
	{provider.ErrAddressLimit, warmpool.RefusedAddressLimit},
}

// refuse turns a cloud error into a warmpool.Refusal with backoff, and
// returns that backoff (true); for errors that are no refusal it returns
// false, with the wait before the next cycle.
func (p *Pool) refuse(err error, plan warmpool.Plan, now time.Time) (time.Duration, bool) {
	subnet := p.o.Node.SubnetID()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range refusalKinds {
		if !errors.Is(err, k.err) {
			continue
		}
		p.strikes[k.kind]++
		if k.kind == warmpool.RefusedNoPrefix {
			p.prefix.at = now
		}
		wait := backoff(refusalBackoff[k.kind], p.strikes[k.kind])
		r := warmpool.Refusal{Kind: k.kind, Until: now.Add(wait)}
		switch k.kind {
		case warmpool.RefusedAddressLimit:
			r.ENI = plan.ENI
		case warmpool.RefusedSubnetFull:
			r.Count = plan.Count // the subnet may fit a smaller request: warmpool halves it
		case warmpool.RefusedNoPrefix:
			if plan.Prefixes && plan.Count > 1 {
				r.Count = plan.Count // fewer /28s may fit: warmpool halves it before single addresses
			}
		}
		p.refusals = append(slices.DeleteFunc(p.refusals, func(o warmpool.Refusal) bool {
			return !o.Until.After(now) || (o.Kind == r.Kind && o.ENI == r.ENI)
		}), r)
		p.o.Logger.Warn("cloud refused pool action", "action", plan.Action.String(), "eni", plan.ENI, "refusal", RefusalText(k.kind, subnet),
			"err", err, "retryAfter", wait)
		return wait, true
	}
	if plan.Action == warmpool.Release || plan.Action == warmpool.DeleteENI {
		// Counted apart: a node whose releases keep failing must not
		// have its next growth failure held at the backoff's cap.
		p.strikes[shrinkFailures]++
		return backoff(genericBackoff, p.strikes[shrinkFailures]), false
	}
	p.strikes[0]++
	return backoff(genericBackoff, p.strikes[0]), false
}

// grew records a growth and clears the growth refusals a successful
// growth call disproves.
func (p *Pool) grew() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastGrow = p.o.Clock()
	p.failure = Failure{}
	p.refusals = slices.DeleteFunc(p.refusals, func(r warmpool.Refusal) bool {
		// A subnet refusal that caps the request size stays until it
		// expires: asking for the refused size again would fail again.
		return r.Kind == warmpool.RefusedThrottled || (r.Kind == warmpool.RefusedSubnetFull && r.Count <= 1)
	})
	clear(p.strikes)
}

// Refusals are the cloud refusals still in force at now, oldest first.
func (p *Pool) Refusals(now time.Time) []warmpool.Refusal {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []warmpool.Refusal
	for _, r := range p.refusals {
		if r.Until.After(now) {
			out = append(out, r)
		}
	}
	return out
}

// RefusalText is a refusal in words for status and logs; subnet names the
// node's subnet.
func RefusalText(k warmpool.RefusalKind, subnet string) string {
	switch k {
	case warmpool.RefusedSubnetFull:
		return "subnet exhausted (" + subnet + ")"
	case warmpool.RefusedNoPrefix:
		return "no contiguous /28 in subnet " + subnet
	case warmpool.RefusedThrottled:
		return "EC2 API throttled"
	case warmpool.RefusedENILimit:
		return "EC2 refused another ENI (attachment limit)"
	case warmpool.RefusedAddressLimit:
		return "ENI address limit reached"
	}
	return "cloud refusal"
}
