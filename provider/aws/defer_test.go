package awsprovider

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// queueBudget is a provider.RequestReserver whose queue holds every
// request of an action listed in waits for that long from the moment it
// is reserved (a fleet's debt queue seen from one node); other actions go
// at once. It counts reservations by action.
type queueBudget struct {
	waits map[string]time.Duration
	mu    sync.Mutex
	taken map[string]int
}

func (b *queueBudget) Reserve(_ context.Context, action string, _ provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.taken == nil {
		b.taken = map[string]int{}
	}
	b.taken[action]++
	return b.waits[action], nil
}

func (b *queueBudget) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

func (*queueBudget) Refused(string) {}

func (b *queueBudget) count(action string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.taken[action]
}

// sent is how many requests of op vpcsim received since before.
func sent(s *sim, before map[string]int, op string) int {
	return s.local.Cloud.Faults().CallCounts()[op] - before[op]
}

// TestDeferredAssignHoldsItsPlaceAndSendsNothing: a deferrable assign
// (provider.WithDeferral) that the fleet's queue would hold 1.5 s returns a
// DeferredError at once, sends nothing, and takes one place; the same
// assign called once it is due is sent without a second place. A call
// without WithDeferral waits in the queue as before.
func TestDeferredAssignHoldsItsPlaceAndSendsNothing(t *testing.T) {
	budget := &queueBudget{waits: map[string]time.Duration{"AssignPrivateIpAddresses": 1500 * time.Millisecond}}
	s, c := budgetClient(t, budget)
	eni := s.inst.PrimaryENI.ID
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	before := s.local.Cloud.Faults().CallCounts()
	start := time.Now()
	_, err := c.AssignAddresses(ctx, eni, 2, false)
	var d *provider.DeferredError
	if !errors.As(err, &d) {
		t.Fatalf("AssignAddresses = %v, want a DeferredError", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("the deferred call returned after %s: it waited in the queue", took)
	}
	if d.Action != "AssignPrivateIpAddresses" || d.Until.Before(start.Add(1400*time.Millisecond)) {
		t.Errorf("DeferredError = %+v, want the assign, due 1.5 s after %s", d, start.Format(time.StampMilli))
	}
	if n := sent(s, before, "AssignPrivateIpAddresses"); n != 0 {
		t.Fatalf("%d assign requests sent for a deferred call", n)
	}
	// Called again before it is due: the place is not taken early; the
	// call holds a second one (another plan's growth).
	if _, err := c.AssignAddresses(ctx, eni, 1, false); !errors.As(err, &d) {
		t.Fatalf("second AssignAddresses = %v, want a DeferredError", err)
	}
	if n := budget.count("AssignPrivateIpAddresses"); n != 2 {
		t.Fatalf("%d places taken for two deferred calls, want 2", n)
	}
	time.Sleep(time.Until(d.Until))
	got, err := c.AssignAddresses(ctx, eni, 2, false)
	if err != nil || len(got) != 2 {
		t.Fatalf("AssignAddresses when due = %v, %v; want 2 addresses", got, err)
	}
	got, err = c.AssignAddresses(ctx, eni, 1, false)
	if err != nil || len(got) != 1 {
		t.Fatalf("the second AssignAddresses when due = %v, %v; want 1 address", got, err)
	}
	if n := budget.count("AssignPrivateIpAddresses"); n != 2 {
		t.Errorf("%d places taken, want 2: the calls made when due took the places held", n)
	}
	if n := sent(s, before, "AssignPrivateIpAddresses"); n != 2 {
		t.Errorf("%d assign requests sent, want 2", n)
	}
	// Without WithDeferral the call waits its turn inside.
	start = time.Now()
	if _, err := c.AssignAddresses(provider.WithPriority(t.Context(), provider.PriorityPodWaiting), eni, 1, false); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 1400*time.Millisecond {
		t.Errorf("a call without WithDeferral returned after %s, want it to wait its 1.5 s turn", took)
	}
}

// TestDeferredCreateHoldsTheAttachesPlaceAtOnce: a deferred create holds
// the attach's and the attribute change's places at the same moment (a
// fleet's three queues waited in parallel) and sends nothing; made when
// due, CreateENI uses the three places held, taking none more, and its
// attach waits only for what is left of its own queue.
func TestDeferredCreateHoldsTheAttachesPlaceAtOnce(t *testing.T) {
	budget := &queueBudget{waits: map[string]time.Duration{
		"CreateNetworkInterface": 1200 * time.Millisecond,
		"AttachNetworkInterface": 1500 * time.Millisecond,
	}}
	s, c := budgetClient(t, budget)
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	before := s.local.Cloud.Faults().CallCounts()
	start := time.Now()
	_, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 2})
	var d *provider.DeferredError
	if !errors.As(err, &d) || d.Action != "CreateNetworkInterface" {
		t.Fatalf("CreateENI = %v, want the create deferred", err)
	}
	for _, a := range []string{"CreateNetworkInterface", "AttachNetworkInterface", "ModifyNetworkInterfaceAttribute"} {
		if n := budget.count(a); n != 1 {
			t.Errorf("%d places of %s held by the deferred create, want 1", n, a)
		}
	}
	for op, n := range s.local.Cloud.Faults().CallCounts() {
		if op != vpcsim.IMDSOp && n != before[op] {
			t.Errorf("%s called %d times for a deferred create", op, n-before[op])
		}
	}
	time.Sleep(time.Until(d.Until))
	e, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 2})
	if err != nil || len(e.SecondaryIPs) != 2 {
		t.Fatalf("CreateENI when due = %+v, %v", e, err)
	}
	// The attach's place was held 1.5 s after the first call: the create
	// made at 1.2 s waits at most the 0.3 s left, not 1.5 s more.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("CreateENI done %s after the first call: the attach waited its queue after the create", took)
	}
	for _, a := range []string{"CreateNetworkInterface", "AttachNetworkInterface", "ModifyNetworkInterfaceAttribute"} {
		if n := budget.count(a); n != 1 {
			t.Errorf("%d places of %s taken in all, want 1 (the held one used)", n, a)
		}
		if n := sent(s, before, a); n != 1 {
			t.Errorf("%d %s requests sent, want 1", n, a)
		}
	}
}

// TestShortQueueIsNotDeferred: a queue shorter than provider.DeferAfter is
// waited inside the call, as a second plan would cost more.
func TestShortQueueIsNotDeferred(t *testing.T) {
	budget := &queueBudget{waits: map[string]time.Duration{"AssignPrivateIpAddresses": 300 * time.Millisecond}}
	s, c := budgetClient(t, budget)
	ctx := provider.WithDeferral(t.Context())
	got, err := c.AssignAddresses(ctx, s.inst.PrimaryENI.ID, 1, false)
	if err != nil || len(got) != 1 {
		t.Fatalf("AssignAddresses = %v, %v; want an address after the short wait", got, err)
	}
}

// TestTicketsTakeTheEarliestAndDropTheStale: a call takes the earliest
// place held for its action; a deferrable call leaves one not yet due to
// the call it was held for, any other call takes it; a place more than
// ticketTTL past due is dropped, not used.
func TestTicketsTakeTheEarliestAndDropTheStale(t *testing.T) {
	var tk tickets
	now := time.Now()
	tk.push("AttachNetworkInterface", now.Add(-ticketTTL-time.Second), now.Add(-ticketTTL-time.Second)) // stale
	tk.push("AttachNetworkInterface", now.Add(30*time.Second), now.Add(30*time.Second))
	tk.push("AttachNetworkInterface", now.Add(-time.Second), now.Add(-time.Second))
	var due time.Time
	if !tk.pop("AttachNetworkInterface", provider.DeferAfter, &due) || !due.Equal(now.Add(-time.Second)) {
		t.Fatalf("first pop: %v %v, want the place due a second ago", due, tk.by)
	}
	if tk.pop("AttachNetworkInterface", provider.DeferAfter, &due) {
		t.Fatalf("a deferrable call took a place due in 30 s")
	}
	if !tk.pop("AttachNetworkInterface", math.MaxInt64, &due) || !due.Equal(now.Add(30*time.Second)) {
		t.Fatalf("a call that waits did not take the place due in 30 s: %v", due)
	}
	if tk.held("AttachNetworkInterface") || tk.pop("AttachNetworkInterface", math.MaxInt64, &due) {
		t.Errorf("the stale place is still held: %v", tk.by)
	}
}

// TestPlacesHeldAheadLastUntilTheirCreateIsMade: the attach's and the
// attribute change's places a deferred create holds ahead are kept for as
// long as the create's own place, however soon they fall due: made when
// due, the create's later steps use them and take no place more. Before,
// each was dropped ticketTTL after its own due time, so with the attach's
// queue empty and the create's a minute long (MaxDebt) the attach took a
// second place, the first one spent for nothing. ticketTTL is shortened
// here to 1 s against the create's 2.5 s queue.
func TestPlacesHeldAheadLastUntilTheirCreateIsMade(t *testing.T) {
	defer func(ttl time.Duration) { ticketTTL = ttl }(ticketTTL)
	ticketTTL = time.Second
	budget := &queueBudget{waits: map[string]time.Duration{"CreateNetworkInterface": 2500 * time.Millisecond}}
	s, c := budgetClient(t, budget)
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	before := s.local.Cloud.Faults().CallCounts()
	_, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 2})
	var d *provider.DeferredError
	if !errors.As(err, &d) || d.Action != "CreateNetworkInterface" {
		t.Fatalf("CreateENI = %v, want the create deferred", err)
	}
	time.Sleep(time.Until(d.Until))
	if _, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 2}); err != nil {
		t.Fatalf("CreateENI when due: %v", err)
	}
	for _, a := range []string{"CreateNetworkInterface", "AttachNetworkInterface", "ModifyNetworkInterfaceAttribute"} {
		if n := budget.count(a); n != 1 {
			t.Errorf("%d places of %s taken in all, want 1 (the one held)", n, a)
		}
		if n := sent(s, before, a); n != 1 {
			t.Errorf("%d %s requests sent, want 1", n, a)
		}
	}
}

// TestENIsUnderDeferralStillFixesDeleteOnTermination: ENIs called under
// provider.WithDeferral (the pool confirming a stale view with EC2 in the
// middle of its growth) still sets delete-on-termination on an ENI of this
// cluster that lacks it, waiting its turn in the fleet's 1.5 s queue.
// Before, the change was deferred (its place held) and its DeferredError
// dropped: nothing was sent.
func TestENIsUnderDeferralStillFixesDeleteOnTermination(t *testing.T) {
	budget := &queueBudget{}
	s, c := budgetClient(t, budget)
	e := eniWithoutDeleteOnTermination(t, s, c)
	budget.mu.Lock()
	budget.waits = map[string]time.Duration{"ModifyNetworkInterfaceAttribute": 1500 * time.Millisecond}
	budget.mu.Unlock()
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	if _, err := c.ENIs(ctx); err != nil {
		t.Fatal(err)
	}
	if ni, _ := s.local.Cloud.NetworkInterface(e.ID); !ni.DeleteOnTermination {
		t.Errorf("%s still lacks delete-on-termination after ENIs under WithDeferral", e.ID)
	}
}

// priorityQueue is queueBudget as the fleet's budget treats priorities: a
// pod-waiting request waits its action's queue, any other is refused
// (provider.BudgetShortError) while the queue is not empty.
type priorityQueue struct{ queueBudget }

func (b *priorityQueue) Reserve(ctx context.Context, action string, p provider.Priority) (time.Duration, error) {
	b.mu.Lock()
	w := b.waits[action]
	b.mu.Unlock()
	if w > 0 && p != provider.PriorityPodWaiting {
		return 0, &provider.BudgetShortError{Action: action, Priority: p, Wait: w}
	}
	return b.queueBudget.Reserve(ctx, action, p)
}

func (b *priorityQueue) Take(ctx context.Context, action string, p provider.Priority) error {
	wait, err := b.Reserve(ctx, action, p)
	if err != nil {
		return err
	}
	return provider.Sleep(ctx, wait)
}

// TestCallThatWouldNotQueueTakesNoPlaceNotYetDue: a call that would not
// wait in the fleet's queue (ENIs' delete-on-termination fix at refill
// priority, refused while the queue is long) does not take a place a
// deferred create holds ahead for its attribute change, due in 3 s: it
// returns at once, and the create made when due uses the place. Before,
// any call that was not deferrable took the earliest place however far,
// so the periodic re-read slept 3 s on the worker and the create's change
// took a second place.
func TestCallThatWouldNotQueueTakesNoPlaceNotYetDue(t *testing.T) {
	budget := &priorityQueue{}
	s, c := budgetClient(t, budget)
	eniWithoutDeleteOnTermination(t, s, c)
	budget.mu.Lock()
	budget.waits = map[string]time.Duration{"CreateNetworkInterface": 1200 * time.Millisecond, "ModifyNetworkInterfaceAttribute": 3 * time.Second}
	budget.taken = nil
	budget.mu.Unlock()
	ctx := provider.WithDeferral(provider.WithPriority(t.Context(), provider.PriorityPodWaiting))
	_, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 1})
	var d *provider.DeferredError
	if !errors.As(err, &d) {
		t.Fatalf("CreateENI = %v, want the create deferred", err)
	}
	start := time.Now()
	if _, err := c.ENIs(t.Context()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("ENIs at refill priority took %s: it waited for a place held for another call", took)
	}
	time.Sleep(time.Until(d.Until))
	if _, err := c.CreateENI(ctx, provider.CreateENIRequest{Addresses: 1}); err != nil {
		t.Fatalf("CreateENI when due: %v", err)
	}
	if n := budget.count("ModifyNetworkInterfaceAttribute"); n != 1 {
		t.Errorf("%d attribute-change places taken, want 1 (the one held ahead, used by its create)", n)
	}
}

// eniWithoutDeleteOnTermination creates and attaches an ENI through c, then
// clears its delete-on-termination, as a daemon killed between the attach
// and the attribute change leaves it.
func eniWithoutDeleteOnTermination(t *testing.T, s *sim, c *Client) provider.ENI {
	t.Helper()
	e, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
	if err != nil {
		t.Fatal(err)
	}
	ni, _ := s.local.Cloud.NetworkInterface(e.ID)
	if _, err := s.raw(t).ModifyNetworkInterfaceAttribute(t.Context(), &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: aws.String(e.ID),
		Attachment:         &types.NetworkInterfaceAttachmentChanges{AttachmentId: aws.String(ni.AttachmentID), DeleteOnTermination: aws.Bool(false)},
	}); err != nil {
		t.Fatal(err)
	}
	return e
}
