package ipamd

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"

	"github.com/vpcip/vpcip/cni/datapath"
	"github.com/vpcip/vpcip/ipamd/config"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/hostnet"
)

// podIMDS keeps the node's pod-to-IMDS filter (hostnet.ChainIMDS) in step
// with the datastore: with VPCIP_IMDS_POD_ACCESS=blocked, every pod is
// rejected except the addresses held by pods of VPCIP_IMDS_ALLOW_NAMESPACES;
// with "all" the filter is removed. Assign calls sync before answering, so
// an allowed pod's rule exists before its sandbox runs anything; Release and
// GC call it after the address is freed, so the rule is gone before the
// address cools down and goes to another pod. The reconcile loop forces a
// full convergence, undoing drift and retrying failures.
type podIMDS struct {
	host  Host
	cfg   config.Config
	store *datastore.Store
	log   *slog.Logger
	allow map[string]bool // namespaces allowed

	mu      sync.Mutex             // guards applied; held across Host calls so two syncs never interleave
	applied map[netip.Addr]imdsPod // the allowed addresses the chain holds; nil: unknown (never applied, or the last apply failed)
}

func newPodIMDS(host Host, cfg config.Config, store *datastore.Store, log *slog.Logger) *podIMDS {
	g := &podIMDS{host: host, cfg: cfg, store: store, log: log, allow: map[string]bool{}}
	for _, ns := range cfg.IMDSAllowNamespaces {
		g.allow[ns] = true
	}
	return g
}

// imdsPod is an allowed pod: "namespace/name" and, in IPv6 mode, its host
// veth (hostnet.IMDSAllowed.Veth).
type imdsPod struct{ name, veth string }

// wanted is the allowed address set the datastore asks for now: address →
// its pod.
func (g *podIMDS) wanted() map[netip.Addr]imdsPod {
	out := map[netip.Addr]imdsPod{}
	if len(g.allow) == 0 {
		return out
	}
	for _, a := range g.store.Assignments() {
		if g.allow[a.Pod.Namespace] {
			p := imdsPod{name: a.Pod.Namespace + "/" + a.Pod.Name}
			if g.cfg.IPv6 {
				p.veth = a.HostVeth
				if p.veth == "" {
					p.veth = datapath.AttachmentVethName(g.cfg.VethPrefix, a.Pod.Namespace, a.Pod.Name, a.Key.ContainerID, a.Key.Network, a.Key.IfName)
				}
			}
			out[a.Address] = p
		}
	}
	return out
}

// sync applies the wanted set when it differs from what the chain holds
// (force: always, re-converging the chain). With VPCIP_IMDS_POD_ACCESS=all
// only a forced sync touches the host, removing the filter.
func (g *podIMDS) sync(force bool) error {
	if g == nil { // parts wired by hand in tests
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cfg.IMDSPodAccess == config.IMDSAll {
		if !force {
			return nil
		}
		if err := g.host.RemoveIMDSBlock(); err != nil {
			return fmt.Errorf("removing the pod IMDS filter: %w", err)
		}
		return nil
	}
	want := g.wanted()
	if !force && g.applied != nil && maps.Equal(want, g.applied) {
		return nil
	}
	c := hostnet.IMDSConfig{VethPrefix: g.cfg.VethPrefix, IPv6: g.cfg.IPv6}
	for a, pod := range want {
		c.Allowed = append(c.Allowed, hostnet.IMDSAllowed{Addr: a, Pod: pod.name, Veth: pod.veth})
	}
	if err := g.host.EnsureIMDSBlock(c); err != nil {
		g.applied = nil
		return fmt.Errorf("pod IMDS filter: %w", err)
	}
	if !maps.Equal(want, g.applied) {
		g.log.Info("pod IMDS filter applied", "allowedPods", len(want))
	}
	g.applied = want
	return nil
}

// syncLogged is sync for callers that go on after a failure (the next
// forced sync retries): a failure leaves pods blocked, never allowed, except
// an allow rule whose removal failed (its address cools down first).
func (g *podIMDS) syncLogged(force bool) {
	if g == nil { // parts wired by hand in tests
		return
	}
	if err := g.sync(force); err != nil {
		g.log.Error("pod IMDS filter not applied", "err", err)
	}
}
