package monitoring

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var nan = math.NaN()

// dashboardsDir holds the generated dashboards (tools/dashboards).
var dashboardsDir = filepath.Join("..", "..", "charts", "vpcip", "files", "dashboards")

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// dashboard is the part of a Grafana dashboard JSON these tests read.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		Type       string         `json:"type"`
		Title      string         `json:"title"`
		Datasource *datasourceRef `json:"datasource"`
		Targets    []struct {
			Expr         string         `json:"expr"`
			LegendFormat string         `json:"legendFormat"`
			RefID        string         `json:"refId"`
			Instant      bool           `json:"instant"`
			Datasource   *datasourceRef `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Type       string         `json:"type"`
			Name       string         `json:"name"`
			Query      any            `json:"query"`
			Datasource *datasourceRef `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(files) != 2 {
		t.Fatalf("dashboards in %s: %v %v, want the fleet and node dashboards", dashboardsDir, files, err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[d.UID] = d
	}
	return out
}

// TestDashboardDatasources: every panel and query uses the dashboard's
// "datasource" variable, a Prometheus data source variable; nothing names a
// data source an installation may not have.
func TestDashboardDatasources(t *testing.T) {
	for uid, d := range loadDashboards(t) {
		var vars []string
		for _, v := range d.Templating.List {
			vars = append(vars, v.Name)
			switch {
			case v.Type == "datasource" && v.Name == "datasource":
				if v.Query != "prometheus" {
					t.Errorf("%s: datasource variable queries %v, want prometheus", uid, v.Query)
				}
			case v.Datasource != nil && *v.Datasource != (datasourceRef{"prometheus", "${datasource}"}):
				t.Errorf("%s: variable %s uses data source %+v", uid, v.Name, *v.Datasource)
			}
		}
		if !slices.Contains(vars, "datasource") {
			t.Errorf("%s: no datasource variable (have %v)", uid, vars)
		}
		if len(d.Panels) == 0 {
			t.Errorf("%s: no panels", uid)
		}
		for _, p := range d.Panels {
			if p.Datasource == nil || *p.Datasource != (datasourceRef{"prometheus", "${datasource}"}) {
				t.Errorf("%s/%s: panel data source %+v, want prometheus ${datasource}", uid, p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s/%s: no queries", uid, p.Title)
			}
			for _, q := range p.Targets {
				if q.Datasource == nil || *q.Datasource != (datasourceRef{"prometheus", "${datasource}"}) {
					t.Errorf("%s/%s/%s: query data source %+v", uid, p.Title, q.RefID, q.Datasource)
				}
				for _, ref := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(q.Expr, -1) {
					if !strings.HasPrefix(ref[1], "__") && !slices.Contains(vars, ref[1]) {
						t.Errorf("%s/%s: query uses $%s, which the dashboard does not define", uid, p.Title, ref[1])
					}
				}
			}
		}
	}
}

// metricNames returns the vpcip_ and awscni_ metric names in PromQL text.
func metricNames(expr string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\b(?:vpcip|awscni)_[a-z0-9_]+`).FindAllString(expr, -1) {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}
