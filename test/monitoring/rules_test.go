package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// rulesFile is the plain Prometheus rule file; the chart's PrometheusRule
// ships the same file.
var rulesFile = filepath.Join("..", "..", "charts", "vpcip", "files", "prometheus-rules.yaml")

// ruleGroups is the part of a Prometheus rule file these tests read.
type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleTests is the part of a promtool unit-test file these tests read.
type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (make test-deps installs Debian's prometheus)")
	}
	return p
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestRulesCheck: promtool accepts the rule file (syntax, PromQL, templates).
func TestRulesCheck(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestRulesUnit runs the promtool unit tests: each alert's labels and
// expanded annotations (with their numbers) at chosen times.
func TestRulesUnit(t *testing.T) {
	cmd := exec.Command(promtool(t), "test", "rules", "rules_test.yaml")
	cmd.Dir = "testdata"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules did not report SUCCESS:\n%s", out)
	}
}

// TestEveryAlertTestedAndDocumented: every alert has a promtool case where it
// fires and one where it does not, a severity, a summary, a description and
// a runbook_url whose anchor is a heading of docs/runbook.md.
func TestEveryAlertTestedAndDocumented(t *testing.T) {
	var rules ruleGroups
	readYAML(t, rulesFile, &rules)
	var tests ruleTests
	readYAML(t, filepath.Join("testdata", "rules_test.yaml"), &tests)
	if len(tests.RuleFiles) != 1 || filepath.Clean(filepath.Join("testdata", tests.RuleFiles[0])) != filepath.Clean(rulesFile) {
		t.Fatalf("rules_test.yaml loads %v, want the chart's rule file", tests.RuleFiles)
	}
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	runbook, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^## (\S+)$`).FindAllStringSubmatch(string(runbook), -1) {
		headings[strings.ToLower(m[1])] = true
	}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			seen[r.Alert] = true
			if !firing[r.Alert] || !silent[r.Alert] {
				t.Errorf("%s: promtool cases firing %v, not firing %v; want both", r.Alert, firing[r.Alert], silent[r.Alert])
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s: no severity label", r.Alert)
			}
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[k]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, k)
				}
			}
			anchor := r.Annotations["runbook_url"][strings.LastIndex(r.Annotations["runbook_url"], "#")+1:]
			if anchor != strings.ToLower(r.Alert) || !headings[anchor] {
				t.Errorf("%s: runbook_url %q: want an anchor to the heading %q in docs/runbook.md", r.Alert, r.Annotations["runbook_url"], r.Alert)
			}
		}
	}
	for name := range firing {
		if !seen[name] {
			t.Errorf("rules_test.yaml tests alert %s, which the rule file does not define", name)
		}
	}
	if len(seen) < 10 {
		t.Errorf("%d alerts in the rule file, want the 10 of the runbook", len(seen))
	}
}
