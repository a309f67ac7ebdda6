package awsprovider

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"

	"github.com/vpcip/vpcip/provider"
)

// action is an EC2 action as the client paces and retries it.
type action struct {
	name       string // EC2 action name, reported to Options.Observe
	mutating   bool   // drawn from the mutating budget, else from the describe budget
	repeatable bool   // safe to repeat after a transient failure whose effect is unknown
	release    bool   // gives something back (unassign, detach, delete): PriorityRelease unless ctx says otherwise
}

var (
	actDescribeNetworkInterfaces = action{"DescribeNetworkInterfaces", false, true, false}
	actDescribeSubnets           = action{"DescribeSubnets", false, true, false}
	actDescribeInstanceTypes     = action{"DescribeInstanceTypes", false, true, false}
	actCreateNetworkInterface    = action{"CreateNetworkInterface", true, true, false} // ClientToken makes it idempotent
	actAttachNetworkInterface    = action{"AttachNetworkInterface", true, false, false}
	actModifyNetworkInterface    = action{"ModifyNetworkInterfaceAttribute", true, true, false}
	actDetachNetworkInterface    = action{"DetachNetworkInterface", true, true, true}
	actDeleteNetworkInterface    = action{"DeleteNetworkInterface", true, true, true}
	actAssignPrivateIPs          = action{"AssignPrivateIpAddresses", true, false, false}
	actUnassignPrivateIPs        = action{"UnassignPrivateIpAddresses", true, true, true}
	actAssignIPv6                = action{"AssignIpv6Addresses", true, false, false}
	actUnassignIPv6              = action{"UnassignIpv6Addresses", true, true, true}
)

// transient reports whether the SDK considers err retryable (5xx, broken
// connections, throttling codes).
var transient = retry.IsErrorRetryables(retry.DefaultRetryables)

// call runs one EC2 action: each attempt first takes a token from the
// action's budget, and a mutating action's also one request from the fleet's
// shared budget (Options.Budget) at the priority ctx carries (see
// priority); a throttled attempt is retried with backoff until
// Options.MaxThrottleWait or ctx ends, a transient failure of a repeatable
// action up to Options.MaxAttempts. The error is classified (see classify).
func call[T any](ctx context.Context, c *Client, a action, fn func(context.Context) (T, error)) (T, error) {
	lim := c.describe
	if a.mutating {
		lim = c.mutating
	}
	start := time.Now()
	throttleUntil := start.Add(c.opts.MaxThrottleWait)
	var zero T
	var lastErr error
	failures := 0 // transient failures other than throttling
	for attempt := 1; ; attempt++ {
		if err := lim.Wait(ctx); err != nil {
			if ctx.Err() == nil { // rate.Limiter refuses a wait past the deadline up front
				err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
			}
			err = errors.Join(lastErr, fmt.Errorf("EC2 %s: waiting for the %s budget: %w", a.name, budgetName(a), err))
			c.opts.Observe(a.name, outcome(err), time.Since(start))
			return zero, err
		}
		if a.mutating && c.opts.Budget != nil {
			var err error
			var due time.Time
			if r := takeReserved(ctx, a); r != nil && attempt == 1 {
				err = r.wait(ctx)
			} else if attempt == 1 && c.tickets.pop(a.name, ticketWithin(ctx, a), &due) {
				err = provider.Sleep(ctx, time.Until(due))
			} else if res, ok := c.opts.Budget.(provider.RequestReserver); ok && attempt == 1 && provider.Deferrable(ctx) && !isFinishing(ctx) {
				var wait time.Duration
				if wait, err = res.Reserve(ctx, a.name, priority(ctx, a)); err == nil && wait >= provider.DeferAfter {
					// Hold the place, send nothing: the caller plans on and
					// calls again when it is due (provider.WithDeferral).
					due := time.Now().Add(wait)
					c.tickets.push(a.name, due, due)
					c.reserveAhead(ctx, a, res, due)
					return zero, &provider.DeferredError{Action: a.name, Until: due}
				}
				if err == nil {
					err = provider.Sleep(ctx, wait)
				}
			} else {
				err = c.opts.Budget.Take(ctx, a.name, priority(ctx, a))
			}
			if err == nil && attempt == 1 {
				c.reserveNext(ctx, a)
			}
			var short *provider.BudgetShortError
			if errors.As(err, &short) && isFinishing(ctx) && time.Now().Add(short.Wait).Before(throttleUntil) {
				// A step of an operation already begun (attach after create):
				// wait for the budget rather than undo what was made.
				if err := provider.Sleep(ctx, short.Wait+rand.N(short.Wait/4+time.Millisecond)); err != nil {
					return zero, errors.Join(lastErr, err)
				}
				continue
			}
			if err != nil {
				err = errors.Join(lastErr, fmt.Errorf("EC2 %s: waiting for the fleet's shared budget: %w", a.name, err))
				c.opts.Observe(a.name, outcome(err), time.Since(start))
				return zero, err
			}
		}
		t0 := time.Now()
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		out, err := fn(actx)
		timedOut := err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil {
			c.opts.Observe(a.name, "ok", time.Since(start))
			return out, nil
		}
		lastErr = classify(a.name, err)
		if timedOut {
			lastErr = fmt.Errorf("EC2 %s: no answer within %v (attempt %d): %w", a.name, c.opts.AttemptTimeout, attempt, err)
			c.log.Warn("EC2 call unanswered; attempt cancelled", "action", a.name, "attempt", attempt, "timeout", c.opts.AttemptTimeout.String(), "repeatable", a.repeatable)
		}
		wait := c.backoff(attempt)
		throttled := errors.Is(lastErr, provider.ErrThrottled)
		if throttled && a.mutating && c.opts.Budget != nil {
			c.opts.Budget.Refused(a.name)
		}
		retry := false
		switch {
		case ctx.Err() != nil:
		case throttled:
			retry = time.Now().Add(wait).Before(throttleUntil)
		case a.repeatable && (timedOut || transient.IsErrorRetryable(err) == aws.TrueTernary):
			failures++
			retry = failures < c.opts.MaxAttempts
		}
		if !retry {
			c.opts.Observe(a.name, outcome(lastErr), time.Since(start))
			return zero, lastErr
		}
		if throttled {
			c.opts.Observe(a.name, "throttled", time.Since(t0))
		}
		c.log.Debug("retrying EC2 call", "action", a.name, "attempt", attempt, "wait", wait, "err", lastErr)
		if err := provider.Sleep(ctx, wait); err != nil {
			err = errors.Join(lastErr, err)
			c.opts.Observe(a.name, outcome(err), time.Since(start))
			return zero, err
		}
	}
}

type finishingKey struct{}

// finishing marks ctx as running the later steps of an operation whose
// first request was made (the attach and attribute change after
// CreateNetworkInterface, the delete after a detach): with a shared budget
// they wait for room instead of failing, and the growing ones go at
// PriorityPodWaiting, since undoing the first step would cost more
// requests than finishing.
func finishing(ctx context.Context) context.Context {
	return context.WithValue(ctx, finishingKey{}, true)
}

func isFinishing(ctx context.Context) bool { v, _ := ctx.Value(finishingKey{}).(bool); return v }

// priority is the priority ctx carries for a, else PriorityRelease for an
// action that gives something back and PriorityRefill for one that grows
// the pool; see also finishing.
func priority(ctx context.Context, a action) provider.Priority {
	if isFinishing(ctx) && !a.release {
		return provider.PriorityPodWaiting
	}
	if p, ok := provider.PriorityOf(ctx); ok {
		if a.release && p > provider.PriorityRelease {
			// A release never unblocks a pod: it does not jump the queue
			// because the pass that planned it was a pod's.
			return provider.PriorityRelease
		}
		return p
	}
	if a.release {
		return provider.PriorityRelease
	}
	return provider.PriorityRefill
}

func budgetName(a action) string {
	if a.mutating {
		return "mutating"
	}
	return "describe"
}

// backoff is the wait before retry number attempt (1-based): d/2 plus a
// uniformly random part of d/2, with d = min(RetryMax, RetryBase·2^(attempt-1))
// (provider.RetryWait).
func (c *Client) backoff(attempt int) time.Duration {
	return provider.RetryWait(c.opts.RetryBase, c.opts.RetryMax, attempt)
}

// A chain is the steps of one operation whose first request opens it
// (CreateNetworkInterface, then AttachNetworkInterface and
// ModifyNetworkInterfaceAttribute): with a shared budget, each later step's
// token is taken (at pod-waiting priority, as finishing steps are) as soon
// as the step before it holds its own, so a step's wait in the fleet's
// queue runs while the step before it calls EC2 instead of after it. In a
// launch of 200 nodes every step of an ENI waited in its own queue in turn.
// A step that fails leaves the next step's token unused: one request of the
// shared budget per failed create (EC2 refuses those rarely, and the pool
// backs off after each).
type chain struct {
	steps []action
	res   map[string]*reservation
	// rctx is what reservations are taken under: canceled when the
	// operation returns, so a reservation for a step that never ran (the
	// create failed) stops waiting in the fleet's queue.
	rctx context.Context
}

type reservation struct {
	done chan struct{}
	err  error
}

func (r *reservation) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type chainKey struct{}

// withChain marks ctx as running steps in order (see chain). The caller
// calls end when the operation returns: a reservation still waiting for
// its token then stops.
func withChain(ctx context.Context, steps ...action) (_ context.Context, end func()) {
	rctx, cancel := context.WithCancel(ctx)
	return context.WithValue(ctx, chainKey{}, &chain{steps: steps, res: map[string]*reservation{}, rctx: rctx}), cancel
}

// takeReserved returns the reservation made for a's first attempt, if any.
// Steps of one chain run one after another, so the map needs no lock: a
// step's reservation is stored before the step itself starts.
func takeReserved(ctx context.Context, a action) *reservation {
	ch, _ := ctx.Value(chainKey{}).(*chain)
	if ch == nil {
		return nil
	}
	r := ch.res[a.name]
	delete(ch.res, a.name)
	return r
}

// reserveNext starts taking the token of the step after a in ctx's chain,
// in the background, once a holds its own.
func (c *Client) reserveNext(ctx context.Context, a action) {
	ch, _ := ctx.Value(chainKey{}).(*chain)
	if ch == nil {
		return
	}
	for i, s := range ch.steps[:max(len(ch.steps)-1, 0)] {
		if s.name != a.name {
			continue
		}
		next := ch.steps[i+1]
		if _, ok := ch.res[next.name]; ok || c.tickets.held(next.name) {
			return
		}
		r := &reservation{done: make(chan struct{})}
		ch.res[next.name] = r
		fctx := finishing(ch.rctx)
		go func() {
			defer close(r.done)
			r.err = c.opts.Budget.Take(fctx, next.name, priority(fctx, next))
		}()
		return
	}
}

// reserveAhead holds the places of the steps after a in ctx's chain, each
// in its own queue, when a was deferred until due: a deferred create's
// attach then waits its turn at the same time as the create instead of
// after it. Each place is kept until ticketTTL past the later of its own
// due time and due (its step runs only after a is made). Steps the budget
// has no room for are left to take their request when they run.
func (c *Client) reserveAhead(ctx context.Context, a action, res provider.RequestReserver, due time.Time) {
	ch, _ := ctx.Value(chainKey{}).(*chain)
	if ch == nil {
		return
	}
	i := slices.IndexFunc(ch.steps, func(s action) bool { return s.name == a.name })
	if i < 0 {
		return
	}
	fctx := finishing(ctx)
	for _, next := range ch.steps[i+1:] {
		wait, err := res.Reserve(fctx, next.name, priority(fctx, next))
		if err != nil {
			c.log.Debug("no place held ahead for a deferred call's next step", "action", next.name, "err", err)
			return
		}
		own := time.Now().Add(wait)
		c.tickets.push(next.name, own, later(own, due))
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ticketTTL is how long past its due time (for a chain's later step, past
// the deferred call's, when later) a held place is kept for a call of its
// action; one no call used by then (the plan that deferred it changed) is
// dropped, its request spent. A variable for tests.
var ticketTTL = time.Minute

// tickets are the places held in the fleet's shared budget for deferred
// calls (provider.DeferredError) and their chains' later steps, by EC2
// action.
type tickets struct {
	mu sync.Mutex
	by map[string][]ticket
}

// ticket is one place held: due is when its request may be made; it is
// dropped ticketTTL after keep (due, or the deferred call's due time for a
// later step of its chain).
type ticket struct {
	due, keep time.Time
}

// push holds a place of action due at due, kept until ticketTTL past keep.
func (t *tickets) push(action string, due, keep time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string][]ticket{}
	}
	t.by[action] = append(t.live(action, time.Now()), ticket{due: due, keep: keep})
}

// ticketWithin is how far ahead a call of a under ctx takes a place held
// for its action: a deferrable call only one due within
// provider.DeferAfter (one not yet due is left to the call it was held
// for, and this one holds its own); a call below PriorityPodWaiting only
// one already due (the budget refuses it rather than queue it, so it would
// not wait for a place of its own: ENIs' delete-on-termination fix at
// refill priority slept on the worker until a deferred create's place came
// due); any other call the earliest, however far (it would wait at least
// as long for a place of its own).
func ticketWithin(ctx context.Context, a action) time.Duration {
	switch {
	case provider.Deferrable(ctx) && !isFinishing(ctx):
		return provider.DeferAfter
	case priority(ctx, a) != provider.PriorityPodWaiting:
		return 0
	}
	return math.MaxInt64
}

// pop takes action's earliest place held if it is due within within of
// now, storing its due time in due; false when there is none.
func (t *tickets) pop(action string, within time.Duration, due *time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	q := t.live(action, now)
	if len(q) == 0 {
		return false
	}
	earliest := slices.MinFunc(q, func(a, b ticket) int { return a.due.Compare(b.due) })
	i := slices.IndexFunc(q, func(k ticket) bool { return k.due.Equal(earliest.due) })
	if q[i].due.Sub(now) > within {
		return false
	}
	*due = q[i].due
	t.by[action] = slices.Delete(q, i, i+1)
	return true
}

// held reports whether a place of action is held.
func (t *tickets) held(action string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live(action, time.Now())) > 0
}

// live drops action's places more than ticketTTL past keep and returns
// the rest; t.mu held.
func (t *tickets) live(action string, now time.Time) []ticket {
	q := slices.DeleteFunc(t.by[action], func(k ticket) bool { return now.Sub(k.keep) > ticketTTL })
	if t.by != nil {
		t.by[action] = q
	}
	return q
}
