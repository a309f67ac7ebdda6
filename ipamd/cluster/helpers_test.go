package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/cluster"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const (
	crdFile   = "../../charts/vpcip/crds/addressbudgets.vpcip.io.yaml"
	rulesFile = "../../charts/vpcip/files/clusterrole-rules.yaml"
)

// fakeDaemon is the daemon side as pure bookkeeping: a snapshot the test
// sets and a host view (pods whose veth is still there).
type fakeDaemon struct {
	mu       sync.Mutex
	snap     cluster.Snapshot
	hostHas  map[string]bool // pod name → host still shows its veth
	released []cluster.Assignment
	refused  int // ReleaseLeaked calls answered "kept"
}

func (f *fakeDaemon) Snapshot() cluster.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.snap
	s.Assignments = append([]cluster.Assignment(nil), f.snap.Assignments...)
	return s
}

func (f *fakeDaemon) ReleaseLeaked(a cluster.Assignment) (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hostHas[a.Pod.Name] {
		f.refused++
		return false, "host veth present"
	}
	for i, x := range f.snap.Assignments {
		if x.Key == a.Key {
			f.snap.Assignments = append(f.snap.Assignments[:i], f.snap.Assignments[i+1:]...)
			f.snap.Assigned--
			f.released = append(f.released, a)
			return true, ""
		}
	}
	return false, "not held"
}

func (f *fakeDaemon) PodsHolding() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := map[string]bool{}
	for _, a := range f.snap.Assignments {
		held[a.Pod.Namespace+"/"+a.Pod.Name] = true
	}
	return held
}

// holdFor makes the daemon hold one address for pod p, under attachment
// containerID, assigned an hour ago (past every grace).
func (e *env) holdFor(p *corev1.Pod, containerID string) {
	e.daemon.set(func(s *cluster.Snapshot) {
		s.Assignments = []cluster.Assignment{{Key: api.Key{Network: "vpcip", ContainerID: containerID, IfName: "eth0"},
			Pod: api.Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}, AssignedAt: time.Now().Add(-time.Hour)}}
		s.Assigned = 1
	})
}

func (f *fakeDaemon) set(fn func(s *cluster.Snapshot)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.snap)
}

func (f *fakeDaemon) releasedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.released)
}

// m5Snapshot is an m5.large node (3 ENIs × 9 pod addresses = 27) holding n
// assigned addresses on 2 ENIs.
func m5Snapshot(n int) cluster.Snapshot {
	return cluster.Snapshot{
		Ready: true, InstanceID: "i-0kube", InstanceType: "m5.large", Zone: "us-west-2a",
		Assigned: n, Warm: 18 - n, Capacity: 18, Budget: 27, ENIs: 2, MaxENIs: 3,
		Version: "test", CheckpointSchema: 1,
	}
}

// env is one node's cluster part against the shared API server, running as
// the ServiceAccount bound to exactly charts/vpcip/files/clusterrole-rules.yaml.
type env struct {
	k      *kubetest.Server
	admin  kubernetes.Interface
	node   string
	daemon *fakeDaemon
	c      *cluster.Cluster
	reg    *prometheus.Registry
	kicks  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func setup(t *testing.T, k *kubetest.Server) (admin kubernetes.Interface, sa *rest.Config) {
	t.Helper()
	ctx := context.Background()
	if err := k.ApplyFiles(ctx, crdFile); err != nil {
		t.Fatal(err)
	}
	sa, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "vpcipd", rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(k.Config), sa
}

// newEnv creates Node <name> with kubelet max-pods maxPods and starts a
// cluster part for it with opts (NodeName, Config, Daemon, Metrics, Kick
// filled in).
func newEnv(t *testing.T, k *kubetest.Server, name string, maxPods int64, opts cluster.Options) *env {
	t.Helper()
	admin, sa := setup(t, k)
	e := &env{k: k, admin: admin, node: name, daemon: &fakeDaemon{snap: m5Snapshot(0), hostHas: map[string]bool{}},
		reg: prometheus.NewRegistry(), kicks: make(chan struct{}, 100), done: make(chan struct{})}
	createNode(t, admin, name, maxPods)
	opts.NodeName, opts.Daemon, opts.Metrics = name, e.daemon, e.reg
	if opts.Config == nil {
		opts.Config = sa
	}
	opts.Kick = func() { e.kicks <- struct{}{} }
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := cluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) start() {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan struct{})
	go func() { e.c.Run(ctx); close(e.done) }()
}

func (e *env) stop() {
	e.cancel()
	<-e.done
}

func createNode(t *testing.T, cs kubernetes.Interface, name string, maxPods int64) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{corev1.LabelTopologyZone: "us-west-2a", corev1.LabelInstanceTypeStable: "m5.large"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(maxPods, resource.DecimalSI)}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podSpec shapes a test pod.
type podSpec struct {
	name, node  string
	hostNetwork bool
	podIP       string
	phase       corev1.PodPhase
	waiting     string // a container waiting reason, e.g. "ContainerCreating"
}

// createPod creates the pod bound to its node (as the scheduler would) and
// sets its status (as kubelet would).
func createPod(t *testing.T, cs kubernetes.Interface, ns string, p podSpec) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: p.node, HostNetwork: p.hostNetwork,
			Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.phase == "" {
		p.phase = corev1.PodPending
	}
	pod.Status.Phase, pod.Status.PodIP = p.phase, p.podIP
	if p.podIP != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: p.podIP}}
	}
	if p.waiting != "" {
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Image: "pause",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: p.waiting}}}}
	}
	pod, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func deletePod(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 100 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func counter(reg *prometheus.Registry, name string, labels ...string) float64 {
	n, _ := testutil.GatherAndCount(reg, name)
	if n == 0 {
		return 0
	}
	mfs, _ := reg.Gather()
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func holder(e *env, names ...string) func(api.Pod) bool {
	return func(p api.Pod) bool {
		for _, n := range names {
			if p.Name == n {
				return true
			}
		}
		return false
	}
}

func uniq(t *testing.T) string {
	return strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())) + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
}
