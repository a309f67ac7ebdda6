package pool

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// queueBudget is a fleet's shared EC2 budget seen from one node whose
// every growth request waits wait in the fleet's queue from the moment it
// is reserved (provider.RequestReserver); it counts places by action.
type queueBudget struct {
	wait  time.Duration
	mu    sync.Mutex
	taken map[string]int
}

func (b *queueBudget) Reserve(_ context.Context, action string, _ provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.taken[action]++
	return b.wait, nil
}

func (b *queueBudget) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

func (*queueBudget) Refused(string) {}

func (b *queueBudget) places() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for a, n := range b.taken {
		out[a] = n
	}
	return out
}

// TestCycleQueuesEveryGrowthWhileTheFirstWaitsItsTurn: with pods waiting
// and the fleet's queue 2 s long, one cycle holds the places of the whole
// growth the pods need (the primary ENI's assign and both new ENIs, each
// with its attach) without waiting in any of them and without a request
// sent, and returns when the first is due; the cycle then makes them all
// with the places held, taking none more. Before, the worker slept in each
// call's turn and planned the next only after it, so a node's growth waited
// the queue once per step.
func TestCycleQueuesEveryGrowthWhileTheFirstWaitsItsTurn(t *testing.T) {
	budget := &queueBudget{wait: 2 * time.Second, taken: map[string]int{}}
	r := newBudgetRig(t, Options{Config: warmpool.Config{WarmIPTarget: 20}, Pending: count(20)}, budget)
	r.pool.o.Clock = time.Now // the budget's due times are the wall clock's
	ctx := context.Background()
	start := time.Now()
	next := r.pool.Cycle(ctx)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the first cycle took %s: it waited in the fleet's queue", took)
	}
	if next > 2*time.Second || next < time.Second {
		t.Errorf("the first cycle asks to be run again in %s, want when the first place is due (2 s)", next)
	}
	for _, op := range []string{"AssignPrivateIpAddresses", "CreateNetworkInterface", "AttachNetworkInterface"} {
		if n := r.calls(op); n != 0 {
			t.Errorf("%d %s requests sent while their places wait", n, op)
		}
	}
	held := budget.places()
	if held["AssignPrivateIpAddresses"] != 1 || held["CreateNetworkInterface"] != 2 || held["AttachNetworkInterface"] != 2 {
		t.Fatalf("places held after one cycle: %v, want 1 assign and 2 creates with their attaches", held)
	}
	time.Sleep(next)
	for range 3 {
		r.pool.Cycle(ctx)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("the growth took %s, want about one queue (2 s) and the calls", took)
	}
	sum := warmpool.Summarize(r.pool.Input(time.Now()))
	if sum.Available < 20 || len(r.store.ENIs()) != 3 {
		t.Fatalf("after the places came due: %d ENIs, %+v; want 3 ENIs, 20 addresses free", len(r.store.ENIs()), sum)
	}
	for a, n := range budget.places() {
		if n != held[a] {
			t.Errorf("%s: %d places taken in all, %d held by the first cycle: the calls made when due took more", a, n, held[a])
		}
	}
}

// actionQueues is a fleet's shared EC2 budget seen from one node whose
// queue holds each action's requests for that action's wait from the
// moment they are reserved (provider.RequestReserver): the next of the
// action's turns when some are listed, else its waits entry; actions not
// listed go at once. Waits may change between calls.
type actionQueues struct {
	mu    sync.Mutex
	waits map[string]time.Duration
	turns map[string][]time.Duration
}

func (b *actionQueues) set(waits map[string]time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waits = waits
}

func (b *actionQueues) Reserve(_ context.Context, action string, _ provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.turns[action]; len(q) > 0 {
		b.turns[action] = q[1:]
		return q[0], nil
	}
	return b.waits[action], nil
}

func (b *actionQueues) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

func (*actionQueues) Refused(string) {}

// pendingVar is a Pending count the test changes.
type pendingVar struct {
	mu sync.Mutex
	n  int
}

func (p *pendingVar) Demand() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *pendingVar) set(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = n
}

// TestDueAssignOnARealENIIsNotHeldBehindAPlaceholderENI: a node with a
// secondary ENI that has room defers an assign on it (1.2 s queue) and an
// ENI create (3 s queue, its placeholder ENI partly filled); when the
// assign is due, the cycle makes it on its ENI. Before, the placeholder
// ENI ("deferred-0") sorted before the real one ("eni-…") in warmpool's
// ENI order, so the plan was an assign on the placeholder, which waits for
// the create: the assign due at 1.2 s waited for the create's 3 s.
func TestDueAssignOnARealENIIsNotHeldBehindAPlaceholderENI(t *testing.T) {
	budget := &actionQueues{}
	pending := &pendingVar{}
	r := newBudgetRig(t, Options{Config: warmpool.Config{WarmIPTarget: 12}, Pending: pending}, budget)
	r.pool.o.Clock = time.Now // the budget's due times are the wall clock's
	ctx := context.Background()
	// No queue: the primary ENI gets its 9 addresses and a second ENI 3.
	r.pool.Cycle(ctx)
	enis := r.store.ENIs()
	if len(enis) != 2 || len(enis[0].Slots)+len(enis[1].Slots) != 12 {
		t.Fatalf("warm-up: %+v, want 2 ENIs holding 12 addresses", enis)
	}
	budget.set(map[string]time.Duration{
		"AssignPrivateIpAddresses": 1200 * time.Millisecond,
		"CreateNetworkInterface":   3 * time.Second,
		"AttachNetworkInterface":   3 * time.Second,
	})
	pending.set(13) // 13 pods wait: 6 more on the second ENI, 7 on a new one
	start := time.Now()
	r.pool.Cycle(ctx)
	assigns, creates := r.calls("AssignPrivateIpAddresses"), r.calls("CreateNetworkInterface")
	if len(r.pool.deferred) != 2 {
		t.Fatalf("deferred after the first cycle: %+v, want the assign and the create", r.pool.deferred)
	}
	time.Sleep(time.Until(start.Add(1300 * time.Millisecond)))
	r.pool.Cycle(ctx)
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Fatalf("the cycle at 1.3 s returned at %s: it waited for the create", took)
	}
	if got := r.calls("AssignPrivateIpAddresses") - assigns; got != 1 {
		t.Errorf("%d assigns sent once the assign was due (before the create's turn), want 1", got)
	}
	if got := r.calls("CreateNetworkInterface") - creates; got != 0 {
		t.Errorf("%d creates sent before their turn", got)
	}
}

// TestDueCreateIsNotHeldBehindALaterPartialENI: a node short of 21
// addresses defers its primary ENI's assign (due at 1.1 s), a whole ENI
// (due at 1.3 s) and a partial one (due at 3 s); at 1.4 s the cycle makes
// the assign and one create, leaving the last for its turn. Before, the
// due whole ENI's placeholder was dropped and the partial one's kept: the
// re-planned growth was an assign on the partial placeholder, which waits
// for its create, so the create due at 1.3 s waited for the one due at 3 s.
func TestDueCreateIsNotHeldBehindALaterPartialENI(t *testing.T) {
	budget := &actionQueues{turns: map[string][]time.Duration{
		"AssignPrivateIpAddresses": {1100 * time.Millisecond},
		"CreateNetworkInterface":   {1300 * time.Millisecond, 3 * time.Second},
	}}
	r := newBudgetRig(t, Options{Config: warmpool.Config{WarmIPTarget: 1}, Pending: count(20)}, budget)
	r.pool.o.Clock = time.Now // the budget's due times are the wall clock's
	ctx := context.Background()
	start := time.Now()
	r.pool.Cycle(ctx)
	var sizes []int
	for _, d := range r.pool.deferred {
		if d.plan.Action == warmpool.CreateENI {
			sizes = append(sizes, d.plan.Count)
		}
	}
	if slices.Sort(sizes); len(r.pool.deferred) != 3 || len(sizes) != 2 || sizes[0] >= 9 || sizes[1] != 9 {
		t.Fatalf("deferred after the first cycle: %+v, want the assign, a whole ENI and a partial one", r.pool.deferred)
	}
	time.Sleep(time.Until(start.Add(1400 * time.Millisecond)))
	r.pool.Cycle(ctx)
	if took := time.Since(start); took > 2800*time.Millisecond {
		t.Fatalf("the cycle at 1.4 s returned at %s: it waited for the last create", took)
	}
	if got := r.calls("AssignPrivateIpAddresses"); got != 1 {
		t.Errorf("%d assigns sent once due, want 1", got)
	}
	if got := r.calls("CreateNetworkInterface"); got != 1 {
		t.Errorf("%d creates sent at 1.4 s, want 1 (the one due at 1.3 s)", got)
	}
}
