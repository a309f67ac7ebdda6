package ipamd

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// maxSteps bounds the actions of one pool cycle. Warm-up from an empty node
// takes one Assign on the primary ENI and one CreateENI per further ENI.
const maxSteps = 16

// errRaced: the datastore changed between the plan and its execution (a pod
// took an address chosen for release); the next cycle plans again.
var errRaced = errors.New("pool changed while executing the plan")

// work is the worker goroutine: it owns every cloud call.
func (d *Daemon) work(ctx context.Context, restored restoreOutcome) {
	if !d.start(ctx, restored) {
		return
	}
	d.loop(ctx)
}

// loop runs pool cycles (timer and kicks), reconciliation, the EC2 resync
// and the leaked-ENI sweep until ctx ends.
func (d *Daemon) loop(ctx context.Context) {
	pool := time.NewTimer(0)
	defer pool.Stop()
	reconcile := time.NewTicker(jitter(d.cfg.ReconcileInterval))
	defer reconcile.Stop()
	resync := time.NewTicker(jitter(d.cfg.ResyncInterval))
	defer resync.Stop()
	sweep := time.NewTimer(jitter(d.cfg.LeakSweepInterval)) // not at start: one Describe per node at start (B08)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
		case <-pool.C:
		case <-reconcile.C:
			d.reconcile(ctx, false)
		case <-resync.C:
			d.reconcile(ctx, true)
		case <-sweep.C:
			d.sweepLeaked(ctx)
			sweep.Reset(jitter(d.cfg.LeakSweepInterval))
		case req := <-d.calls:
			if req.fn != nil {
				req.fn(ctx)
			}
			pool.Reset(d.poolCycle(ctx))
			close(req.done)
			continue
		}
		pool.Reset(d.poolCycle(ctx))
	}
}

// workerCall is a function run on the worker goroutine, followed by a pool
// cycle; done is closed after both.
type workerCall struct {
	fn   func(context.Context)
	done chan struct{}
}

// onWorker runs fn (may be nil) and then a pool cycle on the worker
// goroutine, keeping every cloud call there, and waits for both. It returns
// false if ctx ends first or the worker is not running.
func (d *Daemon) onWorker(ctx context.Context, fn func(context.Context)) bool {
	req := workerCall{fn: fn, done: make(chan struct{})}
	select {
	case d.calls <- req:
	case <-ctx.Done():
		return false
	}
	select {
	case <-req.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitter spreads d over [0.75d, 1.25d) so daemons started together do not
// call the cloud in lock-step.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

// poolCycle plans and executes pool actions until the pool is at target, a
// refusal says wait, or maxSteps; it returns when the next cycle is due.
func (d *Daemon) poolCycle(ctx context.Context) time.Duration {
	next := d.cfg.PoolInterval
	if d.stopping.Load() {
		return next
	}
	for range maxSteps {
		if ctx.Err() != nil || d.stopping.Load() {
			return next
		}
		now := d.now()
		plan := warmpool.Next(d.planInput(now))
		if plan.Action == warmpool.Nothing || plan.Action == warmpool.Wait {
			if !plan.Until.IsZero() {
				next = min(next, max(plan.Until.Sub(now), 10*time.Millisecond))
			}
			return next
		}
		d.log.Info("pool action", "action", plan.Action.String(), "eni", plan.ENI, "count", plan.Count,
			"prefixes", plan.Prefixes, "release", plan.Release, "reason", plan.Reason)
		err := d.execute(ctx, plan)
		if err := d.persist(); err != nil {
			d.log.Error("checkpoint write after pool action failed", "err", err)
		}
		if err == nil {
			d.metrics.actions.WithLabelValues(plan.Action.String(), "ok").Inc()
			continue
		}
		if errors.Is(err, errRaced) {
			return 100 * time.Millisecond
		}
		d.metrics.actions.WithLabelValues(plan.Action.String(), "error").Inc()
		if ctx.Err() != nil {
			return next
		}
		if errors.Is(err, provider.ErrNotFound) || errors.Is(err, provider.ErrAddressLimit) {
			// Our view of the ENIs is stale: confirm with EC2 now.
			if rerr := d.resync(ctx); rerr != nil {
				d.log.Warn("EC2 re-read after a stale-view error failed", "err", rerr)
			}
		}
		if wait, ok := d.refuse(err, plan, now); !ok {
			d.log.Warn("pool action failed", "action", plan.Action.String(), "eni", plan.ENI, "err", err, "retryIn", wait)
			return wait
		}
	}
	return next
}

// planInput is warmpool's view of the node at now.
func (d *Daemon) planInput(now time.Time) warmpool.Input {
	enis := d.store.Snapshot(now)
	d.mu.Lock()
	defer d.mu.Unlock()
	return warmpool.Input{
		ENIs:   enis,
		Limits: d.limits,
		Config: warmpool.Config{
			WarmENITarget: d.cfg.WarmENITarget, WarmIPTarget: d.cfg.WarmIPTarget,
			MinimumIPTarget: d.cfg.MinimumIPTarget, WarmPrefixTarget: d.cfg.WarmPrefixTarget,
			PrefixDelegation: d.cfg.PrefixDelegation, ReleaseInterval: d.cfg.ReleaseInterval,
			ENIMinAge: d.cfg.ENIMinAge,
		},
		Pending:     int(d.pending.Load()),
		Now:         now,
		LastRelease: d.lastRelease,
		Refusals:    slices.Clone(d.refusals),
	}
}

func (d *Daemon) execute(ctx context.Context, p warmpool.Plan) error {
	switch p.Action {
	case warmpool.Assign:
		got, err := d.prov.AssignAddresses(ctx, p.ENI, p.Count, p.Prefixes)
		if errors.Is(err, provider.ErrNotVisible) {
			// Made, but metadata lags: hand out only what EC2 confirms.
			d.log.Warn("assigned addresses not yet in instance metadata: confirming with EC2", "eni", p.ENI, "err", err)
			return d.resync(ctx)
		}
		if err != nil {
			return err
		}
		d.store.AddSlots(p.ENI, got)
		d.grew()
		return nil
	case warmpool.CreateENI:
		req := provider.CreateENIRequest{Addresses: p.Count}
		if p.Prefixes {
			req = provider.CreateENIRequest{Prefixes: p.Count}
		}
		e, err := d.prov.CreateENI(ctx, req)
		if errors.Is(err, provider.ErrNotVisible) {
			d.log.Warn("new ENI not yet in instance metadata: confirming with EC2", "eni", e.ID, "err", err)
			d.setupHost(e)
			return d.resync(ctx)
		}
		if err != nil {
			return err
		}
		d.setupHost(e) // before the datastore has it: no pod is wired to an ENI without its table
		d.store.PutENI(e)
		d.grew()
		d.log.Info("ENI attached", "eni", e.ID, "device", e.DeviceNumber, "addresses", len(e.SecondaryIPs), "prefixes", len(e.Prefixes))
		return nil
	case warmpool.Release:
		return d.releaseSlots(ctx, p)
	case warmpool.DeleteENI:
		return d.deleteENI(ctx, p.ENI)
	}
	return nil
}

// releaseSlots unassigns free slots. They are marked under the datastore
// lock first, so no ADD can take them while EC2 works (B23).
func (d *Daemon) releaseSlots(ctx context.Context, p warmpool.Plan) error {
	marked := d.store.MarkRelease(p.ENI, p.Release, d.now())
	if len(marked) == 0 {
		return errRaced
	}
	err := d.prov.UnassignAddresses(ctx, p.ENI, marked)
	d.store.FinishRelease(p.ENI, marked, err == nil)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.lastRelease = d.now()
	d.mu.Unlock()
	return nil
}

// deleteENI detaches and deletes a secondary ENI that holds no assignment.
func (d *Daemon) deleteENI(ctx context.Context, id string) error {
	if !d.store.MarkDelete(id) {
		return errRaced
	}
	var eni hostnet.ENI
	for _, e := range d.store.ENIs() {
		if e.ID == id {
			eni = hostnet.ENI{MAC: e.MAC, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP, SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway}
		}
	}
	if err := d.prov.DeleteENI(ctx, id); err != nil {
		d.store.FinishDelete(id, false)
		return err
	}
	if err := d.host.RemoveENI(eni); err != nil {
		d.log.Warn("removing host setup of a deleted ENI failed", "eni", id, "err", err)
	}
	d.store.FinishDelete(id, true)
	d.mu.Lock()
	d.lastRelease = d.now()
	delete(d.links, id)
	delete(d.hostErrs, id)
	d.mu.Unlock()
	d.log.Info("ENI deleted", "eni", id)
	return nil
}

// setupHost sets up a secondary ENI on the node; a failure is recorded (and
// shown in status) and retried at every reconciliation.
func (d *Daemon) setupHost(e provider.ENI) {
	if e.DeviceNumber == 0 || e.ID == "" {
		return
	}
	link, err := d.host.EnsureENI(hostnet.ENI{MAC: e.MAC, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP,
		SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway, MTU: d.cfg.MTU})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.hostErrs[e.ID] = err.Error()
		d.log.Error("host setup of ENI failed", "eni", e.ID, "mac", e.MAC, "err", err)
		return
	}
	delete(d.hostErrs, e.ID)
	if link != "" {
		d.links[e.ID] = link
	}
}

// Backoff after a cloud refusal, by kind: first wait and cap. Each wait is
// jittered over [d/2, d) so nodes do not retry in lock-step (B08).
var refusalBackoff = map[warmpool.RefusalKind][2]time.Duration{
	warmpool.RefusedThrottled:    {time.Second, time.Minute},
	warmpool.RefusedSubnetFull:   {5 * time.Second, 2 * time.Minute},
	warmpool.RefusedNoPrefix:     {30 * time.Second, 5 * time.Minute},
	warmpool.RefusedENILimit:     {30 * time.Second, 10 * time.Minute},
	warmpool.RefusedAddressLimit: {10 * time.Second, 2 * time.Minute},
}

// genericBackoff is the backoff after an unclassified cloud error.
var genericBackoff = [2]time.Duration{time.Second, 2 * time.Minute}

// backoff is the n-th (n ≥ 1) jittered wait of an exponential series.
func backoff(b [2]time.Duration, n int) time.Duration {
	d := b[0]
	for i := 1; i < n && d < b[1]; i++ {
		d *= 2
	}
	d = min(d, b[1])
	return d/2 + rand.N(d/2+1)
}

// refuse turns a cloud error into a warmpool.Refusal with backoff. It
// returns false, with the wait before the next cycle, for errors that are no
// refusal.
func (d *Daemon) refuse(err error, p warmpool.Plan, now time.Time) (time.Duration, bool) {
	kinds := []struct {
		err  error
		kind warmpool.RefusalKind
	}{
		{provider.ErrThrottled, warmpool.RefusedThrottled},
		{provider.ErrSubnetFull, warmpool.RefusedSubnetFull},
		{provider.ErrInsufficientCIDR, warmpool.RefusedNoPrefix},
		{provider.ErrENILimit, warmpool.RefusedENILimit},
		{provider.ErrAddressLimit, warmpool.RefusedAddressLimit},
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range kinds {
		if !errors.Is(err, k.err) {
			continue
		}
		d.strikes[k.kind]++
		wait := backoff(refusalBackoff[k.kind], d.strikes[k.kind])
		r := warmpool.Refusal{Kind: k.kind, Until: now.Add(wait)}
		switch k.kind {
		case warmpool.RefusedAddressLimit:
			r.ENI = p.ENI
		case warmpool.RefusedSubnetFull:
			r.Count = p.Count // the subnet may fit a smaller request: warmpool halves it
		}
		d.refusals = append(slices.DeleteFunc(d.refusals, func(o warmpool.Refusal) bool {
			return !o.Until.After(now) || (o.Kind == r.Kind && o.ENI == r.ENI)
		}), r)
		d.log.Warn("cloud refused pool growth", "action", p.Action.String(), "eni", p.ENI, "refusal", refusalText(k.kind, d.self.SubnetID),
			"err", err, "retryAfter", wait)
		return 0, true
	}
	d.strikes[0]++
	return backoff(genericBackoff, d.strikes[0]), false
}

// grew clears the growth refusals a successful growth call disproves.
func (d *Daemon) grew() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refusals = slices.DeleteFunc(d.refusals, func(r warmpool.Refusal) bool {
		// A subnet refusal that caps the request size stays until it
		// expires: asking for the refused size again would fail again.
		return r.Kind == warmpool.RefusedThrottled || (r.Kind == warmpool.RefusedSubnetFull && r.Count <= 1)
	})
	clear(d.strikes)
}
