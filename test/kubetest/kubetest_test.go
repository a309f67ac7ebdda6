package kubetest_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.kubetest.example
spec:
  group: kubetest.example
  scope: Cluster
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
---
apiVersion: kubetest.example/v1
kind: Widget
metadata: {name: w1}
spec: {size: 3}
`

func TestApplyCRDAndItsObjectInOneFile(t *testing.T) {
	k := kubetest.Shared(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "widget.yaml")
	if err := os.WriteFile(path, []byte(widgetCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := k.ApplyFiles(ctx, path); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(k.Config)
	w, err := dyn.Resource(schema.GroupVersionResource{Group: "kubetest.example", Version: "v1", Resource: "widgets"}).Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size := w.Object["spec"].(map[string]any)["size"]; size != int64(3) {
		t.Errorf("widget size = %v, want 3", size)
	}
	out, err := k.Kubectl(ctx, "get", "widgets", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "widget.kubetest.example/w1" {
		t.Errorf("kubectl get widgets = %q, %v", out, err)
	}
}

func TestServiceAccountGetsExactlyItsRules(t *testing.T) {
	k := kubetest.Shared(t)
	ctx := context.Background()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte("- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [list]\n"), 0o644)
	cfg, err := k.ServiceAccountConfigFromFile(ctx, "kubetest-sa", "reader", rules)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list pods as the ServiceAccount: %v", err)
	}
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list nodes as the ServiceAccount = %v, want forbidden", err)
	}
}

func TestStopAndRestartAPIServer(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	k, err := kubetest.Start(kubetest.Options{Name: "restart"})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(k.Config)
	if err := k.EnsureNamespace(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	k.StopAPIServer()
	short, c2 := context.WithTimeout(ctx, 2*time.Second)
	_, err = cs.CoreV1().Namespaces().Get(short, "kept", metav1.GetOptions{})
	c2()
	if err == nil {
		t.Fatal("the API answered with kube-apiserver stopped")
	}
	if err := k.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace created before the restart: %v", err)
	}
}

// An IPv6 server listens on [::1] only and gives Services IPv6 single-stack
// addresses of ServiceCIDR6 (the kubernetes Service and a new one).
func TestIPv6Server(t *testing.T) {
	kubetest.SkipIfUnavailable(t)
	k, err := kubetest.Start(kubetest.Options{Name: "ipv6", IPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	if !strings.HasPrefix(k.URL, "https://[::1]:") || k.ServiceCIDR != kubetest.ServiceCIDR6 {
		t.Errorf("URL %s, Service CIDR %s; want https://[::1]:<port> and %s", k.URL, k.ServiceCIDR, kubetest.ServiceCIDR6)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := k.Kubectl(ctx, "create", "service", "clusterip", "v6", "--tcp=80"); err != nil {
		t.Fatal(err)
	}
	cidr := netip.MustParsePrefix(kubetest.ServiceCIDR6)
	for _, name := range []string{"kubernetes", "v6"} {
		var out string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
			out, err = k.Kubectl(ctx, "get", "service", name, "-o", "jsonpath={.spec.ipFamilies[*]} {.spec.clusterIPs[*]}")
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		f := strings.Fields(out)
		if err != nil || len(f) != 2 || f[0] != "IPv6" || !cidr.Contains(netip.MustParseAddr(f[1])) {
			t.Errorf("service %s: %q %v; want IPv6 only, in %s", name, out, err, cidr)
		}
	}
	port := k.URL[strings.LastIndex(k.URL, ":")+1:]
	if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
		c.Close()
		t.Errorf("the IPv6 API server answers on 127.0.0.1:%s too", port)
	}
}
