package ipamd

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/provider"
)

// fakePods stands in for the Kubernetes part's facts: the pods bound to the
// node that need an address, and the keys whose pod the API server lost.
type fakePods struct {
	mu      sync.Mutex
	pending []api.Pod // bound here, need an address
	gone    []api.Key
	changed chan struct{}
}

func newFakePods(pending ...api.Pod) *fakePods {
	return &fakePods{pending: pending, changed: make(chan struct{}, 1)}
}

func (f *fakePods) Unaddressed(holds func(api.Pod) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, p := range f.pending {
		if !holds(p) {
			n++
		}
	}
	return n
}

func (f *fakePods) PodsGone() []api.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.gone)
}

func (f *fakePods) Changed() <-chan struct{} { return f.changed }

func (f *fakePods) setGone(keys ...api.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone = keys
}

// snapshots records what the daemon publishes.
type snapshots struct {
	mu  sync.Mutex
	got []nodestatus.Snapshot
}

func (s *snapshots) PublishStatus(v nodestatus.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, v)
}

func (s *snapshots) last() (nodestatus.Snapshot, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		return nodestatus.Snapshot{}, 0
	}
	return s.got[len(s.got)-1], len(s.got)
}

// TestKubernetesSeats: the pods the Kubernetes part reports without an
// address reach the pool's input, less those the datastore holds one for;
// every worker pass publishes a snapshot whose counts are the plugin API's
// status and which lists the attachments held; the part's change signal
// wakes the worker.
func TestKubernetesSeats(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	sink := &snapshots{}
	pods := newFakePods(api.Pod{Namespace: "default", Name: "p-c1"}, api.Pod{Namespace: "default", Name: "p-x"}, api.Pod{Namespace: "other", Name: "p-c1"})
	n.pods, n.sink = pods, sink
	n.start()
	if got := n.d.pool.Input(n.clock.Now()).Demand.Unaddressed; got != 3 {
		t.Errorf("pool input Demand.Unaddressed = %d, want the Kubernetes part's 3", got)
	}
	snap, count := sink.last()
	if count < 2 {
		t.Fatalf("%d snapshots published after start-up and a pool cycle, want ≥ 2", count)
	}
	if !snap.Status.Ready || snap.Instance.ID != n.inst.ID || snap.Limits.MaxENIs != 3 || snap.CheckpointSchema == 0 {
		t.Errorf("snapshot: ready %v, instance %q, max ENIs %d, schema %d; want ready, %q, 3, the checkpoint's",
			snap.Status.Ready, snap.Instance.ID, snap.Limits.MaxENIs, snap.CheckpointSchema, n.inst.ID)
	}
	n.mustAdd("c1") // pod default/p-c1
	n.cycle()
	if got := n.d.pool.Input(n.clock.Now()).Demand.Unaddressed; got != 2 {
		t.Errorf("Demand.Unaddressed = %d after default/p-c1 got its address, want 2", got)
	}
	snap, count = sink.last()
	if st := n.status(); snap.Status.Assigned != 1 || snap.Status.Counts != st.Counts {
		t.Errorf("published %+v, status endpoint %+v", snap.Status.Counts, st.Counts)
	}
	if want := []nodestatus.Held{{Key: key("c1"), Pod: api.Pod{Namespace: "default", Name: "p-c1"}}}; !slices.Equal(snap.Held, want) {
		t.Errorf("published Held %+v, want %+v", snap.Held, want)
	}
	pods.changed <- struct{}{}
	waitUntil(t, 10*time.Second, "a pass after the change signal", func() bool { _, c := sink.last(); return c > count })
}

// waitUntil polls cond every 10 ms until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
	}
}

// ruleProbeHost is memHost whose RemovePodRules records whether the address
// was still held when its rules went, and fails while fail is set.
type ruleProbeHost struct {
	*memHost
	n            *node
	pmu          sync.Mutex // guards the fields below
	fail         bool
	heldAtRemove []bool
}

func (h *ruleProbeHost) RemovePodRules(a netip.Addr) (int, error) {
	_, held := h.n.d.store.Holder(a)
	h.pmu.Lock()
	h.heldAtRemove = append(h.heldAtRemove, held)
	fail := h.fail
	h.pmu.Unlock()
	if fail {
		return 0, errors.New("netlink: operation not permitted")
	}
	return h.memHost.RemovePodRules(a)
}

func (h *ruleProbeHost) setFail(fail bool) {
	h.pmu.Lock()
	defer h.pmu.Unlock()
	h.fail = fail
}

// TestPodsGoneReleasedThroughTheHostPath: an address whose pod the
// Kubernetes part confirmed gone is released by the daemon's one release
// path for pods gone without a DEL: only when no host route leads to it,
// its pod rules removed first while it is still held, and kept held while
// they cannot be removed. The part's change signal is enough to run it.
func TestPodsGoneReleasedThroughTheHostPath(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	host := &ruleProbeHost{memHost: newMemHost(), n: n}
	pods := newFakePods()
	n.host, n.pods = host, pods
	n.start()
	live, gone := n.mustAdd("live"), n.mustAdd("gone")
	host.wire(live.Address, "eni-live")
	// "live" is absent from the API server but its veth is on the host (a
	// sandbox the API server never knew); "gone" left no trace.
	pods.setGone(key("live"), key("gone"))
	host.setFail(true)
	n.cycle(func(context.Context) { n.d.work.gone.run() })
	if _, held := n.d.store.Get(key("gone")); !held {
		t.Fatal("released though its pod rules could not be removed")
	}
	host.setFail(false)
	pods.changed <- struct{}{}
	waitUntil(t, 10*time.Second, "gone's address released after the change signal", func() bool {
		_, held := n.d.store.Get(key("gone"))
		return !held
	})
	if _, held := n.d.store.Get(key("live")); !held {
		t.Error("live's address released while the host routes it to a veth")
	}
	host.mu.Lock()
	removed := slices.Clone(host.rulesRemoved)
	host.mu.Unlock()
	if !slices.Contains(removed, gone.Address) {
		t.Errorf("pod rules of %s not removed: %v", gone.Address, removed)
	}
	if slices.Contains(removed, live.Address) {
		t.Errorf("pod rules of the routed %s removed", live.Address)
	}
	host.pmu.Lock()
	defer host.pmu.Unlock()
	for i, held := range host.heldAtRemove {
		if !held {
			t.Errorf("rule removal %d ran after the release", i)
		}
	}
	if v := testutil.ToFloat64(n.d.work.gone.metrics.leaksReleased); v != 1 {
		t.Errorf("vpcip_leaked_addresses_released_total = %v, want 1", v)
	}
}

// TestStatusPublishedWhileStarting: while start-up still waits for the cloud
// the status sink already has a snapshot saying the daemon is not ready, so
// the node's AddressBudget shows it starting rather than nothing.
func TestStatusPublishedWhileStarting(t *testing.T) {
	c := startCloud(t)
	n := newNode(t, c, itypeSmall, nil)
	gate := make(chan struct{})
	n.wrap = func(p provider.Provider) provider.Provider { return &gatedENIs{Provider: p, gate: gate} }
	sink := &snapshots{}
	n.sink = sink
	n.startNoWait()
	waitUntil(t, 10*time.Second, "a snapshot before start-up finished", func() bool { _, c := sink.last(); return c > 0 })
	if snap, _ := sink.last(); snap.Status.Ready {
		t.Errorf("snapshot while the cloud has not answered says ready: %+v", snap.Status)
	}
	close(gate)
	<-n.d.Ready()
	waitUntil(t, 10*time.Second, "a ready snapshot after start-up", func() bool { s, _ := sink.last(); return s.Status.Ready })
}

// livePods is fakePods whose view says whether it is live
// (ipamd/cluster.Cluster.Live).
type livePods struct {
	*fakePods
	live bool
}

func (l livePods) Live() bool { return l.live }

// TestPodDemandLive: the pool's demand from the Kubernetes part is live
// (warmpool.Demand.Bindings) exactly when the part says its view is, and
// not for facts that cannot tell.
func TestPodDemandLive(t *testing.T) {
	for _, c := range []struct {
		facts PodFacts
		want  bool
	}{{livePods{newFakePods(), true}, true}, {livePods{newFakePods(), false}, false}, {newFakePods(), false}} {
		if got := (podDemand{facts: c.facts}).Live(); got != c.want {
			t.Errorf("facts %T live %v: podDemand.Live %v, want %v", c.facts, c.want, got, c.want)
		}
	}
}
