// Package pool is vpcipd's warm-pool component: it plans with package
// warmpool and executes the plan through the provider, one action at a time,
// recording each result in the datastore. It owns what the pool remembers
// between cycles: the cloud's active refusals and their backoff strikes, and
// when it last released (release pacing).
//
// Goroutine: Cycle runs on the daemon's worker goroutine, the only one that
// calls the cloud. Other goroutines read Refusals (status, ADD answers);
// Pool.mu guards the remembered fields and is never held across a cloud,
// datastore or host call.
//
// Driving it without the daemon (a trace simulator, issue-style
// experiments): build a datastore.Store, a provider.Provider (an in-memory
// cloud), a Node with the instance's limits and a Clock reading virtual
// time; call New, then call Cycle whenever the daemon would (at start, after
// each ADD or DEL that kicks it, and when the delay Cycle returned has
// passed on the virtual clock). Cycle runs one full plan-and-execute pass
// synchronously, reading Clock before each step, so a provider that
// advances the virtual clock during a call sees time pass as EC2's latency
// would. Pending and Demand report pods waiting for an address; nil means
// none.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vpcip/vpcip/ipamd/datastore"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// maxSteps bounds the actions of one pool cycle. Warm-up from an empty node
// takes one Assign on the primary ENI and one CreateENI per further ENI.
const maxSteps = 16

// errRaced: the datastore changed between the plan and its execution (a pod
// took an address chosen for release); the next cycle plans again.
var errRaced = errors.New("pool changed while executing the plan")

// Node is what the pool reads of the node: the instance's limits (zero until
// the instance is known) and its subnet, for messages.
type Node interface {
	Limits() warmpool.Limits
	SubnetID() string
}

// Demand counts pods that want an address and have none: ADDs waiting in
// the daemon (Options.Pending), or pods bound to the node without an
// address as the Kubernetes API shows them (Options.Demand).
type Demand interface {
	Demand() int
}

// LiveDemand is a Demand that tells whether it sees pods at their binding
// now (the Kubernetes part, synced): warmpool.Demand.Bindings. A Demand
// without Live is taken as not live.
type LiveDemand interface {
	Demand
	Live() bool
}

// ENIHost sets up and removes an ENI on the node. ENIAttached is called with
// a new ENI before the datastore has it, so no pod is wired to an ENI without
// its route table; ENIDeleted after EC2 deleted one.
type ENIHost interface {
	ENIAttached(e provider.ENI)
	ENIDeleted(e datastore.ENI)
}

// Options are the pool's dependencies. Store, Provider and Node are required.
type Options struct {
	Store    *datastore.Store
	Provider provider.Provider
	Node     Node
	Config   warmpool.Config
	Interval time.Duration    // VPCIP_POOL_INTERVAL: the longest wait Cycle returns; 0: 10 s
	Clock    func() time.Time // nil: time.Now
	Logger   *slog.Logger     // nil: discard
	Pending  Demand           // ADDs waiting for an address; nil: none
	// PrimaryHoldsNoPods leaves the primary ENI out of every plan: it gets
	// no address and Node.Limits counts only the other ENIs (custom
	// networking, AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG).
	PrimaryHoldsNoPods bool
	Demand             Demand  // pods bound to the node without an address (Kubernetes); nil: none
	Host               ENIHost // nil: nothing is set up on the host
	// Resync re-reads the ENIs from EC2 and applies them, when a cloud
	// answer says the pool's view is stale; nil: none.
	Resync func(context.Context) error
	// Persist writes the checkpoint after each action; nil: none.
	Persist func() error
	// Observe counts each executed action by outcome ("ok", "error",
	// "deferred" for growth whose place in the fleet's EC2 budget is held,
	// provider.DeferredError, and "held" for a /28 request not sent
	// because the subnet view shows no whole /28 since EC2 refused one);
	// nil: none.
	Observe func(action, outcome string)
	// Stopping reports that shutdown began: no new cloud changes; nil: never.
	Stopping func() bool
	// SubnetView is the least time between two reads of what a subnet's
	// ENIs hold (Provider.SubnetUsage: EC2 DescribeNetworkInterfaces
	// filtered by subnet-id, one call per page of 1,000 ENIs), which the
	// /28-aware choice of single addresses uses (see PickRelease,
	// PickAssign). It is read only when single addresses are about to be
	// assigned or released and the last read is older. 0:
	// DefaultSubnetView; negative: never read (the choice then packs the
	// node's own addresses only).
	SubnetView time.Duration
	// AddressOrder turns the /28-aware choice off: single addresses are
	// released in address order and EC2 chooses those assigned.
	AddressOrder bool
}

// DefaultSubnetView is Options.SubnetView's default: at most one
// DescribeNetworkInterfaces (per page) per node every 10 minutes, none in
// the first 5 to 15 minutes after the start, so 5,000 nodes that all assign
// or release single addresses make at most 8.3 calls a second, 42 % of the
// 20 a second EC2 refills for filtered describes.
const DefaultSubnetView = 10 * time.Minute

// Pool is the warm-pool component. Use New.
type Pool struct {
	o Options

	mu       sync.Mutex // guards the fields below
	refusals []warmpool.Refusal
	// strikes are consecutive refusals, for backoff; 0: unclassified
	// growth failures, shrinkFailures: unclassified release or deletion
	// failures (counted apart: a node whose releases keep failing must
	// not have its next growth failure held at the backoff's cap).
	strikes      map[warmpool.RefusalKind]int
	lastRelease  time.Time
	lastGrow     time.Time              // release pacing after growth (warmpool.Input.LastGrow)
	history      warmpool.History       // arrivals and levels, for the adaptive policy
	views        map[string]*subnetView // by subnet ID (Cycle's goroutine only)
	namedRefused int                    // named assignments EC2 refused (Cycle's goroutine only)
	prefix       prefixRefusals         // (Cycle's goroutine only)
	started      time.Time              // when New ran, on Options.Clock
	deferred     []deferred             // growth whose place in the fleet's budget is held (Cycle's goroutine only)
	hold         holds                  // (Cycle's goroutine only)
	// failure is the latest growth error that is no refusal and when its
	// backoff ends; zero once a growth succeeded (guarded by mu).
	failure Failure
}

// New returns a pool; it does no I/O.
func New(o Options) (*Pool, error) {
	if o.Store == nil || o.Provider == nil || o.Node == nil {
		return nil, errors.New("pool: Options.Store, Provider and Node are required")
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Observe == nil {
		o.Observe = func(string, string) {}
	}
	if o.Stopping == nil {
		o.Stopping = func() bool { return false }
	}
	if o.SubnetView == 0 {
		o.SubnetView = DefaultSubnetView
	}
	pl := &Pool{o: o, strikes: map[warmpool.RefusalKind]int{}, history: warmpool.NewHistory(o.Config), views: map[string]*subnetView{}, started: o.Clock()}
	if o.Config.Adaptive {
		// The adaptive policy judges surplus by the demand it remembers,
		// and a start remembers none: the addresses the node holds were
		// grown by the previous run. The start counts as their growth, so
		// they are kept warmpool.ReleaseDelay and judged idle no longer
		// than since the start (a restarted daemon released its primary
		// ENI's addresses within a second, then assigned them again).
		pl.lastGrow = o.Clock()
	}
	return pl, nil
}

// Cycle plans and executes pool actions until the pool is at target, a
// refusal says wait, or maxSteps; it returns how long until the next cycle
// is due (at most Options.Interval).
func (p *Pool) Cycle(ctx context.Context) time.Duration {
	next := p.o.Interval
	var due []deferred // creates fallen due this cycle and not yet made again
	for range maxSteps {
		if ctx.Err() != nil || p.o.Stopping() {
			return next
		}
		now := p.o.Clock()
		in, until, dropped := p.withDeferred(p.Input(now), now)
		for _, d := range dropped {
			if d.plan.Action == warmpool.CreateENI {
				due = append(due, d)
			}
		}
		if !until.IsZero() {
			next = min(next, max(until.Sub(now), 10*time.Millisecond))
		}
		plan := warmpool.Next(in)
		if plan.Wanted > 0 {
			p.mu.Lock()
			p.history = p.history.Want(now, plan.Wanted)
			p.mu.Unlock()
		}
		if plan.Action == warmpool.Nothing || plan.Action == warmpool.Wait {
			if !plan.Until.IsZero() {
				next = min(next, max(plan.Until.Sub(now), 10*time.Millisecond))
			}
			return next
		}
		if !until.IsZero() && !p.plannable(plan) {
			// Growth still waits for its turn in the fleet's budget: no
			// release (it may be of the addresses to come) and nothing on an
			// ENI not yet made until it is made.
			if plan.Action != warmpool.Assign || len(due) == 0 {
				return next
			}
			// An assign on a later create's placeholder ENI (one with room,
			// the last of a growth) while a create is due: the growth waits
			// for a new ENI, and that create's turn has come. Re-planned, it
			// would wait for the later one's.
			plan = due[0].plan
		}
		if plan.Action == warmpool.CreateENI && len(due) > 0 {
			due = due[1:]
		}
		if (plan.Action == warmpool.Release || plan.Action == warmpool.DeleteENI) && now.Before(p.hold.shrink) {
			// warmpool's refusals hold growth only: a shrink refused
			// or throttled waits here until its backoff ends.
			return min(next, max(p.hold.shrink.Sub(now), 10*time.Millisecond))
		}
		if (plan.Action == warmpool.Assign || plan.Action == warmpool.CreateENI) && now.Before(p.hold.grow) {
			// A growth that failed with no refusal warmpool plans
			// around would be planned again as it was: it waits out
			// its backoff, whatever ADDs wait (B08).
			return min(next, max(p.hold.grow.Sub(now), 10*time.Millisecond))
		}
		p.o.Logger.Info("pool action", "action", plan.Action.String(), "eni", plan.ENI, "count", plan.Count,
			"prefixes", plan.Prefixes, "release", plan.Release, "reason", plan.Reason)
		ctx := provider.WithPriority(ctx, planPriority(in, plan))
		if plan.Action == warmpool.Assign || plan.Action == warmpool.CreateENI {
			ctx = provider.WithDeferral(ctx)
		}
		if p.noWholePrefix(ctx, plan) {
			// EC2 refused a /28 and the subnet's view still shows none
			// whole: the answer would be the same refusal. Counted as one.
			p.prefix.held++
			p.o.Observe(plan.Action.String(), "held")
			p.o.Logger.Info("pool action not sent: EC2 refused a /28 and the subnet view shows no whole /28 since", "action", plan.Action.String(), "eni", plan.ENI,
				"refusedAt", p.prefix.at)
			p.refuse(fmt.Errorf("%w: the subnet view shows no whole /28", provider.ErrInsufficientCIDR), plan, now)
			continue
		}
		err := p.execute(ctx, plan)
		if err == nil && plan.Prefixes {
			p.prefix.at = time.Time{}
		}
		if errors.Is(err, provider.ErrInsufficientCIDR) {
			p.prefix.sent++
		}
		var d *provider.DeferredError
		if errors.As(err, &d) {
			// Its place in the fleet's queue is held: plan the next growth
			// with this one counted as made, and make it when due.
			p.o.Logger.Info("pool action waits for its turn in the fleet's EC2 budget", "action", plan.Action.String(), "until", d.Until)
			p.deferred = append(p.deferred, deferred{plan: plan, until: d.Until})
			p.o.Observe(plan.Action.String(), "deferred")
			next = min(next, max(d.Until.Sub(now), 10*time.Millisecond))
			continue
		}
		p.persist()
		if err == nil {
			p.o.Observe(plan.Action.String(), "ok")
			continue
		}
		if errors.Is(err, errRaced) {
			return 100 * time.Millisecond
		}
		var short *provider.BudgetShortError
		if errors.As(err, &short) {
			// The fleet's shared EC2 budget has no room at this priority:
			// nothing was sent. Look again when it should have, or sooner
			// when a pod arrives (its growth then goes first).
			p.o.Logger.Debug("pool action waits for the fleet's EC2 budget", "action", plan.Action.String(), "err", err)
			return min(next, max(short.Wait, 100*time.Millisecond))
		}
		p.o.Observe(plan.Action.String(), "error")
		if ctx.Err() != nil {
			return next
		}
		if errors.Is(err, provider.ErrNotFound) || errors.Is(err, provider.ErrAddressLimit) {
			// Our view of the ENIs is stale: confirm with EC2 now.
			if rerr := p.resync(ctx); rerr != nil {
				p.o.Logger.Warn("EC2 re-read after a stale-view error failed", "err", rerr)
			}
		}
		wait, ok := p.refuse(err, plan, now)
		if !ok {
			p.o.Logger.Warn("pool action failed", "action", plan.Action.String(), "eni", plan.ENI, "err", err, "retryIn", wait.String())
			if errors.Is(err, provider.ErrNotFound) {
				// A stale view, re-read above: the next plan is made on
				// EC2's answer (an ENI missing twice is forgotten).
				return wait
			}
			if plan.Action == warmpool.Release || plan.Action == warmpool.DeleteENI {
				p.hold.shrink = now.Add(wait)
				return wait
			}
			p.hold.grow = now.Add(wait)
			p.mu.Lock()
			p.failure = Failure{Action: plan.Action.String(), Err: err, Until: now.Add(wait)}
			p.mu.Unlock()
			return wait
		}
		if errors.Is(err, provider.ErrThrottled) || plan.Action == warmpool.Release || plan.Action == warmpool.DeleteENI {
			// Throttled, the next call would add to the account's bucket;
			// a refused shrink would be planned again as it was (refusals
			// change growth only). Either ends the cycle, and shrinks wait
			// out the backoff; other growth refusals change the next plan
			// (a smaller request, single addresses), which goes at once.
			p.hold.shrink = now.Add(wait)
			return min(next, max(wait, 10*time.Millisecond))
		}
	}
	return next
}

// Arrived records an address request (a CNI ADD for a key holding no
// address) at now: the adaptive policy sizes the pool by the recent
// arrival rate and bursts. Safe from any goroutine; it appends a time.
func (p *Pool) Arrived(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.history = p.history.Record(now)
}

// Input is warmpool's view of the node at now.
func (p *Pool) Input(now time.Time) warmpool.Input {
	enis := p.o.Store.Snapshot(now)
	if p.o.PrimaryHoldsNoPods {
		enis = slices.DeleteFunc(enis, func(e warmpool.ENI) bool { return e.Primary })
	}
	inUse := 0
	for _, e := range enis {
		for _, sl := range e.Slots {
			inUse += sl.Assigned + sl.Cooling
		}
	}
	in := warmpool.Input{
		ENIs:   enis,
		Limits: p.o.Node.Limits(),
		Config: p.o.Config,
		Now:    now,
	}
	if p.o.Pending != nil {
		in.Pending = p.o.Pending.Demand()
	}
	if p.o.Demand != nil {
		in.Demand.Unaddressed = p.o.Demand.Demand()
		if l, ok := p.o.Demand.(LiveDemand); ok {
			in.Demand.Bindings = l.Live()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	in.LastRelease, in.LastGrow = p.lastRelease, p.lastGrow
	p.history = p.history.Observe(now, inUse)
	in.Demand.History = p.history.Snapshot()
	in.Refusals = slices.Clone(p.refusals)
	return in
}

func (p *Pool) persist() {
	if p.o.Persist == nil {
		return
	}
	if err := p.o.Persist(); err != nil {
		p.o.Logger.Error("checkpoint write after pool action failed", "err", err)
	}
}

func (p *Pool) resync(ctx context.Context) error {
	if p.o.Resync == nil {
		return nil
	}
	return p.o.Resync(ctx)
}

func (p *Pool) execute(ctx context.Context, plan warmpool.Plan) error {
	switch plan.Action {
	case warmpool.Assign:
		got, err := p.assign(ctx, plan)
		if errors.Is(err, provider.ErrNotVisible) {
			// Made, but metadata lags: hand out only what EC2 confirms.
			p.o.Logger.Warn("assigned addresses not yet in instance metadata: confirming with EC2", "eni", plan.ENI, "err", err)
			return p.resync(ctx)
		}
		if err != nil {
			return err
		}
		p.o.Store.Cloud().AddSlots(plan.ENI, got)
		p.noteHeld(plan.ENI, got, true)
		p.grew()
		return nil
	case warmpool.CreateENI:
		return p.createENI(ctx, plan)
	case warmpool.Release:
		return p.releaseSlots(ctx, plan)
	case warmpool.DeleteENI:
		return p.deleteENI(ctx, plan.ENI)
	}
	return nil
}

func (p *Pool) createENI(ctx context.Context, plan warmpool.Plan) error {
	req := provider.CreateENIRequest{Addresses: plan.Count}
	if plan.Prefixes {
		req = provider.CreateENIRequest{Prefixes: plan.Count}
	}
	e, err := p.o.Provider.CreateENI(ctx, req)
	if errors.Is(err, provider.ErrNotVisible) {
		p.o.Logger.Warn("new ENI not yet in instance metadata: confirming with EC2", "eni", e.ID, "err", err)
		p.attached(e)
		return p.resync(ctx)
	}
	if errors.Is(err, provider.ErrENILimit) {
		// The plan saw room for an ENI, EC2 counts none: an ENI attached by
		// an earlier call whose end was lost (its metadata unreadable, the
		// daemon stopped mid-call). Learn it from EC2 (one describe) so the
		// next plan uses it instead of making another ENI only to have its
		// attach refused and the ENI deleted.
		p.o.Logger.Warn("EC2 refused an ENI the plan had room for: confirming with EC2", "enis", len(p.o.Store.ENIs()), "err", err)
		if rerr := p.resync(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	if err != nil {
		return err
	}
	p.attached(e) // before the datastore has it: no pod is wired to an ENI without its table
	p.o.Store.Cloud().PutENI(e)
	p.grew()
	p.o.Logger.Info("ENI attached", "eni", e.ID, "device", e.DeviceNumber, "addresses", len(e.SecondaryIPs), "prefixes", len(e.Prefixes))
	return nil
}

func (p *Pool) attached(e provider.ENI) {
	if p.o.Host != nil {
		p.o.Host.ENIAttached(e)
	}
}

// releaseSlots unassigns free slots. They are marked under the datastore
// lock first, so no ADD can take them while EC2 works (B23).
//
// A failed unassign may still have been applied: EC2 made the change and
// its answer was lost, and the provider's retry then read "not assigned to
// interface". So the slots stay marked, never handed out, until EC2's own
// listing (Options.Resync) has shown which are still on the ENI: those are
// assignable again, the others are forgotten with it. Without that listing
// they are all forgotten (surplus given back, as far as the node knows; the
// next resync adopts what EC2 still shows): handing out an address EC2 has
// taken back would give it to a pod while EC2 gives it to another instance.
func (p *Pool) releaseSlots(ctx context.Context, plan warmpool.Plan) error {
	plan.Release = p.chooseRelease(ctx, plan)
	marked := p.o.Store.Cloud().MarkRelease(plan.ENI, plan.Release, p.o.Clock())
	if len(marked) == 0 {
		return errRaced
	}
	err := p.o.Provider.UnassignAddresses(ctx, plan.ENI, marked)
	if err != nil {
		if rerr := p.resync(ctx); rerr != nil || p.o.Resync == nil {
			p.o.Logger.Warn("release failed and EC2 could not confirm what the ENI still holds: its marked slots are forgotten until the next resync",
				"eni", plan.ENI, "slots", len(marked), "err", err, "resyncErr", rerr)
			p.o.Store.Cloud().FinishRelease(plan.ENI, marked, true)
			return err
		}
		p.o.Store.Cloud().FinishRelease(plan.ENI, marked, false)
		return err
	}
	p.o.Store.Cloud().FinishRelease(plan.ENI, marked, true)
	p.noteHeld(plan.ENI, marked, false)
	p.released()
	return nil
}

// deleteENI detaches and deletes a secondary ENI that holds no assignment.
func (p *Pool) deleteENI(ctx context.Context, id string) error {
	if !p.o.Store.Cloud().MarkDelete(id) {
		return errRaced
	}
	var eni datastore.ENI
	for _, e := range p.o.Store.ENIs() {
		if e.ID == id {
			eni = e
		}
	}
	if err := p.o.Provider.DeleteENI(ctx, id); err != nil {
		p.o.Store.Cloud().FinishDelete(id, false)
		return err
	}
	if p.o.Host != nil {
		p.o.Host.ENIDeleted(eni)
	}
	p.o.Store.Cloud().FinishDelete(id, true)
	p.released()
	p.o.Logger.Info("ENI deleted", "eni", id)
	return nil
}

func (p *Pool) released() {
	p.mu.Lock()
	p.lastRelease = p.o.Clock()
	delete(p.strikes, shrinkFailures)
	p.mu.Unlock()
}
