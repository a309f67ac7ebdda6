package cluster

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/ipamd/api"
)

// wire builds the clients from the API server configuration, then the
// informers on them (wireClients). No I/O.
func (c *Cluster) wire() error {
	cfg := *c.o.Config
	cfg.UserAgent = "vpcipd/" + c.o.NodeName
	cs, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(&cfg)
	if err != nil {
		return err
	}
	// GET /version: allowed to every identity, and cheap.
	c.api.probe = func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
		return err
	}
	return c.wireClients(cs, dyn)
}

// wireClients builds the two node-scoped informers, the AddressBudget client
// and the events recorder on cs and dyn. No I/O. It goes through the typed
// and dynamic clients only (no REST client), so client-go's fake clientsets
// can stand in for the API server in tests of the part's timing.
func (c *Cluster) wireClients(cs kubernetes.Interface, dyn dynamic.Interface) error {
	c.api.cs, c.api.budgets = cs, addressbudget.NewClient(dyn)
	pods, nodes := cs.CoreV1().Pods(metav1.NamespaceAll), cs.CoreV1().Nodes()
	c.pods = c.informer(&corev1.Pod{}, "pods", fields.OneTermEqualSelector("spec.nodeName", c.o.NodeName),
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) }, pods.Watch)
	if _, err := c.pods.AddEventHandler(c.noticePods()); err != nil {
		return err
	}
	c.nodes = c.informer(&corev1.Node{}, "nodes", fields.OneTermEqualSelector("metadata.name", c.o.NodeName),
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) }, nodes.Watch)
	c.events = newRecorder(cs, c.o.NodeName, c.log)
	return nil
}

// informer lists and watches one resource (list, watch: its typed client's
// List and Watch) with a field selector, keeping objects without
// managedFields (memory: at 250 pods they would be most of the cache).
// Watch errors mark the part degraded.
func (c *Cluster) informer(obj runtime.Object, resource string, sel fields.Selector,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	// The reflector retries a watch that fails with "connection refused"
	// on its own, without telling the watch error handler: note every
	// failed list and watch here, so a dead API server is seen at once.
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel.String()
			obj, err := list(ctx, o)
			if err != nil && ctx.Err() == nil {
				c.apiError("list "+resource, err)
			}
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.Watch = sel.String(), true
			w, err := watchFn(ctx, o)
			if err != nil && ctx.Err() == nil {
				c.apiError("watch "+resource, err)
			}
			return w, err
		},
	}
	// As client-go's generated informers: the reflector streams the initial
	// list (WatchList) unless the client says it cannot (its fakes).
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, c.api.cs), obj, cache.SharedIndexInformerOptions{})
	inf.SetTransform(stripForCache)
	inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.apiError("watch "+resource, err)
	})
	return inf
}

// stripForCache drops what the daemon never reads from cached objects:
// managedFields and the last-applied annotation (the bulk of a pod's
// metadata), and a pod's spec except the fields demand reads.
func stripForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		o.ManagedFields = nil
		delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
		o.Spec = corev1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork}
		o.Status = corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs}
	case *corev1.Node:
		o.ManagedFields = nil
		delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
		o.Spec = corev1.NodeSpec{}
		o.Status = corev1.NodeStatus{Capacity: o.Status.Capacity}
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// needsAddress reports whether p is a pod that wants a VPC address from this
// node and may not have one yet: bound here, not host-network, not terminal,
// not being deleted, and without a pod IP in its status.
func needsAddress(p *corev1.Pod) bool {
	if p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.PodIP != "" {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// Unaddressed is the number of pods bound to this node that need an address
// and hold none (holds reports whether the daemon holds one for a pod; it
// must not block): pods the scheduler placed whose ADD has not arrived, is
// waiting, or failed and sits in kubelet's back-off. The pool sizes for them
// before their ADDs arrive. It is 0 while the part is disabled, unsynced or
// degraded: without a trustworthy view the pool falls back to the ADDs it
// sees.
//
// It is ipamd.PodFacts' demand: the pool asks every cycle, and the answer
// is also the vpcip_pending_pods gauge.
func (c *Cluster) Unaddressed(holds func(api.Pod) bool) int {
	if !c.synced() {
		if c != nil {
			c.metrics.pendingPods.Set(0)
		}
		return 0
	}
	n := 0
	for _, obj := range c.pods.GetStore().List() {
		p := obj.(*corev1.Pod)
		if needsAddress(p) && !holds(api.Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}) {
			n++
		}
	}
	c.metrics.pendingPods.Set(float64(n))
	return n
}

// noticePods signals Changed when a pod that needs an address appears in
// the cache (bound here by the scheduler) or comes to need one, so the pool
// grows before its ADD arrives.
func (c *Cluster) noticePods() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok && needsAddress(p) {
				c.signal()
			}
		},
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Pod)
			p, ok2 := cur.(*corev1.Pod)
			if ok1 && ok2 && needsAddress(p) && !needsAddress(o) {
				c.signal()
			}
		},
	}
}

type podName struct{ namespace, name string }

// livePods lists this node's pods from the API server itself (a quorum read,
// not the cache): the last word before a release.
func (c *Cluster) livePods(ctx context.Context) (map[podName]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := c.api.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", c.o.NodeName).String(),
	})
	if err != nil {
		return nil, err
	}
	out := make(map[podName]string, len(l.Items))
	for _, p := range l.Items {
		out[podName{p.Namespace, p.Name}] = string(p.UID)
	}
	return out, nil
}

// cachedPod returns the cached pod namespace/name, or nil.
func (c *Cluster) cachedPod(ns, name string) *corev1.Pod {
	obj, ok, err := c.pods.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil
	}
	return obj.(*corev1.Pod)
}
