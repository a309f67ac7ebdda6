package datastore

import (
	"github.com/vpcip/vpcip/provider"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

var slash80 = netip.MustParsePrefix("2600:1f14:1:2:3::/80")

// v6node is a store in IPv6 mode: the primary ENI holds one /80.
func v6node(cooldown time.Duration) *Store {
	s := New(cooldown)
	s.Cloud().Sync([]provider.ENI{{ID: "eni-a", DeviceNumber: 0, PrimaryIP: netip.MustParseAddr("10.0.0.10"),
		IPv6Prefixes: []netip.Prefix{slash80}}}, t0)
	return s
}

// TestLazySlotHandsOutDistinctAddresses: a /80 gives every key its own
// address, lowest first after the prefix's first, without listing the 2^48
// (a store that enumerated the slot would not return), and the counts
// count only what was handed out.
func TestLazySlotHandsOutDistinctAddresses(t *testing.T) {
	s := v6node(30 * time.Second)
	seen := map[netip.Addr]bool{}
	for i := range 300 {
		a := mustAssign(t, s, "c"+strconv.Itoa(i), t0)
		if !slash80.Contains(a.Address) || seen[a.Address] || a.ENIID != "eni-a" {
			t.Fatalf("Assign %d = %s on %q (seen %v), want a new address of %s on eni-a", i, a.Address, a.ENIID, seen[a.Address], slash80)
		}
		seen[a.Address] = true
	}
	first := mustAssign(t, s, "c0", t0) // idempotent
	if want := netip.MustParseAddr("2600:1f14:1:2:3::1"); first.Address != want {
		t.Errorf("first address %s, want %s", first.Address, want)
	}
	if c := s.Counts(t0); c.Assigned != 300 || c.Total != 300 || c.Slots != 1 {
		t.Errorf("counts %+v, want 300 assigned of 300 known in one slot", c)
	}
}

// TestLazySlotCooldownAndRelease: a released address of the /80 is not
// reused, within its cooldown or after it (the next address is handed out:
// a /80 never runs short, and an old pod's conntrack entries never meet a
// new pod), it is forgotten once cooled down, and the pool can never mark
// the /80 for release.
func TestLazySlotCooldownAndRelease(t *testing.T) {
	s := v6node(30 * time.Second)
	a := mustAssign(t, s, "a", t0)
	if _, ok := s.Release(key("a"), t0); !ok {
		t.Fatal("Release(a) released nothing")
	}
	b := mustAssign(t, s, "b", t0.Add(time.Second))
	if b.Address == a.Address {
		t.Errorf("address %s reused within its cooldown", a.Address)
	}
	c := mustAssign(t, s, "c", t0.Add(time.Minute))
	if c.Address == a.Address || c.Address == b.Address || c.Address.Less(b.Address) {
		t.Errorf("after the cooldown got %s, want the address after %s (not the freed %s)", c.Address, b.Address, a.Address)
	}
	if n := s.Counts(t0.Add(time.Minute)); n.Total != 2 || n.Assigned != 2 {
		t.Errorf("counts %+v: the cooled-down %s should be forgotten", n, a.Address)
	}
	if got := s.Cloud().MarkRelease("eni-a", []netip.Prefix{slash80}, t0.Add(time.Hour)); len(got) != 0 {
		t.Errorf("MarkRelease of the /80 = %v, want nothing: the node keeps it", got)
	}
}

// TestLazySlotSurvivesCheckpointAndHostRecovery: assignments and cooldowns
// in a /80 come back from the checkpoint; without a checkpoint, the host's
// pod routes re-hold their addresses, which are then never handed out.
func TestLazySlotSurvivesCheckpointAndHostRecovery(t *testing.T) {
	s := v6node(30 * time.Second)
	var held []netip.Addr
	for _, c := range []string{"a", "b", "c"} {
		held = append(held, mustAssign(t, s, c, t0).Address)
	}
	s.Release(key("c"), t0)
	st, _ := s.Recovery().Checkpoint(t0)

	r := New(30 * time.Second)
	if err := r.Recovery().Restore(st); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	r.Cloud().Sync([]provider.ENI{{ID: "eni-a", DeviceNumber: 0, IPv6Prefixes: []netip.Prefix{slash80}}}, t0)
	for i, c := range []string{"a", "b"} {
		if a, ok := r.Get(key(c)); !ok || a.Address != held[i] || a.ENIID != "eni-a" {
			t.Errorf("restored %s = %v (%v), want %s on eni-a", c, a.Address, ok, held[i])
		}
	}
	if d := mustAssign(t, r, "d", t0.Add(time.Second)); d.Address == held[2] {
		t.Errorf("restored cooldown of %s not kept", held[2])
	}

	lost := v6node(30 * time.Second) // checkpoint lost: the host still routes a and b
	rep := lost.Recovery().FromHost([]HostRoute{
		{Address: held[0], HostVeth: "enia", Sandbox: key("a")},
		{Address: held[1], HostVeth: "enib"},
	}, t0)
	if len(rep.Recovered) != 2 {
		t.Fatalf("FromHost recovered %v, want both routed addresses", rep.Recovered)
	}
	for i := range 5 {
		a := mustAssign(t, lost, "n"+strconv.Itoa(i), t0)
		if a.Address == held[0] || a.Address == held[1] {
			t.Fatalf("handed out %s, which the host routes to a pod", a.Address)
		}
	}
}
