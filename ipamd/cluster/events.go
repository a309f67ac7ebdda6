package cluster

import (
	"context"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/vpcip/vpcip/ipamd/api"
	"github.com/vpcip/vpcip/ipamd/podsubnet"
)

// Event reasons (events.k8s.io/v1 reason, CamelCase), one per cause, so
// different causes are different events and repeats of one fold into a
// series.
var causeReason = map[api.Cause]string{
	api.CauseENILimit:     "AtENILimit",
	api.CauseSubnetFull:   "SubnetFull",
	api.CauseThrottled:    "EC2Throttled",
	api.CauseWaitingCloud: "WaitingForAddresses",
	api.CauseMaxPods:      "AtMaxPods",
	api.CauseNoPrefix:     "NoContiguousPrefix",
	api.CauseCooldown:     "AddressesCoolingDown",
}

// ReasonMaxPodsExceedsAddresses is the Node event's reason when kubelet's
// max-pods is above what the node's addresses can serve.
const ReasonMaxPodsExceedsAddresses = "MaxPodsExceedsAddresses"

// recorder sends Events through client-go's events.k8s.io/v1 broadcaster:
// asynchronous (never blocks the caller), repeats folded into a series.
type recorder struct {
	b   events.EventBroadcaster
	r   events.EventRecorder
	log *slog.Logger
}

func newRecorder(cs kubernetes.Interface, node string, log *slog.Logger) *recorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	return &recorder{b: b, r: b.NewRecorder(scheme.Scheme, "vpcipd"), log: log}
}

func (r *recorder) start(ctx context.Context) (stop func()) {
	if err := r.b.StartRecordingToSinkWithContext(ctx); err != nil {
		r.log.Warn("events recorder not started", "err", err)
	}
	return r.b.Shutdown
}

// NoAddress records a Warning Event on the pod naming why its ADD got no
// address (e's message carries the cause with its numbers, the same text the
// CNI error shows). It returns at once; with the part disabled it does
// nothing.
func (c *Cluster) NoAddress(pod api.Pod, e *api.Error) {
	if !c.enabled() || pod.Name == "" || e == nil {
		return
	}
	reason := causeReason[e.Cause]
	if reason == "" {
		reason = "NoAddress"
	}
	var regarding runtime.Object
	if p := c.cachedPod(pod.Namespace, pod.Name); p != nil {
		regarding = p
	} else {
		regarding = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}}
	}
	c.events.r.Eventf(regarding, nil, corev1.EventTypeWarning, reason, "AssignAddress", "%s", e.Message)
	c.metrics.events.WithLabelValues(reason).Inc()
}

// nodeEvent records an Event on this node.
func (c *Cluster) nodeEvent(node *corev1.Node, eventType, reason, note string) {
	c.events.r.Eventf(node, nil, eventType, reason, "CheckMaxPods", "%s", note)
	c.metrics.events.WithLabelValues(reason).Inc()
}

// NodeWarning records a Warning Event on this node, for problems of the node
// as a whole rather than of one pod: reason is CamelCase (e.g.
// "ENIConfigNotFound"), note the message, eniConfig the ENIConfig the
// problem concerns ("" for none), named as the Event's related object. The
// events.k8s.io recorder folds Events of one regarding, related, action and
// reason into a series that keeps its first note, so without the related
// ENIConfig a node whose problem moved from ENIConfig "default" to its
// zone's would go on showing "default". It returns at once; with the part
// disabled it does nothing. Before the node cache has the Node the Event
// names it without its UID.
func (c *Cluster) NodeWarning(reason, note, eniConfig string) {
	if !c.enabled() {
		return
	}
	node := c.node()
	if node == nil {
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.o.NodeName}}
	}
	var related runtime.Object
	if eniConfig != "" {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(podsubnet.ENIConfigGroup + "/" + podsubnet.ENIConfigVersion)
		u.SetKind("ENIConfig")
		u.SetName(eniConfig)
		related = u
	}
	c.events.r.Eventf(node, related, corev1.EventTypeWarning, reason, "PlaceENI", "%s", note)
	c.metrics.events.WithLabelValues(reason).Inc()
}
