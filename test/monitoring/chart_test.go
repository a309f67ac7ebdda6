package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/vpcip/vpcip/test/chart"
)

// renderChart runs `helm template` on charts/vpcip with the given --set
// values and returns its objects.
func renderChart(t *testing.T, helm string, set ...string) []map[string]any {
	t.Helper()
	args := []string{"template", "t", chart.ChartDir()}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", helm, args, err, out)
	}
	var objs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
}

// canonical is v as JSON, for comparing YAML trees.
func canonical(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestChartShipsRulesAndDashboards: enabled, the chart's PrometheusRule
// carries exactly the groups of the promtool-tested rule file and its
// ConfigMap exactly the generated dashboards, labelled for Grafana's
// sidecar; by default neither is rendered.
func TestChartShipsRulesAndDashboards(t *testing.T) {
	helms, err := chart.Helms()
	if err != nil {
		if os.Getenv("VPCIP_REQUIRE_KUBE") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	var rules map[string]any
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, h := range helms {
		t.Run(h.Name, func(t *testing.T) {
			for _, o := range renderChart(t, h.Path) {
				if o["kind"] == "PrometheusRule" || (o["kind"] == "ConfigMap" && o["data"] != nil && o["data"].(map[string]any)["vpcip-fleet.json"] != nil) {
					t.Errorf("rendered by default: %v %v", o["kind"], o["metadata"])
				}
			}
			var rule, dashboards map[string]any
			for _, o := range renderChart(t, h.Path, "prometheusRule.enabled=true", "dashboards.enabled=true") {
				switch {
				case o["kind"] == "PrometheusRule":
					rule = o
				case o["kind"] == "ConfigMap" && o["data"].(map[string]any)["vpcip-fleet.json"] != nil:
					dashboards = o
				}
			}
			if rule == nil || dashboards == nil {
				t.Fatalf("enabled: PrometheusRule %v, dashboards ConfigMap %v", rule != nil, dashboards != nil)
			}
			if got, want := canonical(t, rule["spec"].(map[string]any)["groups"]), canonical(t, rules["groups"]); got != want {
				t.Errorf("PrometheusRule groups differ from %s", rulesFile)
			}
			labels := dashboards["metadata"].(map[string]any)["labels"].(map[string]any)
			if labels["grafana_dashboard"] != "1" {
				t.Errorf("dashboards ConfigMap labels %v, want grafana_dashboard: \"1\" (the sidecar's default)", labels)
			}
			for _, name := range []string{"vpcip-fleet.json", "vpcip-node.json"} {
				want, err := os.ReadFile(filepath.Join(dashboardsDir, name))
				if err != nil {
					t.Fatal(err)
				}
				if got := dashboards["data"].(map[string]any)[name]; got != string(want) {
					t.Errorf("ConfigMap's %s differs from the generated file", name)
				}
			}
		})
	}
}
