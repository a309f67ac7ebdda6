package chart

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpcip/vpcip/test/kubetest"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// The rendered chart, CRDs included, is valid for a real kube-apiserver:
// `kubectl apply --dry-run=server` with the default and the aws-node values,
// rendered by Helm 3 and Helm 4.
func TestApplyDryRunServer(t *testing.T) {
	hs := helms(t)
	k := kubetest.Shared(t)
	aws, err := filepath.Abs("testdata/aws-node-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		for _, values := range []string{"", aws} {
			name := h.Name + "/default"
			if values != "" {
				name = h.Name + "/aws-node"
			}
			t.Run(name, func(t *testing.T) {
				args := []string{"template", "vpcip", ChartDir(), "--namespace", "kube-system", "--include-crds"}
				if values != "" {
					args = append(args, "-f", values)
				}
				out, err := h.Run(args...)
				if err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(t.TempDir(), "rendered.yaml")
				if err := os.WriteFile(p, out, 0o644); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				res, err := k.Kubectl(ctx, "apply", "--dry-run=server", "-f", p)
				if err != nil {
					t.Fatalf("%v\n%s", err, res)
				}
				for _, kind := range []string{"daemonset.apps/vpcip", "clusterrole.rbac.authorization.k8s.io/vpcip", "serviceaccount/vpcip"} {
					if !strings.Contains(res, kind) {
						t.Errorf("apply output lacks %s:\n%s", kind, res)
					}
				}
			})
		}
	}
}
