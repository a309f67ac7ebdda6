package pool

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// Growth in a fleet sharing one EC2 budget (provider.RequestBudget): the
// priority of the pool's calls, and the growth whose call the budget
// defers, planned on as if made.

// deferred is a growth plan whose EC2 call the fleet's shared budget holds
// until until (provider.DeferredError): planned on as if made, and made
// again once due.
type deferred struct {
	plan  warmpool.Plan
	until time.Time
}

// withDeferred is in with the growth still deferred (not yet due at now)
// counted as made: a deferred Assign's addresses (or prefixes) on its ENI,
// a deferred CreateENI's new ENI, as free slots with placeholder prefixes
// (0.0.0.0/8, which no VPC holds) and ENI IDs deferredENI+N. Entries due by
// now are dropped (returned in due): their plans are made again, and take
// the places held. until is the earliest due time left (zero: none).
func (p *Pool) withDeferred(in warmpool.Input, now time.Time) (_ warmpool.Input, until time.Time, due []deferred) {
	p.deferred = slices.DeleteFunc(p.deferred, func(d deferred) bool {
		if !d.until.After(now) {
			due = append(due, d)
			return true
		}
		return false
	})
	if len(p.deferred) == 0 {
		return in, time.Time{}, due
	}
	in.ENIs = slices.Clone(in.ENIs)
	n := 0
	placeholders := func(count int, prefixes bool) []warmpool.Slot {
		out := make([]warmpool.Slot, 0, count)
		for range count {
			n++
			a := netip.AddrFrom4([4]byte{0, byte(n >> 12), byte(n >> 4), byte(n << 4)})
			bits := 32
			if prefixes {
				bits = 28
			}
			out = append(out, warmpool.Slot{Prefix: netip.PrefixFrom(a, bits)})
		}
		return out
	}
	for i, d := range p.deferred {
		if until.IsZero() || d.until.Before(until) {
			until = d.until
		}
		switch d.plan.Action {
		case warmpool.Assign:
			for j := range in.ENIs {
				if in.ENIs[j].ID == d.plan.ENI {
					in.ENIs[j].Slots = append(slices.Clone(in.ENIs[j].Slots), placeholders(d.plan.Count, d.plan.Prefixes)...)
				}
			}
		case warmpool.CreateENI:
			in.ENIs = append(in.ENIs, warmpool.ENI{ID: deferredENI + strconv.Itoa(i), Attached: now, Slots: placeholders(d.plan.Count, d.plan.Prefixes)})
		}
	}
	return in, until, due
}

// deferredENI starts the IDs of ENIs withDeferred counts before they exist.
// It sorts after every EC2 ID ("eni-…"): warmpool grows on the first ENI
// with room in ID order, and a placeholder ahead of a real ENI with room
// held the growth due on the real one until the create came due.
const deferredENI = "~deferred-"

// plannable reports whether plan may be made while growth is deferred:
// growth on an ENI that exists (or a new one); no release, no deletion.
func (p *Pool) plannable(plan warmpool.Plan) bool {
	switch plan.Action {
	case warmpool.Assign:
		return !strings.HasPrefix(plan.ENI, deferredENI)
	case warmpool.CreateENI:
		return true
	}
	return false
}

// planPriority is the priority of plan's cloud calls in a fleet sharing
// one EC2 budget (provider.Priority): growth while more pods wait for an
// address (ADDs waiting, or pods bound here without one) than the pool has
// free goes first, growth of the warm pool next, releases last. Pods the
// free addresses serve do not make growth urgent: a node whose pods were
// just bound, their ADDs not yet come, would otherwise queue its warm
// refill ahead of another node's pod that has no address at all.
func planPriority(in warmpool.Input, plan warmpool.Plan) provider.Priority {
	switch {
	case plan.Action == warmpool.Release || plan.Action == warmpool.DeleteENI:
		return provider.PriorityRelease
	case max(in.Pending, in.Demand.Unaddressed) > freeAddresses(in.ENIs):
		return provider.PriorityPodWaiting
	}
	return provider.PriorityRefill
}

// freeAddresses is how many addresses of enis a pod could get now.
func freeAddresses(enis []warmpool.ENI) int {
	n := 0
	for _, e := range enis {
		for _, sl := range e.Slots {
			n += sl.Free()
		}
	}
	return n
}
