package ec2budget

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vpcip/vpcip/provider"
)

// TestAPIServerFailureFallsBackToLocalLimits: a daemon of a 200-node fleet
// whose Lease reads fail (an API server down or timing out) calls EC2 under
// its own limits for Options.Degraded once they have failed for that long
// (before, a bucket it never saw makes the call look again in a second or
// two): Take then returns at once for every call and reads no Lease
// meanwhile; afterwards it uses the shared bucket again.
// Pacing at the shared rate over the node count instead (5/s over 200)
// held each action to one call per 40 s.
func TestAPIServerFailureFallsBackToLocalLimits(t *testing.T) {
	down, leaseReads := true, 0
	cs := flakyLeases(&down, &leaseReads)
	now := t0
	b, err := New(Options{Client: cs, NodeName: "node-1", Degraded: 30 * time.Second, Shards: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var short *provider.BudgetShortError
	for i, after := range []time.Duration{0, 10 * time.Second, 29 * time.Second} {
		now = t0.Add(after)
		if err := b.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting); !errors.As(err, &short) || short.Wait < time.Second || short.Wait > 2*time.Second {
			t.Fatalf("take %d, %s into the failure, of a bucket never seen: %v; want BudgetShortError to look again in 1–2 s", i+1, after, err)
		}
	}
	now = t0.Add(30 * time.Second)
	for i := range 10 {
		if err := b.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting); err != nil {
			t.Fatalf("take %d after 30 s with the API server down: %v; want the call let through under local limits", i+1, err)
		}
	}
	if leaseReads != 4 {
		t.Errorf("%d Lease requests for 13 takes with the API server down, want the first four alone (then degraded)", leaseReads)
	}
	down, now = false, now.Add(31*time.Second)
	if err := b.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting); err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, LeaseName("AttachNetworkInterface"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after the degraded span the shared bucket is not used: %v", err)
	}
	if st, err := Decode(l.Annotations[Annotation]); err != nil || st.Tokens != 39 {
		t.Errorf("shared bucket after one take: %+v, %v; want 39 of 40 tokens", st, err)
	}
}

// TestDegradedNodeWaitsForTheQueueItLastSaw: a node that read a bucket 100
// requests in debt (a launch's queue of pod-waiting reservations) and then
// lost the API server does not call EC2 at once, where the account's bucket
// is empty and the call would be refused: it waits as the queue it saw
// would have made it wait, and once the refill has paid that queue it calls
// at once again. EC2's refusals while degraded empty its view too.
func TestDegradedNodeWaitsForTheQueueItLastSaw(t *testing.T) {
	const action = "AttachNetworkInterface"
	down, leaseRequests := false, 0
	cs := flakyLeases(&down, &leaseRequests)
	now := t0
	b, err := New(Options{Client: cs, NodeName: "node-1", Degraded: 30 * time.Second, Shards: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	l := b.Limits()[action] // 40 tokens, 4 a second at the default share
	inDebt := State{Capacity: l.Capacity, RefillPerSecond: l.RefillPerSecond, Tokens: -100, At: t0}
	if _, err := cs.CoordinationV1().Leases("kube-system").Create(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: LeaseName(action), Namespace: "kube-system", Annotations: map[string]string{Annotation: inDebt.Encode()},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A refill is refused by the shared bucket (it reads the Lease: the
	// node has now seen the queue).
	var short *provider.BudgetShortError
	if err := b.Take(t.Context(), action, provider.PriorityRefill); !errors.As(err, &short) {
		t.Fatalf("refill from a bucket in debt: %v, want BudgetShortError", err)
	}

	down = true
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := b.Take(ctx, action, provider.PriorityPodWaiting); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pod-waiting take with the API server down after seeing 100 queued: %v after %s; want it to wait for the queue (25 s) until ctx ends",
			err, time.Since(start).Round(time.Millisecond))
	}
	if err := b.Take(t.Context(), action, provider.PriorityRefill); !errors.As(err, &short) || short.Wait < 25*time.Second {
		t.Errorf("degraded refill behind the queue seen: %v, want BudgetShortError to wait at least 25 s", err)
	}

	// 30 s later the refill (120 requests) has paid the queue and the
	// node's own reservation: calls go at once.
	now = t0.Add(30 * time.Second)
	b.mu.Lock()
	b.degradedUntil[action] = now.Add(time.Minute) // still out of reach
	b.mu.Unlock()
	for i := range 3 {
		if err := b.Take(t.Context(), action, provider.PriorityPodWaiting); err != nil {
			t.Fatalf("take %d once the queue seen is paid: %v", i+1, err)
		}
	}
	// EC2 refuses one: the node's view empties, so its next refill waits.
	b.Refused(action)
	if err := b.Take(t.Context(), action, provider.PriorityRefill); !errors.As(err, &short) {
		t.Errorf("degraded refill after EC2 refused: %v, want BudgetShortError", err)
	}
}

// TestShardsSplitTheBucketAndTwoChoicesEvenThem: with shards, each node
// takes from its home shard (a hash of its name: 400 nodes spread over 8
// shards), and a call its home shard would make wait goes to a second shard
// that serves it sooner; a refill both shards refuse is refused.
func TestShardsSplitTheBucketAndTwoChoicesEvenThem(t *testing.T) {
	per := make([]int, DefaultShards)
	for i := range 400 {
		b, err := New(Options{Client: fake.NewClientset(), NodeName: fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/250, i%250)})
		if err != nil {
			t.Fatal(err)
		}
		per[b.Home()]++
	}
	for k, n := range per {
		if n < 25 || n > 75 {
			t.Errorf("shard %d is home to %d of 400 nodes, want about 50: %v", k, n, per)
		}
	}

	const action = "AttachNetworkInterface"
	cs := fake.NewClientset()
	b, err := New(Options{Client: cs, NodeName: "node-1", Shards: 2, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	l := b.Limits()[action] // 20 tokens, 2 a second: half of the 80 % share
	home, other := b.Home(), 1-b.Home()
	set := func(k int, tokens float64) {
		st := State{Capacity: l.Capacity, RefillPerSecond: l.RefillPerSecond, Tokens: tokens, At: t0}
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: ShardLeaseName(action, k, 2), Namespace: "kube-system",
			Annotations: map[string]string{Annotation: st.Encode()}}}
		leases := cs.CoordinationV1().Leases("kube-system")
		if _, err := leases.Update(t.Context(), lease, metav1.UpdateOptions{}); err != nil {
			if _, err := leases.Create(t.Context(), lease, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tokens := func(k int) float64 {
		lease, err := cs.CoordinationV1().Leases("kube-system").Get(t.Context(), ShardLeaseName(action, k, 2), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := Decode(lease.Annotations[Annotation])
		if err != nil {
			t.Fatal(err)
		}
		return st.Tokens
	}

	// Home 20 requests in debt (10 s of queue), the other shard full: the
	// call goes to the other at once.
	set(home, -20)
	set(other, l.Capacity)
	if err := b.Take(t.Context(), action, provider.PriorityPodWaiting); err != nil {
		t.Fatal(err)
	}
	if h, o := tokens(home), tokens(other); h != -20 || o != l.Capacity-1 {
		t.Errorf("after a take with the home shard in debt: home %v, other %v; want -20 and %v", h, o, l.Capacity-1)
	}
	// Both in debt: the shorter queue (the other's, 4) gets the reservation.
	set(other, -4)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := b.Take(ctx, action, provider.PriorityPodWaiting); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take behind a queue: %v, want it to wait for its turn", err)
	}
	if h, o := tokens(home), tokens(other); h != -20 || o != -5 {
		t.Errorf("reservation with both shards in debt: home %v, other %v; want -20 and -5", h, o)
	}
	// A refill neither shard has room for is refused.
	var short *provider.BudgetShortError
	if err := b.Take(t.Context(), action, provider.PriorityRefill); !errors.As(err, &short) {
		t.Errorf("refill with both shards in debt: %v, want BudgetShortError", err)
	}
}

// TestAPIServerFailureHoldsCallsNoPodWaitsFor: with the API server out of
// reach (a daemon's first take while the whole fleet starts, its Leases not
// yet made), a warm-pool refill, a release and background work send nothing
// to EC2: each gets a BudgetShortError telling it to look again when the
// API server is tried again, while a pod-waiting call goes on alone.
func TestAPIServerFailureHoldsCallsNoPodWaitsFor(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("context deadline exceeded")
	})
	now := t0
	b, err := New(Options{Client: cs, NodeName: "node-1", Degraded: 30 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// Failing since t0 on a bucket never seen: from 30 s on, degraded.
	var first *provider.BudgetShortError
	if err := b.Take(t.Context(), "AssignPrivateIpAddresses", provider.PriorityRefill); !errors.As(err, &first) {
		t.Fatalf("first take: %v, want BudgetShortError", err)
	}
	now = now.Add(30 * time.Second)
	for i, p := range []provider.Priority{provider.PriorityRefill, provider.PriorityRelease, provider.PriorityBackground, provider.PriorityRefill} {
		var short *provider.BudgetShortError
		if err := b.Take(t.Context(), "AssignPrivateIpAddresses", p); !errors.As(err, &short) || short.Wait < 20*time.Second || short.Wait > 30*time.Second {
			t.Errorf("take %d at priority %v with the API server out of reach: %v; want BudgetShortError until it is tried again (20–30 s)", i+1, p, err)
		}
		now = now.Add(time.Second)
	}
	if err := b.Take(t.Context(), "AssignPrivateIpAddresses", provider.PriorityPodWaiting); err != nil {
		t.Errorf("pod-waiting take with the API server out of reach: %v, want it let through", err)
	}
}

// TestRefusedEmptiesEveryShard: EC2's refusal means the account's bucket is
// empty, so every shard of it is emptied and the whole fleet backs off, not
// only the nodes whose home is the refused node's shard. On the old code the
// other shard kept its 20 requests.
func TestRefusedEmptiesEveryShard(t *testing.T) {
	const action = "AttachNetworkInterface"
	cs := fake.NewClientset()
	b, err := New(Options{Client: cs, NodeName: "node-1", Shards: 2, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		if _, _, err := b.read(t.Context(), action, k, b.Limits()[action]); err != nil {
			t.Fatal(err)
		}
	}
	b.Refused(action)
	for k := range 2 {
		lease, err := cs.CoordinationV1().Leases("kube-system").Get(t.Context(), ShardLeaseName(action, k, 2), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := Decode(lease.Annotations[Annotation])
		if err != nil {
			t.Fatal(err)
		}
		if st.Tokens > 0 {
			t.Errorf("shard %d (home %d) holds %v requests after EC2 refused one, want none", k, b.Home(), st.Tokens)
		}
	}
}

// TestOneActionsFailureLeavesTheOthersShared: a Lease request of one action
// that times out (a slow API server) sends that action alone to EC2 for
// Options.Degraded, not the node's other actions: an attach taken right
// after the node's assign Lease timed out still goes through its own
// shared bucket. Degrading them all sent the attaches and creates of 68
// nodes to EC2 outside the budget in a 200-node launch (test/fleet: 4 % of
// its requests refused).
func TestOneActionsFailureLeavesTheOthersShared(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if g, ok := a.(k8stesting.GetAction); ok && strings.HasPrefix(g.GetName(), LeaseName("AssignPrivateIpAddresses")) {
			return true, nil, errors.New("context deadline exceeded")
		}
		return false, nil, nil
	})
	b, err := New(Options{Client: cs, NodeName: "node-1", Shards: 1, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	var short *provider.BudgetShortError
	if err := b.Take(t.Context(), "AssignPrivateIpAddresses", provider.PriorityPodWaiting); !errors.As(err, &short) {
		t.Fatalf("pod-waiting assign with its Lease timing out: %v, want it told to look again", err)
	}
	if err := b.Take(t.Context(), "AttachNetworkInterface", provider.PriorityPodWaiting); err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases("kube-system").Get(t.Context(), LeaseName("AttachNetworkInterface"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the attach did not go through its shared bucket after the assign's Lease timed out: %v", err)
	}
	if st, err := Decode(l.Annotations[Annotation]); err != nil || st.Tokens != st.Capacity-1 {
		t.Errorf("attach bucket after one take: %+v, %v; want one request taken", st, err)
	}
}

// flakyLeases is a fake clientset whose Lease requests fail with "connection
// refused" while *down, each counted in *requests.
func flakyLeases(down *bool, requests *int) *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*requests++
		if *down {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	return cs
}
