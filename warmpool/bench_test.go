package warmpool

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// bigNode is a node with 15 ENIs × 50 secondary addresses, assigned
// addresses per ENI as given.
func bigNode(cfg Config, assigned int) Input {
	in := Input{Limits: Limits{MaxENIs: 15, SlotsPerENI: 50}, Config: cfg, Now: t0}
	a := netip.MustParseAddr("10.0.0.1")
	for i := range 15 {
		e := ENI{ID: fmt.Sprintf("eni-%02d", i), Primary: i == 0, Attached: t0.Add(-time.Hour)}
		for j := range 50 {
			sl := Slot{Prefix: netip.PrefixFrom(a, 32)}
			if j < assigned {
				sl.Assigned = 1
			}
			e.Slots = append(e.Slots, sl)
			a = a.Next()
		}
		in.ENIs = append(in.ENIs, e)
	}
	return in
}

// BenchmarkNext measures one plan for a node with 15 ENIs × 50 addresses:
// at target (the steady state), with a surplus to release, and short at
// the ENI limit.
func BenchmarkNext(b *testing.B) {
	cases := []struct {
		name string
		in   Input
		want ActionKind
	}{
		{"at-target", bigNode(Config{}, 49), Nothing},
		{"release", bigNode(Config{WarmIPTarget: 5}, 40), Release},
		{"short-at-limit", bigNode(Config{WarmIPTarget: 5}, 50), Nothing},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if p := Next(c.in); p.Action != c.want {
				b.Fatalf("Next = %v (%s); want %v", p.Action, p.Reason, c.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				Next(c.in)
			}
		})
	}
}
