package reference

import (
	"context"
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// stats are the datastore's counts (GetIPStats), in addresses except the
// prefix counts.
type stats struct {
	total, assigned, available int // available = total − assigned: cooling included
	prefixes, freePrefixes     int // PD: /28s, and those with no assigned address
}

func (p *Pool) statsOf(enis []*eni) stats {
	var s stats
	for _, e := range enis {
		for _, c := range e.cidrs {
			used := 0
			for _, x := range c.ips {
				if x.pod != "" {
					used++
				}
			}
			s.total += len(c.ips)
			s.assigned += used
			if len(c.ips) == prefixSize {
				s.prefixes++
				if used == 0 {
					s.freePrefixes++
				}
			}
		}
	}
	s.available = s.total - s.assigned
	return s
}

func (p *Pool) stats() stats { return p.statsOf(p.enis) }

// warmIPTargetsDefined: WARM_IP_TARGET or MINIMUM_IP_TARGET set.
func (p *Pool) warmIPTargetsDefined() bool {
	return p.cfg.WarmIPTarget > 0 || p.cfg.MinimumIPTarget > 0
}

// targetState is datastoreTargetState: addresses short and over.
func (p *Pool) targetState(s stats) (short, over int) {
	w, m := p.cfg.WarmIPTarget, p.cfg.MinimumIPTarget
	short = max(w-s.available, 0)
	short = max(short, m-s.total)
	over = max(s.available-w, 0)
	over = max(min(over, s.total-m), 0)
	return short, over
}

func ceil16(n int) int { return (n + prefixSize - 1) / prefixSize }

// overPrefixes is the PD surplus in /28s under IP targets.
func (p *Pool) overPrefixes(s stats) int {
	o := max(min(s.freePrefixes, s.prefixes-ceil16(s.assigned+p.cfg.WarmIPTarget)), 0)
	return max(min(o, s.prefixes-ceil16(p.cfg.MinimumIPTarget)), 0)
}

// warmUnit is T × W of isDatastorePoolTooLow without IP targets.
func (p *Pool) warmUnit() (t, w int) {
	if p.cfg.PrefixDelegation {
		return prefixSize, p.cfg.WarmPrefixTarget
	}
	return p.maxSlots, p.cfg.WarmENITarget
}

// tooLow is isDatastorePoolTooLow.
func (p *Pool) tooLow() bool {
	s := p.stats()
	if p.cfg.MaxPods > 0 && s.total >= p.cfg.MaxPods {
		return false
	}
	if p.warmIPTargetsDefined() {
		short, _ := p.targetState(s)
		return short > 0
	}
	t, w := p.warmUnit()
	return s.available < t*w || (w == 0 && s.available == 0)
}

// tooHigh is isDatastorePoolTooHigh.
func (p *Pool) tooHigh() bool {
	s := p.stats()
	if p.warmIPTargetsDefined() {
		if p.cfg.PrefixDelegation {
			return p.overPrefixes(s) > 0
		}
		_, over := p.targetState(s)
		return over > 0
	}
	return p.cfg.PrefixDelegation && s.freePrefixes > p.cfg.WarmPrefixTarget
}

// allocatable is GetAllocatableENIs: every ENI below its slot limit, in
// random order.
func (p *Pool) allocatable() []*eni {
	var out []*eni
	for _, e := range p.enis {
		if len(e.cidrs) < p.maxSlots {
			out = append(out, e)
		}
	}
	p.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// toAllocate is how many slots one growth call asks for (before the ENI's
// room): a whole ENI's worth, or what the IP targets lack.
func (p *Pool) toAllocate() int {
	s := p.stats()
	short, _ := p.targetState(s)
	if p.cfg.PrefixDelegation {
		if p.warmIPTargetsDefined() {
			return max(1, ceil16(short))
		}
		return max(1, p.cfg.WarmPrefixTarget-s.freePrefixes)
	}
	if p.warmIPTargetsDefined() {
		return short
	}
	return p.maxSlots
}

// increase is increaseDatastorePool: an assign on the first allocatable ENI
// (retried once with 1 on failure); only if nothing was added, a new ENI
// with its addresses.
func (p *Pool) increase(ctx context.Context) {
	want := p.toAllocate()
	if want <= 0 {
		return
	}
	if es := p.allocatable(); len(es) > 0 {
		e := es[0]
		n := min(p.maxSlots-len(e.cidrs), want)
		got, err := p.prov.AssignAddresses(ctx, e.id, n, p.cfg.PrefixDelegation)
		if err != nil && n > 1 {
			got, err = p.prov.AssignAddresses(ctx, e.id, 1, p.cfg.PrefixDelegation)
		}
		if err == nil && len(got) > 0 {
			p.addCIDRs(e, got)
			return
		}
	}
	if len(p.enis) >= p.maxENIs {
		return
	}
	n := min(want, p.maxSlots)
	req := reqOf(n, p.cfg.PrefixDelegation)
	ne, err := p.prov.CreateENI(ctx, req)
	if err != nil {
		return
	}
	de := &eni{id: ne.ID, created: p.now()}
	p.addCIDRs(de, cloudCIDRs(ne))
	p.enis = append(p.enis, de)
}

// decrease is decreaseDatastorePool: at most once per DecreaseInterval,
// free up to the surplus in CIDRs with no assigned address (cooldown is not
// checked), one unassign call per ENI.
func (p *Pool) decrease(ctx context.Context) {
	now := p.now()
	if now.Sub(p.lastDecrease) < DecreaseInterval {
		return
	}
	p.lastDecrease = now
	s := p.stats()
	var budget int
	switch {
	case p.warmIPTargetsDefined() && p.cfg.PrefixDelegation:
		budget = p.overPrefixes(s)
	case p.warmIPTargetsDefined():
		_, budget = p.targetState(s)
	default:
		budget = s.freePrefixes - p.cfg.WarmPrefixTarget
	}
	for _, e := range p.enis {
		if budget <= 0 {
			return
		}
		var free []*cidr
		kept := e.cidrs[:0:0]
		for _, c := range e.cidrs {
			if budget > 0 && unused(c) {
				free = append(free, c)
				budget--
				continue
			}
			kept = append(kept, c)
		}
		if len(free) == 0 {
			continue
		}
		e.cidrs = kept // non-forced datastore delete first: no ADD takes them
		ps := make([]netip.Prefix, 0, len(free))
		for _, c := range free {
			ps = append(ps, c.prefix)
		}
		if err := p.prov.UnassignAddresses(ctx, e.id, ps); err != nil {
			e.cidrs = append(e.cidrs, free...)
		}
	}
}

func unused(c *cidr) bool {
	for _, x := range c.ips {
		if x.pod != "" {
			return false
		}
	}
	return true
}

// shouldRemoveExtraENIs: under IP targets always; otherwise when the
// available addresses exceed the warm target by a whole ENI, or in PD when
// a secondary ENI holds no pod.
func (p *Pool) shouldRemoveExtraENIs() bool {
	if p.warmIPTargetsDefined() {
		return true
	}
	s := p.stats()
	w := max(p.cfg.WarmENITarget, 0)
	perENI := p.maxSlots
	if p.cfg.PrefixDelegation {
		perENI *= prefixSize
		for _, e := range p.enis {
			if !e.primary && p.statsOf([]*eni{e}).assigned == 0 {
				return true
			}
		}
	}
	return s.available >= (w+1)*perENI
}

// tryFreeENI frees the first deletable ENI (getDeletableENI).
func (p *Pool) tryFreeENI(ctx context.Context) {
	now := p.now()
	for i, e := range p.enis {
		if !p.deletable(e, now) {
			continue
		}
		p.enis = append(p.enis[:i:i], p.enis[i+1:]...)
		if err := p.prov.DeleteENI(ctx, e.id); err != nil {
			p.enis = append(p.enis, e)
		}
		return
	}
}

func (p *Pool) deletable(e *eni, now time.Time) bool {
	if e.primary || now.Sub(e.created) < MinENILifetime {
		return false
	}
	for _, c := range e.cidrs {
		for _, x := range c.ips {
			if x.pod != "" || p.cooling(x, now) {
				return false
			}
		}
	}
	var others []*eni
	for _, o := range p.enis {
		if o != e {
			others = append(others, o)
		}
	}
	s := p.statsOf(others)
	if w := p.cfg.WarmIPTarget; w > 0 {
		if p.cfg.PrefixDelegation {
			w = ceil16(w) * prefixSize
		}
		if s.available < w {
			return false
		}
	}
	if m := p.cfg.MinimumIPTarget; m > 0 && s.total < m {
		return false
	}
	if !p.warmIPTargetsDefined() && p.cfg.PrefixDelegation && s.freePrefixes < p.cfg.WarmPrefixTarget {
		return false
	}
	return true
}

func reqOf(n int, prefixes bool) provider.CreateENIRequest {
	if prefixes {
		return provider.CreateENIRequest{Prefixes: n}
	}
	return provider.CreateENIRequest{Addresses: n}
}
