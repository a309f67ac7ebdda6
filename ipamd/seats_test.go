package ipamd

import (
	"sync"
	"testing"
)

type fixedDemand int

func (d fixedDemand) Demand() int { return int(d) }

// snapshots records what the daemon publishes.
type snapshots struct {
	mu  sync.Mutex
	got []Snapshot
}

func (s *snapshots) PublishStatus(v Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, v)
}

func (s *snapshots) last() (Snapshot, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		return Snapshot{}, 0
	}
	return s.got[len(s.got)-1], len(s.got)
}

// TestKubernetesSeats: the demand the Kubernetes part reports reaches the
// pool's input, and every worker pass publishes a snapshot that agrees with
// the plugin API's status.
func TestKubernetesSeats(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	sink := &snapshots{}
	n.demand, n.sink = fixedDemand(3), sink
	n.start()
	if got := n.d.pool.Input(n.clock.Now()).Demand.Unaddressed; got != 3 {
		t.Errorf("pool input Demand.Unaddressed = %d, want the Kubernetes part's 3", got)
	}
	snap, count := sink.last()
	if count < 2 {
		t.Fatalf("%d snapshots published after start-up and a pool cycle, want ≥ 2", count)
	}
	if !snap.Status.Ready || snap.Instance.ID != n.inst.ID || snap.Limits.MaxENIs != 3 {
		t.Errorf("snapshot: ready %v, instance %q, max ENIs %d; want ready, %q, 3", snap.Status.Ready, snap.Instance.ID, snap.Limits.MaxENIs, n.inst.ID)
	}
	n.mustAdd("c1")
	n.cycle()
	snap, _ = sink.last()
	if st := n.status(); snap.Status.Assigned != 1 || snap.Status.Assigned != st.Assigned || snap.Status.Warm != st.Warm || snap.Status.Capacity != st.Capacity {
		t.Errorf("published %+v, status endpoint %+v", snap.Status, st)
	}
}
