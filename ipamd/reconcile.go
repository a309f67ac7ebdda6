package ipamd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// start restores the daemon's view before it serves ADDs: instance and limits
// from the provider, the ENIs from EC2 (one Describe), host setup, SNAT, and
// pods the host shows that the checkpoint lost. It retries with backoff until
// it succeeds or ctx ends, and marks the daemon ready (B03).
func (d *Daemon) start(ctx context.Context, restored restoreOutcome) bool {
	for n := 1; ; n++ {
		err := d.startOnce(ctx, restored)
		if err == nil {
			break
		}
		wait := backoff(genericBackoff, n)
		d.setReady(false, "waiting for the cloud: "+err.Error())
		d.log.Error("start-up reconciliation failed", "err", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	d.setReady(true, "")
	s := d.Status()
	d.log.Info("vpcipd ready", "assigned", s.Assigned, "warm", s.Warm, "cooling", s.Cooling, "enis", s.ENIs, "maxENIs", s.MaxENIs)
	return true
}

func (d *Daemon) startOnce(ctx context.Context, restored restoreOutcome) error {
	self, err := d.prov.Self(ctx)
	if err != nil {
		return fmt.Errorf("instance metadata: %w", err)
	}
	lim, err := d.prov.Limits(ctx, self.Type)
	if err != nil {
		return fmt.Errorf("limits of %s: %w", self.Type, err)
	}
	maxENIs := lim.MaxENIs
	if d.cfg.MaxENI > 0 {
		maxENIs = min(maxENIs, d.cfg.MaxENI)
	}
	d.mu.Lock()
	d.self = self
	d.limits = warmpool.Limits{MaxENIs: maxENIs, SlotsPerENI: lim.PodAddressesPerENI(), MaxPods: d.cfg.MaxPods, PrefixSupported: lim.PrefixDelegation}
	d.mu.Unlock()
	d.instance.Store(self.ID)
	if d.dropForeign(self.ID) {
		restored = restoredCorrupt
	}
	enis, err := d.prov.ENIs(ctx)
	if err != nil {
		return fmt.Errorf("ENIs from EC2: %w", err)
	}
	d.applyENIs(enis) // sets up every secondary ENI on the host
	if err := d.ensureSNAT(self); err != nil {
		return err
	}
	if restored == restoredCorrupt {
		// Release times were lost with the checkpoint: treat every free
		// address as just released, so none is reused before the cooldown.
		d.store.CoolFree(d.now())
	}
	d.checkHost(true)
	return d.persist()
}

// ensureSNAT installs the node's SNAT rules (nothing with NoHost).
func (d *Daemon) ensureSNAT(self provider.Instance) error {
	link, err := d.host.LinkName(self.PrimaryMAC)
	if err != nil {
		return err
	}
	err = d.host.EnsureSNAT(hostnet.SNATConfig{VPCCIDRs: self.VPCCIDRs, ExcludeCIDRs: d.cfg.ExcludeSNAT,
		PrimaryIP: self.PrimaryIP, PrimaryLink: link, RandomFully: d.cfg.RandomFully, External: d.cfg.ExternalSNAT})
	if err != nil {
		return fmt.Errorf("SNAT rules: %w", err)
	}
	return nil
}

func linkByMAC(mac string) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces: %w", err)
	}
	for _, i := range ifs {
		if strings.EqualFold(i.HardwareAddr.String(), mac) {
			return i.Name, nil
		}
	}
	return "", fmt.Errorf("no interface has the primary ENI's MAC %s", mac)
}

// reconcile compares the datastore with the cloud. Periodic runs read
// instance metadata first (cheap, not rate-limited) and call EC2 only when it
// disagrees; authoritative runs (the resync) read EC2 directly. Only EC2's
// answer changes the datastore, and never frees an assigned address (B05).
func (d *Daemon) reconcile(ctx context.Context, authoritative bool) {
	if d.stopping.Load() {
		return
	}
	if !authoritative {
		meta, err := d.prov.MetadataENIs(ctx)
		if err == nil {
			diff := disagreement(meta, d.store.ENIs())
			if diff == "" {
				d.ensureHost()
				d.checkHost(false)
				return
			}
			d.log.Info("instance metadata disagrees with the datastore: confirming with EC2", "diff", diff)
		} else {
			d.log.Warn("instance metadata unreadable: confirming with EC2", "err", err)
		}
	}
	enis, err := d.prov.ENIs(ctx)
	if err != nil {
		d.log.Warn("reconciliation: EC2 ENIs unreadable", "err", err)
		return
	}
	d.applyENIs(enis)
	d.ensureHost()
	d.checkHost(false)
	if err := d.persist(); err != nil {
		d.log.Error("checkpoint write after reconciliation failed", "err", err)
	}
}

// ensureHost re-applies the host setup of every secondary ENI and the SNAT
// rules, undoing drift (a flushed table, a changed rp_filter) and retrying
// failed setups. Every call is idempotent.
func (d *Daemon) ensureHost() {
	for _, e := range d.store.ENIs() {
		d.setupHost(provider.ENI{ID: e.ID, MAC: e.MAC, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP,
			SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway})
	}
	d.mu.Lock()
	self := d.self
	d.mu.Unlock()
	if err := d.ensureSNAT(self); err != nil {
		d.log.Error("re-applying SNAT rules failed", "err", err)
	}
}

// resync re-reads the ENIs from EC2 and applies them.
func (d *Daemon) resync(ctx context.Context) error {
	enis, err := d.prov.ENIs(ctx)
	if err != nil {
		return err
	}
	d.applyENIs(enis)
	return nil
}

// applyENIs makes the datastore match EC2's ENIs, sets up new ENIs on the host
// (and re-ensures the others: cheap and idempotent) and counts the repairs.
func (d *Daemon) applyENIs(enis []provider.ENI) {
	before := map[string]datastore.ENI{}
	for _, e := range d.store.ENIs() {
		before[e.ID] = e
	}
	for _, e := range enis {
		d.setupHost(e)
	}
	enis = d.keepOnFirstMiss(enis, before)
	r := d.store.Sync(enis, d.now())
	for _, id := range r.ForgottenENIs {
		e := before[id]
		if err := d.host.RemoveENI(hostnet.ENI{MAC: e.MAC, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP,
			SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway}); err != nil {
			d.log.Warn("removing host setup of a vanished ENI failed", "eni", id, "err", err)
		}
		d.mu.Lock()
		delete(d.links, id)
		delete(d.hostErrs, id)
		d.mu.Unlock()
	}
	if len(before) == 0 {
		// The first sync adopts everything, which is no repair; but a
		// checkpointed assignment the cloud does not show is worth a word.
		for _, a := range d.store.Assignments() {
			if a.ENIID == "" {
				d.metrics.repaired("kept_assigned_address", 1)
				d.log.Warn("checkpointed assignment is on no ENI of this node: kept for its pod, never reused",
					"key", a.Key.String(), "address", a.Address)
			}
		}
		return
	}
	d.metrics.repaired("adopted_eni", len(r.AdoptedENIs))
	d.metrics.repaired("forgotten_eni", len(r.ForgottenENIs))
	d.metrics.repaired("adopted_address", len(r.AdoptedSlots))
	d.metrics.repaired("forgotten_address", len(r.ForgottenSlots))
	d.metrics.repaired("kept_assigned_address", len(r.KeptAssigned))
	if r.Changes() > 0 {
		d.log.Warn("reconciliation repaired the datastore from EC2", "adoptedENIs", r.AdoptedENIs, "forgottenENIs", r.ForgottenENIs,
			"adoptedSlots", r.AdoptedSlots, "forgottenSlots", r.ForgottenSlots, "assignedButGone", r.KeptAssigned)
	}
}

// keepOnFirstMiss adds back the ENIs the datastore has and this EC2 answer
// lacks for the first time: EC2's DescribeNetworkInterfaces is eventually
// consistent, and a just-attached ENI may be missing from one answer.
// Forgetting it would tear down its host setup under its pods. An ENI missing
// from two answers in a row is gone.
func (d *Daemon) keepOnFirstMiss(enis []provider.ENI, have map[string]datastore.ENI) []provider.ENI {
	seen := make(map[string]bool, len(enis))
	for _, e := range enis {
		seen[e.ID] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.missing {
		if seen[id] || have[id].ID == "" {
			delete(d.missing, id)
		}
	}
	for id, e := range have {
		if seen[id] {
			continue
		}
		d.missing[id]++
		if d.missing[id] >= 2 {
			delete(d.missing, id)
			continue
		}
		d.log.Warn("EC2 does not list an ENI the datastore has: keeping it until the next read confirms", "eni", id)
		pe := provider.ENI{ID: e.ID, MAC: e.MAC, DeviceNumber: e.DeviceNumber, SubnetID: e.SubnetID,
			SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway, PrimaryIP: e.PrimaryIP, Attached: e.Attached}
		for _, s := range e.Slots {
			if s.Bits() == s.Addr().BitLen() {
				pe.SecondaryIPs = append(pe.SecondaryIPs, s.Addr())
			} else {
				pe.Prefixes = append(pe.Prefixes, s)
			}
		}
		enis = append(enis, pe)
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
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// checkHost compares assignments with the host's pod routes: a free address
// the host routes to a pod gets a recovered owner (the checkpoint lost it);
// an assignment older than VPCIP_GC_GRACE whose address has had no host route
// on two reconciliations in a row is released (its pod is gone), unless more
// than half the pods lost their routes at once (a broken view is likelier).
// At start (first true) only recovery runs. Without a host view nothing
// happens.
func (d *Daemon) checkHost(first bool) {
	routes, err := d.host.PodRoutes()
	if errors.Is(err, ErrNoHostView) {
		return
	}
	if err != nil {
		d.log.Warn("host pod routes unreadable", "err", err)
		return
	}
	now := d.now()
	byAddr := make(map[netip.Addr]string, len(routes))
	for _, r := range routes {
		byAddr[r.Address] = r.HostVeth
	}
	if rec := d.store.Recover(byAddr, now); len(rec) > 0 {
		d.metrics.repaired("recovered_from_host", len(rec))
		for _, a := range rec {
			d.log.Warn("address routed to a pod but not in the checkpoint: held for it", "address", a.Address, "hostVeth", a.HostVeth)
		}
	}
	if first {
		return
	}
	d.releaseRouteless(byAddr, now)
	d.removeStaleRules(byAddr)
}

// removeStaleRules deletes the per-pod policy rules of addresses that no pod
// holds and no host route leads to: left by a pod that vanished without a
// DEL, or by a DEL that could not finish. A rule is never left pointing at
// an address the pool may hand to another pod (B13). An ADD holds its
// address before the plugin adds rules, and a DEL's rules go with or after
// its route, so neither races this.
func (d *Daemon) removeStaleRules(byAddr map[netip.Addr]string) {
	addrs, err := d.host.PodRuleAddresses()
	if err != nil {
		d.log.Warn("host policy rules unreadable", "err", err)
		return
	}
	for _, a := range addrs {
		if _, routed := byAddr[a]; routed {
			continue
		}
		if _, held := d.store.Holder(a); held {
			continue
		}
		n, err := d.host.RemovePodRules(a)
		if err != nil {
			d.log.Error("removing stale pod rules failed", "address", a, "err", err)
			continue
		}
		if n > 0 {
			d.metrics.repaired("stale_pod_rules", n)
			d.log.Warn("removed policy rules of an address no pod holds", "address", a, "rules", n)
		}
	}
}

func (d *Daemon) releaseRouteless(byAddr map[netip.Addr]string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	assigned := d.store.Assignments()
	seen := map[api.Key]bool{}
	var gone []datastore.Assignment
	for _, a := range assigned {
		seen[a.Key] = true
		if _, ok := byAddr[a.Address]; ok || now.Sub(a.AssignedAt) < d.cfg.GCGrace {
			delete(d.noRoute, a.Key)
			continue
		}
		d.noRoute[a.Key]++
		if d.noRoute[a.Key] >= 2 {
			gone = append(gone, a)
		}
	}
	for k := range d.noRoute {
		if !seen[k] {
			delete(d.noRoute, k)
		}
	}
	// Pods leave through DEL; many routes vanishing at once more likely
	// means a broken host view than dead pods. Freeing their addresses
	// would hand live pods' addresses out again, so do not trust it.
	if limit := max(2, len(assigned)/2); len(gone) > limit {
		d.log.Error("host shows no route for too many pods at once: not releasing on its word",
			"podsWithoutRoute", len(gone), "assigned", len(assigned))
		return
	}
	for _, a := range gone {
		delete(d.noRoute, a.Key)
		if _, ok := d.store.Release(a.Key, now); ok {
			d.metrics.repaired("released_no_route", 1)
			// The pod went without a DEL: its veth and host route went with
			// its netns, but the plugin's rules stay in the node netns.
			rules, err := d.host.RemovePodRules(a.Address)
			if err != nil {
				d.log.Error("removing the released address's pod rules failed", "address", a.Address, "err", err)
			}
			d.log.Warn("released an address whose pod route is gone", "key", a.Key.String(), "address", a.Address, "rulesRemoved", rules)
		}
	}
}

// sweepLeaked deletes this cluster's ENIs left available (unattached) longer
// than VPCIP_LEAKED_ENI_GRACE, e.g. by a node that died between detach and
// delete (B06).
func (d *Daemon) sweepLeaked(ctx context.Context) {
	if d.stopping.Load() {
		return
	}
	ids, err := d.prov.DeleteLeakedENIs(ctx, d.cfg.LeakedENIGrace)
	if len(ids) > 0 {
		d.metrics.repaired("leaked_eni_deleted", len(ids))
		d.log.Warn("deleted leaked ENIs", "enis", ids)
	}
	if err != nil {
		d.log.Warn("leaked-ENI sweep failed", "err", err)
	}
}
