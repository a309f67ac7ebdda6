package cluster_test

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
)

// The tests in this file judge the part's timing (leak grace, publish
// interval, resync, what a never-synced cache does over minutes) on
// client-go's fake clientsets inside a testing/synctest bubble, where time
// is fake: minutes of the part's life take milliseconds, and durations are
// exact. The behaviour against a real kube-apiserver (field selectors, RBAC,
// the CRD's schema and printer columns, Event series, an API server that
// stops) is in the other files.

// fakeEnv is an env on fake clientsets, to be made inside a bubble. The fake
// applies no field selector: every pod its tests create is on this node.
type fakeEnv struct {
	*env
	cs  *fake.Clientset
	dyn *dynamicfake.FakeDynamicClient
}

// newFakeEnv starts a cluster part for node "node-a" (kubelet max-pods 110)
// with opts on fresh fake clientsets, and a fakeDaemon beside it; before
// starting, prepare may add reactors. Objects created get a UID, as the API
// server gives them.
func newFakeEnv(t *testing.T, opts cluster.Options, prepare ...func(*fake.Clientset)) *fakeEnv {
	t.Helper()
	cs := fake.NewClientset()
	var uids atomic.Int64
	cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && o.GetUID() == "" {
			o.SetUID(types.UID(fmt.Sprintf("uid-%d", uids.Add(1))))
		}
		return false, nil, nil
	})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{addressbudget.Resource: "AddressBudgetList"})
	e := &fakeEnv{env: &env{admin: cs, node: "node-a", daemon: newFakeDaemon(m5Snapshot(0)), reg: prometheus.NewRegistry()}, cs: cs, dyn: dyn}
	createNode(t, cs, e.node, 110)
	for _, p := range prepare {
		p(cs)
	}
	opts.NodeName, opts.Metrics, opts.Logger = e.node, e.reg, slog.New(slog.DiscardHandler)
	c, err := cluster.NewWithClients(opts, cs, dyn)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.start()
	t.Cleanup(e.stop)
	return e
}

// statusWrites is how many AddressBudget status writes succeeded.
func (e *fakeEnv) statusWrites() float64 {
	return counter(e.reg, "vpcip_kubernetes_writes_total", "kind", "addressbudget_status", "outcome", "ok")
}

// publishedBudget is the AddressBudget as the fake API server holds it, or nil.
func (e *fakeEnv) publishedBudget(t *testing.T) *addressbudget.AddressBudget {
	ab, err := addressbudget.NewClient(e.dyn).Get(t.Context(), e.node)
	if err != nil {
		return nil
	}
	return ab
}

// waitFor advances fake time in steps of 100 ms until cond holds, at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if !time.Now().Before(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
	}
}

// An attachment whose pod went without a DEL is released after LeakGrace
// (default 2 min) and not before; one whose veth the host still shows is
// kept until the host lets go.
func TestLeakReleasedAfterGraceNotBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace, tick = 2 * time.Minute, time.Second // the defaults
		e := newFakeEnv(t, cluster.Options{})
		ns := "default"
		var held []nodestatus.Held
		for _, name := range []string{"live", "leaked", "stuck"} {
			p := createPod(t, e.admin, ns, podSpec{name: name, node: e.node, podIP: "100.64.1.11", phase: corev1.PodRunning})
			held = append(held, nodestatus.Held{Key: api.Key{Network: "vpcip", ContainerID: "c" + name, IfName: "eth0"},
				Pod: api.Pod{Namespace: ns, Name: name, UID: string(p.UID)}})
		}
		e.daemon.set(func(s *nodestatus.Snapshot) { s.Held, s.Status.Assigned = held, len(held) })
		e.daemon.mu.Lock()
		e.daemon.hostHas["stuck"] = true // its veth is still on the host
		e.daemon.mu.Unlock()
		waitFor(t, 10*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })

		time.Sleep(2 * grace)
		if n := e.daemon.releasedCount(); n != 0 {
			t.Fatalf("%d assignments released while all their pods exist", n)
		}
		if g := gauge(t, e.reg, "vpcip_addresses_without_pod"); g != 0 {
			t.Errorf("vpcip_addresses_without_pod = %v with every pod present, want 0", g)
		}

		// The pods go without a DEL (their node lost them, the runtime crashed).
		deletedAt := time.Now()
		deletePod(t, e.admin, ns, "leaked")
		deletePod(t, e.admin, ns, "stuck")
		waitFor(t, 2*tick, "gauge counts the two assignments without pod", func() bool {
			return gauge(t, e.reg, "vpcip_addresses_without_pod") == 2
		})
		waitFor(t, grace+3*tick, "leaked assignment released", func() bool { return e.daemon.releasedCount() == 1 })
		if waited := time.Since(deletedAt); waited < grace {
			t.Errorf("released %v after the pod went, before the %v grace", waited, grace)
		}
		if r := e.daemon.released[0]; r.Pod.Name != "leaked" {
			t.Errorf("released %s, want leaked (stuck's veth is still on the host)", r.Pod.Name)
		}
		// However long the host keeps stuck's veth, it is not released.
		time.Sleep(time.Hour)
		if n := e.daemon.releasedCount(); n != 1 {
			t.Errorf("%d released after an hour while the host keeps stuck's veth, want 1", n)
		}
		if got := e.c.PodsGone(); len(got) != 1 || got[0].ContainerID != "cstuck" {
			t.Errorf("PodsGone = %v while the host keeps stuck, want [cstuck]", got)
		}
		// The host view goes too: then stuck is released and the gauge is 0.
		e.daemon.mu.Lock()
		delete(e.daemon.hostHas, "stuck")
		e.daemon.mu.Unlock()
		waitFor(t, 2*tick, "stuck released and gauge back to 0", func() bool {
			return e.daemon.releasedCount() == 2 && gauge(t, e.reg, "vpcip_addresses_without_pod") == 0
		})
		if got := e.c.PodsGone(); len(got) != 0 {
			t.Errorf("PodsGone = %v once the daemon holds none of them", got)
		}
	})
}

// A gone pod whose host state stays is confirmed by one live LIST of the
// node's pods and stays reported without another, however long the host
// keeps it (#25 kind 4: before, a LIST per tick, then one per grace).
func TestConfirmedLeakCostsOneLiveListForAnHour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lists atomic.Int64
		e := newFakeEnv(t, cluster.Options{}, func(cs *fake.Clientset) {
			cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				lists.Add(1)
				return false, nil, nil
			})
		})
		stuck := createPod(t, e.admin, "default", podSpec{name: "stuck", node: e.node, podIP: "100.64.1.13", phase: corev1.PodRunning})
		e.holdFor(stuck, "cstuck")
		e.daemon.mu.Lock()
		e.daemon.hostHas["stuck"] = true
		e.daemon.mu.Unlock()
		waitFor(t, 10*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
		before := lists.Load() // the informer's list
		deletePod(t, e.admin, "default", "stuck")
		waitFor(t, 2*time.Minute+3*time.Second, "confirmed gone", func() bool { return len(e.c.PodsGone()) == 1 })
		time.Sleep(time.Hour)
		if n := lists.Load() - before; n != 1 {
			t.Errorf("%d live LISTs of the node's pods in an hour for one gone pod the host keeps; want 1", n)
		}
		if got := e.c.PodsGone(); len(got) != 1 || got[0].ContainerID != "cstuck" {
			t.Errorf("PodsGone = %v while the host keeps it, want [cstuck]", got)
		}
		e.daemon.mu.Lock()
		delete(e.daemon.hostHas, "stuck")
		e.daemon.mu.Unlock()
		waitFor(t, 2*time.Second, "released once the host lets go", func() bool { return e.daemon.releasedCount() == 1 })
	})
}

// The AddressBudget status is written when it changed, at most once per
// PublishInterval (default 15 s) for a change a reader acts on, at most
// once per CountsInterval (default 1 min) when only the counts moved, and
// once per ResyncInterval (default 10 min) when nothing changed.
func TestStatusWrittenOnChangeOncePerIntervalAndOnResync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, counts, resync = 15 * time.Second, time.Minute, 10 * time.Minute // the defaults
		e := newFakeEnv(t, cluster.Options{})
		waitFor(t, 10*time.Second, "first write", func() bool { return e.statusWrites() == 1 })
		first := time.Now()
		if ab := e.publishedBudget(t); ab == nil || len(ab.OwnerReferences) != 1 || ab.OwnerReferences[0].Name != e.node {
			t.Fatalf("AddressBudget %+v, want one owned by the Node", ab)
		}

		// Nothing changes: no write until the resync.
		time.Sleep(resync - 2*time.Second)
		if n := e.statusWrites(); n != 1 {
			t.Errorf("%v status writes in %v with nothing changed, want 1", n, time.Since(first))
		}
		waitFor(t, 3*time.Second, "the resync's write", func() bool { return e.statusWrites() == 2 })

		// A change is written within PublishInterval of the last write (the
		// resync's, just now), and not sooner.
		resynced := time.Now()
		e.daemon.set(func(s *nodestatus.Snapshot) {
			c := &s.Status.Counts
			c.Assigned, c.Warm, c.ENIs, c.Capacity = 20, 7, 3, 27
		})
		waitFor(t, interval+2*time.Second, "change published", func() bool {
			ab := e.publishedBudget(t)
			return ab != nil && ab.Status.Addresses.Assigned == 20 && ab.Status.ENIs.Summary == "3/3"
		})
		if d := time.Since(resynced); d < interval-time.Second {
			t.Errorf("change written %v after the last write, before PublishInterval %v", d, interval)
		}
		st := e.publishedBudget(t).Status
		if c := meta.FindStatusCondition(st.Conditions, addressbudget.ConditionAtENILimit); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("AtENILimit = %+v at 3/3 ENIs", c)
		}
		if err := st.Check(); err != nil {
			t.Error(err)
		}

		// Churn of the counts only, from a CountsInterval after the last
		// write: a change every 100 ms for 5 CountsIntervals is 5 writes.
		time.Sleep(counts)
		before := e.statusWrites()
		start := time.Now()
		for i := 0; time.Since(start) < 5*counts; i++ {
			// Never the same status twice: on fake time a periodic change
			// would look the same at every tick.
			e.daemon.set(func(s *nodestatus.Snapshot) { s.Status.Assigned, s.Status.Warm = i%10, 100+i })
			time.Sleep(100 * time.Millisecond)
		}
		if n := e.statusWrites() - before; n != 5 {
			t.Errorf("%v status writes in %v of counts-only churn, want one per %v (5)", n, 5*counts, counts)
		}
		if errs := counter(e.reg, "vpcip_kubernetes_writes_total", "outcome", "error"); errs != 0 {
			t.Errorf("%v failed writes", errs)
		}
	})
}

// With an API server that never answers a list, the caches never sync: in
// an hour nothing is released, demand is 0, health says why, and the
// daemon's calls do not block.
func TestNeverSyncedCacheReleasesNothingInAnHour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := errors.New("dial tcp 127.0.0.1:443: connect: connection refused")
		e := newFakeEnv(t, cluster.Options{LeakGrace: time.Second}, func(cs *fake.Clientset) {
			cs.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, refused })
		})
		createPod(t, e.admin, "default", podSpec{name: "pending", node: e.node})
		e.daemon.set(func(s *nodestatus.Snapshot) {
			s.Held = []nodestatus.Held{{Key: api.Key{Network: "vpcip", ContainerID: "x", IfName: "eth0"},
				Pod: api.Pod{Namespace: "default", Name: "never-seen"}}}
		})
		time.Sleep(time.Hour)
		if n := e.daemon.releasedCount(); n != 0 {
			t.Errorf("%d released on an unsynced cache", n)
		}
		if got := e.c.Unaddressed(func(api.Pod) bool { return false }); got != 0 {
			t.Errorf("demand %d on an unsynced cache, want 0", got)
		}
		h := e.c.Health()
		if !h.Enabled || h.Connected || h.Reason == "" {
			t.Errorf("health %+v, want enabled, not connected, with a reason", h)
		}
		if g := gauge(t, e.reg, "vpcip_kubernetes_connected"); g != 0 {
			t.Errorf("vpcip_kubernetes_connected = %v, want 0", g)
		}
		e.c.NoAddress(api.Pod{Namespace: "default", Name: "x"}, &api.Error{Code: api.CodeNoAddress, Message: "m"}) // must not block
	})
}

// A pod in kubelet's back-off (sandbox creation failed) keeps counting as
// demand however long it waits; it stops when the pod is deleted.
func TestBackoffPodKeepsCountingAsDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newFakeEnv(t, cluster.Options{})
		createPod(t, e.admin, "default", podSpec{name: "backoff", node: e.node, waiting: "ContainerCreating"})
		createPod(t, e.admin, "default", podSpec{name: "running", node: e.node, podIP: "100.64.1.10", phase: corev1.PodRunning})
		none := func(api.Pod) bool { return false }
		waitFor(t, 10*time.Second, "demand counts the pod in back-off", func() bool { return e.c.Unaddressed(none) == 1 })
		time.Sleep(10 * time.Minute)
		if got := e.c.Unaddressed(none); got != 1 {
			t.Errorf("demand after 10 min = %d, want 1 (a pod in back-off keeps counting)", got)
		}
		deletePod(t, e.admin, "default", "backoff")
		waitFor(t, 2*time.Second, "demand drops when the pod is deleted", func() bool { return e.c.Unaddressed(none) == 0 })
	})
}
