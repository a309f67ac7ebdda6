package datastore

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/checkpoint"
	"github.com/vpcip/vpcip/provider"
)

func route(addr, veth, sandbox string) HostRoute {
	r := HostRoute{Address: netip.MustParseAddr(addr), HostVeth: veth}
	if sandbox != "" {
		r.Sandbox = key(sandbox)
	}
	return r
}

// A stale checkpoint (kind 3): it says c1 holds .11, but .11 now belongs to
// c3, whose veth the host routes it to. Restoring it must not let a GC that
// frees c1's key hand .11 to c4 while c3 uses it.
func TestFromHostRepairsAStaleCheckpoint(t *testing.T) {
	s := New(0)
	stale := checkpoint.State{Version: checkpoint.Version, Assignments: []checkpoint.Assignment{
		{Key: key("c1"), Address: netip.MustParseAddr("10.0.0.11"), AssignedAt: t0},
	}}
	if err := s.Recovery().Restore(stale); err != nil {
		t.Fatal(err)
	}
	s2 := node(t, 0) // the ENIs as EC2 shows them
	s.Cloud().Sync(s2ENIs(s2), t0)
	rep := s.Recovery().FromHost([]HostRoute{route("10.0.0.11", "eni3", "c3")}, t0.Add(time.Hour))
	if len(rep.Conflicts) != 1 || rep.Conflicts[0].Recorded != key("c1") || rep.Conflicts[0].Now != key("c3") {
		t.Fatalf("conflicts = %+v, want .11 moved from c1 to c3", rep.Conflicts)
	}
	if a, ok := s.Get(key("c3")); !ok || a.Address != netip.MustParseAddr("10.0.0.11") {
		t.Errorf("c3 holds %v (%v), want 10.0.0.11", a.Address, ok)
	}
	if _, ok := s.Get(key("c1")); ok {
		t.Errorf("c1 still holds an address")
	}
	released := s.Collector().GC("vpcip", map[api.Key]bool{key("c3"): true}, 0, t0.Add(2*time.Hour))
	if len(released) != 0 {
		t.Errorf("GC released %v", released)
	}
	if a := mustAssign(t, s, "c4", t0.Add(2*time.Hour)); a.Address == netip.MustParseAddr("10.0.0.11") {
		t.Errorf("c4 was given 10.0.0.11, which c3 uses")
	}
}

func TestFromHost(t *testing.T) {
	t.Run("free address routed to a marked veth is held for its sandbox", func(t *testing.T) {
		s := node(t, 0)
		rep := s.Recovery().FromHost([]HostRoute{route("10.0.0.12", "enia", "c7")}, t0)
		if a, ok := s.Get(key("c7")); !ok || a.Address != netip.MustParseAddr("10.0.0.12") || len(rep.Recovered) != 1 {
			t.Errorf("c7 holds %v (%v), report %+v", a.Address, ok, rep)
		}
	})
	t.Run("free address routed to an unmarked veth gets a placeholder", func(t *testing.T) {
		s := node(t, 0)
		s.Recovery().FromHost([]HostRoute{route("10.0.0.12", "enia", "")}, t0)
		h, ok := s.Holder(netip.MustParseAddr("10.0.0.12"))
		if !ok || !h.Recovered || h.HostVeth != "enia" {
			t.Errorf("holder %+v (%v), want a placeholder on enia", h, ok)
		}
	})
	t.Run("a placeholder whose veth is now marked moves to the sandbox", func(t *testing.T) {
		s := node(t, 0)
		s.Recovery().FromHost([]HostRoute{route("10.0.0.12", "enia", "")}, t0)
		rep := s.Recovery().FromHost([]HostRoute{route("10.0.0.12", "enia", "c8")}, t0)
		if a, ok := s.Get(key("c8")); !ok || a.Address != netip.MustParseAddr("10.0.0.12") || len(rep.Identified) != 1 {
			t.Errorf("c8 holds %v (%v), report %+v", a.Address, ok, rep)
		}
	})
	t.Run("consistent holder is left alone", func(t *testing.T) {
		s := node(t, 0)
		a := mustAssign(t, s, "c1", t0)
		rep := s.Recovery().FromHost([]HostRoute{route(a.Address.String(), "enia", "c1")}, t0)
		if len(rep.Conflicts)+len(rep.Recovered)+len(rep.Identified) != 0 {
			t.Errorf("report %+v, want nothing", rep)
		}
	})
	t.Run("a sandbox already holding another address: the routed one gets a placeholder", func(t *testing.T) {
		s := node(t, 0)
		mustAssign(t, s, "c1", t0) // .11
		rep := s.Recovery().FromHost([]HostRoute{route("10.0.0.12", "enib", "c1")}, t0)
		h, ok := s.Holder(netip.MustParseAddr("10.0.0.12"))
		if !ok || !h.Recovered || len(rep.Recovered) != 1 {
			t.Errorf("holder of .12 %+v (%v), want a placeholder", h, ok)
		}
		if a, _ := s.Get(key("c1")); a.Address != netip.MustParseAddr("10.0.0.11") {
			t.Errorf("c1 moved to %v", a.Address)
		}
	})
}

// s2ENIs turns a store's ENIs back into the provider's view.
func s2ENIs(s *Store) []provider.ENI {
	var out []provider.ENI
	for _, e := range s.ENIs() {
		pe := provider.ENI{ID: e.ID, DeviceNumber: e.DeviceNumber, PrimaryIP: e.PrimaryIP}
		for _, sl := range e.Slots {
			pe.SecondaryIPs = append(pe.SecondaryIPs, sl.Addr())
		}
		out = append(out, pe)
	}
	return out
}

// Generations keep rising across a restore, so a copy of an older file is
// older than the state that outlived it.
func TestGenerationContinuesAcrossRestore(t *testing.T) {
	s := node(t, 0)
	mustAssign(t, s, "c1", t0)
	st, gen := s.Recovery().Checkpoint(t0)
	if st.Generation != gen || gen == 0 {
		t.Fatalf("checkpoint generation %d, store %d", st.Generation, gen)
	}
	r := New(0)
	if err := r.Recovery().Restore(st); err != nil {
		t.Fatal(err)
	}
	if r.Generation() <= gen {
		t.Errorf("restored generation %d, want above %d", r.Generation(), gen)
	}
}
