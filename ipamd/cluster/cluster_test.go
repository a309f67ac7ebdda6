package cluster_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestDemandCountsPodsBoundHereWithoutAddress(t *testing.T) {
	k := kubetest.Shared(t)
	e := newEnv(t, k, uniq(t), 110, cluster.Options{})
	ns := e.node
	if err := k.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
	pods := []struct {
		spec  podSpec
		count bool
		why   string
	}{
		{podSpec{name: "scheduled", node: e.node}, true, "bound here, no ADD yet"},
		{podSpec{name: "backoff", node: e.node, waiting: "ContainerCreating"}, true, "ADD failed, sandbox in kubelet back-off"},
		{podSpec{name: "running", node: e.node, podIP: "100.64.1.10", phase: corev1.PodRunning}, false, "has its address"},
		{podSpec{name: "hostnet", node: e.node, hostNetwork: true}, false, "host network needs no address"},
		{podSpec{name: "done", node: e.node, phase: corev1.PodSucceeded}, false, "terminal"},
		{podSpec{name: "failed", node: e.node, phase: corev1.PodFailed}, false, "terminal"},
		{podSpec{name: "elsewhere", node: "other-node"}, false, "bound to another node"},
		{podSpec{name: "held", node: e.node}, false, "the daemon already holds its address (status not updated yet)"},
	}
	want := 0
	for _, p := range pods {
		createPod(t, e.admin, ns, p.spec)
		if p.count {
			want++
		}
	}
	held := holder(e, "held")
	eventually(t, 10*time.Second, "demand reaches the pods without address", func() bool { return e.c.Unaddressed(held) == want })
	// The daemon is woken (Changed) when demand rises, not only when an
	// ADD arrives.
	eventually(t, 5*time.Second, "the daemon woken after pods were bound to the node", func() bool { return e.daemon.wakeCount() > 0 })
	if g := gauge(t, e.reg, "vpcip_pending_pods"); g != float64(want) {
		t.Errorf("vpcip_pending_pods = %v, want the %d Unaddressed counted", g, want)
	}
	// The back-off pod still counts seconds later (the pool must not
	// release what it is about to need).
	time.Sleep(2 * time.Second)
	if got := e.c.Unaddressed(held); got != want {
		t.Errorf("demand after 2 s = %d, want %d (a pod in back-off keeps counting)", got, want)
	}
	deletePod(t, e.admin, ns, "scheduled")
	eventually(t, 10*time.Second, "demand drops when a pending pod is deleted", func() bool { return e.c.Unaddressed(held) == want-1 })
}

func TestLeakedAssignmentReleasedAfterGrace(t *testing.T) {
	k := kubetest.Shared(t)
	grace := 3 * time.Second
	e := newEnv(t, k, uniq(t), 110, cluster.Options{LeakGrace: grace, Tick: 200 * time.Millisecond})
	ns := e.node
	k.EnsureNamespace(context.Background(), ns)
	live := createPod(t, e.admin, ns, podSpec{name: "live", node: e.node, podIP: "100.64.1.11", phase: corev1.PodRunning})
	leaked := createPod(t, e.admin, ns, podSpec{name: "leaked", node: e.node, podIP: "100.64.1.12", phase: corev1.PodRunning})
	stuck := createPod(t, e.admin, ns, podSpec{name: "stuck", node: e.node, podIP: "100.64.1.13", phase: corev1.PodRunning})
	e.daemon.set(func(s *nodestatus.Snapshot) {
		for i, p := range []*corev1.Pod{live, leaked, stuck} {
			s.Held = append(s.Held, nodestatus.Held{
				Key: api.Key{Network: "vpcip", ContainerID: "c" + p.Name, IfName: "eth0"},
				Pod: api.Pod{Namespace: ns, Name: p.Name, UID: string(p.UID)}})
			s.Status.Assigned = i + 1
		}
	})
	e.daemon.mu.Lock()
	e.daemon.hostHas["stuck"] = true // its veth is still on the host
	e.daemon.mu.Unlock()
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
	time.Sleep(grace + time.Second)
	if n := e.daemon.releasedCount(); n != 0 {
		t.Fatalf("%d assignments released while all their pods exist", n)
	}
	if g := gauge(t, e.reg, "vpcip_addresses_without_pod"); g != 0 {
		t.Errorf("vpcip_addresses_without_pod = %v with every pod present, want 0", g)
	}
	// The pod goes without a DEL (its node lost it, the runtime crashed).
	deletedAt := time.Now()
	deletePod(t, e.admin, ns, "leaked")
	deletePod(t, e.admin, ns, "stuck")
	eventually(t, 5*time.Second, "gauge counts the two assignments without pod", func() bool {
		return gauge(t, e.reg, "vpcip_addresses_without_pod") == 2
	})
	eventually(t, grace+5*time.Second, "leaked assignment released", func() bool { return e.daemon.releasedCount() == 1 })
	if waited := time.Since(deletedAt); waited < grace {
		t.Errorf("released %v after the pod went, before the %v grace", waited, grace)
	}
	if r := e.daemon.released[0]; r.Pod.Name != "leaked" {
		t.Errorf("released %s, want leaked (stuck's veth is still on the host)", r.Pod.Name)
	}
	// The host view goes too: then stuck is released and the gauge is 0.
	e.daemon.mu.Lock()
	delete(e.daemon.hostHas, "stuck")
	e.daemon.mu.Unlock()
	eventually(t, 5*time.Second, "gauge back to 0", func() bool {
		return e.daemon.releasedCount() == 2 && gauge(t, e.reg, "vpcip_addresses_without_pod") == 0
	})
	if got := e.c.PodsGone(); len(got) != 0 {
		t.Errorf("PodsGone = %v once the daemon holds none of them", got)
	}
}

// TestConfirmedLeakCostsOneLiveList: an attachment whose pod is gone from
// the API server but whose host state stays (a static pod's mirror UID, a
// force-deleted pod whose sandbox lingers) is confirmed by one live LIST of
// the node's pods and stays reported by PodsGone without another, however
// long the host keeps it (#25 kind 4: before, a LIST per 100 ms tick, then
// one per grace); once the host lets go, the daemon releases it.
func TestConfirmedLeakCostsOneLiveList(t *testing.T) {
	k := kubetest.Shared(t)
	grace := time.Second
	_, sa := setup(t, k)
	var lists atomic.Int64
	counted := rest.CopyConfig(sa)
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper { return podLists{rt, &lists} })
	e := newEnv(t, k, uniq(t), 110, cluster.Options{Config: counted, LeakGrace: grace, Tick: 100 * time.Millisecond})
	ns := e.node
	k.EnsureNamespace(context.Background(), ns)
	stuck := createPod(t, e.admin, ns, podSpec{name: "stuck", node: e.node, podIP: "100.64.1.13", phase: corev1.PodRunning})
	e.holdFor(stuck, "cstuck")
	e.daemon.mu.Lock()
	e.daemon.hostHas["stuck"] = true
	e.daemon.mu.Unlock()
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
	before := lists.Load()
	deletePod(t, e.admin, ns, "stuck")
	eventually(t, grace+5*time.Second, "confirmed gone", func() bool { return len(e.c.PodsGone()) == 1 })
	time.Sleep(4 * grace)
	if n := lists.Load() - before; n != 1 {
		t.Errorf("%d live LISTs of the node's pods in about %v for one gone pod the host keeps; want 1", n, 5*grace)
	}
	if got := e.c.PodsGone(); len(got) != 1 || got[0].ContainerID != "cstuck" {
		t.Errorf("PodsGone = %v while the host keeps it, want [cstuck]", got)
	}
	e.daemon.mu.Lock()
	delete(e.daemon.hostHas, "stuck")
	e.daemon.mu.Unlock()
	eventually(t, 5*time.Second, "released once the host lets go", func() bool { return e.daemon.releasedCount() == 1 })
}

// podLists counts the live LISTs of pods (GET /api/v1/pods without watch
// and without resourceVersion: the informer's lists carry one).
type podLists struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (p podLists) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	if r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && q.Get("watch") == "" && !q.Has("resourceVersion") {
		p.n.Add(1)
	}
	return p.rt.RoundTrip(r)
}

func TestRecreatedPodWithSameNameIsAnotherPod(t *testing.T) {
	k := kubetest.Shared(t)
	e := newEnv(t, k, uniq(t), 110, cluster.Options{LeakGrace: 2 * time.Second, Tick: 200 * time.Millisecond})
	ns := e.node
	k.EnsureNamespace(context.Background(), ns)
	old := createPod(t, e.admin, ns, podSpec{name: "web-0", node: e.node, podIP: "100.64.1.20", phase: corev1.PodRunning})
	e.holdFor(old, "old")
	deletePod(t, e.admin, ns, "web-0")
	createPod(t, e.admin, ns, podSpec{name: "web-0", node: e.node}) // the StatefulSet's new pod, new UID
	eventually(t, 15*time.Second, "the old pod's assignment released", func() bool { return e.daemon.releasedCount() == 1 })
}

func TestNothingReleasedWithoutATrustworthyView(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	k, err := kubetest.Start(kubetest.Options{Name: "apistop"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	grace := 2 * time.Second
	e := newEnv(t, k, uniq(t), 110, cluster.Options{LeakGrace: grace, Tick: 200 * time.Millisecond})
	ns := e.node
	k.EnsureNamespace(context.Background(), ns)
	p := createPod(t, e.admin, ns, podSpec{name: "app", node: e.node, podIP: "100.64.1.30", phase: corev1.PodRunning})
	e.holdFor(p, "app")
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })

	// The API server dies with the pod deleted just before: the cache may
	// or may not have seen it go; either way nothing is released while
	// the view cannot be confirmed.
	deletePod(t, e.admin, ns, "app")
	k.StopAPIServer()
	eventually(t, 30*time.Second, "degraded once the API server is gone", func() bool { return !e.c.Health().Connected })
	if h := e.c.Health(); !strings.Contains(h.Reason, "degraded") {
		t.Errorf("health reason %q, want it to say degraded", h.Reason)
	}
	time.Sleep(3 * grace)
	if n := e.daemon.releasedCount(); n != 0 {
		t.Fatalf("%d assignments released while the API server was down", n)
	}
	if got := e.c.Unaddressed(func(api.Pod) bool { return false }); got != 0 {
		t.Errorf("demand %d while degraded, want 0 (no trustworthy view)", got)
	}
	if err := k.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	// Back: the grace starts over, then the gone pod's address is freed.
	eventually(t, 60*time.Second, "released after the API server returned", func() bool { return e.daemon.releasedCount() == 1 })
	if g := gauge(t, e.reg, "vpcip_kubernetes_connected"); g != 1 {
		t.Errorf("vpcip_kubernetes_connected = %v after recovery, want 1", g)
	}
}

func TestNeverSyncedCacheReleasesNothing(t *testing.T) {
	k := kubetest.Shared(t)
	// A config that reaches no API server: the informers never sync.
	dead := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	e := newEnv(t, k, uniq(t), 110, cluster.Options{Config: dead, LeakGrace: time.Second, Tick: 100 * time.Millisecond})
	e.daemon.set(func(s *nodestatus.Snapshot) {
		s.Held = []nodestatus.Held{{Key: api.Key{Network: "vpcip", ContainerID: "x", IfName: "eth0"},
			Pod: api.Pod{Namespace: "default", Name: "never-seen"}}}
	})
	time.Sleep(3 * time.Second)
	if n := e.daemon.releasedCount(); n != 0 {
		t.Errorf("%d released on an unsynced cache", n)
	}
	h := e.c.Health()
	if !h.Enabled || h.Connected || h.Reason == "" {
		t.Errorf("health %+v, want enabled, not connected, with a reason", h)
	}
	e.c.NoAddress(api.Pod{Namespace: "default", Name: "x"}, &api.Error{Code: api.CodeNoAddress, Message: "m"}) // must not block
}

func TestDisabledWithoutNodeName(t *testing.T) {
	c, err := cluster.New(cluster.Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	h := c.Health()
	if h.Enabled || h.Connected || !strings.Contains(h.Reason, "MY_NODE_NAME") {
		t.Errorf("health %+v, want disabled naming MY_NODE_NAME", h)
	}
	if got := c.Unaddressed(func(api.Pod) bool { return false }); got != 0 {
		t.Errorf("demand %d when disabled", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Errorf("Run when disabled: %v", err)
	}
	var nilCluster *cluster.Cluster
	nilCluster.NoAddress(api.Pod{Name: "p"}, &api.Error{})
	if nilCluster.Health().Enabled {
		t.Error("nil cluster reports enabled")
	}
}

func TestNoAddressEventNamesCauseAndNumbers(t *testing.T) {
	k := kubetest.Shared(t)
	e := newEnv(t, k, uniq(t), 110, cluster.Options{})
	ns := e.node
	k.EnsureNamespace(context.Background(), ns)
	p := createPod(t, e.admin, ns, podSpec{name: "stuck", node: e.node, waiting: "ContainerCreating"})
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
	msg := "no free address: node at its ENI limit (3 of 3) and all 27 addresses assigned"
	for range 3 { // kubelet retries the sandbox: one Event, a series
		e.c.NoAddress(api.Pod{Namespace: ns, Name: "stuck", UID: string(p.UID)}, &api.Error{Code: api.CodeNoAddress, Cause: api.CauseENILimit, Message: msg})
		time.Sleep(200 * time.Millisecond)
	}
	eventually(t, 10*time.Second, "one Event with a series of 3 on the pod", func() bool {
		l, err := e.admin.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		ev := l.Items[0]
		if ev.Regarding.Kind != "Pod" || ev.Regarding.Name != "stuck" || ev.Regarding.UID != p.UID {
			t.Fatalf("event regards %+v, want the pod", ev.Regarding)
		}
		if ev.Type != corev1.EventTypeWarning || ev.Reason != "AtENILimit" || ev.Note != msg {
			t.Fatalf("event %s %s %q, want Warning AtENILimit %q", ev.Type, ev.Reason, ev.Note, msg)
		}
		return ev.Series != nil && ev.Series.Count >= 2
	})
	// kubectl describe pod shows it, as users look for it.
	out, err := k.Kubectl(context.Background(), "describe", "pod", "-n", ns, "stuck")
	if err != nil || !strings.Contains(out, "3 of 3") || !strings.Contains(out, "27 addresses") {
		t.Errorf("kubectl describe pod does not show the cause with numbers (%v):\n%s", err, out)
	}
}
