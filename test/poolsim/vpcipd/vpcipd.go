// Package vpcipd runs vpcipd's pool in the simulator: the datastore of
// package ipamd/datastore and the policy of package warmpool, driven by the
// plan-and-execute cycle of the daemon's pool loop, against the simulator's
// cloud on its virtual clock.
package vpcipd

import (
	"context"
	"errors"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/poolsim"
	"github.com/vpcip/vpcip/warmpool"
)

// Settings are the daemon's pool settings (its environment).
type Settings struct {
	Pool         warmpool.Config
	Cooldown     time.Duration                           // IP_COOLDOWN_PERIOD
	PoolInterval time.Duration                           // VPCIP_POOL_INTERVAL
	MaxPods      int                                     // VPCIP_MAX_PODS
	Log          func(now time.Time, plan warmpool.Plan) // each action planned, when set
}

// Pool is one node's vpcipd pool.
type Pool struct {
	prov  provider.Provider
	now   func() time.Time
	set   Settings
	store *datastore.Store

	limits      warmpool.Limits
	lastRelease time.Time
	lastGrow    time.Time
	history     warmpool.History
	seen        map[string]bool
}

var _ poolsim.Pool = (*Pool)(nil)

// New returns the pool of a daemon with settings s on prov, reading time
// from now.
func New(prov provider.Provider, now func() time.Time, s Settings) *Pool {
	if s.Cooldown == 0 {
		s.Cooldown = 30 * time.Second
	}
	if s.PoolInterval == 0 {
		s.PoolInterval = 10 * time.Second
	}
	st := datastore.New(s.Cooldown)
	st.SetMaxAssigned(s.MaxPods)
	return &Pool{prov: prov, now: now, set: s, store: st, seen: map[string]bool{}}
}

// Start reads the instance's limits and ENIs as the daemon does at start.
func (p *Pool) Start(ctx context.Context) error {
	self, err := p.prov.Self(ctx)
	if err != nil {
		return err
	}
	lim, err := p.prov.Limits(ctx, self.Type)
	if err != nil {
		return err
	}
	p.limits = warmpool.Limits{MaxENIs: lim.MaxENIs, SlotsPerENI: lim.PodAddressesPerENI(), MaxPods: p.set.MaxPods, PrefixSupported: lim.PrefixDelegation}
	enis, err := p.prov.ENIs(ctx)
	if err != nil {
		return err
	}
	p.store.Sync(enis, p.now())
	return nil
}

func key(pod string) api.Key { return api.Key{Network: "vpcip", ContainerID: pod, IfName: "eth0"} }

// Assign is the daemon's ADD: the datastore hands out an address. The
// first ADD of each pod is an arrival for the adaptive policy.
func (p *Pool) Assign(pod string, now time.Time) bool {
	if !p.seen[pod] {
		p.seen[pod] = true
		p.history = p.history.Record(now)
	}
	_, _, err := p.store.Assign(key(pod), api.Pod{Namespace: "default", Name: pod}, now)
	return err == nil
}

// Release is the daemon's DEL.
func (p *Pool) Release(pod string, now time.Time) {
	p.store.Release(key(pod), now)
	delete(p.seen, pod)
}

// maxSteps bounds the actions of one cycle, as in the daemon.
const maxSteps = 16

// Cycle is the daemon's pool cycle: plan, execute, until the plan is
// Nothing or Wait.
func (p *Pool) Cycle(ctx context.Context, demand func() poolsim.Demand) time.Duration {
	next := p.set.PoolInterval
	for range maxSteps {
		now := p.now()
		plan := warmpool.Next(p.input(now, demand()))
		if plan.Action == warmpool.Nothing || plan.Action == warmpool.Wait {
			if !plan.Until.IsZero() {
				next = min(next, max(plan.Until.Sub(now), 10*time.Millisecond))
			}
			return next
		}
		if p.set.Log != nil {
			p.set.Log(now, plan)
		}
		if err := p.execute(ctx, plan); err != nil {
			return time.Second
		}
	}
	return next
}

func (p *Pool) input(now time.Time, d poolsim.Demand) warmpool.Input {
	c := p.store.Counts(now)
	p.history = p.history.Observe(now, c.Assigned+c.Cooling)
	return warmpool.Input{
		ENIs: p.store.Snapshot(now), Limits: p.limits, Config: p.set.Pool,
		Pending: d.Pending, Demand: warmpool.Demand{Unaddressed: d.Unaddressed, History: p.history},
		Now: now, LastRelease: p.lastRelease, LastGrow: p.lastGrow,
	}
}

var errRaced = errors.New("raced")

func (p *Pool) execute(ctx context.Context, plan warmpool.Plan) error {
	switch plan.Action {
	case warmpool.Assign:
		got, err := p.prov.AssignAddresses(ctx, plan.ENI, plan.Count, plan.Prefixes)
		if err != nil {
			return err
		}
		p.store.AddSlots(plan.ENI, got)
		p.lastGrow = p.now()
	case warmpool.CreateENI:
		req := provider.CreateENIRequest{Addresses: plan.Count}
		if plan.Prefixes {
			req = provider.CreateENIRequest{Prefixes: plan.Count}
		}
		e, err := p.prov.CreateENI(ctx, req)
		if err != nil {
			return err
		}
		p.store.PutENI(e)
		p.lastGrow = p.now()
	case warmpool.Release:
		marked := p.store.MarkRelease(plan.ENI, plan.Release, p.now())
		if len(marked) == 0 {
			return errRaced
		}
		err := p.prov.UnassignAddresses(ctx, plan.ENI, marked)
		p.store.FinishRelease(plan.ENI, marked, err == nil)
		if err != nil {
			return err
		}
		p.lastRelease = p.now()
	case warmpool.DeleteENI:
		if !p.store.MarkDelete(plan.ENI) {
			return errRaced
		}
		err := p.prov.DeleteENI(ctx, plan.ENI)
		p.store.FinishDelete(plan.ENI, err == nil)
		if err != nil {
			return err
		}
		p.lastRelease = p.now()
	}
	return nil
}
