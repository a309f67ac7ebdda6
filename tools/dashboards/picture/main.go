// Command picture draws the README's picture of the Fleet capacity
// dashboard: the panels' query results from a real run (test/monitoring's
// scenario, written with VPCIP_PANELS_OUT), plotted with gonum/plot as the
// panels show them. Grafana itself is not needed: the queries are the
// dashboard's own, evaluated by a real Prometheus.
//
// Usage (from the repository root: make readme-picture):
//
//	cd tools/dashboards && go run ./picture -in ../../results/panels.json -out ../../docs/fleet-dashboard.png
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
)

// series, query, panel and dump mirror what test/monitoring writes.
type series struct {
	Labels map[string]string `json:"labels"`
	Times  []float64         `json:"times"` // unix seconds
	Values []float64         `json:"values"`
}

type query struct {
	Legend string   `json:"legend"` // Grafana legend format, "{{node}}"
	Series []series `json:"series"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"` // Grafana panel type: timeseries, bargauge, stat, table
	Queries []query `json:"queries"`
}

type dump struct {
	Dashboard string  `json:"dashboard"`
	Panels    []panel `json:"panels"`
}

// shown are the panels drawn, in reading order (two columns), with their
// units.
var shown = []struct{ title, unit string }{
	{"Nodes by address budget used", "% of budget"},
	{"Cluster addresses", "addresses"},
	{"Free addresses per subnet", "% of usable"},
	{"ADD wait", "seconds"},
	{"Address requests refused, by cause", "per second"},
	{"EC2 calls by operation", "per second"},
}

func main() {
	in := flag.String("in", "", "panel results written by test/monitoring (VPCIP_PANELS_OUT)")
	out := flag.String("out", "fleet-dashboard.png", "PNG to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "picture:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var d dump
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var panels []panel
	for _, s := range shown {
		i := slices.IndexFunc(d.Panels, func(p panel) bool { return p.Title == s.title })
		if i < 0 {
			return fmt.Errorf("%s has no panel %q", in, s.title)
		}
		panels = append(panels, d.Panels[i])
	}
	return draw(panels, out)
}
