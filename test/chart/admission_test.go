package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcip/vpcip/ipamd/addressbudget"
	"github.com/vpcip/vpcip/test/kubetest"
)

// vapAPI makes helm render the admission policies, as it does against an
// API server that serves them (helm template alone does not know).
const vapAPI = "--api-versions=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

// TestAdmissionNodeWritesOnlyItsOwn applies the chart's RBAC and admission
// policies to a real kube-apiserver, starts two "daemon pods" of the chart's
// ServiceAccount bound to nodes A and B, and acts with each pod's bound
// token, as vpcipd does in the DaemonSet: A creates and updates its own
// AddressBudget (status included) and records Events about a pod and its
// own Node; A cannot create, update or update the status of B's budget, nor
// record an Event about Node B, about another kind, or under another
// reporting controller; the ServiceAccount's token bound to no pod cannot
// write any budget.
func TestAdmissionNodeWritesOnlyItsOwn(t *testing.T) {
	hs := helms(t)
	k := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := hs[0].Run("template", "vpcip", ChartDir(), "--namespace", "kube-system", "--include-crds", vapAPI)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(p)
	if err != nil {
		t.Fatal(err)
	}
	var apply []string
	keep := objs[:0]
	for _, o := range objs {
		switch o.GetKind() {
		case "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			keep = append(keep, o)
			apply = append(apply, o.GetKind()+"/"+o.GetName())
		}
	}
	if err := k.EnsureNamespace(ctx, "kube-system"); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.ApplyObjects(ctx, k.Config, keep...); err != nil {
		t.Fatal(err)
	}
	t.Logf("applied %s", strings.Join(apply, ", "))
	admin := kubernetes.NewForConfigOrDie(k.Config)
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e6)
	nodeA, nodeB := "vap-a-"+suffix, "vap-b-"+suffix
	for _, n := range []string{nodeA, nodeB} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vpcip-" + n, Namespace: "kube-system"},
			Spec: corev1.PodSpec{NodeName: n, ServiceAccountName: "vpcip", HostNetwork: true,
				Containers: []corev1.Container{{Name: "vpcipd", Image: "localhost/vpcip/vpcip:0.1.0"}}}}
		if _, err := admin.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		dyn := dynamic.NewForConfigOrDie(k.Config)
		for _, n := range []string{nodeA, nodeB} {
			admin.CoreV1().Pods("kube-system").Delete(ctx, "vpcip-"+n, metav1.DeleteOptions{})
			admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
			dyn.Resource(addressbudget.Resource).Delete(ctx, n, metav1.DeleteOptions{})
		}
	})
	cfgA, err := k.PodTokenConfig(ctx, "kube-system", "vpcip-"+nodeA)
	if err != nil {
		t.Fatal(err)
	}
	budgets := func(cfg *rest.Config) *addressbudget.Client {
		return addressbudget.NewClient(dynamic.NewForConfigOrDie(cfg))
	}
	asA, asAdmin := budgets(cfgA), budgets(k.Config)

	// Policies take effect once the API server has loaded them: wait until
	// A's write of B's budget is refused.
	var refused error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		_, refused = asA.Create(ctx, &addressbudget.AddressBudget{ObjectMeta: metav1.ObjectMeta{Name: nodeB}})
		if refused != nil {
			break
		}
		// It got through before the policy loaded.
		dynamic.NewForConfigOrDie(k.Config).Resource(addressbudget.Resource).Delete(ctx, nodeB, metav1.DeleteOptions{})
		time.Sleep(200 * time.Millisecond)
	}
	expectForbidden(t, "A creates B's AddressBudget", refused)

	own, err := asA.Create(ctx, &addressbudget.AddressBudget{ObjectMeta: metav1.ObjectMeta{Name: nodeA}})
	if err != nil {
		t.Fatalf("A creates its own AddressBudget: %v", err)
	}
	own.Status.Addresses = addressbudget.Addresses{Assigned: 1, Warm: 2, Capacity: 9, Budget: 27}
	if own, err = asA.UpdateStatus(ctx, own); err != nil {
		t.Fatalf("A updates its own AddressBudget's status: %v", err)
	}
	own.Labels = map[string]string{"vpcip.io/test": "own"}
	if _, err = asA.Update(ctx, own); err != nil {
		t.Fatalf("A updates its own AddressBudget: %v", err)
	}

	theirs, err := asAdmin.Create(ctx, &addressbudget.AddressBudget{ObjectMeta: metav1.ObjectMeta{Name: nodeB}})
	if err != nil {
		t.Fatal(err)
	}
	theirs.Status.Addresses = addressbudget.Addresses{Capacity: 9, Budget: 27}
	_, err = asA.UpdateStatus(ctx, theirs)
	expectForbidden(t, "A updates B's AddressBudget status", err)
	theirs.Labels = map[string]string{"vpcip.io/test": "theirs"}
	_, err = asA.Update(ctx, theirs)
	expectForbidden(t, "A updates B's AddressBudget", err)
	if got, err := asAdmin.Get(ctx, nodeB); err != nil || got.Status.Addresses.Budget != 0 || got.Labels["vpcip.io/test"] != "" {
		t.Errorf("B's AddressBudget after A's refused writes: %+v, %v; want it unchanged", got, err)
	}

	plain, err := k.ServiceAccountConfigFromFile(ctx, "kube-system", "vpcip", filepath.Join(ChartDir(), "files", "clusterrole-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := asAdmin.Get(ctx, nodeA); err == nil {
		_, err = budgets(plain).UpdateStatus(ctx, got)
		expectForbidden(t, "a token bound to no pod updates A's status", err)
	}

	events := kubernetes.NewForConfigOrDie(cfgA).EventsV1()
	event := func(regarding corev1.ObjectReference, controller string) error {
		e := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "vpcip-test-", Namespace: "default"},
			EventTime: metav1.NowMicro(), ReportingController: controller, ReportingInstance: controller + "-" + nodeA,
			Action: "AssignAddress", Reason: "NoAddress", Type: corev1.EventTypeWarning, Regarding: regarding, Note: "test"}
		_, err := events.Events("default").Create(ctx, e, metav1.CreateOptions{})
		return err
	}
	if err := event(corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"}, "vpcipd"); err != nil {
		t.Errorf("A records an Event about a pod: %v", err)
	}
	if err := event(corev1.ObjectReference{Kind: "Node", Name: nodeA}, "vpcipd"); err != nil {
		t.Errorf("A records an Event about its own Node: %v", err)
	}
	expectForbidden(t, "A records an Event about Node B", event(corev1.ObjectReference{Kind: "Node", Name: nodeB}, "vpcipd"))
	expectForbidden(t, "A records an Event about a Secret", event(corev1.ObjectReference{Kind: "Secret", Namespace: "default", Name: "s"}, "vpcipd"))
	expectForbidden(t, "A records an Event as kubelet", event(corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p"}, "kubelet"))
}

func expectForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted, want refused", what)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: %v, want Forbidden by the admission policy", what, err)
		return
	}
	t.Logf("%s: refused: %v", what, err)
}
