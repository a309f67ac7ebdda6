package ec2budget

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vpcip/vpcip/provider"
)

// TestAPIServerFailureFallsBackToLocalLimits: a daemon of a 200-node fleet
// whose Lease reads fail (an API server down or timing out) calls EC2 under
// its own limits for Options.Degraded: Take returns at once for every call
// and reads no Lease meanwhile; afterwards it uses the shared bucket again.
// Pacing at the shared rate over the node count instead (5/s over 200)
// held each action to one call per 40 s.
func TestAPIServerFailureFallsBackToLocalLimits(t *testing.T) {
	var objs []runtime.Object
	for i := range 200 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}})
	}
	cs := fake.NewClientset(objs...)
	down := true
	leaseReads := 0
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		leaseReads++
		if down {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	now := t0
	b, err := New(Options{Client: cs, NodeName: "node-1", Degraded: 30 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	for i := range 10 {
		if err := b.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting); err != nil {
			t.Fatalf("take %d with the API server down: %v; want the call let through under local limits", i+1, err)
		}
	}
	if leaseReads != 1 {
		t.Errorf("%d Lease requests for 10 takes with the API server down, want the first alone (then degraded)", leaseReads)
	}
	down, now = false, now.Add(31*time.Second)
	if err := b.Take(ctx, "AttachNetworkInterface", provider.PriorityPodWaiting); err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, LeaseName("AttachNetworkInterface"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after the degraded span the shared bucket is not used: %v", err)
	}
	if st, err := Decode(l.Annotations[Annotation]); err != nil || st.Tokens != 39 {
		t.Errorf("shared bucket after one take: %+v, %v; want 39 of 40 tokens", st, err)
	}
}
