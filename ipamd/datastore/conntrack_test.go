package datastore

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpcip/vpcip/provider"
)

// flushingNode is node with conntrack flush bookkeeping on, as vpcipd runs it.
func flushingNode(t *testing.T, cooldown time.Duration) *Store {
	t.Helper()
	s := New(cooldown)
	s.Conntrack().SetFlushing(true)
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", DeviceNumber: 0, PrimaryIP: netip.MustParseAddr("10.0.0.10"),
		SecondaryIPs: addrs("10.0.0.11", "10.0.0.12")}}, t0)
	return s
}

// With a cooldown: every address the store learns, and every released one
// once its cooldown has passed, is due for one flush; an address handed out
// before it says so; a flush that began before the address was marked again
// does not count.
func TestConntrackFlushDue(t *testing.T) {
	s := flushingNode(t, 30*time.Second)
	due, mark, _ := s.Conntrack().FlushDue(t0)
	if !slices.Equal(due, addrs("10.0.0.11", "10.0.0.12")) {
		t.Fatalf("due at start-up %v, want every free address", due)
	}
	if a := mustAssign(t, s, "c0", t0); !a.Unflushed || a.Address != due[0] {
		t.Errorf("Assign before the start-up flush: %v unflushed %v, want %v unflushed", a.Address, a.Unflushed, due[0])
	}
	s.Conntrack().Flushed(due, mark)
	a := mustAssign(t, s, "c1", t0)
	if a.Unflushed {
		t.Errorf("a flushed address is handed out as unflushed")
	}
	s.Release(key("c1"), t0)
	if due, _, next := s.Conntrack().FlushDue(t0.Add(29 * time.Second)); len(due) != 0 || !next.Equal(t0.Add(30*time.Second)) {
		t.Errorf("while cooling: due %v next %v, want none and the cooldown's end", due, next)
	}
	due, mark, _ = s.Conntrack().FlushDue(t0.Add(31 * time.Second))
	if !slices.Equal(due, []netip.Addr{a.Address}) {
		t.Fatalf("due after the cooldown %v, want %v", due, a.Address)
	}
	// Marked again (a stale rule) while the flush runs: not covered by it.
	s.Conntrack().MarkUnflushed(a.Address)
	s.Conntrack().Flushed(due, mark)
	if again, _, _ := s.Conntrack().FlushDue(t0.Add(32 * time.Second)); !slices.Equal(again, due) {
		t.Errorf("due after a flush that began before the address was marked again: %v, want %v", again, due)
	}
	due, mark, _ = s.Conntrack().FlushDue(t0.Add(32 * time.Second))
	s.Conntrack().Flushed(due, mark)
	if c := mustAssign(t, s, "c3", t0.Add(32*time.Second)); c.Address != a.Address || c.Unflushed {
		t.Errorf("after the flush c3 got %v unflushed %v, want %v flushed", c.Address, c.Unflushed, a.Address)
	}
	if due, _, next := s.Conntrack().FlushDue(t0.Add(32 * time.Second)); len(due) != 0 || !next.IsZero() {
		t.Errorf("nothing left to flush, got due %v next %v", due, next)
	}
}

// Without a cooldown a released address is handed out at once, saying it
// needs a flush first; a flushed one does not.
func TestConntrackFlushNoCooldown(t *testing.T) {
	s := flushingNode(t, 0)
	a := mustAssign(t, s, "c1", t0)
	if !a.Unflushed {
		t.Errorf("an address never flushed is handed out as flushed")
	}
	s.Conntrack().Flushed([]netip.Addr{a.Address}, a.FlushMark)
	s.Release(key("c1"), t0)
	if due, _, _ := s.Conntrack().FlushDue(t0); slices.Contains(due, a.Address) {
		t.Errorf("a released address is due in the background with no cooldown; it is flushed at hand-out")
	}
	again := mustAssign(t, s, "c2", t0)
	if again.Address != a.Address || !again.Unflushed {
		t.Errorf("c2 got %v unflushed %v, want %v unflushed", again.Address, again.Unflushed, a.Address)
	}
}

// An unflushed address that leaves the node stays due until a flush covers
// it: one released to the cloud before the background flush reached it
// (right after its cooldown, or with no cooldown, where only a hand-out
// flushes), and the free addresses of a deleted ENI. EC2 may hand such an
// address to another pod while this node's entries still lead to it.
func TestConntrackFlushOfAddressesLeavingTheNode(t *testing.T) {
	for _, cooldown := range []time.Duration{0, time.Second} {
		s := flushingNode(t, cooldown)
		due, mark, _ := s.Conntrack().FlushDue(t0)
		s.Conntrack().Flushed(due, mark)
		a := mustAssign(t, s, "c1", t0)
		s.Release(key("c1"), t0)
		now := t0.Add(2 * time.Second)
		slot := netip.PrefixFrom(a.Address, 32)
		if got := s.Cloud().MarkRelease("eni-a", []netip.Prefix{slot}, now); len(got) != 1 {
			t.Fatalf("cooldown %v: MarkRelease of %v marked %v", cooldown, slot, got)
		}
		s.Cloud().FinishRelease("eni-a", []netip.Prefix{slot}, true)
		due, mark, _ = s.Conntrack().FlushDue(now)
		if !slices.Equal(due, []netip.Addr{a.Address}) {
			t.Fatalf("cooldown %v: due after releasing unflushed %v to the cloud: %v, want it", cooldown, a.Address, due)
		}
		s.Conntrack().Flushed(due, mark)
		if due, _, _ := s.Conntrack().FlushDue(now); len(due) != 0 {
			t.Errorf("cooldown %v: due after the flush: %v, want none", cooldown, due)
		}
	}
	s := New(0)
	s.Conntrack().SetFlushing(true)
	eniB := provider.ENI{ID: "eni-b", DeviceNumber: 1, PrimaryIP: netip.MustParseAddr("10.0.1.10"), SecondaryIPs: addrs("10.0.1.11")}
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", DeviceNumber: 0, PrimaryIP: netip.MustParseAddr("10.0.0.10")}, eniB}, t0)
	if !s.Cloud().MarkDelete("eni-b") {
		t.Fatal("MarkDelete of an ENI holding no pod refused")
	}
	s.Cloud().FinishDelete("eni-b", true)
	if due, _, _ := s.Conntrack().FlushDue(t0); !slices.Equal(due, addrs("10.0.1.11")) {
		t.Errorf("due after deleting an ENI whose address was never flushed: %v, want 10.0.1.11", due)
	}
}

// TestConntrackFlushOfDepartedSurvivesRestart: an address that left the
// node unflushed is in the checkpoint, and a store restored from it has it
// due for a flush (a restart before the background flush would otherwise
// skip it); once flushed, the next checkpoint no longer lists it. A
// checkpoint without the list (an older daemon's) restores with none due.
func TestConntrackFlushOfDepartedSurvivesRestart(t *testing.T) {
	s := flushingNode(t, 0)
	due, mark, _ := s.Conntrack().FlushDue(t0)
	s.Conntrack().Flushed(due, mark)
	a := mustAssign(t, s, "c1", t0)
	s.Release(key("c1"), t0)
	slot := netip.PrefixFrom(a.Address, 32)
	if got := s.Cloud().MarkRelease("eni-a", []netip.Prefix{slot}, t0); len(got) != 1 {
		t.Fatalf("MarkRelease of %v marked %v", slot, got)
	}
	s.Cloud().FinishRelease("eni-a", []netip.Prefix{slot}, true)
	cp, _ := s.Recovery().Checkpoint(t0)
	if !slices.Equal(cp.Departed, []netip.Addr{a.Address}) {
		t.Fatalf("checkpoint departed %v, want [%v]", cp.Departed, a.Address)
	}
	r := New(0)
	r.Conntrack().SetFlushing(true)
	if err := r.Recovery().Restore(cp); err != nil {
		t.Fatal(err)
	}
	due, mark, _ = r.Conntrack().FlushDue(t0)
	if !slices.Contains(due, a.Address) {
		t.Fatalf("restored store: due %v, want %v among them", due, a.Address)
	}
	r.Conntrack().Flushed(due, mark)
	if cp, _ := r.Recovery().Checkpoint(t0); len(cp.Departed) != 0 {
		t.Errorf("checkpoint after the flush: departed %v, want none", cp.Departed)
	}
	cp.Departed = nil
	old := New(0)
	old.Conntrack().SetFlushing(true)
	if err := old.Recovery().Restore(cp); err != nil {
		t.Fatal(err)
	}
	if due, _, _ := old.Conntrack().FlushDue(t0); slices.Contains(due, a.Address) {
		t.Errorf("restored from a checkpoint without departed addresses: %v due", a.Address)
	}
}
