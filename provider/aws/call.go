package awsprovider

import (
	"context"
	"errors"
	"fmt"
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
}

var (
	actDescribeNetworkInterfaces = action{"DescribeNetworkInterfaces", false, true}
	actDescribeSubnets           = action{"DescribeSubnets", false, true}
	actDescribeInstanceTypes     = action{"DescribeInstanceTypes", false, true}
	actCreateNetworkInterface    = action{"CreateNetworkInterface", true, true} // ClientToken makes it idempotent
	actAttachNetworkInterface    = action{"AttachNetworkInterface", true, false}
	actModifyNetworkInterface    = action{"ModifyNetworkInterfaceAttribute", true, true}
	actDetachNetworkInterface    = action{"DetachNetworkInterface", true, true}
	actDeleteNetworkInterface    = action{"DeleteNetworkInterface", true, true}
	actAssignPrivateIPs          = action{"AssignPrivateIpAddresses", true, false}
	actUnassignPrivateIPs        = action{"UnassignPrivateIpAddresses", true, true}
	actAssignIPv6                = action{"AssignIpv6Addresses", true, false}
	actUnassignIPv6              = action{"UnassignIpv6Addresses", true, true}
)

// transient reports whether the SDK considers err retryable (5xx, broken
// connections, throttling codes).
var transient = retry.IsErrorRetryables(retry.DefaultRetryables)

// call runs one EC2 action: each attempt first takes a token from the
// action's budget; a throttled attempt is retried with backoff until
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
		t0 := time.Now()
		out, err := fn(ctx)
		if err == nil {
			c.opts.Observe(a.name, "ok", time.Since(start))
			return out, nil
		}
		lastErr = classify(a.name, err)
		wait := c.backoff(attempt)
		throttled := errors.Is(lastErr, provider.ErrThrottled)
		retry := false
		switch {
		case ctx.Err() != nil:
		case throttled:
			retry = time.Now().Add(wait).Before(throttleUntil)
		case a.repeatable && transient.IsErrorRetryable(err) == aws.TrueTernary:
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
		if err := sleep(ctx, wait); err != nil {
			err = errors.Join(lastErr, err)
			c.opts.Observe(a.name, outcome(err), time.Since(start))
			return zero, err
		}
	}
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

// sleep waits d or until ctx ends, and then returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
