package awsprovider

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// TestDeviceIndexReadFailsAfterCreate: when the describe for the device
// number fails after CreateNetworkInterface made the ENI, the ENI is
// deleted and the failure returned; nothing is left in EC2.
func TestDeviceIndexReadFailsAfterCreate(t *testing.T) {
	s, c := budgetClient(t, &recordingBudget{})
	before := len(s.local.Cloud.NetworkInterfaces())
	s.local.Cloud.Faults().FailNext("DescribeNetworkInterfaces", "UnauthorizedOperation")
	_, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2})
	if !errors.Is(err, provider.ErrUnauthorized) {
		t.Fatalf("CreateENI = %v, want ErrUnauthorized", err)
	}
	if n := s.local.Cloud.Faults().Calls("DeleteNetworkInterface"); n != 1 {
		t.Errorf("%d DeleteNetworkInterface, want 1", n)
	}
	if got := len(s.local.Cloud.NetworkInterfaces()); got != before {
		t.Errorf("%d ENIs left in EC2 after the rollback", got-before)
	}
	// The next create works and takes device 1.
	e, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 2})
	if err != nil || e.DeviceNumber != 1 {
		t.Fatalf("next CreateENI = %+v, %v", e, err)
	}
}

// TestConcurrentCreatesWithABudget: concurrent CreateENI calls on one
// client with a shared budget each get their own device number and each
// step's token once.
func TestConcurrentCreatesWithABudget(t *testing.T) {
	budget := &recordingBudget{delay: 20 * time.Millisecond}
	_, c := budgetClient(t, budget)
	const n = 3
	var wg sync.WaitGroup
	devs := make(chan int, n)
	for range n {
		wg.Go(func() {
			e, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
			if err != nil {
				t.Error(err)
				return
			}
			devs <- e.DeviceNumber
		})
	}
	wg.Wait()
	close(devs)
	seen := map[int]bool{}
	for d := range devs {
		if seen[d] {
			t.Errorf("device %d twice", d)
		}
		seen[d] = true
	}
	for _, a := range []string{"CreateNetworkInterface", "AttachNetworkInterface", "ModifyNetworkInterfaceAttribute"} {
		if _, k := budget.first(a); k != n {
			t.Errorf("%s: %d takes, want %d", a, k, n)
		}
	}
}

// shortAttachBudget has no room for the first n attaches, then lets all through.
type shortAttachBudget struct {
	mu sync.Mutex
	n  int
	k  map[string]int
}

func (b *shortAttachBudget) Take(_ context.Context, action string, p provider.Priority) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.k[action]++
	if action == "AttachNetworkInterface" && b.n > 0 {
		b.n--
		return &provider.BudgetShortError{Action: action, Priority: p, Wait: 50 * time.Millisecond}
	}
	return nil
}

func (*shortAttachBudget) Refused(string) {}

// TestAttachShortAfterCreate: the budget has no room for the attach after
// the create was made: the attach waits for room, the ENI is made once and
// attached, nothing is deleted.
func TestAttachShortAfterCreate(t *testing.T) {
	budget := &shortAttachBudget{n: 2, k: map[string]int{}}
	s, c := budgetClient(t, budget)
	e, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := s.local.Cloud.Faults()
	if f.Calls("CreateNetworkInterface") != 1 || f.Calls("AttachNetworkInterface") != 1 || f.Calls("DeleteNetworkInterface") != 0 {
		t.Errorf("calls: %v", f.CallCounts())
	}
	if budget.k["AttachNetworkInterface"] != 3 || budget.k["ModifyNetworkInterfaceAttribute"] != 1 {
		t.Errorf("takes: %v", budget.k)
	}
	if got, _ := s.local.Cloud.NetworkInterface(e.ID); got.InstanceID != s.inst.ID {
		t.Errorf("ENI %+v not attached", got)
	}
}

// TestIMDSDownWhileCtxEnds: IMDS answers 503 after an assign and the
// caller's ctx ends before Options.MetadataWait: AssignAddresses returns
// what EC2 added with ErrNotVisible, soon after ctx ends.
func TestIMDSDownWhileCtxEnds(t *testing.T) {
	s := startSim(t)
	c := s.client(t, testOptions(), "")
	e, err := c.CreateENI(t.Context(), provider.CreateENIRequest{Addresses: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.local.Cloud.Faults().SetIMDSStatus(503)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	added, err := c.AssignAddresses(ctx, e.ID, 2, false)
	if !errors.Is(err, provider.ErrNotVisible) || len(added) != 2 {
		t.Fatalf("AssignAddresses = %v, %v; want 2 and ErrNotVisible", added, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s with ctx ending after 500 ms", d)
	}
	t.Log(err)
}
