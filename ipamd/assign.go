package ipamd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/warmpool"
)

// waitPoll is how often a waiting ADD looks again, to catch addresses whose
// cooldown ran out (which no event announces).
const waitPoll = 100 * time.Millisecond

// Assign answers an address request (CNI ADD). A key that holds an address
// gets it again. Otherwise it takes a free address, records it in the
// checkpoint before answering, and kicks the pool loop to refill. When the
// pool is empty it kicks the loop and waits up to VPCIP_ADD_WAIT for an
// address, then answers CodeNoAddress with the cause. Before the daemon is
// ready (checkpoint loaded and first reconcile done) it waits the same bound,
// then answers CodeNotReady.
func (d *Daemon) Assign(ctx context.Context, req api.AssignRequest) (api.Assignment, error) {
	start := time.Now()
	defer func() { d.metrics.addWait.Observe(time.Since(start).Seconds()) }()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.AddWait)
	defer cancel()
	select {
	case <-d.ready:
	case <-d.closing:
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is shutting down"}
	case <-ctx.Done():
		d.metrics.noAddress.WithLabelValues("not-ready").Inc()
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is not ready: " + d.Status().Reason}
	}
	waiting := false
	defer func() {
		if waiting {
			d.pending.Add(-1)
		}
	}()
	var tick *time.Ticker
	for {
		changed := d.store.Changed()
		a, existing, err := d.store.Assign(req.Key, req.Pod, d.now())
		if err == nil {
			if !existing {
				if perr := d.persist(); perr != nil {
					d.store.Unassign(req.Key)
					return api.Assignment{}, &api.Error{Code: api.CodeInternal,
						Message: fmt.Sprintf("vpcipd: cannot record the assignment of %s in the checkpoint: %v", a.Address, perr)}
				}
				d.log.Debug("assigned", "key", req.Key.String(), "pod", req.Pod.Namespace+"/"+req.Pod.Name, "address", a.Address, "eni", a.ENIID)
			}
			d.Kick()
			return d.wire(a), nil
		}
		if e, final := d.noAddress(d.now()); final {
			return api.Assignment{}, d.refused(req.Key, e)
		}
		if !waiting {
			waiting = true
			d.pending.Add(1)
			tick = time.NewTicker(waitPoll)
			defer tick.Stop()
		}
		d.Kick()
		select {
		case <-changed:
		case <-tick.C:
		case <-d.closing:
			return api.Assignment{}, d.refused(req.Key, &api.Error{Code: api.CodeNotReady, Cause: api.CauseWaitingCloud,
				Message: "vpcipd is shutting down: no address now, try again"})
		case <-ctx.Done():
			e, _ := d.noAddress(d.now())
			return api.Assignment{}, d.refused(req.Key, e)
		}
	}
}

// refused counts and logs an ADD answered without an address.
func (d *Daemon) refused(key api.Key, e *api.Error) *api.Error {
	d.metrics.noAddress.WithLabelValues(string(e.Cause)).Inc()
	d.log.Info("no address for pod", "key", key.String(), "cause", e.Cause, "msg", e.Message)
	return e
}

// Release gives a key's address back (CNI DEL); it cools down for
// IP_COOLDOWN_PERIOD before any other key gets it. An unknown key is success.
func (d *Daemon) Release(req api.ReleaseRequest) (api.ReleaseResponse, error) {
	d.adopt(req.Key, api.Pod{}, req.HostVeth)
	a, ok := d.store.Release(req.Key, d.now())
	if !ok {
		return api.ReleaseResponse{Version: api.Version}, nil
	}
	if err := d.persist(); err != nil {
		// The release stands in memory; the next write records it. A crash
		// before that restores the assignment, which GC reclaims.
		d.log.Error("checkpoint write after release failed", "key", req.Key.String(), "err", err)
	}
	d.log.Debug("released", "key", req.Key.String(), "address", a.Address)
	d.Kick()
	w := d.wire(a)
	return api.ReleaseResponse{Version: api.Version, Released: true, Assignment: &w}, nil
}

// Check returns a key's assignment (CNI CHECK), or CodeNotFound.
func (d *Daemon) Check(req api.CheckRequest) (api.Assignment, error) {
	a, ok := d.store.Get(req.Key)
	if !ok {
		a, ok = d.adopt(req.Key, req.Pod, req.HostVeth)
	}
	if ok {
		return d.wire(a), nil
	}
	if !d.readyOK.Load() {
		return api.Assignment{}, &api.Error{Code: api.CodeNotReady, Message: "vpcipd is not ready: " + d.Status().Reason}
	}
	return api.Assignment{}, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("vpcipd holds no address for %s", req.Key)}
}

// adopt matches an unknown key to an assignment re-held from its pod's host
// route after a lost checkpoint, and records it under the key.
func (d *Daemon) adopt(key api.Key, pod api.Pod, hostVeth string) (datastore.Assignment, bool) {
	a, ok := d.store.Adopt(key, pod, hostVeth)
	if !ok {
		return a, false
	}
	d.log.Info("recovered assignment matched to its attachment by host veth", "key", key.String(), "address", a.Address, "hostVeth", hostVeth)
	d.metrics.repaired("recovered_adopted", 1)
	if err := d.persist(); err != nil {
		d.log.Error("checkpoint write after adopting a recovered assignment failed", "err", err)
	}
	return a, true
}

// GC releases every assignment of req.Network not listed in req.Valid and
// older than VPCIP_GC_GRACE (CNI spec 1.1 §GC).
func (d *Daemon) GC(req api.GCRequest) (api.GCResponse, error) {
	valid := make(map[api.Key]bool, len(req.Valid))
	for _, k := range req.Valid {
		valid[k] = true
	}
	released := d.store.GC(req.Network, valid, d.cfg.GCGrace, d.now())
	out := api.GCResponse{Version: api.Version, Released: []api.Assignment{}}
	for _, a := range released {
		out.Released = append(out.Released, d.wire(a))
	}
	if len(released) > 0 {
		if err := d.persist(); err != nil {
			d.log.Error("checkpoint write after GC failed", "err", err)
		}
		d.metrics.repaired("gc_released", len(released))
		d.log.Info("GC released stale attachments", "network", req.Network, "count", len(released))
		d.Kick()
	}
	return out, nil
}

// Status reports readiness and the pool's numbers.
func (d *Daemon) Status() api.Status {
	now := d.now()
	c := d.store.Counts(now)
	d.mu.Lock()
	lim, reason := d.limits, d.statusReasonLocked(now)
	d.mu.Unlock()
	unit := d.slotSize(lim)
	capacity := 0
	for _, e := range d.store.ENIs() {
		capacity += eniCapacity(e, lim, unit)
	}
	return api.Status{
		Version: api.Version, Ready: d.readyOK.Load(), Reason: reason,
		Assigned: c.Assigned, Warm: c.Warm, Cooling: c.Cooling,
		Capacity: capacity, ENIs: c.ENIs, MaxENIs: lim.MaxENIs,
		Budget: capacity + max(lim.MaxENIs-c.ENIs, 0)*lim.SlotsPerENI*unit,
	}
}

// eniCapacity is how many addresses an attached ENI could hold: its slots at
// their real size (a /28 held from prefix mode counts 16 even after the mode
// is turned off, a /32 from the no-/28 fallback counts 1) plus its free slots
// at the current mode's size.
func eniCapacity(e datastore.ENI, lim warmpool.Limits, unit int) int {
	n := 0
	for _, s := range e.Slots {
		n += 1 << (s.Addr().BitLen() - s.Bits())
	}
	return n + max(lim.SlotsPerENI-len(e.Slots), 0)*unit
}

// maxENINote names MAX_ENI when it, not the instance type, sets the limit.
func (d *Daemon) maxENINote(lim warmpool.Limits) string {
	if d.cfg.MaxENI > 0 && d.cfg.MaxENI == lim.MaxENIs {
		return ", MAX_ENI"
	}
	return ""
}

// slotSize is the addresses per slot: 16 in prefix mode, else 1.
func (d *Daemon) slotSize(lim warmpool.Limits) int {
	if d.cfg.PrefixDelegation && lim.PrefixSupported {
		return warmpool.PrefixAddresses
	}
	return 1
}

// statusReasonLocked is why the daemon is not ready, or its degradations.
func (d *Daemon) statusReasonLocked(now time.Time) string {
	if !d.readyOK.Load() {
		return d.reason
	}
	var parts []string
	for _, r := range d.refusals {
		if r.Until.After(now) {
			parts = append(parts, "degraded: "+refusalText(r.Kind, d.self.SubnetID))
		}
	}
	for id, e := range d.hostErrs {
		parts = append(parts, fmt.Sprintf("degraded: host setup of %s failed: %s", id, e))
	}
	return strings.Join(parts, "; ")
}

func refusalText(k warmpool.RefusalKind, subnet string) string {
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

// noAddress builds the CodeNoAddress answer with the most specific cause.
// final is true when waiting cannot help (node at its ENI limit with every
// address assigned, or at its pod limit): the ADD then fails at once (B19).
func (d *Daemon) noAddress(now time.Time) (e *api.Error, final bool) {
	st := d.Status()
	c := d.store.Counts(now)
	d.mu.Lock()
	lim, subnet := d.limits, d.self.SubnetID
	active := map[warmpool.RefusalKind]time.Time{}
	for _, r := range d.refusals {
		if r.Until.After(now) {
			active[r.Kind] = r.Until
		}
	}
	d.mu.Unlock()
	atLimit := lim.MaxENIs > 0 && c.ENIs >= lim.MaxENIs && c.Slots >= lim.MaxENIs*lim.SlotsPerENI
	tail := fmt.Sprintf("%d addresses assigned, %d cooling down, %d ENIs of %d", st.Assigned, st.Cooling, st.ENIs, st.MaxENIs)
	mk := func(cause api.Cause, format string, args ...any) *api.Error {
		return &api.Error{Code: api.CodeNoAddress, Cause: cause, Message: "no free address: " + fmt.Sprintf(format, args...)}
	}
	retry := func(k warmpool.RefusalKind) string { return active[k].UTC().Format(time.RFC3339) }
	switch _, throttled := active[warmpool.RefusedThrottled]; {
	case d.cfg.MaxPods > 0 && st.Assigned >= d.cfg.MaxPods:
		return mk(api.CauseMaxPods, "node holds its maximum of %d pods (VPCIP_MAX_PODS)", d.cfg.MaxPods), true
	case atLimit && st.Cooling == 0:
		return mk(api.CauseENILimit, "node at its ENI limit (%d of %d%s) and all %d addresses assigned", c.ENIs, lim.MaxENIs, d.maxENINote(lim), st.Assigned), true
	case atLimit:
		return mk(api.CauseCooldown, "node at its ENI limit (%d of %d): %d addresses assigned, %d cooling down for IP_COOLDOWN_PERIOD %s",
			c.ENIs, lim.MaxENIs, st.Assigned, st.Cooling, d.cfg.Cooldown), false
	case !active[warmpool.RefusedSubnetFull].IsZero():
		return mk(api.CauseSubnetFull, "subnet %s has no free addresses (EC2 InsufficientFreeAddressesInSubnet), growth retried after %s; %s",
			subnet, retry(warmpool.RefusedSubnetFull), tail), false
	case !active[warmpool.RefusedNoPrefix].IsZero() && d.cfg.PrefixDelegation:
		return mk(api.CauseNoPrefix, "subnet %s has no contiguous free /28 for a prefix (EC2 InsufficientCidrBlocks), retried after %s; %s",
			subnet, retry(warmpool.RefusedNoPrefix), tail), false
	case throttled:
		return mk(api.CauseThrottled, "EC2 is throttling this node's calls (RequestLimitExceeded), retried after %s; %s", retry(warmpool.RefusedThrottled), tail), false
	case !active[warmpool.RefusedENILimit].IsZero():
		return mk(api.CauseENILimit, "EC2 refused another ENI (AttachmentLimitExceeded); %s", tail), false
	}
	return mk(api.CauseWaitingCloud, "pool refill in flight; %s", tail), false
}
