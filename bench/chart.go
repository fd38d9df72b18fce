package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var runColors = []color.Color{
	color.RGBA{R: 200, G: 60, B: 40, A: 255},
	color.RGBA{R: 30, G: 100, B: 200, A: 255},
}

// writeChart draws throughput and p99 latency per second for every run,
// one above the other, with the guard's doublings as dashed lines, and
// writes it to path as PNG.
func writeChart(path string, res *results) error {
	rps, p99 := plot.New(), plot.New()
	rps.Title.Text = fmt.Sprintf("cuckooguard load test: %s, %d users, %.0f%% absent", res.Store, res.Config.Rows, 100*res.Config.Absent)
	rps.Y.Label.Text = "requests/s"
	p99.Y.Label.Text = "p99 latency (ms)"
	p99.X.Label.Text = "seconds into the run"
	for i, p := range res.Phases {
		thr, lat := make(plotter.XYs, len(p.Timeline)), make(plotter.XYs, len(p.Timeline))
		for s, sec := range p.Timeline {
			x := (float64(s) + 0.5) * p.Bucket.Seconds()
			thr[s] = plotter.XY{X: x, Y: sec.RPS}
			lat[s] = plotter.XY{X: x, Y: float64(sec.P99us) / 1000}
		}
		col := runColors[i%len(runColors)]
		for _, pl := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{rps, thr}, {p99, lat}} {
			if len(pl.xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(pl.xys)
			if err != nil {
				return err
			}
			l.Color = col
			l.Width = vg.Points(1.5)
			pl.p.Add(l)
			if pl.p == rps {
				pl.p.Legend.Add(p.Name, l)
			}
		}
	}
	// Doublings of the guarded run, as dashed vertical lines.
	for _, p := range res.Phases {
		for j, d := range p.Doublings {
			for _, pl := range []*plot.Plot{rps, p99} {
				pl.Y.Min = 0
				ymax := max(pl.Y.Max, 1)
				l, err := plotter.NewLine(plotter.XYs{{X: d.Seconds(), Y: 0}, {X: d.Seconds(), Y: ymax}})
				if err != nil {
					return err
				}
				l.Color = color.Gray{Y: 120}
				l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
				pl.Add(l)
				if pl == rps && j == 0 {
					pl.Legend.Add("guard doubling", l)
				}
			}
		}
	}
	rps.Legend.Top = true
	rps.Y.Min, p99.Y.Min = 0, 0
	rps.X.Min, p99.X.Min = 0, 0
	img := vgimg.New(9*vg.Inch, 7*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadX: vg.Points(4), PadY: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{rps}, {p99}}, tiles, dc)
	rps.Draw(canvases[0][0])
	p99.Draw(canvases[1][0])
	w, err := createFile(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
