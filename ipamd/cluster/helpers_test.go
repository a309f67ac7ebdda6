package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
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
	"github.com/vpcip/vpcip/ipamd/nodestatus"
	"github.com/vpcip/vpcip/provider"
	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const (
	crdFile   = "../../charts/vpcip/crds/addressbudgets.vpcip.io.yaml"
	rulesFile = "../../charts/vpcip/files/clusterrole-rules.yaml"
)

// fakeDaemon plays the daemon's side of the seam as pure bookkeeping: it
// publishes a status the test sets (ipamd.StatusSink) and releases what
// PodsGone reports unless the host still shows the pod's veth (as ipamd's
// goneReleaser does), woken by Changed or every 100 ms.
type fakeDaemon struct {
	mu       sync.Mutex
	snap     nodestatus.Snapshot
	hostHas  map[string]bool // pod name → host still shows its veth
	released []nodestatus.Held
	refused  int // PodsGone keys kept because the host still shows them
	wakes    int // values received from Changed
}

func newFakeDaemon(snap nodestatus.Snapshot) *fakeDaemon {
	return &fakeDaemon{snap: snap, hostHas: map[string]bool{}}
}

// serve runs the daemon's side against c until ctx ends.
func (f *fakeDaemon) serve(ctx context.Context, c *cluster.Cluster) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, k := range c.PodsGone() {
			f.release(k)
		}
		f.mu.Lock()
		s := f.snap
		s.Held = slices.Clone(f.snap.Held)
		f.mu.Unlock()
		c.PublishStatus(s)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.Changed():
			f.mu.Lock()
			f.wakes++
			f.mu.Unlock()
		}
	}
}

func (f *fakeDaemon) release(k api.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.snap.Held {
		if x.Key != k {
			continue
		}
		if f.hostHas[x.Pod.Name] {
			f.refused++
			return
		}
		f.snap.Held = slices.Delete(f.snap.Held, i, i+1)
		f.snap.Status.Assigned--
		f.released = append(f.released, x)
		return
	}
}

// holdFor makes the daemon hold one address for pod p, under attachment
// containerID.
func (e *env) holdFor(p *corev1.Pod, containerID string) {
	e.daemon.set(func(s *nodestatus.Snapshot) {
		s.Held = []nodestatus.Held{{Key: api.Key{Network: "vpcip", ContainerID: containerID, IfName: "eth0"},
			Pod: api.Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}}}
		s.Status.Assigned = 1
	})
}

func (f *fakeDaemon) set(fn func(s *nodestatus.Snapshot)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.snap)
}

func (f *fakeDaemon) releasedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.released)
}

func (f *fakeDaemon) wakeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wakes
}

// m5Snapshot is an m5.large node (3 ENIs × 9 pod addresses = 27) holding n
// assigned addresses on 2 ENIs.
func m5Snapshot(n int) nodestatus.Snapshot {
	return nodestatus.Snapshot{
		Instance: provider.Instance{ID: "i-0kube", Type: "m5.large", AvailabilityZone: "us-west-2a"},
		Status:   api.Status{Ready: true, Counts: api.Counts{Assigned: n, Warm: 18 - n, Capacity: 18, Budget: 27, ENIs: 2, MaxENIs: 3}},
		Version:  "test", CheckpointSchema: 1,
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
// cluster part for it with opts (NodeName, Config, Metrics, Logger filled
// in), with a fakeDaemon on the daemon's side.
func newEnv(t *testing.T, k *kubetest.Server, name string, maxPods int64, opts cluster.Options) *env {
	t.Helper()
	admin, sa := setup(t, k)
	e := &env{k: k, admin: admin, node: name, daemon: newFakeDaemon(m5Snapshot(0)),
		reg: prometheus.NewRegistry(), done: make(chan struct{})}
	createNode(t, admin, name, maxPods)
	opts.NodeName, opts.Metrics = name, e.reg
	if opts.Config == nil {
		opts.Config = sa
	}
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
	served := make(chan struct{})
	go func() { e.daemon.serve(ctx, e.c); close(served) }()
	go func() { e.c.Run(ctx); <-served; close(e.done) }()
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
