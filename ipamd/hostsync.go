package ipamd

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/hostnet"
	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/provider"
)

// hostSync keeps the node's networking in step with the datastore: each
// secondary ENI's link, table and rule (through Host), the SNAT rules, and
// the pods' host routes and policy rules. All its calls into Host run on the
// worker goroutine; status and introspection read links and errors.
type hostSync struct {
	host    Host
	cfg     config.Config
	store   *datastore.Store
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu    sync.Mutex        // guards links and errs, never held across a Host call
	links map[string]string // ENI id → host link name
	errs  map[string]string // ENI id → last EnsureENI failure

	noRoute         map[api.Key]int // worker goroutine only: consecutive checks an assignment had no host route
	keptUnconfirmed int             // worker goroutine only: route-less assignments the witness could not confirm gone, last check

	imds *podIMDS // the pod-to-IMDS filter, shared with the API server

	witness netnsWitness
	wview   witnessView // the witness's view at the last check
}

// witnessView is the netns witness's view at the last check, written by
// the worker goroutine and read by status and introspection.
type witnessView struct {
	mu    sync.Mutex   // guards the fields below
	state WitnessState // the view at the last check
	known bool         // a check with a host view has run
}

// set records s and reports whether availability changed (or s is the
// first view).
func (v *witnessView) set(s WitnessState) (changed bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	changed = !v.known || v.state.Available != s.Available
	v.state, v.known = s, true
	return changed
}

// get returns the last view; ok is false before the first.
func (v *witnessView) get() (s WitnessState, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.state, v.known
}

var _ pool.ENIHost = (*hostSync)(nil)

// newHostSync wires a hostSync; netnsDirs are where the witness looks for
// sandboxes' netns (DefaultNetnsDirs when nil).
func newHostSync(host Host, cfg config.Config, store *datastore.Store, log *slog.Logger, m *Metrics, now func() time.Time, netnsDirs []string) *hostSync {
	if netnsDirs == nil {
		netnsDirs = DefaultNetnsDirs
	}
	return &hostSync{host: host, cfg: cfg, store: store, log: log, metrics: m, now: now,
		links: map[string]string{}, errs: map[string]string{}, noRoute: map[api.Key]int{},
		witness: netnsWitness{dirs: netnsDirs}}
}

// setWitness records the witness's view and exports it as a metric; a
// change is logged (the first view at start too).
func (h *hostSync) setWitness(s WitnessState) {
	changed := h.wview.set(s)
	h.metrics.witness(s.Available)
	switch {
	case changed && s.Available:
		h.log.Info("sandbox netns visible: an address whose pod went without a DEL is released after VPCIP_GC_GRACE", "dirs", s.Dirs)
	case changed:
		h.log.Error("sandbox netns not visible", "reason", s.Reason)
	}
}

// witnessState is the netns witness's view at the last check; ok is false
// before the first check, and always without a host view (NoHost).
func (h *hostSync) witnessState() (s WitnessState, ok bool) {
	return h.wview.get()
}

// hostENI is the one conversion of an ENI into what the host needs.
func hostENI(e provider.ENI, mtu int) hostnet.ENI {
	return hostnet.ENI{MAC: e.MAC, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP,
		SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway, MTU: mtu}
}

// cloudENI is the one conversion of a datastore ENI back into the cloud's
// form: its slots split into secondary addresses and prefixes.
func cloudENI(e datastore.ENI) provider.ENI {
	pe := provider.ENI{ID: e.ID, MAC: e.MAC, DeviceNumber: e.DeviceNumber, SubnetID: e.SubnetID,
		SubnetCIDR: e.SubnetCIDR, Gateway: e.Gateway, PrimaryIP: e.PrimaryIP, Attached: e.Attached}
	for _, s := range e.Slots {
		switch {
		case s.Addr().Is6():
			pe.IPv6Prefixes = append(pe.IPv6Prefixes, s)
		case s.Bits() == s.Addr().BitLen():
			pe.SecondaryIPs = append(pe.SecondaryIPs, s.Addr())
		default:
			pe.Prefixes = append(pe.Prefixes, s)
		}
	}
	return pe
}

// ENIAttached sets up a secondary ENI on the node; a failure is recorded
// (and shown in status) and retried at every reconciliation.
func (h *hostSync) ENIAttached(e provider.ENI) {
	if e.DeviceNumber == 0 || e.ID == "" {
		return
	}
	link, err := h.host.EnsureENI(hostENI(e, h.cfg.MTU))
	if err != nil {
		h.log.Error("host setup of ENI failed", "eni", e.ID, "mac", e.MAC, "err", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.errs[e.ID] = err.Error()
		return
	}
	delete(h.errs, e.ID)
	if link != "" {
		h.links[e.ID] = link
	}
}

// ENIDeleted removes the host setup of an ENI EC2 deleted.
func (h *hostSync) ENIDeleted(e datastore.ENI) {
	h.forget(e, "removing host setup of a deleted ENI failed")
}

// forget removes an ENI's host setup and what hostSync knows of it.
func (h *hostSync) forget(e datastore.ENI, failure string) {
	if err := h.host.RemoveENI(hostENI(cloudENI(e), h.cfg.MTU)); err != nil {
		h.log.Warn(failure, "eni", e.ID, "err", err)
	}
	h.mu.Lock()
	delete(h.links, e.ID)
	delete(h.errs, e.ID)
	h.mu.Unlock()
}

// linkNames is a copy of ENI id → host link name.
func (h *hostSync) linkNames() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.links)
}

// failures is a copy of ENI id → last host setup failure.
func (h *hostSync) failures() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.errs)
}

// ensureAll re-applies the host setup of every secondary ENI, the SNAT
// rules and the pod-to-IMDS filter, undoing drift (a flushed table, a changed rp_filter) and retrying
// failed setups. Every call is idempotent.
func (h *hostSync) ensureAll(self provider.Instance) {
	for _, e := range h.store.ENIs() {
		h.ENIAttached(cloudENI(e))
	}
	if err := h.ensureSNAT(self); err != nil {
		h.log.Error("re-applying SNAT rules failed", "err", err)
	}
	h.imds.syncLogged(true)
}

// ensureSNAT installs the node's SNAT rules (nothing with NoHost). In IPv6
// mode there are none (IPv6 pods have addresses of the VPC's /56, routable
// as they are; their IPv4 egress is the plugin's); it keeps router
// advertisements in effect on the primary ENI's link instead (accept_ra=2),
// which the pods' IPv6 forwarding would otherwise turn off.
func (h *hostSync) ensureSNAT(self provider.Instance) error {
	link, err := h.host.LinkName(self.PrimaryMAC)
	if err != nil {
		return err
	}
	if h.cfg.IPv6 {
		if err := h.host.EnsureAcceptRA(link); err != nil {
			return fmt.Errorf("accept_ra on %s: %w", link, err)
		}
		return nil
	}
	err = h.host.EnsureSNAT(hostnet.SNATConfig{VPCCIDRs: self.VPCCIDRs, ExcludeCIDRs: h.cfg.ExcludeSNAT,
		PrimaryIP: self.PrimaryIP, PrimaryLink: link, Ports: hostnet.SNATPorts(h.cfg.RandomizeSNAT), External: h.cfg.ExternalSNAT})
	if err != nil {
		return fmt.Errorf("SNAT rules: %w", err)
	}
	return nil
}

// checkPods makes assignments agree with the host's pod routes
// (datastore.Recovery.FromHost): a free address the host routes to a pod is held for
// the sandbox its veth records, or a placeholder (the checkpoint lost it);
// an address the checkpoint gave one attachment but the host routes to
// another sandbox is a conflict, held for that sandbox; an assignment older
// than VPCIP_GC_GRACE whose address has had no host route on two checks in a
// row is released when its pod is confirmed gone (see confirmGone). At start
// (first true) only the first part runs. Without a host view nothing
// happens.
func (h *hostSync) checkPods(first bool) {
	routes, err := h.host.PodRoutes()
	if errors.Is(err, ErrNoHostView) {
		return
	}
	if err != nil {
		h.log.Warn("host pod routes unreadable", "err", err)
		return
	}
	now := h.now()
	byAddr := make(map[netip.Addr]string, len(routes))
	host := make([]datastore.HostRoute, 0, len(routes))
	for _, r := range routes {
		byAddr[r.Address] = r.HostVeth
		host = append(host, datastore.HostRoute{Address: r.Address, HostVeth: r.HostVeth,
			Sandbox: api.Key{Network: r.Sandbox.Network, ContainerID: r.Sandbox.ContainerID, IfName: r.Sandbox.IfName}})
	}
	h.report(h.store.Recovery().FromHost(host, now))
	if first {
		assigned := h.store.Assignments()
		h.setWitness(h.witness.state(h.witness.seen(assigned, byAddr)))
		return
	}
	h.releaseRouteless(byAddr, now)
	h.removeStaleRules(byAddr)
}
