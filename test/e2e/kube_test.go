package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/ipamd/introspect"
	"github.com/vpcip/vpcip/test/e2e/cluster"
	"github.com/vpcip/vpcip/test/kubetest"
	"github.com/vpcip/vpcip/test/netnsdir"
	"github.com/vpcip/vpcip/test/vpcsim/fabric"
	"github.com/vpcip/vpcip/test/vpcsim/podruntime"
)

const (
	crdFile   = "../../charts/vpcip/crds/addressbudgets.vpcip.io.yaml"
	rulesFile = "../../charts/vpcip/files/clusterrole-rules.yaml"
	// apiAddr is where the API server is reachable from inside instance
	// netns: a relay in the fabric's router netns (kubetest.Forward).
	apiAddr = fabric.MetadataAddr + ":6443"
)

// kubeEnv is a vpcsim cluster whose daemons talk to a real kube-apiserver as
// the ServiceAccount bound to exactly charts/vpcip/files/clusterrole-rules.yaml.
type kubeEnv struct {
	k          *kubetest.Server
	admin      kubernetes.Interface
	c          *cluster.Cluster
	kubeconfig string
	names      map[*cluster.Node]string // Kubernetes node names
}

// joinKube relays apiAddr to k, creates a Node object per vpcsim node (kubelet
// max-pods maxPods) and restarts the daemons of nodes with MY_NODE_NAME and
// VPCIP_KUBECONFIG set (plus env). With no nodes given, every node joins.
func joinKube(t testing.TB, k *kubetest.Server, c *cluster.Cluster, maxPods int64, env []string, nodes ...*cluster.Node) *kubeEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Fabric.Listen(apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	go k.Forward(l)
	t.Cleanup(func() { l.Close() })
	if err := k.ApplyFiles(ctx, crdFile); err != nil {
		t.Fatal(err)
	}
	sa, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "vpcipd", rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	e := &kubeEnv{k: k, admin: kubernetes.NewForConfigOrDie(k.Config), c: c,
		kubeconfig: filepath.Join(c.WorkDir, "vpcipd.kubeconfig"), names: map[*cluster.Node]string{}}
	if err := kubetest.WriteKubeconfig(kubetest.ConfigVia(sa, apiAddr), e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if len(nodes) == 0 {
		nodes = c.Nodes
	}
	for _, n := range nodes {
		name := c.Prefix + "-" + n.Name
		e.names[n] = name
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		node, err := e.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(maxPods, resource.DecimalSI)}
		if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		n.StopDaemon(false)
		if err := n.StartDaemon(ctx, append([]string{"MY_NODE_NAME=" + name, "VPCIP_KUBECONFIG=" + e.kubeconfig}, env...)...); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		waitFor(t, 30*time.Second, n.Name+" connected to the API server", func() bool { return metric(t, n, "vpcip_kubernetes_connected") == 1 })
	}
	if err := k.EnsureNamespace(ctx, c.Prefix); err != nil {
		t.Fatal(err)
	}
	return e
}

// bind creates pod name in the test's namespace bound to n, as the scheduler
// leaves it: no address yet.
func (e *kubeEnv) bind(t testing.TB, n *cluster.Node, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.c.Prefix},
		Spec: corev1.PodSpec{NodeName: e.names[n], Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
	p, err := e.admin.CoreV1().Pods(e.c.Prefix).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs the pod's sandbox through the CNI chain, as kubelet would, with
// the API object's UID.
func (e *kubeEnv) start(ctx context.Context, n *cluster.Node, p *corev1.Pod) (*podruntime.Pod, error) {
	return n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)})
}

func (e *kubeEnv) deleteAPIPod(t *testing.T, name string) {
	t.Helper()
	zero := int64(0)
	if err := e.admin.CoreV1().Pods(e.c.Prefix).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// metric reads one unlabelled sample (or a full series name with labels)
// from the daemon's /metrics; -1 when absent.
func metric(t testing.TB, n *cluster.Node, name string) float64 {
	t.Helper()
	resp, err := n.HTTPClient().Get("http://127.0.0.1:61678/metrics")
	if err != nil {
		return -1
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	v, ok := sample(body, name)
	if !ok {
		return -1
	}
	return v
}

func state(t *testing.T, n *cluster.Node) introspect.State {
	t.Helper()
	out, err := n.Ctl(context.Background(), "status", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st introspect.State
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func holds(st introspect.State, ns, name string) bool {
	for _, a := range st.Assignments {
		if a.Pod.Namespace == ns && a.Pod.Name == name {
			return true
		}
	}
	return false
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubeDemandGrowsPoolBeforeADDs: pods the scheduler binds to a node grow
// its pool before their ADDs arrive, so the ADDs find addresses; a pod whose
// ADD never comes (kubelet back-off) keeps its address reserved; deleting
// such pods lets the pool shrink. node-2 runs without the Kubernetes part
// (MY_NODE_NAME unset) as the comparison and the "disabled" case.
func TestKubeDemandGrowsPoolBeforeADDs(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	env := []string{"WARM_IP_TARGET=1", "VPCIP_POOL_INTERVAL=1s", "VPCIP_RELEASE_INTERVAL=1s", "IP_COOLDOWN_PERIOD=1"}
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", DaemonEnv: env})
	k := kubetest.Shared(t)
	e := joinKube(t, k, c, 29, nil, c.Nodes[0])
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if st := state(t, n2); st.Kubernetes.Enabled || !strings.Contains(st.Kubernetes.Reason, "MY_NODE_NAME") {
		t.Errorf("node-2 without MY_NODE_NAME: kubernetes %+v, want disabled naming MY_NODE_NAME", st.Kubernetes)
	}
	if out, _ := n2.Ctl(ctx, "status"); !strings.Contains(out, "Kubernetes:  disabled: MY_NODE_NAME unset") {
		t.Errorf("vpcipctl status on node-2:\n%s", out)
	}

	f := c.Cloud.Faults()
	growCalls := func() int { return f.Calls("AssignPrivateIpAddresses") + f.Calls("CreateNetworkInterface") }
	waitFor(t, 20*time.Second, "node-1 pool at WARM_IP_TARGET", func() bool { return state(t, n1).Pool.Warm == 1 })
	before := growCalls()
	const burst = 6
	var pods []*corev1.Pod
	for i := range burst {
		pods = append(pods, e.bind(t, n1, fmt.Sprintf("web-%d", i)))
	}
	waitFor(t, 20*time.Second, "pool grown for the bound pods before any ADD", func() bool { return state(t, n1).Pool.Warm >= burst+1 })
	grew := growCalls() - before
	if grew < 1 {
		t.Errorf("no EC2 call grew the pool though %d pods were bound", burst)
	}
	// The gauge is set when the Kubernetes part next compares the bound pods
	// with the pool's holders (about once a second); on a loaded machine that
	// can trail the growth introspection already shows.
	waitFor(t, 10*time.Second, fmt.Sprintf("vpcip_pending_pods = %d", burst), func() bool {
		return metric(t, n1, "vpcip_pending_pods") == burst
	})
	addWait := func(n *cluster.Node, ps []*corev1.Pod, ns func(i int) (string, string)) (time.Duration, int) {
		before := growCalls()
		var worst time.Duration
		for i := range ps {
			namespace, name := ns(i)
			p, err := n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: namespace, Name: name, UID: string(ps[i].UID)})
			if err != nil {
				t.Fatalf("ADD %s on %s: %v", name, n.Name, err)
			}
			worst = max(worst, p.AddTime)
		}
		return worst, growCalls() - before
	}
	worst1, during1 := addWait(n1, pods, func(i int) (string, string) { return pods[i].Namespace, pods[i].Name })
	worst2, during2 := addWait(n2, pods, func(i int) (string, string) { return "nodemand", pods[i].Name })
	t.Logf("with demand: %d EC2 growth calls before the %d ADDs, %d during them, slowest ADD %v; without (node-2): %d during, slowest ADD %v",
		grew, burst, during1, worst1.Round(time.Millisecond), during2, worst2.Round(time.Millisecond))
	if during1 != 0 {
		t.Errorf("node-1 made %d EC2 growth calls during the ADDs: the pool should have grown before them", during1)
	}

	// Back-off: two pods bound whose ADDs fail and are retried later keep
	// their addresses reserved past several release intervals...
	e.bind(t, n1, "backoff-0")
	e.bind(t, n1, "backoff-1")
	waitFor(t, 20*time.Second, "pool grown for the pods in back-off", func() bool { return state(t, n1).Pool.Warm >= 3 })
	time.Sleep(5 * time.Second) // five VPCIP_RELEASE_INTERVALs
	if w := state(t, n1).Pool.Warm; w < 3 {
		t.Errorf("warm %d after 5 release intervals with 2 pods in back-off, want ≥ 3 (WARM_IP_TARGET 1 + 2)", w)
	}
	// ... and when they are deleted the pool shrinks back to its target.
	e.deleteAPIPod(t, "backoff-0")
	e.deleteAPIPod(t, "backoff-1")
	waitFor(t, 30*time.Second, "pool back to WARM_IP_TARGET once the pending pods are gone", func() bool { return state(t, n1).Pool.Warm == 1 })
}

// TestKubeLeakReleasedAndNothingReleasedWhileAPIServerDown: a pod deleted from
// the API whose sandbox vanished without a DEL has its address released after
// VPCIP_POD_LEAK_GRACE and the gauge returns to 0; with kube-apiserver
// stopped nothing is released and ADDs keep working; the host check keeps
// the address of a pod whose veth is still there.
func TestKubeLeakReleasedAndNothingReleasedWhileAPIServerDown(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large"})
	k, err := kubetest.Start(kubetest.Options{Name: "e2e-leak"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	const grace = 3 * time.Second
	e := joinKube(t, k, c, 29, []string{"VPCIP_POD_LEAK_GRACE=3s", "VPCIP_GC_GRACE=10m"})
	n := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := c.Prefix
	sandboxes := map[string]*podruntime.Pod{}
	for _, name := range []string{"a", "b", "c"} {
		p, err := e.start(ctx, n, e.bind(t, n, name))
		if err != nil {
			t.Fatal(err)
		}
		sandboxes[name] = p
	}
	time.Sleep(grace + 2*time.Second)
	if v := metric(t, n, "vpcip_addresses_without_pod"); v != 0 {
		t.Errorf("vpcip_addresses_without_pod = %v with every pod listed, want 0", v)
	}

	// a: deleted from the API, its sandbox gone without a DEL.
	e.deleteAPIPod(t, "a")
	if err := netnsdir.Delete(sandboxes["a"].Netns); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	waitFor(t, 10*time.Second, "gauge counts a", func() bool { return metric(t, n, "vpcip_addresses_without_pod") == 1 })
	waitFor(t, grace+20*time.Second, "a's address released", func() bool { return !holds(state(t, n), ns, "a") })
	if d := time.Since(gone); d < grace {
		t.Errorf("released %v after the pod went, before the %v grace", d, grace)
	}
	waitFor(t, 10*time.Second, "gauge back to 0", func() bool { return metric(t, n, "vpcip_addresses_without_pod") == 0 })

	// b: deleted, sandbox gone, then the API server dies.
	e.deleteAPIPod(t, "b")
	if err := netnsdir.Delete(sandboxes["b"].Netns); err != nil {
		t.Fatal(err)
	}
	k.StopAPIServer()
	waitFor(t, 40*time.Second, "degraded without the API server", func() bool { return metric(t, n, "vpcip_kubernetes_connected") == 0 })
	time.Sleep(3 * grace)
	st := state(t, n)
	if !holds(st, ns, "b") {
		t.Fatal("b's address was released while the API server was down")
	}
	if !strings.Contains(st.Kubernetes.Reason, "degraded") {
		t.Errorf("status kubernetes %+v, want degraded", st.Kubernetes)
	}
	d, err := n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: ns, Name: "d"})
	if err != nil {
		t.Fatalf("ADD with the API server down: %v", err)
	}
	if err := k.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	// Back: b is released after a fresh grace; d (no API object, but its
	// veth and route are there) is kept by the host check.
	waitFor(t, 90*time.Second, "b released after the API server returned", func() bool { return !holds(state(t, n), ns, "b") })
	time.Sleep(2 * grace)
	if !holds(state(t, n), ns, "d") {
		t.Error("d's address released though its sandbox is alive")
	}
	if err := n.DelPod(ctx, d); err != nil {
		t.Error(err)
	}
}

// TestKubeEventNamesCauseOfNoAddress: an ADD refused at the ENI limit fails
// with the cause and its numbers, and the pod gets an Event with the same.
func TestKubeEventNamesCauseOfNoAddress(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large", DaemonEnv: []string{"MAX_ENI=1", "VPCIP_ADD_WAIT=1s"}})
	e := joinKube(t, kubetest.Shared(t), c, 29, nil)
	n := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range 9 { // one ENI of an m5.large: 9 pod addresses
		if _, err := e.start(ctx, n, e.bind(t, n, fmt.Sprintf("p-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	stuck := e.bind(t, n, "stuck")
	_, err := e.start(ctx, n, stuck)
	if err == nil {
		t.Fatal("ADD beyond the ENI limit succeeded")
	}
	msg := "node at its ENI limit (1 of 1, MAX_ENI) and all 9 addresses assigned"
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("CNI error %q does not name the cause %q", err, msg)
	}
	waitFor(t, 15*time.Second, "Event on the pod", func() bool {
		l, err := e.admin.EventsV1().Events(stuck.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range l.Items {
			if ev.Regarding.Name == "stuck" && ev.Regarding.UID == stuck.UID && ev.Type == corev1.EventTypeWarning {
				if !strings.Contains(ev.Note, msg) || ev.Reason != "AtENILimit" {
					t.Fatalf("event %s %q, want AtENILimit naming %q", ev.Reason, ev.Note, msg)
				}
				return true
			}
		}
		return false
	})
}

// TestKubeAddressBudgetsOfTwoNodes: `kubectl get addressbudgets` shows both
// vpcsim nodes with the figures vpcipctl shows, a change of the counts is
// published within VPCIP_COUNTS_INTERVAL (set to 15 s here; its 1-minute
// default is checked on fake time in ipamd/cluster), kubelet's max-pods
// above the addresses raises the condition and a Node event; under churn the
// writes per node stay at most one per 15 s.
func TestKubeAddressBudgetsOfTwoNodes(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	// Cooldown 0: the churn below reuses addresses at once instead of
	// running the nodes into their ENI limit.
	c := start(t, cluster.Options{Nodes: 2, InstanceType: "m5.large", DaemonEnv: []string{"IP_COOLDOWN_PERIOD=0", "VPCIP_COUNTS_INTERVAL=15s"}})
	k := kubetest.Shared(t)
	e := joinKube(t, k, c, 110, nil) // kubelet's default 110 on an m5.large (29 by address)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for i, n := range c.Nodes {
		for j := range 3 + 2*i {
			if _, err := e.start(ctx, n, e.bind(t, n, fmt.Sprintf("%s-p%d", n.Name, j))); err != nil {
				t.Fatal(err)
			}
		}
	}
	row := func(n *cluster.Node) string {
		st := state(t, n)
		p := st.Pool
		return fmt.Sprintf("%s %s %d %d %d %d/%d", e.names[n], st.Node.InstanceType, p.Assigned, p.Budget, p.Assigned*100/p.Budget, p.ENIs, p.MaxENIs)
	}
	table := func() map[string]string {
		out, err := k.Kubectl(ctx, "get", "addressbudgets", "--no-headers")
		if err != nil {
			t.Fatal(err)
		}
		rows := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) >= 6 {
				rows[f[0]] = strings.Join(f[:6], " ")
			}
		}
		return rows
	}
	match := func() bool {
		rows := table()
		for _, n := range c.Nodes {
			if rows[e.names[n]] != row(n) {
				return false
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, "kubectl get addressbudgets matches vpcipctl on both nodes", match)
	out, _ := k.Kubectl(ctx, "get", "addressbudgets")
	t.Logf("kubectl get addressbudgets:\n%s", out)

	n1 := c.Nodes[0]
	for j := range 2 {
		if _, err := e.start(ctx, n1, e.bind(t, n1, fmt.Sprintf("late-%d", j))); err != nil {
			t.Fatal(err)
		}
	}
	changed := time.Now()
	waitFor(t, 17*time.Second, "the change published within 15 s (plus the 1 s tick)", match)
	t.Logf("change visible after %v", time.Since(changed).Round(100*time.Millisecond))

	waitFor(t, 15*time.Second, "MaxPodsExceedsAddresses Node event", func() bool {
		l, err := e.admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range l.Items {
			if ev.Regarding.Kind == "Node" && ev.Regarding.Name == e.names[n1] && ev.Reason == "MaxPodsExceedsAddresses" {
				return true
			}
		}
		return false
	})
	writes := func(n *cluster.Node) float64 {
		return metric(t, n, `vpcip_kubernetes_writes_total{kind="addressbudget_status",outcome="ok"}`)
	}

	// Churn: pods come and go on both nodes for 40 s.
	const churn = 40 * time.Second
	w0 := []float64{writes(c.Nodes[0]), writes(c.Nodes[1])}
	end := time.Now().Add(churn)
	for i := 0; time.Now().Before(end); i++ {
		for _, n := range c.Nodes {
			p, err := n.Runtime.Add(ctx, podruntime.PodSpec{Namespace: "churn", Name: fmt.Sprintf("c%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			if err := n.DelPod(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, n := range c.Nodes {
		got := writes(n) - w0[i]
		perMin := got / churn.Minutes()
		t.Logf("%s: %v AddressBudget status writes in %v of churn = %.1f/min per node; at 5,000 nodes %.0f writes/s", n.Name, got, churn, perMin, perMin*5000/60)
		if limit := churn.Seconds()/15 + 1; got > limit {
			t.Errorf("%s: %v status writes in %v, more than one per 15 s (%v)", n.Name, got, churn, limit)
		}
	}
}

// TestKubeDaemonServesWithAPIServerUnreachable: vpcipd starts, serves ADDs
// and says why the Kubernetes part is not connected (log, metric, status).
func TestKubeDaemonServesWithAPIServerUnreachable(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	c := start(t, cluster.Options{Nodes: 1, InstanceType: "m5.large"})
	n := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := kubetest.Shared(t)
	kc := filepath.Join(c.WorkDir, "dead.kubeconfig")
	if err := kubetest.WriteKubeconfig(kubetest.ConfigVia(k.Config, fabric.MetadataAddr+":6999"), kc); err != nil {
		t.Fatal(err)
	}
	n.StopDaemon(false)
	if err := n.StartDaemon(ctx, "MY_NODE_NAME="+c.Prefix+"-dead", "VPCIP_KUBECONFIG="+kc); err != nil {
		t.Fatalf("vpcipd did not become ready with the API server unreachable: %v", err)
	}
	if _, err := n.AddPod(ctx, "default", "works"); err != nil {
		t.Fatalf("ADD with the API server unreachable: %v", err)
	}
	st := state(t, n)
	if !st.Kubernetes.Enabled || st.Kubernetes.Connected || st.Kubernetes.Reason == "" {
		t.Errorf("kubernetes %+v, want enabled, not connected, with a reason", st.Kubernetes)
	}
	if v := metric(t, n, "vpcip_kubernetes_connected"); v != 0 {
		t.Errorf("vpcip_kubernetes_connected = %v, want 0", v)
	}
	waitFor(t, 20*time.Second, "the log says the API is unreachable", func() bool {
		return strings.Contains(n.LogTail(200), "kubernetes API unreachable")
	})
}
