// Package vpcipd runs vpcipd's pool in the simulator: the daemon's pool
// component (package ipamd/pool: plan with warmpool, execute through the
// provider, record in the datastore) on the datastore of package
// ipamd/datastore, against the simulator's cloud on its virtual clock. What
// the daemon's other parts do around it is done here as they do it: the
// ADD path assigns from the datastore and reports each new request to the
// pool (Pool.Arrived), and counts waiting ADDs as the pool's pending demand.
package vpcipd

import (
	"context"
	"log/slog"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/ipamd/pool"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/poolsim"
	"github.com/vpcip/vpcip/warmpool"
)

// Settings are the daemon's pool settings (its environment).
type Settings struct {
	Pool         warmpool.Config
	Cooldown     time.Duration // IP_COOLDOWN_PERIOD
	PoolInterval time.Duration // VPCIP_POOL_INTERVAL
	MaxPods      int           // VPCIP_MAX_PODS
	// Log receives each action the pool executes, when set.
	Log func(now time.Time, action, reason string)
}

// Pool is one node's vpcipd pool: ipamd/pool's component and the datastore.
type Pool struct {
	prov  provider.Provider
	now   func() time.Time
	set   Settings
	store *datastore.Store
	node  *node
	pool  *pool.Pool

	demand func() poolsim.Demand // set by Cycle
	seen   map[string]bool
}

var _ poolsim.Pool = (*Pool)(nil)

// node is what the pool component reads of the instance.
type node struct{ limits warmpool.Limits }

func (n *node) Limits() warmpool.Limits { return n.limits }
func (n *node) SubnetID() string        { return "subnet-sim" }

// pending and unaddressed feed the simulated node's demand to the pool, as
// the ADD path (pool.Options.Pending) and the Kubernetes part
// (pool.Options.Demand) do in the daemon.
type pending struct{ p *Pool }
type unaddressed struct{ p *Pool }

func (d pending) Demand() int {
	if d.p.demand == nil {
		return 0
	}
	return d.p.demand().Pending
}

func (d unaddressed) Demand() int {
	if d.p.demand == nil {
		return 0
	}
	return d.p.demand().Unaddressed
}

// Live implements pool.LiveDemand: the node's pod watch is on
// (poolsim.Behaviour.Kube).
func (d unaddressed) Live() bool {
	return d.p.demand != nil && d.p.demand().Bindings
}

// actionLog hands the pool component's "pool action" log records (action
// and reason attributes) to Settings.Log.
type actionLog struct {
	now func() time.Time
	log func(now time.Time, action, reason string)
}

func (h actionLog) Enabled(context.Context, slog.Level) bool { return true }
func (h actionLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h actionLog) WithGroup(string) slog.Handler            { return h }
func (h actionLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "pool action" {
		return nil
	}
	var action, reason string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "action":
			action = a.Value.String()
		case "reason":
			reason = a.Value.String()
		}
		return true
	})
	h.log(h.now(), action, reason)
	return nil
}

// New returns the pool of a daemon with settings s on prov, reading time
// from now.
func New(prov provider.Provider, now func() time.Time, s Settings) (*Pool, error) {
	if s.Cooldown == 0 {
		s.Cooldown = 30 * time.Second
	}
	if s.PoolInterval == 0 {
		s.PoolInterval = 10 * time.Second
	}
	p := &Pool{prov: prov, now: now, set: s, store: datastore.New(s.Cooldown), node: &node{}, seen: map[string]bool{}}
	p.store.SetMaxAssigned(s.MaxPods)
	var logger *slog.Logger
	if s.Log != nil {
		logger = slog.New(actionLog{now: now, log: s.Log})
	}
	var err error
	p.pool, err = pool.New(pool.Options{
		Store: p.store, Provider: prov, Node: p.node, Config: s.Pool, Interval: s.PoolInterval,
		Clock: now, Pending: pending{p}, Demand: unaddressed{p}, Logger: logger,
	})
	return p, err
}

// Start reads the instance's limits and ENIs as the daemon's start-up
// reconciliation does.
func (p *Pool) Start(ctx context.Context) error {
	self, err := p.prov.Self(ctx)
	if err != nil {
		return err
	}
	lim, err := p.prov.Limits(ctx, self.Type)
	if err != nil {
		return err
	}
	p.node.limits = warmpool.Limits{MaxENIs: lim.MaxENIs, SlotsPerENI: lim.PodAddressesPerENI(), MaxPods: p.set.MaxPods, PrefixSupported: lim.PrefixDelegation}
	enis, err := p.prov.ENIs(ctx)
	if err != nil {
		return err
	}
	p.store.Cloud().Sync(enis, p.now())
	return nil
}

func key(pod string) api.Key { return api.Key{Network: "vpcip", ContainerID: pod, IfName: "eth0"} }

// Assign is the daemon's ADD: a pod's first request is reported to the
// pool, and the datastore hands out an address.
func (p *Pool) Assign(pod string, now time.Time) bool {
	if !p.seen[pod] {
		p.seen[pod] = true
		p.pool.Arrived(now)
	}
	_, _, err := p.store.Assign(key(pod), api.Pod{Namespace: "default", Name: pod}, now)
	return err == nil
}

// Release is the daemon's DEL.
func (p *Pool) Release(pod string, now time.Time) {
	p.store.Release(key(pod), now)
	delete(p.seen, pod)
}

// Cycle is one cycle of the daemon's pool component.
func (p *Pool) Cycle(ctx context.Context, demand func() poolsim.Demand) time.Duration {
	p.demand = demand
	return p.pool.Cycle(ctx)
}
