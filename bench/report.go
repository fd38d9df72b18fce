package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// report prints the side-by-side table to out and writes the JSON and the
// chart if asked to.
func report(c config, res *results, out io.Writer) error {
	writeTable(out, res)
	if c.JSON != "" {
		if err := writeJSON(c.JSON, res, out); err != nil {
			return err
		}
	}
	if c.Chart != "" {
		if err := writeChart(c.Chart, res); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		// The absolute path: `go -C bench run .` runs in bench/, not in
		// the directory the user typed the command in.
		path := c.Chart
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		fmt.Fprintf(out, "chart: %s\n", path)
	}
	return nil
}

// writeTable prints one column per run.
func writeTable(out io.Writer, res *results) {
	c := res.Config
	fmt.Fprintf(out, "store %s, %d users, %d workers, %s, %.0f%% absent ids, %s; %s, GOMAXPROCS=%d\n",
		res.Store, c.Rows, c.Workers, runLength(c), 100*c.Absent, c.Dist, res.GoVer, res.CPUs)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(p *phase) string) {
		cells := []string{label}
		for _, p := range res.Phases {
			cells = append(cells, f(p))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row("", func(p *phase) string { return p.Name })
	row("requests/s", func(p *phase) string { return fmt.Sprintf("%.0f", p.RPS()) })
	row("latency p50 (µs)", func(p *phase) string { return fmt.Sprint(p.quantile(0.50)) })
	row("latency p99 (µs)", func(p *phase) string { return fmt.Sprint(p.quantile(0.99)) })
	row("latency p99.9 (µs)", func(p *phase) string { return fmt.Sprint(p.quantile(0.999)) })
	row("present ids p50/p99 (µs)", func(p *phase) string {
		return fmt.Sprintf("%d / %d", quantile(p.HistPresent, 0.50), quantile(p.HistPresent, 0.99))
	})
	row("absent ids p50/p99 (µs)", func(p *phase) string {
		return fmt.Sprintf("%d / %d", quantile(p.HistAbsent, 0.50), quantile(p.HistAbsent, 0.99))
	})
	row("requests", func(p *phase) string { return fmt.Sprint(p.Ops) })
	row("db queries", func(p *phase) string { return fmt.Sprint(p.Queries) })
	row("queries avoided", func(p *phase) string { return guardedOnly(p, fmt.Sprint(p.Avoided)) })
	row("false positives", func(p *phase) string { return guardedOnly(p, fmt.Sprint(p.FalsePos)) })
	row("observed FPR", func(p *phase) string { return guardedOnly(p, fmt.Sprintf("%.2g", p.ObservedFPR)) })
	row("guard memory", func(p *phase) string {
		if !p.Guarded || p.GuardBytes == 0 {
			return guardedOnly(p, "-")
		}
		return humanBytes(p.GuardBytes)
	})
	row("guard bits/item", func(p *phase) string { return guardedOnly(p, fmt.Sprintf("%.1f", p.BitsPerItem)) })
	row("guard doublings (in run)", func(p *phase) string {
		return guardedOnly(p, fmt.Sprintf("%d (%d)", p.DoublingCount, len(p.Doublings)))
	})
	row("wrong answers", func(p *phase) string { return fmt.Sprint(p.WrongFound) })
	row("errors", func(p *phase) string { return fmt.Sprint(p.Errors) })
	tw.Flush()
	switch {
	case res.WarmUp > 0 && c.Warmup == "during":
		fmt.Fprintf(out, "the guard warmed up in %.0f ms of the guarded run; until then its lookups passed through\n", 1000*res.WarmUp)
	case res.WarmUp > 0:
		fmt.Fprintf(out, "the guard warmed up from the store in %.0f ms before the guarded run (-warmup during to include it)\n", 1000*res.WarmUp)
	}
}

func guardedOnly(p *phase, s string) string {
	if !p.Guarded {
		return "-"
	}
	return s
}

func runLength(c config) string {
	if c.Ops > 0 {
		return fmt.Sprintf("%d ops per run", c.Ops)
	}
	return fmt.Sprintf("%v per run", c.Duration)
}

// writeJSON writes res to path, or to out for "-".
func writeJSON(path string, res *results, out io.Writer) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err := out.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// MarshalJSON adds the percentiles, which live in the histogram.
func (p *phase) MarshalJSON() ([]byte, error) {
	type plain phase
	return json.Marshal(struct {
		*plain
		RPS           float64 `json:"requests_per_second"`
		P50us         int64   `json:"p50_us"`
		P99us         int64   `json:"p99_us"`
		P999us        int64   `json:"p999_us"`
		PresentP50us  int64   `json:"present_p50_us"`
		PresentP99us  int64   `json:"present_p99_us"`
		AbsentP50us   int64   `json:"absent_p50_us"`
		AbsentP99us   int64   `json:"absent_p99_us"`
		PresentLookup int64   `json:"present_lookups"`
		AbsentLookup  int64   `json:"absent_lookups"`
	}{(*plain)(p), p.RPS(), p.quantile(0.50), p.quantile(0.99), p.quantile(0.999),
		quantile(p.HistPresent, 0.50), quantile(p.HistPresent, 0.99),
		quantile(p.HistAbsent, 0.50), quantile(p.HistAbsent, 0.99),
		count(p.HistPresent), count(p.HistAbsent)})
}

// count returns the number of values in h, 0 for none.
func count(h *hdrhistogram.Histogram) int64 {
	if h == nil {
		return 0
	}
	return h.TotalCount()
}

func createFile(path string) (*os.File, error) { return os.Create(path) }

// humanBytes formats n bytes in KiB or MiB.
func humanBytes(n int) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
