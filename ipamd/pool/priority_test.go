package pool

import (
	"net/netip"
	"testing"

	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/warmpool"
)

// TestPlanPriorityOnlyUrgentWhenPodsOutnumberFreeAddresses: growth is
// pod-waiting only while more pods wait (ADDs, or pods bound without an
// address) than the pool has free; pods the free addresses serve leave it
// a refill, so a fleet's shared budget serves other nodes' waiting pods first.
func TestPlanPriorityOnlyUrgentWhenPodsOutnumberFreeAddresses(t *testing.T) {
	slot := func(addr string, assigned, cooling int) warmpool.Slot {
		return warmpool.Slot{Prefix: netip.PrefixFrom(netip.MustParseAddr(addr), 32), Assigned: assigned, Cooling: cooling}
	}
	// Two free addresses: one assigned, one cooling, two free.
	enis := []warmpool.ENI{{ID: "eni-1", Primary: true, Slots: []warmpool.Slot{
		slot("10.0.0.1", 1, 0), slot("10.0.0.2", 0, 1), slot("10.0.0.3", 0, 0), slot("10.0.0.4", 0, 0),
	}}}
	grow := warmpool.Plan{Action: warmpool.CreateENI, Count: 9}
	for _, c := range []struct {
		name                 string
		pending, unaddressed int
		plan                 warmpool.Plan
		want                 provider.Priority
	}{
		{"no pod waits", 0, 0, grow, provider.PriorityRefill},
		{"two pods bound, two free addresses", 0, 2, grow, provider.PriorityRefill},
		{"three pods bound, two free addresses", 0, 3, grow, provider.PriorityPodWaiting},
		{"three ADDs waiting, two free", 3, 1, grow, provider.PriorityPodWaiting},
		{"release while pods wait", 5, 5, warmpool.Plan{Action: warmpool.Release}, provider.PriorityRelease},
		{"ENI deletion", 0, 0, warmpool.Plan{Action: warmpool.DeleteENI}, provider.PriorityRelease},
	} {
		in := warmpool.Input{ENIs: enis, Pending: c.pending, Demand: warmpool.Demand{Unaddressed: c.unaddressed}}
		if got := planPriority(in, c.plan); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	in := warmpool.Input{Pending: 1}
	if got := planPriority(in, grow); got != provider.PriorityPodWaiting {
		t.Errorf("an ADD waiting on a node with no ENI slot: %s, want pod-waiting", got)
	}
}
