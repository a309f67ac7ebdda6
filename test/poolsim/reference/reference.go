// Package reference is a baseline for side-by-side comparisons, not
// production code: the warm-pool algorithm of the reference plugin (AWS VPC
// CNI v1.23 ipamd), written from its documented behaviour
// (docs/eni-and-ip-target.md and docs/prefix-and-ip-target.md of
// amazon-vpc-cni-k8s, issues #420, #1700, #2896, #2749), with its own
// datastore, driving a provider.Provider.
//
// Its rules, as documented, and deliberately unlike vpcipd's:
//   - one reconcile cycle every 5 s; per cycle at most one grow action (one
//     assign call on the first allocatable ENI in random order, or one new
//     ENI created with its addresses) and at most one ENI freed; addresses
//     or prefixes are released at most once per 30 s;
//   - available = total − assigned: addresses in cooldown count as
//     available (so a pool of cooling addresses does not grow);
//   - with only WARM_ENI_TARGET, single addresses are never released;
//   - an ENI younger than 60 s, or holding a cooling or assigned address, is
//     not freed;
//   - an ADD that finds no address out of cooldown fails at once.
package reference

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/poolsim"
)

var _ poolsim.Pool = (*Pool)(nil)

// Timing constants of the reference ipamd.
const (
	Interval         = 5 * time.Second  // ipPoolMonitorInterval
	DecreaseInterval = 30 * time.Second // decreaseIPPoolInterval
	MinENILifetime   = time.Minute      // minENILifeTime
	prefixSize       = 16
)

// Config is the reference's warm-pool configuration; a zero target is unset.
type Config struct {
	WarmENITarget    int           // WARM_ENI_TARGET (the manifest's default is 1)
	WarmIPTarget     int           // WARM_IP_TARGET
	MinimumIPTarget  int           // MINIMUM_IP_TARGET
	WarmPrefixTarget int           // WARM_PREFIX_TARGET (the manifest's default is 1)
	PrefixDelegation bool          // ENABLE_PREFIX_DELEGATION
	Cooldown         time.Duration // IP_COOLDOWN_PERIOD (30 s)
	MaxPods          int           // kubelet max pods: no growth once the node holds this many addresses
}

type ip struct {
	addr     netip.Addr
	pod      string    // "" when not assigned
	released time.Time // last release; cooling until released + Cooldown
}

type cidr struct {
	prefix netip.Prefix
	ips    []*ip
}

type eni struct {
	id      string
	primary bool
	created time.Time
	cidrs   []*cidr
}

// Pool is one node's reference ipamd: datastore and pool manager.
type Pool struct {
	prov provider.Provider
	now  func() time.Time
	cfg  Config
	rng  *rand.Rand

	maxENIs      int
	maxSlots     int // maxIPsPerENI in secondary-IP mode, maxPrefixesPerENI in PD
	enis         []*eni
	byPod        map[string]*ip
	lastDecrease time.Time
}

// New returns a reference pool on prov; now is the clock, seed orders its
// random ENI choice.
func New(prov provider.Provider, now func() time.Time, cfg Config, seed uint64) *Pool {
	if cfg.Cooldown == 0 {
		cfg.Cooldown = 30 * time.Second
	}
	return &Pool{prov: prov, now: now, cfg: cfg, rng: rand.New(rand.NewPCG(seed, 11)), byPod: map[string]*ip{}}
}

// Start reads the instance's limits and ENIs (nodeInit).
func (p *Pool) Start(ctx context.Context) error {
	self, err := p.prov.Self(ctx)
	if err != nil {
		return err
	}
	lim, err := p.prov.Limits(ctx, self.Type)
	if err != nil {
		return err
	}
	p.maxENIs, p.maxSlots = lim.MaxENIs, lim.PodAddressesPerENI()
	enis, err := p.prov.ENIs(ctx)
	if err != nil {
		return err
	}
	for _, e := range enis {
		de := &eni{id: e.ID, primary: e.DeviceNumber == 0, created: e.Attached}
		p.enis = append(p.enis, de)
		p.addCIDRs(de, cloudCIDRs(e))
	}
	return nil
}

func cloudCIDRs(e provider.ENI) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range e.SecondaryIPs {
		out = append(out, netip.PrefixFrom(a, 32))
	}
	return append(out, e.Prefixes...)
}

func (p *Pool) addCIDRs(e *eni, ps []netip.Prefix) {
	for _, pf := range ps {
		c := &cidr{prefix: pf}
		for a := pf.Masked().Addr(); pf.Contains(a); a = a.Next() {
			c.ips = append(c.ips, &ip{addr: a})
		}
		e.cidrs = append(e.cidrs, c)
	}
}

func (p *Pool) cooling(x *ip, now time.Time) bool {
	return x.pod == "" && !x.released.IsZero() && now.Sub(x.released) < p.cfg.Cooldown
}

// Assign gives pod an address that is neither assigned nor cooling, primary
// ENI first; false when there is none.
func (p *Pool) Assign(pod string, now time.Time) bool {
	if _, ok := p.byPod[pod]; ok {
		return true
	}
	for _, e := range p.enis {
		for _, c := range e.cidrs {
			for _, x := range c.ips {
				if x.pod == "" && !p.cooling(x, now) {
					x.pod = pod
					p.byPod[pod] = x
					return true
				}
			}
		}
	}
	return false
}

// Release frees pod's address; it cools down from now.
func (p *Pool) Release(pod string, now time.Time) {
	x, ok := p.byPod[pod]
	if !ok {
		return
	}
	delete(p.byPod, pod)
	x.pod, x.released = "", now
}

// Cycle is one updateIPPoolIfRequired: grow if too low, else shrink if too
// high, then free at most one ENI. The next cycle is Interval later.
// The demand is ignored: the reference knows only its datastore.
func (p *Pool) Cycle(ctx context.Context, _ func() poolsim.Demand) time.Duration {
	switch {
	case p.tooLow():
		p.increase(ctx)
	case p.tooHigh():
		p.decrease(ctx)
	}
	if p.shouldRemoveExtraENIs() {
		p.tryFreeENI(ctx)
	}
	return Interval
}
