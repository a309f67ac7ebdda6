package ipamd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/provider"
)

// reconciler brings the datastore in line with the cloud: start-up (instance,
// limits, ENIs, host), the periodic metadata comparison confirmed by EC2,
// the authoritative EC2 re-read and the leaked-ENI sweep. It runs on the
// worker goroutine only and holds no lock.
type reconciler struct {
	cfg     config.Config
	prov    provider.Provider
	store   *datastore.Store
	node    *nodeInfo
	hosts   *hostSync
	ckpt    *checkpointer
	life    *lifecycle
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	missing map[string]int // consecutive EC2 reads that lacked an ENI the datastore has
	// fatal is why start-up gave up for good (a configuration the node
	// cannot serve, such as IPv6 on a subnet without an IPv6 CIDR block);
	// the daemon stops with it. Set by start only.
	fatal error
}

// start restores the daemon's view before it serves ADDs: instance and limits
// from the provider, the ENIs from EC2 (one Describe), host setup, SNAT, and
// pods the host shows that the checkpoint lost, the pod-to-IMDS filter. It retries with backoff until
// it succeeds or ctx ends, and marks the daemon ready (B03).
func (r *reconciler) start(ctx context.Context, restored restoreOutcome) bool {
	for n := 1; ; n++ {
		err := r.startOnce(ctx, restored)
		if err == nil {
			break
		}
		var fe *fatalError
		if errors.As(err, &fe) {
			r.fatal = err
			r.life.setReady(false, err.Error())
			r.log.Error("start-up failed: this node cannot serve this configuration", "err", err)
			return false
		}
		wait := pool.RetryBackoff(n)
		r.life.setReady(false, "waiting for the cloud: "+err.Error())
		r.log.Error("start-up reconciliation failed", "err", err, "retryIn", wait.String())
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	r.life.setReady(true, "")
	c := r.store.Counts(r.now())
	_, lim := r.node.get()
	r.log.Info("vpcipd ready", "assigned", c.Assigned, "warm", c.Warm, "cooling", c.Cooling, "enis", c.ENIs, "maxENIs", lim.MaxENIs)
	return true
}

func (r *reconciler) startOnce(ctx context.Context, restored restoreOutcome) error {
	self, err := r.prov.Self(ctx)
	if err != nil {
		return fmt.Errorf("instance metadata: %w", err)
	}
	lim, err := r.prov.Limits(ctx, self.Type)
	if err != nil {
		return fmt.Errorf("limits of %s: %w", self.Type, err)
	}
	r.node.set(self, nodeLimits(lim, r.cfg.MaxENI, r.cfg.MaxPods, r.cfg.CustomNetworking))
	if r.ckpt.adoptInstance(self.ID) {
		restored = restoredCorrupt
	}
	enis, err := r.prov.ENIs(ctx)
	if err != nil {
		return fmt.Errorf("ENIs from EC2: %w", err)
	}
	enis = r.family(enis)
	if r.cfg.IPv6 {
		if enis, err = r.ensureIPv6Prefix(ctx, self, lim, enis); err != nil {
			return err
		}
	}
	r.applyENIs(enis) // sets up every secondary ENI on the host
	if err := r.hosts.ensureSNAT(self); err != nil {
		return err
	}
	if restored == restoredCorrupt {
		// Release times were lost with the checkpoint: treat every free
		// address as just released, so none is reused before the cooldown.
		r.store.Recovery().CoolFree(r.now())
	}
	r.hosts.checkPods(true)
	// Before the first ADD is served: a daemon that cannot keep pods from
	// IMDS stays unready rather than start pods that reach it.
	if err := r.hosts.imds.sync(true); err != nil {
		return err
	}
	return r.ckpt.persist()
}

// reconcile compares the datastore with the cloud. Periodic runs read
// instance metadata first (cheap, not rate-limited) and call EC2 only when it
// disagrees; authoritative runs (the resync) read EC2 directly. Only EC2's
// answer changes the datastore, and never frees an assigned address (B05).
func (r *reconciler) reconcile(ctx context.Context, authoritative bool) {
	if r.life.stopping.Load() {
		return
	}
	if r.ckpt.failure() != nil {
		// Not ready while the checkpoint cannot be written, and a node
		// not ready gets no ADD to write it: try again on this tick.
		if err := r.ckpt.persist(); err != nil {
			r.log.Warn("checkpoint still cannot be written", "err", err)
		}
	}
	self, _ := r.node.get()
	if !authoritative {
		meta, err := r.prov.MetadataENIs(ctx)
		if err == nil {
			diff := disagreement(r.family(meta), r.store.ENIs())
			if diff == "" {
				r.hosts.ensureAll(self)
				r.hosts.checkPods(false)
				return
			}
			r.log.Info("instance metadata disagrees with the datastore: confirming with EC2", "diff", diff)
		} else {
			r.log.Warn("instance metadata unreadable: confirming with EC2", "err", err)
		}
	}
	enis, err := r.prov.ENIs(ctx)
	if err != nil {
		r.log.Warn("reconciliation: EC2 ENIs unreadable", "err", err)
		return
	}
	r.applyENIs(r.family(enis))
	r.hosts.ensureAll(self)
	r.hosts.checkPods(false)
	if err := r.ckpt.persist(); err != nil {
		r.log.Error("checkpoint write after reconciliation failed", "err", err)
	}
}

// resync re-reads the ENIs from EC2 and applies them.
func (r *reconciler) resync(ctx context.Context) error {
	enis, err := r.prov.ENIs(ctx)
	if err != nil {
		return err
	}
	r.applyENIs(r.family(enis))
	return nil
}

// applyENIs makes the datastore match EC2's ENIs, sets up new ENIs on the host
// (and re-ensures the others: cheap and idempotent) and counts the repairs.
func (r *reconciler) applyENIs(enis []provider.ENI) {
	before := map[string]datastore.ENI{}
	for _, e := range r.store.ENIs() {
		before[e.ID] = e
	}
	for _, e := range enis {
		r.hosts.ENIAttached(e)
	}
	enis = r.keepOnFirstMiss(enis, before)
	rep := r.store.Cloud().Sync(enis, r.now())
	for _, id := range rep.ForgottenENIs {
		r.hosts.forget(before[id], "removing host setup of a vanished ENI failed")
	}
	if len(before) == 0 {
		// The first sync adopts everything, which is no repair; but a
		// checkpointed assignment the cloud does not show is worth a word.
		for _, a := range r.store.Assignments() {
			if a.ENIID == "" {
				r.metrics.repaired("kept_assigned_address", 1)
				r.log.Warn("checkpointed assignment is on no ENI of this node: kept for its pod, never reused",
					"key", a.Key.String(), "address", a.Address)
			}
		}
		return
	}
	r.metrics.repaired("adopted_eni", len(rep.AdoptedENIs))
	r.metrics.repaired("forgotten_eni", len(rep.ForgottenENIs))
	r.metrics.repaired("adopted_address", len(rep.AdoptedSlots))
	r.metrics.repaired("forgotten_address", len(rep.ForgottenSlots))
	r.metrics.repaired("kept_assigned_address", len(rep.KeptAssigned))
	if rep.Changes() > 0 {
		r.log.Warn("reconciliation repaired the datastore from EC2", "adoptedENIs", rep.AdoptedENIs, "forgottenENIs", rep.ForgottenENIs,
			"adoptedSlots", rep.AdoptedSlots, "forgottenSlots", rep.ForgottenSlots, "assignedButGone", rep.KeptAssigned)
	}
}

// keepOnFirstMiss adds back the ENIs the datastore has and this EC2 answer
// lacks for the first time: EC2's DescribeNetworkInterfaces is eventually
// consistent, and a just-attached ENI may be missing from one answer.
// Forgetting it would tear down its host setup under its pods. An ENI missing
// from two answers in a row is gone.
func (r *reconciler) keepOnFirstMiss(enis []provider.ENI, have map[string]datastore.ENI) []provider.ENI {
	seen := make(map[string]bool, len(enis))
	for _, e := range enis {
		seen[e.ID] = true
	}
	for id := range r.missing {
		if seen[id] || have[id].ID == "" {
			delete(r.missing, id)
		}
	}
	for id, e := range have {
		if seen[id] {
			continue
		}
		r.missing[id]++
		if r.missing[id] >= 2 {
			delete(r.missing, id)
			continue
		}
		r.log.Warn("EC2 does not list an ENI the datastore has: keeping it until the next read confirms", "eni", id)
		enis = append(enis, cloudENI(e))
	}
	return enis
}

// disagreement describes how instance metadata differs from the datastore
// (ENI set, and each ENI's slots, member by member — not only counts), or "".
func disagreement(meta []provider.ENI, have []datastore.ENI) string {
	haveByID := map[string]datastore.ENI{}
	for _, e := range have {
		haveByID[e.ID] = e
	}
	var diffs []string
	for _, m := range meta {
		h, ok := haveByID[m.ID]
		if !ok {
			diffs = append(diffs, "new ENI "+m.ID)
			continue
		}
		delete(haveByID, m.ID)
		if !slices.Equal(metaSlots(m), h.Slots) {
			diffs = append(diffs, "slots of "+m.ID)
		}
	}
	for id := range haveByID {
		diffs = append(diffs, "missing ENI "+id)
	}
	slices.Sort(diffs)
	return strings.Join(diffs, ", ")
}

func metaSlots(e provider.ENI) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range e.SecondaryIPs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	for _, p := range e.Prefixes {
		out = append(out, p.Masked())
	}
	for _, p := range e.IPv6Prefixes {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// sweepLeaked deletes this cluster's ENIs left available (unattached) longer
// than VPCIP_LEAKED_ENI_GRACE, e.g. by a node that died between detach and
// delete (B06).
func (r *reconciler) sweepLeaked(ctx context.Context) {
	if r.life.stopping.Load() {
		return
	}
	ids, err := r.prov.DeleteLeakedENIs(ctx, r.cfg.LeakedENIGrace)
	if len(ids) > 0 {
		r.metrics.repaired("leaked_eni_deleted", len(ids))
		r.log.Warn("deleted leaked ENIs", "enis", ids)
	}
	if err != nil {
		r.log.Warn("leaked-ENI sweep failed", "err", err)
	}
}
