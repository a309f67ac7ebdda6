package ec2budget

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/vpcip/vpcip/provider"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// attach is a shared AttachNetworkInterface bucket at 80 % of AWS's: 40
// requests, 4 a second.
var attach = Limit{Capacity: 40, RefillPerSecond: 4}

func TestTakeRefillsUpToCapacity(t *testing.T) {
	s := State{Capacity: 40, RefillPerSecond: 4, Tokens: 10, At: t0}
	next, wait, ok := s.Take(attach, t0.Add(5*time.Second), provider.PriorityRefill)
	if !ok || wait != 0 || next.Tokens != 29 || !next.At.Equal(t0.Add(5*time.Second)) {
		t.Errorf("after 5 s at 4/s from 10: %+v wait %v ok %v; want 29 tokens left, now", next, wait, ok)
	}
	next, _, _ = s.Take(attach, t0.Add(time.Hour), provider.PriorityRefill)
	if next.Tokens != 39 {
		t.Errorf("after an hour: %v tokens left, want capacity 40 - 1", next.Tokens)
	}
	// A clock behind the stored time refills nothing and does not move At back.
	next, _, _ = s.Take(attach, t0.Add(-time.Second), provider.PriorityPodWaiting)
	if next.Tokens != 9 || !next.At.Equal(t0) {
		t.Errorf("clock behind: %+v, want 9 tokens at t0", next)
	}
}

// TestReserves: each priority may take only while the bucket stays above
// its reserve; the refused get how long until they could.
func TestReserves(t *testing.T) {
	s := State{Capacity: 40, RefillPerSecond: 4, Tokens: 15, At: t0} // 37.5 % full
	for _, c := range []struct {
		p    provider.Priority
		ok   bool
		wait time.Duration
	}{
		{provider.PriorityPodWaiting, true, 0},
		{provider.PriorityRefill, true, 0},                         // 14 ≥ 10
		{provider.PriorityRelease, false, 1500 * time.Millisecond}, // needs 21: 6 more at 4/s
		{provider.PriorityBackground, false, 4 * time.Second},      // needs 31: 16 more
	} {
		_, wait, ok := s.Take(attach, t0, c.p)
		if ok != c.ok || wait != c.wait {
			t.Errorf("%s at 15 of 40: ok %v wait %v, want %v %v", c.p, ok, wait, c.ok, c.wait)
		}
	}
}

// TestPodWaitingQueuesInDebt: pod-waiting calls take past zero, each told
// to wait until the refill has paid for it (first come, first served), up
// to QueueSpan of refill in debt (a minute at 4 a second: 240, six buckets);
// then they are refused too, and lower priorities wait until the debt is
// paid and their reserve restored.
func TestPodWaitingQueuesInDebt(t *testing.T) {
	s := State{Capacity: 40, RefillPerSecond: 4, Tokens: 1, At: t0}
	var waits []time.Duration
	for range 241 {
		next, wait, ok := s.Take(attach, t0, provider.PriorityPodWaiting)
		if !ok {
			t.Fatalf("refused at %v tokens", s.Tokens)
		}
		waits = append(waits, wait)
		s = next
	}
	if s.Tokens != -240 {
		t.Fatalf("%v tokens after 241 takes from 1, want -240", s.Tokens)
	}
	if waits[0] != 0 || waits[1] != 250*time.Millisecond || waits[240] != time.Minute {
		t.Errorf("waits %v %v … %v, want 0, 250ms … 1m (one request per 1/4 s)", waits[0], waits[1], waits[240])
	}
	if _, wait, ok := s.Take(attach, t0, provider.PriorityPodWaiting); ok || wait != 250*time.Millisecond {
		t.Errorf("beyond a minute of debt: ok %v wait %v, want refused for 250ms", ok, wait)
	}
	if _, wait, ok := s.Take(attach, t0, provider.PriorityRefill); ok || wait != time.Duration(251.0/4*float64(time.Second)) {
		t.Errorf("refill under debt: ok %v wait %v, want refused for (240 debt + 10 reserve + 1)/4 s", ok, wait)
	}
	// A bucket refilled slowly still queues at least its capacity.
	slow := Limit{Capacity: 40, RefillPerSecond: 0.5}
	if d := MaxDebt(slow); d != 40 {
		t.Errorf("MaxDebt at 0.5/s: %v, want the capacity 40", d)
	}
}

func TestRefusedEmptiesButKeepsDebt(t *testing.T) {
	full := Full(attach, t0)
	if r := full.Refused(attach, t0.Add(time.Second)); r.Tokens != 0 || !r.At.Equal(t0.Add(time.Second)) {
		t.Errorf("refused from full: %+v, want 0 tokens now", r)
	}
	debt := State{Capacity: 40, RefillPerSecond: 4, Tokens: -8, At: t0}
	if r := debt.Refused(attach, t0.Add(time.Second)); r.Tokens != -4 {
		t.Errorf("refused in debt: %v tokens, want the refilled -4 kept", r.Tokens)
	}
}

func TestEncodeDecode(t *testing.T) {
	s := State{Capacity: 40, RefillPerSecond: 4, Tokens: -2.5, At: t0.Add(123456789)}
	got, err := Decode(s.Encode())
	if err != nil || got != s {
		t.Errorf("round trip %+v, %v; want %+v", got, err, s)
	}
	for _, bad := range []string{"", "{", `{"capacity":40}`, `{"tokens":"x","at":"2026-01-01T00:00:00Z"}`} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
}

func TestSharedFiguresAreAShareOfAWSs(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without a client accepted")
	}
	b, err := New(Options{Client: fake.NewClientset(), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := b.Limits()
	if l["AttachNetworkInterface"] != attach || l["AssignPrivateIpAddresses"] != (Limit{Capacity: 80, RefillPerSecond: 4}) {
		t.Errorf("default share of AWS's buckets: %+v", l)
	}
	// Shards split it: together they hold the share, never more.
	b, err = New(Options{Client: fake.NewClientset()})
	if err != nil {
		t.Fatal(err)
	}
	if l := b.Limits(); l["AttachNetworkInterface"] != (Limit{Capacity: 40.0 / DefaultShards, RefillPerSecond: 4.0 / DefaultShards}) {
		t.Errorf("one of %d shards of the default share of AWS's attach bucket: %+v", DefaultShards, l["AttachNetworkInterface"])
	}
	for _, n := range []int{-1, MaxShards + 1} {
		if _, err := New(Options{Client: fake.NewClientset(), Shards: n}); err == nil {
			t.Errorf("%d shards accepted", n)
		}
	}
	if _, ok := l["DescribeNetworkInterfaces"]; ok {
		t.Error("describes are shared; they should be paced locally")
	}
	if _, err := New(Options{Client: fake.NewClientset(), Share: 1.5}); err == nil {
		t.Error("share 1.5 accepted")
	}
}

// TestShardsNeverHoldMoreThanTheShare: a shard holds at least one request
// (a bucket under one never serves), so with more shards than the share has
// requests the shards are fewer: together they never exceed the share. On
// the old code 16 shards of 10 % of the attach bucket (5 requests) held 16.
func TestShardsNeverHoldMoreThanTheShare(t *testing.T) {
	for _, c := range []struct {
		share  float64
		shards int
	}{{0.1, 16}, {0.8, MaxShards}, {1, 64}} {
		b, err := New(Options{Client: fake.NewClientset(), Share: c.share, Shards: c.shards, NodeName: "node-1"})
		if err != nil {
			t.Fatal(err)
		}
		for a, l := range AWSLimits() {
			if sum := b.Limits()[a].Capacity * float64(b.o.Shards); sum > l.Capacity*c.share+1e-9 {
				t.Errorf("share %v over %d shards: %s's shards hold %v requests, the share %v", c.share, c.shards, a, sum, l.Capacity*c.share)
			}
		}
		if b.Home() >= b.o.Shards {
			t.Errorf("home shard %d of %d", b.Home(), b.o.Shards)
		}
	}
}
