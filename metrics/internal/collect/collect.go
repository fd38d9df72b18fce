// Package collect builds Prometheus collectors that read a statistics
// struct once per scrape and turn its fields into constant metrics.
package collect

import (
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector reads S once per scrape with stats and emits one sample per
// metric added with Add.
type Collector[S any] struct {
	ns      string
	labels  prometheus.Labels
	stats   func() S
	descs   []*prometheus.Desc
	byName  map[string]*prometheus.Desc
	samples []sample[S]
}

type sample[S any] struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	labels []string
	value  func(*S) float64
}

// New returns an empty collector of the statistics stats returns, whose
// metric names start with namespace and whose metrics carry constLabels.
func New[S any](namespace string, constLabels prometheus.Labels, stats func() S) *Collector[S] {
	return &Collector[S]{ns: namespace, labels: constLabels, stats: stats, byName: make(map[string]*prometheus.Desc)}
}

// Metric is one metric family: its name within a subsystem, help, type,
// and the names of its variable labels.
type Metric struct {
	Subsystem, Name, Help string
	Type                  prometheus.ValueType
	Labels                []string
}

// Add adds a sample of m whose variable labels have the values
// labelValues, read from the statistics by value. Samples of one family
// share its Desc.
func (c *Collector[S]) Add(m Metric, value func(*S) float64, labelValues ...string) *Collector[S] {
	name := prometheus.BuildFQName(c.ns, m.Subsystem, m.Name)
	d, ok := c.byName[name]
	if !ok {
		d = prometheus.NewDesc(name, m.Help, m.Labels, c.labels)
		c.byName[name] = d
		c.descs = append(c.descs, d)
	}
	c.samples = append(c.samples, sample[S]{desc: d, typ: m.Type, labels: labelValues, value: value})
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one call of the statistics
// function per scrape, so that the samples of a scrape agree with each
// other as far as the statistics do.
func (c *Collector[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for _, m := range c.samples {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(&s), m.labels...)
	}
}

// Bool is 1 for true and 0 for false.
func Bool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// IsNil reports whether v, the thing a collector would watch, is nil or a
// nil pointer in an interface.
func IsNil(v any) bool {
	return v == nil || reflect.ValueOf(v).Kind() == reflect.Pointer && reflect.ValueOf(v).IsNil()
}

// Timestamp is t in Unix seconds, 0 for the zero time (never).
func Timestamp(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}
