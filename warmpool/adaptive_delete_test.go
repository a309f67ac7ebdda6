package warmpool

import (
	"testing"
	"time"
)

// TestAdaptiveDeleteENINotUndoneAtOnce: the adaptive policy deletes an
// empty ENI (attached long ago, no growth for ENIDeleteDelay) only if the
// targets hold without it. Without its room a refill needs a new ENI
// (ENILatency, not AssignLatency), which widens the margin while pods
// arrive; the deletion must count that, or the next call creates an ENI
// again (a delete and a create: five EC2 calls for nothing). Secondary-IP
// and prefix mode, 1 to 6 recent arrivals, 1 to 6 free addresses.
func TestAdaptiveDeleteENINotUndoneAtOnce(t *testing.T) {
	for _, prefix := range []bool{false, true} {
		for arrivals := 1; arrivals <= 6; arrivals++ {
			for free := 1; free <= 6; free++ {
				lim := Limits{MaxENIs: 3, SlotsPerENI: 10, PrefixSupported: prefix}
				s := newSim(lim, Config{PrefixDelegation: prefix, Adaptive: true})
				now := t0.Add(8 * time.Hour)
				s.in.ENIs[0].Slots = s.newSlots(10, false)
				for i := free; i < 10; i++ {
					s.in.ENIs[0].Slots[i].Assigned = 1
				}
				s.in.ENIs = append(s.in.ENIs, ENI{ID: "eni-01", Attached: t0})
				s.in.LastGrow = t0
				for i := range arrivals { // one every 3 s, the last 3 s ago
					at := now.Add(-time.Duration(arrivals-i) * 3 * time.Second)
					s.in.Demand.History = s.in.Demand.History.Record(at).Observe(at, 10-free)
				}
				s.in.Now = now
				del := Next(s.in)
				if del.Action != DeleteENI {
					continue
				}
				if err := s.apply(del); err != nil {
					t.Fatal(err)
				}
				if p := Next(s.in); p.Action == CreateENI || p.Action == Assign {
					t.Errorf("prefix %v, %d arrivals, %d free: %s\n  then %v: %s", prefix, arrivals, free, del.Reason, p.Action, p.Reason)
				}
			}
		}
	}
}
