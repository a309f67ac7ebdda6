package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
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
	// That the back-off pod keeps counting minutes later (the pool must
	// not release what it is about to need) is TestBackoffPodKeepsCountingAsDemand.
	deletePod(t, e.admin, ns, "scheduled")
	eventually(t, 10*time.Second, "demand drops when a pending pod is deleted", func() bool { return e.c.Unaddressed(held) == want-1 })
}

// The leak check against a real API server: the pod's deletion seen
// through the watch, the live LIST by field selector, a new pod under the
// old name (another UID) not taken for the old one. The grace's timing and
// the one-LIST rule are judged on fake time (synctest_test.go).
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
	grace := time.Second
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
	time.Sleep(4 * grace)
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

// TestNodeWarningFollowsTheENIConfig: a node whose placement problem moves
// from one ENIConfig to another (ENIConfig "default" before the zone label,
// then its zone's) gets an Event naming each, with the ENIConfig as the
// related object; the events.k8s.io recorder would otherwise fold the
// second into the first's series and keep showing "default".
func TestNodeWarningFollowsTheENIConfig(t *testing.T) {
	k := kubetest.Shared(t)
	e := newEnv(t, k, uniq(t), 110, cluster.Options{})
	eventually(t, 20*time.Second, "cluster part connected", func() bool { return e.c.Health().Connected })
	e.c.NodeWarning("ENIConfigNotFound", `ENIConfig "default" does not exist`, "default")
	time.Sleep(200 * time.Millisecond)
	e.c.NodeWarning("ENIConfigNotFound", `ENIConfig "us-west-2a" does not exist`, "us-west-2a")
	eventually(t, 10*time.Second, "an Event per ENIConfig on the node, each relating its ENIConfig", func() bool {
		l, err := e.admin.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, ev := range l.Items {
			if ev.Regarding.Kind != "Node" || ev.Regarding.Name != e.node || ev.Reason != "ENIConfigNotFound" || ev.Related == nil {
				continue
			}
			if ev.Related.Kind == "ENIConfig" && strings.Contains(ev.Note, `"`+ev.Related.Name+`"`) {
				seen[ev.Related.Name] = true
			}
		}
		return seen["default"] && seen["us-west-2a"]
	})
}
