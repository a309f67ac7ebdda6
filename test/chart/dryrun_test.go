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

// The rendered chart, CRDs and admission policies included, is valid for a
// real kube-apiserver:
// `kubectl apply --dry-run=server` with the default values and each release
// values set (releaseValues) and with the shared EC2 budget's flow control,
// rendered by Helm 3 and Helm 4. The chart's
// CRDs are applied for real first: a dry run cannot check an ENIConfig
// against a CRD that is itself only dry-run.
func TestApplyDryRunServer(t *testing.T) {
	hs := helms(t)
	k := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if res, err := k.Kubectl(ctx, "apply", "-f", filepath.Join(ChartDir(), "crds")); err != nil {
		t.Fatalf("applying the chart's CRDs: %v\n%s", err, res)
	}
	if res, err := k.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=50s", "crd/eniconfigs.crd.k8s.amazonaws.com"); err != nil {
		t.Fatalf("%v\n%s", err, res)
	}
	sets := []struct {
		name  string
		files []string
	}{{"default", nil}, {"shared EC2 budget", []string{"ec2-budget-values.yaml"}}}
	for _, rv := range releaseValues {
		sets = append(sets, struct {
			name  string
			files []string
		}{rv.name, rv.files})
	}
	for _, h := range hs {
		for _, set := range sets {
			t.Run(h.Name+"/"+set.name, func(t *testing.T) {
				args := []string{"template", "vpcip", ChartDir(), "--namespace", "kube-system", "--include-crds", vapAPI}
				for _, f := range set.files {
					p, err := filepath.Abs(filepath.Join("testdata", f))
					if err != nil {
						t.Fatal(err)
					}
					args = append(args, "-f", p)
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
				for _, kind := range []string{"daemonset.apps/vpcip", "clusterrole.rbac.authorization.k8s.io/vpcip", "serviceaccount/vpcip",
					"validatingadmissionpolicy.admissionregistration.k8s.io/vpcip-addressbudget-own-node",
					"validatingadmissionpolicybinding.admissionregistration.k8s.io/vpcip-events"} {
					if !strings.Contains(res, kind) {
						t.Errorf("apply output lacks %s:\n%s", kind, res)
					}
				}
				if set.name == "shared EC2 budget" {
					for _, kind := range []string{"flowschema.flowcontrol.apiserver.k8s.io/vpcip-ec2-budget", "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/vpcip-ec2-budget"} {
						if !strings.Contains(res, kind) {
							t.Errorf("apply output lacks %s:\n%s", kind, res)
						}
					}
				}
			})
		}
	}
}
