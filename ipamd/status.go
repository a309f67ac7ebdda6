package ipamd

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/routing"
	"github.com/vpcip/vpcip/warmpool"
)

// StatusSink receives a nodestatus.Snapshot, with the attachments held
// (Snapshot.Held), after every pass of the worker (start-up, each pool cycle
// and reconciliation), on the worker goroutine: it must not block. The
// Kubernetes part is one (it publishes the node's AddressBudget);
// Options.Status nil publishes nothing.
type StatusSink interface {
	PublishStatus(nodestatus.Snapshot)
}

// statusView computes the status from the parts; it owns no state and
// takes no lock of its own.
type statusView struct {
	cfg     config.Config
	store   *datastore.Store
	node    *nodeInfo
	pool    *pool.Pool
	hosts   *hostSync
	life    *lifecycle
	now     func() time.Time
	version string
	started time.Time
	// placement is the latest ENI placement decision (Options.Placement).
	placement func() podsubnet.Decision
	kube      func() introspect.Kubernetes // nil: no Kubernetes part
	ckpt      *checkpointer
}

// snapshot is the node's status now, without Held (see published).
func (v *statusView) snapshot() nodestatus.Snapshot {
	now := v.now()
	self, lim := v.node.get()
	ready := v.life.readyOK.Load() && v.ckpt.failure() == nil
	st := api.Status{Version: api.Version, Ready: ready, Reason: v.reason(now, self.SubnetID), Counts: v.counts(now, lim)}
	snap := nodestatus.Snapshot{Time: now, Instance: self, Limits: lim, Status: st, PrefixMode: slotSize(v.cfg, lim) > 1,
		Placement: v.placement(), Version: v.version, CheckpointSchema: checkpoint.Version}
	if w, ok := v.hosts.witnessState(); ok {
		snap.SandboxNetns = &nodestatus.SandboxNetns{Visible: w.Available, Dirs: w.Dirs, Reason: w.Reason}
	}
	return snap
}

// published is snapshot with the attachments held: what the status sink
// gets.
func (v *statusView) published() nodestatus.Snapshot {
	snap := v.snapshot()
	for _, a := range v.store.Assignments() {
		snap.Held = append(snap.Held, nodestatus.Held{Key: a.Key, Pod: a.Pod})
	}
	return snap
}

// counts are the pool's numbers at now: the one computation of api.Counts
// every rendering starts from. Under custom networking the primary ENI holds
// no pod address, so neither its capacity nor the ENI itself is counted
// (lim.MaxENIs excludes it too: see api.Counts).
func (v *statusView) counts(now time.Time, lim warmpool.Limits) api.Counts {
	c := v.store.Counts(now)
	if v.cfg.IPv6 {
		return v.countsIPv6(c, lim)
	}
	unit := slotSize(v.cfg, lim)
	capacity, podENIs := 0, 0
	for _, e := range v.store.ENIs() {
		if v.cfg.CustomNetworking && e.Primary() {
			continue
		}
		podENIs++
		capacity += eniCapacity(e, lim, unit)
	}
	return api.Counts{Assigned: c.Assigned, Warm: c.Warm, Cooling: c.Cooling,
		Capacity: capacity, ENIs: podENIs, MaxENIs: lim.MaxENIs,
		Budget: warmpool.Budget(capacity, podENIs, lim, unit)}
}

// countsIPv6 are the pool's numbers in IPv6 mode: capacity is what the
// node's /80s hold (2^48 − 1 addresses each: lazySlotSize), every free
// address out of cooldown is warm, and the budget is the capacity (no other
// /80 is ever taken). Under custom networking the primary ENI still counts:
// IPv6 mode takes pods' addresses from it.
func (v *statusView) countsIPv6(c datastore.Counts, lim warmpool.Limits) api.Counts {
	capacity, podENIs := 0, 0
	for _, e := range v.store.ENIs() {
		podENIs++
		capacity += eniCapacityIPv6(e)
	}
	warm := max(capacity-c.Assigned-c.Cooling-c.Releasing, 0)
	return api.Counts{Assigned: c.Assigned, Warm: warm, Cooling: c.Cooling, Capacity: capacity,
		ENIs: podENIs, MaxENIs: max(lim.MaxENIs, podENIs), Budget: capacity}
}

// lazySlotSize is the addresses a pod may get from a lazy slot (an IPv6
// /80): all but its first (datastore.Store.Assign never hands that out).
func lazySlotSize(s netip.Prefix) int {
	return 1<<(s.Addr().BitLen()-s.Bits()) - 1
}

// eniCapacityIPv6 is what an ENI's /80s hold, in addresses.
func eniCapacityIPv6(e datastore.ENI) int {
	n := 0
	for _, s := range e.Slots {
		if s.Addr().Is6() && s.Addr().BitLen()-s.Bits() > datastore.LazySlotBits {
			n += lazySlotSize(s)
		}
	}
	return n
}

// status reports readiness and the pool's numbers.
func (v *statusView) status() api.Status { return v.snapshot().Status }

// eniCapacity is warmpool.ENICapacity of a datastore ENI.
func eniCapacity(e datastore.ENI, lim warmpool.Limits, unit int) int {
	held := 0
	for _, s := range e.Slots {
		held += 1 << (s.Addr().BitLen() - s.Bits())
	}
	return warmpool.ENICapacity(held, len(e.Slots), lim, unit)
}

// slotSize is the addresses per slot: 16 in prefix mode, else 1.
func slotSize(cfg config.Config, lim warmpool.Limits) int {
	if cfg.PrefixDelegation && lim.PrefixSupported {
		return warmpool.PrefixAddresses
	}
	return 1
}

// reason is why the daemon is not ready, or its degradations.
func (v *statusView) reason(now time.Time, subnet string) string {
	if !v.life.readyOK.Load() {
		return v.life.notReadyReason()
	}
	var parts []string
	if f := v.ckpt.failure(); f != nil {
		// Not ready: no ADD can be answered (CNI STATUS fails with 50, the
		// readiness probe with 503) until a write succeeds again.
		parts = append(parts, fmt.Sprintf("checkpoint %s cannot be written since %s: %v (every ADD fails until it can)", v.ckpt.path, f.at.UTC().Format(time.RFC3339), f.err))
	}
	for _, r := range v.pool.Refusals(now) {
		parts = append(parts, "degraded: "+pool.RefusalText(r.Kind, subnet))
	}
	if f, ok := v.pool.LastFailure(now); ok {
		parts = append(parts, fmt.Sprintf("degraded: pool %s failed: %v (retried after %s)", f.Action, f.Err, f.Until.UTC().Format(time.RFC3339)))
	}
	errs := v.hosts.failures()
	ids := make([]string, 0, len(errs))
	for id := range errs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("degraded: host setup of %s failed: %s", id, errs[id]))
	}
	if w, ok := v.hosts.witnessState(); ok && !w.Available {
		parts = append(parts, "degraded: "+w.Reason)
	}
	return strings.Join(parts, "; ")
}

// state is the introspection view: node, pool numbers, ENIs with their
// addresses, assignments with pod names, cooling addresses, effective
// configuration and readiness.
func (v *statusView) state() introspect.State {
	snap := v.snapshot()
	now, self, lim, st := snap.Time, snap.Instance, snap.Limits, snap.Status
	cp, _ := v.store.Recovery().Checkpoint(now)
	links := v.hosts.linkNames()
	mode := introspect.ModeSecondaryIP
	switch {
	case v.cfg.IPv6:
		mode = introspect.ModeIPv6Prefix
	case snap.PrefixMode:
		mode = introspect.ModePrefix
	}
	out := introspect.State{
		Node: introspect.NodeInfo{Name: v.cfg.NodeName, InstanceID: self.ID, InstanceType: self.Type,
			AvailabilityZone: self.AvailabilityZone, PrimaryIP: self.PrimaryIP, Mode: mode, Version: v.version, StartedAt: v.started},
		Pool:        st.Counts,
		ENIs:        []introspect.ENI{},
		Assignments: []introspect.Assignment{},
		Cooling:     []introspect.CoolingAddress{},
		Config:      v.cfg.Map(),
		Ready:       st.Ready,
		Reason:      st.Reason,
		Kubernetes:  introspect.Kubernetes{Reason: "disabled"},
		Time:        now,
	}
	if w := snap.SandboxNetns; w != nil {
		out.SandboxNetns = &introspect.SandboxNetns{Visible: w.Visible, Dirs: w.Dirs, Reason: w.Reason}
	}
	if pl := snap.Placement; pl.Mode != "" {
		out.Placement = &introspect.Placement{At: pl.At, Mode: pl.Mode, ENIConfig: pl.ENIConfig, Reason: pl.Reason, Problem: pl.Problem, Cause: pl.Cause}
		if len(pl.Targets) > 0 {
			out.Placement.SubnetID, out.Placement.SecurityGroups = pl.Targets[0].SubnetID, pl.Targets[0].SecurityGroups
		}
	}
	if v.kube != nil {
		out.Kubernetes = v.kube()
	}
	for _, e := range v.store.ENIs() {
		capacity := eniCapacity(e, lim, slotSize(v.cfg, lim))
		if v.cfg.IPv6 {
			capacity = eniCapacityIPv6(e)
		}
		out.ENIs = append(out.ENIs, introspectENI(e, links[e.ID], capacity))
	}
	for _, a := range v.store.Assignments() {
		out.Assignments = append(out.Assignments, introspect.Assignment{Key: a.Key, Pod: a.Pod, Address: a.Address,
			ENIID: a.ENIID, AssignedAt: a.AssignedAt})
	}
	for _, c := range cp.Cooling {
		out.Cooling = append(out.Cooling, introspect.CoolingAddress{Address: c.Address, ENIID: c.ENI, UnassignedAt: c.UnassignedAt})
	}
	return out
}

func introspectENI(e datastore.ENI, link string, capacity int) introspect.ENI {
	ie := introspect.ENI{ID: e.ID, MAC: e.MAC, DeviceNumber: e.DeviceNumber, RouteTable: routing.TableForDevice(e.DeviceNumber),
		LinkName: link, SubnetID: e.SubnetID, SubnetCIDR: e.SubnetCIDR, PrimaryIP: e.PrimaryIP,
		Addresses: []netip.Addr{}, Capacity: capacity}
	for _, s := range e.Slots {
		if s.Bits() < s.Addr().BitLen() {
			ie.Prefixes = append(ie.Prefixes, s)
		}
		if s.Addr().BitLen()-s.Bits() > datastore.LazySlotBits {
			continue // an IPv6 /80: its pods' addresses are in Assignments
		}
		for a := s.Addr(); s.Contains(a); a = a.Next() {
			ie.Addresses = append(ie.Addresses, a)
		}
	}
	return ie
}
