package podsubnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// Provider is a provider.Provider whose CreateENI places every ENI that
// names no subnet with its Placer: it tries the decision's targets in order
// and moves to the next when EC2 refuses one as full
// (provider.ErrSubnetFull, or ErrInsufficientCIDR for prefixes), so that when
// a subnet fills the next ENI goes to the next subnet. Every other method is
// the wrapped provider's.
type Provider struct {
	provider.Provider
	Placer *Placer

	mu       sync.Mutex
	deferred *Decision // a decision whose first target the fleet's EC2 budget had no room for
	// deferredInput is the Placer's input (the node's ENIConfig) when
	// deferred was made: a changed input places anew.
	deferredInput string
}

// DeferredDecisionAge is how long a placement whose create the fleet's
// shared EC2 budget deferred (provider.BudgetShortError, or
// provider.DeferredError with its place in the queue held: nothing was
// sent) is used again (from the target deferred on) instead of placing
// anew, while the node's ENIConfig is unchanged. The pool tries again when the
// budget expects room, often within a second; placing anew each time cost a
// DescribeSubnets per try (in a launch of 200 nodes, more describes than
// every other request together).
const DeferredDecisionAge = time.Minute

var _ provider.Provider = (*Provider)(nil)

// CreateENI creates the ENI in req.SubnetID when set; otherwise where the
// Placer decides (see Placer.Place for its errors). When every target
// refuses, the last refusal is returned. Under custom networking an ENIConfig
// security group EC2 does not know (InvalidGroup.NotFound) is
// ErrInvalidENIConfig.
func (w *Provider) CreateENI(ctx context.Context, req provider.CreateENIRequest) (provider.ENI, error) {
	if req.SubnetID != "" || w.Placer == nil {
		return w.Provider.CreateENI(ctx, req)
	}
	input := w.Placer.inputKey()
	d, ok := w.takeDeferred(input)
	if !ok {
		var err error
		if d, err = w.Placer.Place(ctx); err != nil {
			return provider.ENI{}, err
		}
	}
	var last error
	for i, t := range d.Targets {
		r := req
		r.SubnetID, r.SecurityGroups = t.SubnetID, t.SecurityGroups
		e, err := w.Provider.CreateENI(ctx, r)
		var short *provider.BudgetShortError
		var deferred *provider.DeferredError
		if errors.As(err, &short) || errors.As(err, &deferred) {
			// Nothing was sent (no room yet, or the place in the fleet's
			// queue is held until due): the next try starts at this
			// target; the ones before it refused.
			kept := d
			kept.Targets = d.Targets[i:]
			w.mu.Lock()
			w.deferred, w.deferredInput = &kept, input
			w.mu.Unlock()
			return e, err
		}
		if errors.Is(err, provider.ErrSubnetFull) || errors.Is(err, provider.ErrInsufficientCIDR) {
			w.Placer.refused(t, err)
			last = err
			continue
		}
		if err != nil && d.Mode == ModeCustom && errors.Is(err, provider.ErrNotFound) {
			err = fmt.Errorf("%w: ENIConfig %q: EC2 refused its subnet or security groups: %v", ErrInvalidENIConfig, d.ENIConfig, err)
			w.Placer.record(Decision{At: d.At, Mode: d.Mode, ENIConfig: d.ENIConfig, Reason: d.Reason, Problem: err.Error(), Cause: problemReason(err)}, err, w.Placer.inputKey())
		}
		return e, err
	}
	return provider.ENI{}, last
}

// takeDeferred returns, once, the decision of a create the budget deferred
// less than DeferredDecisionAge ago on the same Placer input (the node's
// ENIConfig under custom networking).
func (w *Provider) takeDeferred(input string) (Decision, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.deferred
	w.deferred = nil
	if d == nil || w.deferredInput != input || time.Since(d.At) >= DeferredDecisionAge {
		return Decision{}, false
	}
	return *d, true
}

var _ provider.IPv6Assigner = (*Provider)(nil)

// AssignIPv6 is the wrapped provider's (provider.IPv6Assigner), which an
// IPv6-mode daemon needs through this wrapper; a wrapped provider without
// it returns an error wrapping errors.ErrUnsupported.
func (w *Provider) AssignIPv6(ctx context.Context, eniID string, n int, prefix bool) ([]netip.Prefix, error) {
	a, ok := w.Provider.(provider.IPv6Assigner)
	if !ok {
		return nil, fmt.Errorf("provider %T assigns no IPv6: %w", w.Provider, errors.ErrUnsupported)
	}
	return a.AssignIPv6(ctx, eniID, n, prefix)
}

// UnassignIPv6 is the wrapped provider's (provider.IPv6Assigner); without
// it, an error wrapping errors.ErrUnsupported.
func (w *Provider) UnassignIPv6(ctx context.Context, eniID string, addrs []netip.Prefix) error {
	a, ok := w.Provider.(provider.IPv6Assigner)
	if !ok {
		return fmt.Errorf("provider %T assigns no IPv6: %w", w.Provider, errors.ErrUnsupported)
	}
	return a.UnassignIPv6(ctx, eniID, addrs)
}
