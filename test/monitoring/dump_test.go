package monitoring

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

// The panels' results can be written out (VPCIP_PANELS_OUT=file, as `make
// readme-picture` does) for tools/dashboards/picture to draw the README's
// picture of the Fleet capacity dashboard from a real run.

type dumpedSeries struct {
	Labels map[string]string `json:"labels"`
	Times  []float64         `json:"times"` // unix seconds
	Values []float64         `json:"values"`
}

type dumpedQuery struct {
	Legend string         `json:"legend"` // Grafana legend format
	Series []dumpedSeries `json:"series"`
}

type dumpedPanel struct {
	Title   string        `json:"title"`
	Type    string        `json:"type"` // Grafana panel type
	Queries []dumpedQuery `json:"queries"`
}

type dump struct {
	Dashboard string        `json:"dashboard"`
	Start     time.Time     `json:"start"`
	End       time.Time     `json:"end"`
	Panels    []dumpedPanel `json:"panels"`
}

// record adds one panel's results (NaN points dropped: JSON has no NaN).
func (d *dump) record(title, typ string, legends []string, results [][]series) {
	p := dumpedPanel{Title: title, Type: typ}
	for i, res := range results {
		q := dumpedQuery{Legend: legends[i]}
		for _, s := range res {
			ds := dumpedSeries{Labels: s.labels}
			for j, v := range s.values {
				if v == v {
					ds.Times, ds.Values = append(ds.Times, s.times[j]), append(ds.Values, v)
				}
			}
			q.Series = append(q.Series, ds)
		}
		p.Queries = append(p.Queries, q)
	}
	d.Panels = append(d.Panels, p)
}

// write saves the dump to $VPCIP_PANELS_OUT, if set.
func (d *dump) write(t *testing.T) {
	path := os.Getenv("VPCIP_PANELS_OUT")
	if path == "" || len(d.Panels) == 0 {
		return
	}
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("panel results written to %s", path)
}
