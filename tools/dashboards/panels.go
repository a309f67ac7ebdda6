package main

import (
	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// kind is a Grafana panel type.
type kind int

const (
	graph  kind = iota // timeseries: range queries over the dashboard's time
	bars               // bargauge: one bar per series, instant query
	single             // stat: one number, instant query
	list               // table: one row per series, instant query
)

// query is one PromQL target of a panel.
type query struct {
	expr   string
	legend string // Grafana legend format, e.g. "{{node}}"
}

// panel is one dashboard panel: what it shows and how.
type panel struct {
	title, description string
	kind               kind
	unit               string // Grafana unit id: "percent", "s", "reqps", "short", "percentunit"
	width, height      uint32 // grid units: 24 columns wide
	queries            []query
}

// datasource is the dashboard's "datasource" variable: every panel and
// query uses it, so the dashboard works with whichever Prometheus the
// operator picks.
func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

func datasourceVariable() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")
}

func targets(p panel, instant bool) []cog.Builder[variants.Dataquery] {
	var out []cog.Builder[variants.Dataquery]
	for i, q := range p.queries {
		b := prometheus.NewDataqueryBuilder().Expr(q.expr).LegendFormat(q.legend).
			RefId(string(rune('A' + i))).Datasource(datasource())
		if instant {
			b = b.Instant().Format(prometheus.PromQueryFormatTable)
		} else {
			b = b.Range()
		}
		out = append(out, b)
	}
	return out
}

// build turns a panel into its SDK builder.
func build(p panel) cog.Builder[dashboard.Panel] {
	w, h := p.width, p.height
	if w == 0 {
		w = 12
	}
	if h == 0 {
		h = 8
	}
	switch p.kind {
	case bars:
		return bargauge.NewPanelBuilder().Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(datasource()).Targets(targets(p, true)).Span(w).Height(h).Min(0).Max(100).
			Orientation(common.VizOrientationHorizontal).DisplayMode(common.BarGaugeDisplayModeGradient)
	case single:
		return stat.NewPanelBuilder().Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(datasource()).Targets(targets(p, true)).Span(w).Height(h)
	case list:
		return table.NewPanelBuilder().Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(datasource()).Targets(targets(p, true)).Span(w).Height(h)
	default:
		return timeseries.NewPanelBuilder().Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(datasource()).Targets(targets(p, false)).Span(w).Height(h).Min(0).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))
	}
}
