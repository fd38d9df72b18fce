package main

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

var curveColors = []color.Color{
	color.RGBA{R: 200, G: 60, B: 40, A: 255},
	color.RGBA{R: 30, G: 100, B: 200, A: 255},
	color.RGBA{R: 40, G: 150, B: 60, A: 255},
	color.RGBA{R: 150, G: 80, B: 170, A: 255},
}

// chart draws growth curves, heap bits per key against keys on a log
// scale, one line per CSV file that growth -csv wrote (its first two
// columns), with the declared capacity and the aim of 27 bits per key
// marked, and writes it to path as a PNG. Each of specs is label=file.
func chart(path string, specs []string, declared int) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("guard memory while growing from WithCapacity(%d)", declared)
	p.X.Label.Text = "keys added"
	p.Y.Label.Text = "heap bits per key"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 60
	xmin, xmax := 0.0, 0.0
	for i, spec := range specs {
		label, file, ok := strings.Cut(spec, "=")
		if !ok {
			return fmt.Errorf("chart: %q is not label=file", spec)
		}
		xys, err := readCurve(file)
		if err != nil {
			return err
		}
		if len(xys) == 0 {
			return fmt.Errorf("chart: %s has no samples", file)
		}
		if xmin == 0 || xys[0].X < xmin {
			xmin = xys[0].X
		}
		xmax = max(xmax, xys[len(xys)-1].X)
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color = curveColors[i%len(curveColors)]
		l.Width = vg.Points(1.2)
		if i > 0 {
			l.Dashes = []vg.Length{vg.Points(4 + 2*float64(i)), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(label, l)
	}
	declaredLine, err := plotter.NewLine(plotter.XYs{{X: float64(declared), Y: 0}, {X: float64(declared), Y: 60}})
	if err != nil {
		return err
	}
	declaredLine.Color = color.Gray{Y: 90}
	declaredLine.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(declaredLine)
	p.Legend.Add(fmt.Sprintf("declared capacity (%d)", declared), declaredLine)
	aim, err := plotter.NewLine(plotter.XYs{{X: min(xmin, float64(declared)), Y: 27}, {X: xmax, Y: 27}})
	if err != nil {
		return err
	}
	aim.Color = color.Gray{Y: 160}
	aim.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	p.Add(aim)
	p.Legend.Add("aim: 27 bits/key", aim)
	p.Legend.Top = true
	p.Legend.Left = false
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// readCurve reads keys and heap bits per key, the first two columns of a
// CSV file with a header line.
func readCurve(path string) (plotter.XYs, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var xys plotter.XYs
	for _, r := range rows[min(1, len(rows)):] {
		if len(r) < 2 {
			return nil, fmt.Errorf("%s: short row %q", path, r)
		}
		x, err1 := strconv.ParseFloat(r[0], 64)
		y, err2 := strconv.ParseFloat(r[1], 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad row %q", path, r)
		}
		xys = append(xys, plotter.XY{X: x, Y: y})
	}
	return xys, nil
}
