package main

import (
	"fmt"
	"image/color"
	"os"
	"regexp"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	vgdraw "gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette is a set of distinct series colours on a light background.
var palette = []color.RGBA{
	{0x37, 0x87, 0x2d, 0xff}, {0xe0, 0x2f, 0x44, 0xff}, {0x1f, 0x60, 0xc4, 0xff}, {0xfa, 0x64, 0x00, 0xff},
	{0x8f, 0x3b, 0xb8, 0xff}, {0xc4, 0x16, 0x2a, 0xff}, {0x56, 0xa6, 0x4b, 0xff}, {0xe0, 0xb4, 0x00, 0xff},
}

var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// legend expands a Grafana legend format with a series' labels.
func legend(format string, labels map[string]string) string {
	if format == "" {
		return fmt.Sprint(labels)
	}
	return legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return labels[legendVar.FindStringSubmatch(m)[1]]
	})
}

// draw lays the panels out two per row and writes a PNG.
func draw(panels []panel, out string) error {
	const cols = 2
	rows := (len(panels) + cols - 1) / cols
	img := vgimg.New(2*6*vg.Inch, vg.Length(rows)*3.2*vg.Inch)
	dc := vgdraw.New(img)
	tiles := vgdraw.Tiles{Rows: rows, Cols: cols, PadX: vg.Inch / 4, PadY: vg.Inch / 4,
		PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range panels {
		pl, err := panelPlot(p, shown[i].unit)
		if err != nil {
			return fmt.Errorf("%s: %w", p.Title, err)
		}
		grid[i/cols][i%cols] = pl
	}
	canvases := plot.Align(grid, tiles, dc)
	for r := range grid {
		for c := range grid[r] {
			if grid[r][c] != nil {
				grid[r][c].Draw(canvases[r][c])
			}
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// panelPlot draws one panel: horizontal bars for a bar gauge (its instant
// values), lines over minutes since the run's start for a time series.
func panelPlot(p panel, unit string) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.Title.TextStyle.Font.Size = font.Length(13)
	pl.Y.Label.Text = unit
	pl.Legend.Top = true
	pl.Legend.Left = true
	if p.Type == "bargauge" {
		return barPlot(pl, p)
	}
	t0 := 0.0
	for _, q := range p.Queries {
		for _, s := range q.Series {
			if len(s.Times) > 0 && (t0 == 0 || s.Times[0] < t0) {
				t0 = s.Times[0]
			}
		}
	}
	pl.X.Label.Text = "minutes into the run"
	n := 0
	for _, q := range p.Queries {
		for _, s := range q.Series {
			if len(s.Values) == 0 || (len(q.Series) > 1 && allZero(s.Values)) {
				continue // as Grafana's legend can hide all-zero series (causes never seen)
			}
			xy := make(plotter.XYs, len(s.Values))
			for i := range s.Values {
				xy[i].X, xy[i].Y = (s.Times[i]-t0)/60, s.Values[i]
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			line.Color = palette[n%len(palette)]
			line.Width = vg.Points(1.6)
			pl.Add(line)
			pl.Legend.Add(legend(q.Legend, s.Labels), line)
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no data")
	}
	pl.Add(plotter.NewGrid())
	pl.Y.Min = 0
	return pl, nil
}

// barPlot draws one horizontal bar per series of the first query, highest
// at the top, as Grafana's bar gauge lists them.
func barPlot(pl *plot.Plot, p panel) (*plot.Plot, error) {
	if len(p.Queries) == 0 || len(p.Queries[0].Series) == 0 {
		return nil, fmt.Errorf("no data")
	}
	q := p.Queries[0]
	var names []string
	var vals plotter.Values
	for _, s := range slices.Backward(q.Series) {
		names = append(names, legend(q.Legend, s.Labels))
		vals = append(vals, s.Values[len(s.Values)-1])
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(22))
	if err != nil {
		return nil, err
	}
	bars.Horizontal = true
	bars.Color = palette[0]
	bars.LineStyle.Width = 0
	pl.Add(bars)
	pl.NominalY(names...)
	pl.Y.Label.Text = ""
	pl.X.Label.Text = "% of budget"
	pl.X.Min, pl.X.Max = 0, 100
	return pl, nil
}

func allZero(v []float64) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}
