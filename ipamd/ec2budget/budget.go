package ec2budget

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/provider"
)

// Annotation is the Lease annotation that holds a bucket's State.
const Annotation = "vpcip.io/ec2-bucket"

// LeaseName is the Lease that holds action's bucket: "vpcip-ec2-" and the
// action in lower case.
func LeaseName(action string) string { return "vpcip-ec2-" + strings.ToLower(action) }

// ShardLeaseName is the Lease of shard k of shards of action's bucket:
// LeaseName(action) and "-k"; LeaseName(action) alone when shards is 1.
func ShardLeaseName(action string, k, shards int) string {
	if shards <= 1 {
		return LeaseName(action)
	}
	return LeaseName(action) + "-" + strconv.Itoa(k)
}

// DefaultShards is how many Leases share each action's bucket by default.
// Every take of a request is a read and a conditional write of one Lease,
// so one Lease serves about one take per two API round trips whatever the
// fleet's size, and the rest conflict and try again. In a launch of 200
// nodes on one Lease per action, each take cost 20 Lease requests and the
// fleet took 5.8 requests a second where it needed 17 (test/fleet); eight
// shards hold about 25 launching nodes each at 200.
const DefaultShards = 8

// LeaseTimeout bounds each Lease read and write; past it the API server
// counts as unreachable (the daemon calls EC2 under its own limits for
// Options.Degraded). Measured at 200 nodes on a loaded API server
// (test/fleet, scenario a): at 3 s a third of the fleet's EC2 requests
// were refused, as the nodes that timed out called EC2 alone; at 10 s none
// were.
const LeaseTimeout = 10 * time.Second

// Options configure a Budget.
type Options struct {
	Client    kubernetes.Interface // required
	Namespace string               // where the Leases live; default kube-system
	NodeName  string               // written as the Lease's holder, for people reading it
	// Share is the fraction of each account bucket (capacity and refill)
	// the fleet takes, leaving the rest to the account's other callers;
	// default 0.8.
	Share float64
	// Limits are the account's buckets by EC2 action; default AWSLimits.
	// An action not listed is not shared.
	Limits map[string]Limit
	// Degraded is how long after an API server failure (an error or a
	// LeaseTimeout) the daemon calls EC2 under its own limits alone before
	// trying the API server again; default 30 s.
	Degraded time.Duration
	// Shards is how many Leases split each action's bucket (each holds
	// 1/Shards of its capacity and refill, so together they never exceed
	// it); every daemon of the fleet must use the same count. A node takes
	// from its home shard (a hash of NodeName) and, when that one would make
	// it wait or refuse, from a second shard picked at random if that one
	// serves it sooner. Default DefaultShards; fewer when the smallest
	// share of a bucket holds fewer requests (each shard holds at least one).
	Shards int
	Logger *slog.Logger     // default: discard
	Now    func() time.Time // default time.Now
}

// Budget is a provider.RequestBudget kept in the API server. It is safe for
// concurrent use.
type Budget struct {
	o      Options
	limits map[string]Limit // shared figures (Share applied)

	home int        // this node's shard, in [0, Shards)
	mu   sync.Mutex // guards degradedUntil and seen
	// degradedUntil is, by action, until when this daemon calls EC2 without
	// the shared budget after an API server failure on that action's Lease:
	// a Lease request that timed out says the API server is slow, not that
	// every other action's Lease is out of reach too.
	degradedUntil map[string]time.Time
	// failingSince is, by action never seen, when its Lease requests began
	// to fail (cleared by a success).
	failingSince map[string]time.Time
	// seen is each action's bucket as this daemon last read or wrote it,
	// then taken from locally while the API server is out of reach.
	seen map[string]State
}

var _ provider.RequestBudget = (*Budget)(nil)

// New returns a Budget; it does no I/O.
func New(o Options) (*Budget, error) {
	if o.Client == nil {
		return nil, errors.New("ec2budget: Options.Client is required")
	}
	if o.Namespace == "" {
		o.Namespace = "kube-system"
	}
	if o.Share == 0 {
		o.Share = 0.8
	}
	if o.Share < 0 || o.Share > 1 {
		return nil, fmt.Errorf("ec2budget: share %v outside (0, 1]", o.Share)
	}
	if o.Limits == nil {
		o.Limits = AWSLimits()
	}
	if o.Degraded <= 0 {
		o.Degraded = 30 * time.Second
	}
	if o.Shards == 0 {
		o.Shards = DefaultShards
	}
	if o.Shards < 1 || o.Shards > MaxShards {
		return nil, fmt.Errorf("ec2budget: %d shards, want 1 to %d", o.Shards, MaxShards)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	// A shard holds at least one request (a bucket under one never serves):
	// fewer shards when the smallest share has fewer requests than Shards, so
	// that together they never exceed it (the same count on every node of
	// the same configuration).
	if most := math.Floor(minCapacity(o.Limits) * o.Share); most >= 1 && float64(o.Shards) > most {
		o.Logger.Warn("EC2 budget: fewer shards than asked, so each holds a request", "asked", o.Shards, "shards", int(most))
		o.Shards = int(most)
	}
	b := &Budget{o: o, limits: map[string]Limit{}, seen: map[string]State{}, degradedUntil: map[string]time.Time{}, failingSince: map[string]time.Time{}}
	if o.NodeName != "" {
		h := fnv.New32a()
		h.Write([]byte(o.NodeName))
		b.home = int(h.Sum32() % uint32(o.Shards))
	} else {
		b.home = rand.IntN(o.Shards)
	}
	for a, l := range o.Limits {
		b.limits[a] = Limit{Capacity: max(1, l.Capacity*o.Share/float64(o.Shards)), RefillPerSecond: l.RefillPerSecond * o.Share / float64(o.Shards)}
	}
	return b, nil
}

// minCapacity is the smallest capacity of limits (+Inf when there is none).
func minCapacity(limits map[string]Limit) float64 {
	m := math.Inf(1)
	for _, l := range limits {
		m = math.Min(m, l.Capacity)
	}
	return m
}

// MaxShards bounds Options.Shards.
const MaxShards = 256

// Home is this node's shard of every action's bucket.
func (b *Budget) Home() int { return b.home }

// Limits are the figures of one shard by action: the account's, times
// Share, over Shards.
func (b *Budget) Limits() map[string]Limit {
	out := make(map[string]Limit, len(b.limits))
	for a, l := range b.limits {
		out[a] = l
	}
	return out
}

var _ provider.RequestReserver = (*Budget)(nil)

// Take implements provider.RequestBudget (see the package doc): Reserve,
// then a sleep until the reservation is due. It returns a
// *provider.BudgetShortError when the bucket has no room at p now, and
// ctx's error when ctx ends while it waits for a reservation.
func (b *Budget) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

// Reserve implements provider.RequestReserver: it takes one request of
// action at p from the shared bucket (a pod-waiting call may take it into
// debt, a place in the queue) and returns how long until that request may
// be made, without waiting. Errors as Take's, ctx's only while it reads or
// writes the Leases.
func (b *Budget) Reserve(ctx context.Context, action string, p provider.Priority) (time.Duration, error) {
	l, ok := b.limits[action]
	if !ok {
		return 0, nil
	}
	if b.isDegraded(action) {
		return b.reserveLocal(action, l, p)
	}
	for attempt := 1; ; attempt++ {
		lease, st, err := b.read(ctx, action, b.home, l)
		if err != nil {
			return b.degrade(ctx, action, l, p, err)
		}
		b.see(action, st)
		next, wait, ok := st.Take(l, b.o.Now(), p)
		if (!ok || wait > 0) && b.o.Shards > 1 {
			// The home shard makes this call wait: a second shard at random
			// serves it if it is shorter (two choices even out the shards'
			// queues, which hashing alone leaves uneven).
			alt := (b.home + 1 + rand.IntN(b.o.Shards-1)) % b.o.Shards
			if lease2, st2, err := b.read(ctx, action, alt, l); err == nil {
				if next2, wait2, ok2 := st2.Take(l, b.o.Now(), p); ok2 && (!ok || wait2 < wait) {
					lease, next, wait, ok = lease2, next2, wait2, true
				}
			}
		}
		if !ok {
			return 0, &provider.BudgetShortError{Action: action, Priority: p, Wait: wait}
		}
		err = b.write(ctx, lease, next)
		if apierrors.IsConflict(err) {
			// Another node took a token between our read and write: read
			// again after a short jittered pause, longer as conflicts repeat.
			if err := provider.Sleep(ctx, conflictBackoff(attempt)); err != nil {
				return 0, err
			}
			continue
		}
		if err != nil {
			return b.degrade(ctx, action, l, p, err)
		}
		b.see(action, next)
		return wait, nil
	}
}

// see keeps st as action's bucket last seen in the API server.
func (b *Budget) see(action string, st State) {
	b.mu.Lock()
	delete(b.failingSince, action)
	b.seen[action] = st
	b.mu.Unlock()
}

// reserveLocal takes a request at p from action's bucket as this daemon last
// saw it, kept in memory, while the API server is out of reach: the
// reservations queued before this node's (a launch's debt) are waited for,
// as they would have been in the Lease, and so are its own earlier takes;
// only what other nodes took since is unknown. With no bucket ever seen it
// takes nothing and the provider's own pacing alone applies.
//
// Only calls a pod waits for go on: a warm-pool refill, a release or
// background work gets a BudgetShortError until the API server is tried
// again (the end of Options.Degraded). An outage then costs the account
// only what pods need, and the start of a large fleet, when the API server
// is slowest and the Leases are not yet made, sends no warm-pool call to
// EC2 outside the budget (test/fleet, 200 nodes: 133 nodes timed out on
// their first take while all started, called EC2 alone for their warm
// pools, and 21.5 % of the launch's requests were refused). Errors as
// Reserve's; the wait is how long until the request may be made.
func (b *Budget) reserveLocal(action string, l Limit, p provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p != provider.PriorityPodWaiting {
		wait := b.degradedUntil[action].Sub(b.o.Now())
		return 0, &provider.BudgetShortError{Action: action, Priority: p, Wait: max(wait, 100*time.Millisecond)}
	}
	st, known := b.seen[action]
	if !known {
		return 0, nil
	}
	next, wait, ok := st.Take(l, b.o.Now(), p)
	if !ok {
		return 0, &provider.BudgetShortError{Action: action, Priority: p, Wait: wait}
	}
	b.seen[action] = next
	return wait, nil
}

// Refused implements provider.RequestBudget: it empties the shared bucket,
// every shard of it (best effort: a few attempts each, within 5 s, then the
// fleet learns from its own refusals).
func (b *Budget) Refused(action string) {
	l, ok := b.limits[action]
	if !ok {
		return
	}
	if b.isDegraded(action) {
		b.mu.Lock()
		if st, known := b.seen[action]; known {
			b.seen[action] = st.Refused(l, b.o.Now())
		}
		b.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The account's bucket is empty: every shard of it, the home one first.
	for i := range b.o.Shards {
		if !b.refuse(ctx, action, (b.home+i)%b.o.Shards, l) {
			return
		}
	}
}

// refuse empties shard k of action's bucket; false when the API server
// failed or ctx ended (the caller gives up).
func (b *Budget) refuse(ctx context.Context, action string, k int, l Limit) bool {
	for attempt := 1; attempt <= 5; attempt++ {
		lease, st, err := b.read(ctx, action, k, l)
		if err != nil {
			return false
		}
		err = b.write(ctx, lease, st.Refused(l, b.o.Now()))
		if !apierrors.IsConflict(err) {
			return err == nil
		}
		if provider.Sleep(ctx, conflictBackoff(attempt)) != nil {
			return false
		}
	}
	return true
}

// conflictBackoff is the pause after the n-th write conflict: uniform in
// [0, 20 ms·2^n), at most 1 s.
func conflictBackoff(n int) time.Duration {
	d := min(time.Second, 20*time.Millisecond<<min(n, 10))
	return rand.N(d)
}

// read returns the Lease of shard k of action's bucket and its state,
// creating the Lease with a full bucket when it does not exist. A Lease
// whose annotation is missing or unreadable reads as a full bucket (it is
// overwritten on the next write).
func (b *Budget) read(ctx context.Context, action string, k int, l Limit) (*coordinationv1.Lease, State, error) {
	ctx, cancel := context.WithTimeout(ctx, LeaseTimeout)
	defer cancel()
	leases := b.o.Client.CoordinationV1().Leases(b.o.Namespace)
	name := ShardLeaseName(action, k, b.o.Shards)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		st := Full(l, b.o.Now())
		lease, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: b.o.Namespace, Annotations: map[string]string{Annotation: st.Encode()},
		}}, metav1.CreateOptions{FieldManager: "vpcipd"})
		if apierrors.IsAlreadyExists(err) {
			lease, err = leases.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return nil, State{}, err
	}
	st, derr := Decode(lease.Annotations[Annotation])
	if derr != nil {
		b.o.Logger.Warn("EC2 budget Lease unreadable: taking it as a full bucket", "lease", lease.Name, "err", derr)
		st = Full(l, b.o.Now())
	}
	return lease, st, nil
}

// write stores st in lease under the resourceVersion read.
func (b *Budget) write(ctx context.Context, lease *coordinationv1.Lease, st State) error {
	ctx, cancel := context.WithTimeout(ctx, LeaseTimeout)
	defer cancel()
	lease = lease.DeepCopy()
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[Annotation] = st.Encode()
	if b.o.NodeName != "" {
		holder := b.o.NodeName
		lease.Spec.HolderIdentity = &holder
	}
	_, err := b.o.Client.CoordinationV1().Leases(b.o.Namespace).Update(ctx, lease, metav1.UpdateOptions{FieldManager: "vpcipd"})
	return err
}

func (b *Budget) isDegraded(action string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.o.Now().Before(b.degradedUntil[action])
}

// degrade notes an API server failure and takes this call's request
// locally (reserveLocal): for Options.Degraded this daemon calls EC2 for
// waiting pods under its local limits (the provider's own pacing, and
// backing off when EC2 answers RequestLimitExceeded), as it does without a
// shared budget, and no sooner than the buckets it last saw allow; other
// calls wait for the API server. Pacing at the fleet's share divided by its node count
// instead would keep an outage from raising the fleet's rate, but gives a
// node of a 200-node fleet one call per 40 s of each action, so a loaded API
// server (one timed-out read) made its pods wait minutes (test/fleet at 200
// nodes: launch p99 3 min against 1 min 39 s without a shared budget).
//
// An action whose bucket this daemon has never seen (the first takes after
// it starts, when the whole fleet starts with it and the API server is at
// its slowest) is not let through at once: its call gets a
// BudgetShortError to look again in a second or two until its Lease
// requests have failed for Options.Degraded, and only then goes alone. In
// a 200-node launch (test/fleet) 157 nodes whose first Lease read timed out
// within 15 s of their start sent their first assigns to EC2 alone, and
// 176 of them were refused.
func (b *Budget) degrade(ctx context.Context, action string, l Limit, p provider.Priority, err error) (time.Duration, error) {
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	now := b.o.Now()
	b.mu.Lock()
	if _, known := b.seen[action]; !known {
		since, failing := b.failingSince[action]
		if !failing {
			b.failingSince[action], since = now, now
		}
		if now.Sub(since) < b.o.Degraded {
			b.mu.Unlock()
			b.o.Logger.Info("EC2 budget: the API server did not answer for a bucket never seen; looking again", "action", action,
				"failingFor", now.Sub(since).Round(time.Millisecond), "err", err)
			return 0, &provider.BudgetShortError{Action: action, Priority: p, Wait: time.Second + rand.N(time.Second)}
		}
	}
	delete(b.failingSince, action)
	b.degradedUntil[action] = now.Add(b.o.Degraded)
	b.mu.Unlock()
	b.o.Logger.Warn("EC2 budget: API server unreachable, calling EC2 under this node's own limits and the buckets it last saw", "action", action,
		"for", b.o.Degraded, "err", err)
	return b.reserveLocal(action, l, p)
}
