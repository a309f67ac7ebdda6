package pool

import (
	"context"
	"errors"
	"hash/fnv"
	"net/netip"
	"slices"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// subnetView is the pool's cached view of what every ENI of one subnet
// holds (Provider.SubnetUsage), kept current between reads with the
// pool's own assignments and releases. Other nodes' changes show only at
// the next read, so the view may be stale: an address it shows free may be
// taken, and EC2 then refuses the named assignment (the pool falls back to
// letting EC2 choose).
type subnetView struct {
	used        map[netip.Addr]bool // nil: never read successfully
	read        time.Time           // last read attempt
	readOK      time.Time           // last successful read
	unsupported bool                // the provider cannot list a subnet
	// After EC2 refused addresses named from the view (taken since it was
	// read), nothing is named until pauseUntil, and the view is read again
	// first. The pause is a tenth of Options.SubnetView, doubled for each
	// further refusal in a row (at most 8×), so a subnet where named
	// addresses keep being taken (EC2 handing out its lowest free
	// addresses, which are the very holes named) costs fewer refused
	// calls; a named assignment that succeeds ends the streak.
	pauseUntil time.Time
	strikes    int
}

// subnetOf returns the subnet ID and CIDR of an ENI the datastore knows,
// and every address the node holds in that subnet (ENI primaries, single
// addresses and the addresses of /28 prefixes, on every ENI in it).
func (p *Pool) subnetOf(eniID string) (id string, cidr netip.Prefix, held []netip.Addr) {
	enis := p.o.Store.ENIs()
	for _, e := range enis {
		if e.ID == eniID {
			id, cidr = e.SubnetID, e.SubnetCIDR
		}
	}
	if id == "" {
		return "", netip.Prefix{}, nil
	}
	for _, e := range enis {
		if e.SubnetID != id {
			continue
		}
		if e.PrimaryIP.IsValid() {
			held = append(held, e.PrimaryIP)
		}
		for _, sl := range e.Slots {
			for a := sl.Masked().Addr(); sl.Contains(a); a = a.Next() {
				held = append(held, a)
			}
		}
	}
	return id, cidr, held
}

// others returns the addresses other ENIs hold in the subnet, from the view
// (read first when it is older than Options.SubnetView), or nil when there
// is no view yet (none is read in the pool's first half Options.SubnetView)
// or naming is paused after a refusal.
func (p *Pool) others(ctx context.Context, eniID, subnetID string, held []netip.Addr) map[netip.Addr]bool {
	return p.othersWithin(ctx, eniID, subnetID, held, p.o.SubnetView)
}

// othersWithin is others with the view read again once older than maxAge.
func (p *Pool) othersWithin(ctx context.Context, eniID, subnetID string, held []netip.Addr, maxAge time.Duration) map[netip.Addr]bool {
	if p.o.SubnetView < 0 || subnetID == "" {
		return nil
	}
	now := p.o.Clock()
	v := p.views[subnetID]
	if v == nil {
		// No read at start: a fleet starting together would add one
		// describe per node to the start-up's (field failure B08). The
		// first is due between half and one and a half Options.SubnetView
		// after the pool started, spread by a hash of the ENI id.
		h := fnv.New64a()
		h.Write([]byte(eniID))
		spread := time.Duration(h.Sum64()%1000) * p.o.SubnetView / 1000
		v = &subnetView{read: p.started.Add(spread - p.o.SubnetView/2)}
		p.views[subnetID] = v
	}
	if now.Before(v.pauseUntil) {
		return nil
	}
	if !v.unsupported && (v.read.IsZero() || now.Sub(v.read) >= maxAge) {
		v.read = now
		used, err := p.o.Provider.SubnetUsage(ctx, subnetID)
		switch {
		case errors.Is(err, errors.ErrUnsupported):
			v.unsupported = true
		case err != nil:
			p.o.Logger.Warn("reading the subnet's addresses for the /28-aware choice failed; keeping the last view", "subnet", subnetID, "err", err)
		default:
			v.readOK = now
			v.used = map[netip.Addr]bool{}
			for _, pf := range used {
				for a := pf.Masked().Addr(); pf.Contains(a); a = a.Next() {
					v.used[a] = true
				}
			}
		}
	}
	if v.used == nil {
		return nil
	}
	out := make(map[netip.Addr]bool, len(v.used))
	for a := range v.used {
		out[a] = true
	}
	for _, a := range held {
		delete(out, a)
	}
	return out
}

// noteHeld keeps the view of the ENI's subnet current with the pool's own
// change: slots assigned (added true) or released.
func (p *Pool) noteHeld(eniID string, slots []netip.Prefix, added bool) {
	id, _, _ := p.subnetOf(eniID)
	v := p.views[id]
	if v == nil || v.used == nil {
		return
	}
	for _, sl := range slots {
		for a := sl.Masked().Addr(); sl.Contains(a); a = a.Next() {
			if added {
				v.used[a] = true
			} else {
				delete(v.used, a)
			}
		}
	}
}

// assign executes an Assign plan. Single addresses are named from /28s of
// the subnet that are already broken when the view shows enough of them
// free (PickAssign, EC2 AssignPrivateIpAddresses with PrivateIpAddresses);
// when EC2 refuses the named ones for any reason but throttling or a
// stale ENI, the same count is asked for with EC2 choosing.
func (p *Pool) assign(ctx context.Context, plan warmpool.Plan) ([]netip.Prefix, error) {
	if plan.Prefixes || p.o.AddressOrder {
		return p.o.Provider.AssignAddresses(ctx, plan.ENI, plan.Count, plan.Prefixes)
	}
	subnetID, cidr, held := p.subnetOf(plan.ENI)
	salt := fnv.New64a()
	salt.Write([]byte(plan.ENI))
	names := PickAssign(plan.Count, held, p.others(ctx, plan.ENI, subnetID, held), cidr, salt.Sum64()|1)
	if names == nil {
		return p.o.Provider.AssignAddresses(ctx, plan.ENI, plan.Count, false)
	}
	got, err := p.o.Provider.AssignAddressesAt(ctx, plan.ENI, names)
	if v := p.views[subnetID]; v != nil && (err == nil || errors.Is(err, provider.ErrNotVisible)) {
		v.strikes = 0
	}
	var deferred *provider.DeferredError
	if err == nil || errors.Is(err, provider.ErrNotVisible) || errors.Is(err, provider.ErrThrottled) ||
		errors.Is(err, provider.ErrNotFound) || errors.Is(err, provider.ErrAddressLimit) || errors.As(err, &deferred) || ctx.Err() != nil {
		return got, err
	}
	p.namedRefused++
	p.o.Logger.Info("EC2 refused the addresses named from broken /28s; letting EC2 choose", "eni", plan.ENI, "addresses", names, "err", err)
	if v := p.views[subnetID]; v != nil {
		v.strikes = min(v.strikes+1, 4)
		v.pauseUntil = p.o.Clock().Add(p.o.SubnetView / 10 << (v.strikes - 1))
		v.read = time.Time{} // read again before naming again
	}
	return p.o.Provider.AssignAddresses(ctx, plan.ENI, plan.Count, false)
}

// chooseRelease returns the slots to release for a Release plan. When the
// plan gives back single addresses, as many are chosen among all the ENI's
// idle single addresses (none assigned, none cooling: those warmpool could
// have picked, each worth one address to the targets) by PickRelease; a
// plan with prefixes is kept as it is.
func (p *Pool) chooseRelease(ctx context.Context, plan warmpool.Plan) []netip.Prefix {
	if p.o.AddressOrder || len(plan.Release) == 0 {
		return plan.Release
	}
	for _, r := range plan.Release {
		if r.Bits() != 32 {
			return plan.Release
		}
	}
	var free []netip.Addr
	for _, e := range p.o.Store.Snapshot(p.o.Clock()) {
		if e.ID != plan.ENI {
			continue
		}
		for _, sl := range e.Slots {
			if sl.Size() == 1 && sl.Assigned <= 0 && sl.Cooling <= 0 {
				free = append(free, sl.Prefix.Addr())
			}
		}
	}
	for _, r := range plan.Release {
		if !slices.Contains(free, r.Addr()) {
			return plan.Release // not as the snapshot shows: keep the plan, MarkRelease decides
		}
	}
	subnetID, cidr, held := p.subnetOf(plan.ENI)
	picked := PickRelease(free, len(plan.Release), held, p.others(ctx, plan.ENI, subnetID, held), cidr)
	out := make([]netip.Prefix, len(picked))
	for i, a := range picked {
		out[i] = netip.PrefixFrom(a, 32)
	}
	return out
}

// noWholePrefix reports that plan asks for /28 prefixes on an ENI whose
// subnet refused one (EC2 InsufficientCidrBlocks, Pool.prefix.at) and
// whose view, read since or kept current with the pool's own changes,
// shows no aligned /28 that no one holds an address of (none of EC2's
// reserved addresses in it): EC2 would refuse again. False without a view
// (not read yet, unsupported, paused after a refused named assignment,
// or not read successfully within half Options.SubnetView: reads failing),
// for a new ENI (its subnet is the provider's choice) and for single
// addresses. The view is read again once older than a quarter of
// Options.SubnetView (one DescribeNetworkInterfaces, a read, where each
// /28 request EC2 refuses is a mutating call), so a /28 another node gave
// back is asked for at most that late, plus the refusal's backoff.
func (p *Pool) noWholePrefix(ctx context.Context, plan warmpool.Plan) bool {
	if !plan.Prefixes || plan.Action != warmpool.Assign || p.prefix.at.IsZero() {
		return false
	}
	subnetID, cidr, held := p.subnetOf(plan.ENI)
	if !cidr.IsValid() || !cidr.Addr().Is4() {
		return false
	}
	others := p.othersWithin(ctx, plan.ENI, subnetID, held, p.o.SubnetView/4)
	if v := p.views[subnetID]; others == nil || v == nil || p.o.Clock().Sub(v.readOK) > p.o.SubnetView/2 {
		return false // no view, or none read lately (reads failing): ask EC2
	}
	used := map[netip.Prefix]bool{}
	for a := range others {
		used[blockOf(a)] = true
	}
	for _, a := range held {
		used[blockOf(a)] = true
	}
	return freeBlocks(cidr, used) == 0
}

// freeBlocks counts the aligned /28s of subnet that are not in used and
// hold none of EC2's reserved addresses (0 for a subnet smaller than a
// /28).
func freeBlocks(subnet netip.Prefix, used map[netip.Prefix]bool) int {
	if subnet.Bits() > 28 {
		return 0
	}
	n := 0
	blocks := 1 << (28 - subnet.Bits())
	b := netip.PrefixFrom(subnet.Masked().Addr(), 28)
	for i := 0; i < blocks; i++ {
		if !used[b] && !blockHasReserved(subnet, b) {
			n++
		}
		next := lastOf(b).Next()
		if !next.IsValid() {
			break
		}
		b = netip.PrefixFrom(next, 28)
	}
	return n
}
