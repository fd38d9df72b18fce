package mysqlguard

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuckooguard/cuckooguard/metrics/fanoutmetrics"
)

// Describe and Collect make the Service one prometheus.Collector of
// everything it runs: each table's Loader and guard (metrics'
// cuckooguard_loader_* and cuckooguard_guard_*), its Middleware
// (cuckooguard_http_*) and its follower (mysqlmetrics'
// cuckooguard_follower_* and cuckooguard_mysql_*, or through NATS
// fanoutmetrics' cuckooguard_follower_* and cuckooguard_fanout_*),
// labelled table="<name>", and through NATS the relay
// (cuckooguard_fanout_relay_*). Register it once:
// prometheus.MustRegister(svc). A
// registry that holds it cannot hold a pgguard.Service too (their
// followers' metrics share names with other help texts; see
// mysqlmetrics): give each its own registry.

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.collectors() {
		c.Collect(ch)
	}
}

// collectors returns the collectors of the Service's parts, made once.
func (s *Service) collectors() []prometheus.Collector {
	s.collectOnce.Do(func() {
		for _, m := range s.members {
			s.parts = append(s.parts, m.collectors...)
		}
		if s.relay != nil {
			s.parts = append(s.parts, fanoutmetrics.NewRelayCollector(s.relay))
		}
	})
	return s.parts
}
