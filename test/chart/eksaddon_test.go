package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The rules a Helm chart must follow to be installable as a third-party
// Amazon EKS add-on (AWS Marketplace seller guide, "Container-based product
// requirements", EKS add-on requirements, as AWS's add-on pre-validation
// tool checks them): EKS renders the chart itself, without a cluster to ask
// and without running Helm's lifecycle, so
//   - no Helm hooks (annotation helm.sh/hook): EKS does not run them;
//   - no `lookup`: there is no cluster to read at render time;
//   - no `.Capabilities`: the render does not know the cluster's API
//     versions (a `.Capabilities.APIVersions.Has` test would be false and
//     silently drop what it guards);
//   - of `.Release`, only `.Release.Name` and `.Release.Namespace`;
//   - every dependency inside the chart;
//   - it renders with `helm template --kube-version V --namespace N
//     --include-crds --no-hooks` for every Kubernetes version it supports,
//     and passes `helm lint --strict` (TestLint).
//
// Besides, the add-on's namespace is the user's choice (EKS namespace
// configuration): every namespaced object renders into the release's
// namespace; and an update re-applies the manifests, so a render must not
// change from one run to the next (no random or time-dependent values).

// templateAction matches one template action {{ ... }} (comments included,
// which are checked too: a rule's word in a comment is easy to move into
// code).
var templateAction = regexp.MustCompile(`(?s)\{\{.*?\}\}`)

// chartTemplateFiles returns the chart's template sources by path relative
// to the chart.
func chartTemplateFiles(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	dir := filepath.Join(ChartDir(), "templates")
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ChartDir(), p)
		out[rel] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no templates found")
	}
	return out
}

// eksAddonViolations lists where the template sources break the EKS add-on
// rules, as "file:line: what".
func eksAddonViolations(files map[string]string) []string {
	lookup := regexp.MustCompile(`(^|[\s(|])lookup\s`)
	release := regexp.MustCompile(`\.Release\.([A-Za-z]+)`)
	var out []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	}) {
		src := files[name]
		lineOf := func(off int) int { return 1 + strings.Count(src[:off], "\n") }
		if i := strings.Index(src, "helm.sh/hook"); i >= 0 {
			out = append(out, name+":"+itoa(lineOf(i))+": a Helm hook (helm.sh/hook)")
		}
		for _, loc := range templateAction.FindAllStringIndex(src, -1) {
			action := src[loc[0]:loc[1]]
			if lookup.MatchString(action) {
				out = append(out, name+":"+itoa(lineOf(loc[0]))+": lookup")
			}
			if strings.Contains(action, ".Capabilities") {
				out = append(out, name+":"+itoa(lineOf(loc[0]))+": .Capabilities")
			}
			for _, m := range release.FindAllStringSubmatch(action, -1) {
				if m[1] != "Name" && m[1] != "Namespace" {
					out = append(out, name+":"+itoa(lineOf(loc[0]))+": .Release."+m[1])
				}
			}
		}
	}
	return out
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// The checker finds each kind of violation (a rule test that cannot fail is
// no test).
func TestEKSAddonRulesChecker(t *testing.T) {
	bad := map[string]string{
		"templates/a.yaml": "metadata:\n  annotations:\n    \"helm.sh/hook\": pre-install\n",
		"templates/b.yaml": "{{- $s := (lookup \"v1\" \"Secret\" .Release.Namespace \"x\") }}\n",
		"templates/c.yaml": "x\n{{- if .Capabilities.APIVersions.Has \"a/v1\" }}\n",
		"templates/d.yaml": "by: {{ .Release.Service }}\nrev: {{ .Release.Revision }}\n",
		"templates/e.yaml": "name: {{ .Release.Name }}\nns: {{ .Release.Namespace }}\nlookup: {{ .Values.lookup }}\n",
	}
	got := eksAddonViolations(bad)
	want := []string{
		"templates/a.yaml:3: a Helm hook (helm.sh/hook)",
		"templates/b.yaml:1: lookup",
		"templates/c.yaml:2: .Capabilities",
		"templates/d.yaml:1: .Release.Service",
		"templates/d.yaml:2: .Release.Revision",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The chart's templates follow the EKS add-on rules.
func TestEKSAddonTemplateSources(t *testing.T) {
	if v := eksAddonViolations(chartTemplateFiles(t)); len(v) > 0 {
		t.Errorf("the chart breaks the EKS add-on rules (charts/vpcip/README.md, \"As an EKS add-on\"):\n%s", strings.Join(v, "\n"))
	}
	data, err := os.ReadFile(filepath.Join(ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Dependencies []struct{ Name, Repository string } `yaml:"dependencies"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	for _, d := range c.Dependencies {
		if d.Repository != "" && !strings.HasPrefix(d.Repository, "file://") {
			t.Errorf("dependency %s from %s: an EKS add-on's dependencies must be inside the chart", d.Name, d.Repository)
		}
	}
	schema, err := os.ReadFile(filepath.Join(ChartDir(), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(schema, &s); err != nil {
		t.Fatal(err)
	}
	if s["$schema"] != "http://json-schema.org/draft-07/schema#" || s["additionalProperties"] != false {
		t.Errorf("values.schema.json: $schema %v, additionalProperties %v; the add-on configuration schema is it unchanged: draft-07, unknown keys refused", s["$schema"], s["additionalProperties"])
	}
	if bytes.Contains(schema, []byte(`"$ref": "http`)) {
		t.Error("values.schema.json refers to an external schema; the add-on configuration schema must stand alone")
	}
}

// eksKubeVersions are the Kubernetes versions the add-on render is checked
// for: the oldest the chart's admission policies need (1.30, the v1
// ValidatingAdmissionPolicy) to the newest the project's build uses.
var eksKubeVersions = []string{"1.30.0", "1.32.0", "1.35.0"}

// The chart renders as EKS renders an add-on (no cluster, no hooks, each
// supported Kubernetes version, the add-on's namespace) to the same
// manifests Helm installs against a cluster that serves every API the chart
// uses, admission policies included; twice the same; every namespaced object
// in the add-on's namespace; no object with a hook annotation.
func TestEKSAddonRender(t *testing.T) {
	for _, h := range helms(t) {
		t.Run(h.Name, func(t *testing.T) {
			base := []string{"template", "vpcip", ChartDir(), "--namespace", "vpcip-system", "--include-crds"}
			asCluster, err := h.Run(append(base, vapAPI)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range eksKubeVersions {
				asEKS, err := h.Run(append(base, "--no-hooks", "--kube-version", kv)...)
				if err != nil {
					t.Fatalf("--kube-version %s: %v", kv, err)
				}
				if !bytes.Equal(asEKS, asCluster) {
					t.Errorf("--kube-version %s --no-hooks without the cluster's API versions renders differently from a render against the cluster:\n%s", kv, firstDiff(asEKS, asCluster))
				}
			}
			again, err := h.Run(append(base, vapAPI)...)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, asCluster) {
				t.Errorf("two renders differ:\n%s", firstDiff(again, asCluster))
			}
			objs, err := Decode(asCluster)
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]bool{}
			for _, o := range objs {
				kinds[o.Kind()] = true
				if dig(o, "metadata", "annotations", "helm.sh/hook") != nil {
					t.Errorf("%s %s has a Helm hook annotation", o.Kind(), o.Name())
				}
				ns := str(dig(o, "metadata", "namespace"))
				switch o.Kind() {
				case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
					"FlowSchema", "PriorityLevelConfiguration":
					if ns != "" {
						t.Errorf("cluster-scoped %s %s in namespace %s", o.Kind(), o.Name(), ns)
					}
				default:
					if ns != "vpcip-system" {
						t.Errorf("%s %s in namespace %q, want the add-on's vpcip-system", o.Kind(), o.Name(), ns)
					}
				}
			}
			for _, k := range []string{"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "CustomResourceDefinition"} {
				if !kinds[k] {
					t.Errorf("the add-on render has no %s", k)
				}
			}
			// Switched off, the policies are left out (clusters before 1.30).
			off, err := render(t, h, "rbac: {admissionPolicies: false}")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range off {
				if strings.HasPrefix(o.Kind(), "ValidatingAdmissionPolicy") {
					t.Errorf("rbac.admissionPolicies=false renders %s %s", o.Kind(), o.Name())
				}
			}
		})
	}
}

// firstDiff shows the first differing line of two renders.
func firstDiff(a, b []byte) string {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < max(len(la), len(lb)); i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return "line " + itoa(i+1) + ":\n- " + x + "\n+ " + y
		}
	}
	return "(same lines)"
}
