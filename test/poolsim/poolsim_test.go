package poolsim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// TestClockParksGoroutines: a goroutine sleeping on the clock lets events
// due meanwhile run, and resumes at its wake-up time.
func TestClockParksGoroutines(t *testing.T) {
	c := NewClock()
	var woke time.Time
	var seen []bool
	c.At(Epoch.Add(time.Second), func() { seen = append(seen, !woke.IsZero()) })
	c.At(Epoch.Add(3*time.Second), func() { seen = append(seen, !woke.IsZero()) })
	c.Go(func() {
		c.Sleep(2 * time.Second)
		woke = c.Now()
	})
	c.Run(Epoch.Add(time.Hour))
	if !woke.Equal(Epoch.Add(2*time.Second)) || len(seen) != 2 || seen[0] || !seen[1] {
		t.Errorf("woke at %v, events saw it woken %v; want 2s, [false true]", woke.Sub(Epoch), seen)
	}
}

// TestCloudLimitsAndCalls: the cloud refuses beyond the instance's limits
// and counts mutating calls as EC2 bills them (a refused assign counts
// too).
func TestCloudLimitsAndCalls(t *testing.T) {
	c := NewClock()
	cloud := NewCloud(c, InstanceTypes[0], DefaultLatencies, nil) // m5.large: 3 ENIs × 9
	var errs []error
	c.Go(func() {
		ctx := context.Background()
		_, err := cloud.AssignAddresses(ctx, cloud.enis[0].ID, 10, false)
		errs = append(errs, err)
		for range 3 {
			_, err = cloud.CreateENI(ctx, provider.CreateENIRequest{Addresses: 9})
			errs = append(errs, err)
		}
	})
	c.Run(Epoch.Add(time.Hour))
	if !errors.Is(errs[0], provider.ErrAddressLimit) || errs[1] != nil || errs[2] != nil || !errors.Is(errs[3], provider.ErrENILimit) {
		t.Errorf("errors %v; want address limit, nil, nil, ENI limit", errs)
	}
	if by, n := cloud.Calls(); by["CreateNetworkInterface"] != 3 || by["AttachNetworkInterface"] != 3 || by["ModifyNetworkInterfaceAttribute"] != 2 ||
		by["DeleteNetworkInterface"] != 1 || n != 10 { // the refused attach deletes the new ENI again
		t.Errorf("calls %v (%d)", by, n)
	}
	if cloud.Held() != 2*9+2 {
		t.Errorf("held %d; want 20 (two ENIs of 9 and their primaries)", cloud.Held())
	}
}

// gate is a pool that has no address until open.
type gate struct {
	c    *Clock
	open time.Time
}

func (g *gate) Start(context.Context) error                               { return nil }
func (g *gate) Assign(string, time.Time) bool                             { return !g.c.Now().Before(g.open) }
func (g *gate) Release(string, time.Time)                                 {}
func (g *gate) Cycle(context.Context, func() Demand) (next time.Duration) { return time.Minute }

// TestADDWaitsAndKubeletBacksOff: an ADD waits in the daemon up to AddWait;
// without it, a failed ADD is retried by kubelet after 10 s, then 20 s.
func TestADDWaitsAndKubeletBacksOff(t *testing.T) {
	tr := Trace{Duration: time.Hour, Pods: []Pod{{Arrive: 0, Life: time.Minute}}}
	for _, tc := range []struct {
		name     string
		beh      Behaviour
		open     time.Duration
		min, max time.Duration
	}{
		{"waits in the daemon", Behaviour{AddWait: 5 * time.Second}, 2 * time.Second, 2 * time.Second, 2*time.Second + pollEvery},
		{"fails at once, kubelet retries after 10 s", Behaviour{}, 2 * time.Second, 10 * time.Second, 15 * time.Second},
		{"second retry after 20 s more", Behaviour{}, 12 * time.Second, 30 * time.Second, 45 * time.Second},
	} {
		res, err := Simulate(tr, InstanceTypes[0], DefaultLatencies, tc.beh, 1, func(c *Clock, _ *Cloud) (Pool, error) {
			return &gate{c: c, open: c.Now().Add(tc.open)}, nil
		})
		if err != nil || res.Waited != 1 || len(res.Waits) != 1 {
			t.Fatalf("%s: %+v, %v", tc.name, res, err)
		}
		if w := time.Duration(res.Waits[0] * float64(time.Second)); w < tc.min || w > tc.max {
			t.Errorf("%s: waited %v; want %v–%v", tc.name, w, tc.min, tc.max)
		}
	}
}

// TestTracesAreBoundedAndSeeded: every generator is deterministic for a
// seed and never binds more pods than the node's capacity.
func TestTracesAreBoundedAndSeeded(t *testing.T) {
	for _, g := range Generators {
		a, b := g.Trace(7, 56), g.Trace(7, 56)
		if len(a.Pods) == 0 || len(a.Pods) != len(b.Pods) || a.Pods[len(a.Pods)-1] != b.Pods[len(b.Pods)-1] {
			t.Errorf("%s: not deterministic or empty (%d, %d pods)", g.Name, len(a.Pods), len(b.Pods))
		}
		var ends []time.Duration
		for _, p := range a.Pods {
			n := 0
			for _, e := range ends {
				if e > p.Arrive {
					n++
				}
			}
			if n >= 56 {
				t.Fatalf("%s: pod at %v arrives with %d running", g.Name, p.Arrive, n)
			}
			ends = append(ends, p.Arrive+p.Life)
		}
	}
}
