package awsprovider

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/vpcsim"
)

// recordingBudget is a provider.RequestBudget that lets every request
// through after delay, recording when each Take began and at which priority.
type recordingBudget struct {
	delay time.Duration
	mu    sync.Mutex
	takes []budgetTake
}

type budgetTake struct {
	action string
	p      provider.Priority
	at     time.Time
}

func (b *recordingBudget) Take(ctx context.Context, action string, p provider.Priority) error {
	b.mu.Lock()
	b.takes = append(b.takes, budgetTake{action, p, time.Now()})
	b.mu.Unlock()
	return provider.Sleep(ctx, b.delay)
}

func (b *recordingBudget) Refused(string) {}

// budgetClient is a client of a new vpcsim instance calling through budget
// as a fleet's shared one, its identity already read from IMDS.
func budgetClient(t *testing.T, budget provider.RequestBudget) (*sim, *Client) {
	t.Helper()
	s := startSim(t)
	opts := testOptions()
	opts.Budget = budget
	c := s.client(t, opts, "")
	if _, err := c.Self(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func (b *recordingBudget) first(action string) (budgetTake, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	var out budgetTake
	for _, t := range b.takes {
		if t.action == action {
			if n == 0 {
				out = t
			}
			n++
		}
	}
	return out, n
}

// TestCreateENIReservesEachStepWhileTheStepBeforeRuns: with a shared
// budget, the attach's token is asked for as soon as the create holds its
// own, while CreateNetworkInterface runs (and the attribute change's while
// the attach runs), once each and at pod-waiting priority; so a fleet's
// queues for the three steps are waited in parallel, not one after another.
func TestCreateENIReservesEachStepWhileTheStepBeforeRuns(t *testing.T) {
	budget := &recordingBudget{delay: 200 * time.Millisecond}
	s, c := budgetClient(t, budget)
	s.local.Cloud.Faults().SetLatency("CreateNetworkInterface", 300*time.Millisecond, 0)
	s.local.Cloud.Faults().SetLatency("AttachNetworkInterface", 300*time.Millisecond, 0)
	start := time.Now()
	if _, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	create, nc := budget.first("CreateNetworkInterface")
	attach, na := budget.first("AttachNetworkInterface")
	modify, nm := budget.first("ModifyNetworkInterfaceAttribute")
	if nc != 1 || na != 1 || nm != 1 {
		t.Fatalf("takes: create %d, attach %d, modify %d; want one each", nc, na, nm)
	}
	// The attach's take begins when the create's ends (after its 200 ms),
	// not after CreateNetworkInterface's 300 ms.
	if d := attach.at.Sub(create.at); d >= 450*time.Millisecond {
		t.Errorf("attach's take began %s after the create's: after the create call, not during it", d)
	}
	if d := modify.at.Sub(attach.at); d >= 450*time.Millisecond {
		t.Errorf("attribute change's take began %s after the attach's: after the attach call, not during it", d)
	}
	if attach.p != provider.PriorityPodWaiting || modify.p != provider.PriorityPodWaiting {
		t.Errorf("priorities: attach %v, modify %v; want pod-waiting (finishing what the create began)", attach.p, modify.p)
	}
	// In series: 3 takes of 200 ms and two calls of 300 ms ≥ 1.2 s.
	if took >= 1200*time.Millisecond {
		t.Errorf("CreateENI took %s: the steps' budget waits ran in series", took)
	}
}

// refusingBudget refuses every request of one action as a shared budget
// with no room does (nothing sent).
type refusingBudget struct{ action string }

func (b refusingBudget) Take(_ context.Context, action string, p provider.Priority) error {
	if action == b.action {
		return &provider.BudgetShortError{Action: action, Priority: p, Wait: time.Second}
	}
	return nil
}

func (refusingBudget) Refused(string) {}

// TestCreateENIRefusedByTheBudgetCallsNothing: a create the fleet's budget
// has no room for sends no request at all, not even the describe for the
// device number: the pool tries again within a second or so, and in a
// launch those describes were most of the fleet's EC2 requests.
func TestCreateENIRefusedByTheBudgetCallsNothing(t *testing.T) {
	s, c := budgetClient(t, refusingBudget{"CreateNetworkInterface"})
	before := s.local.Cloud.Faults().CallCounts()
	_, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2})
	var short *provider.BudgetShortError
	if !errors.As(err, &short) {
		t.Fatalf("CreateENI = %v, want the budget's refusal", err)
	}
	for op, n := range s.local.Cloud.Faults().CallCounts() {
		if op != vpcsim.IMDSOp && n != before[op] {
			t.Errorf("%s called %d times for a create the budget refused", op, n-before[op])
		}
	}
}

// holdingBudget lets every request through at once except action's, whose
// Take waits until its ctx ends; it reports when that Take returned.
type holdingBudget struct {
	action string
	ended  chan struct{}
}

func (b *holdingBudget) Take(ctx context.Context, action string, _ provider.Priority) error {
	if action != b.action {
		return nil
	}
	<-ctx.Done()
	close(b.ended)
	return ctx.Err()
}

func (*holdingBudget) Refused(string) {}

// TestFailedCreateLeavesNoReservationWaiting: when CreateNetworkInterface
// fails, the attach's token, asked for while the create ran, is no longer
// waited for once CreateENI returns: no goroutine of the call stays in the
// fleet's queue for a step that will never run.
func TestFailedCreateLeavesNoReservationWaiting(t *testing.T) {
	budget := &holdingBudget{action: "AttachNetworkInterface", ended: make(chan struct{})}
	s, c := budgetClient(t, budget)
	s.local.Cloud.Faults().FailNext("CreateNetworkInterface", "InsufficientFreeAddressesInSubnet")
	if _, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2}); !errors.Is(err, provider.ErrSubnetFull) {
		t.Fatalf("CreateENI = %v, want ErrSubnetFull", err)
	}
	select {
	case <-budget.ended:
	case <-time.After(time.Second):
		t.Fatal("1 s after CreateENI failed, its attach's reservation still waits in the budget")
	}
}
