// Package metricstest gathers a Prometheus registry into a map that tests
// compare with the statistics the samples come from.
package metricstest

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// Sample is one sample's type and value.
type Sample struct {
	Type  dto.MetricType
	Value float64
}

// The types our collectors emit.
const (
	Gauge   = dto.MetricType_GAUGE
	Counter = dto.MetricType_COUNTER
)

// Gather scrapes g and returns its samples by name and labels, written as
// in the exposition format with the labels sorted by name:
// `name{a="1",b="2"}`, or `name` without labels.
func Gather(t testing.TB, g prometheus.Gatherer) map[string]Sample {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]Sample)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			if len(m.GetLabel()) > 0 {
				var b strings.Builder
				for i, l := range m.GetLabel() { // sorted by the registry
					if i > 0 {
						b.WriteByte(',')
					}
					b.WriteString(l.GetName() + `="` + l.GetValue() + `"`)
				}
				key += "{" + b.String() + "}"
			}
			var v float64
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			default:
				t.Fatalf("%s: type %v, want a gauge or a counter", key, mf.GetType())
			}
			if _, dup := out[key]; dup {
				t.Fatalf("%s: gathered twice", key)
			}
			out[key] = Sample{mf.GetType(), v}
		}
	}
	return out
}

// Compare fails t unless got has exactly the samples of want, with their
// types and values.
func Compare(t testing.TB, got, want map[string]Sample) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: missing", k)
		case g != want[k]:
			t.Errorf("%s = %v %v, want %v %v", k, g.Type, g.Value, want[k].Type, want[k].Value)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: not expected (%v %v)", k, got[k].Type, got[k].Value)
		}
	}
}

// Lint fails t if promlint finds a problem with the names, units or help
// of g's metrics.
func Lint(t testing.TB, g prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// Bool is 1 for true and 0 for false.
func Bool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
