package health

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the checker's Prometheus series. A nil *metrics records
// nothing.
type metrics struct {
	up       prometheus.Gauge
	draining prometheus.Gauge
	checks   *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_health_up",
			Help: "1 when the apiserver health check considers this node healthy (after thresholds), else 0.",
		}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_health_draining",
			Help: "1 while the apiserver is going away (its /readyz reports the shutdown, or its port was refused right after a good probe): this node hands its VIPs over, else 0.",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_health_checks_total",
			Help: "Apiserver health probes by result (ok or the failure reason).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vipd_health_check_duration_seconds",
			Help:    "Duration of apiserver health probes, including connection and TLS setup.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
	}
	cs := []prometheus.Collector{m.up, m.draining, m.checks, m.duration}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("register health metrics: %w", err)
		}
	}
	// Export every result at 0 so rate() works from the first failure.
	for _, r := range reasons {
		m.checks.WithLabelValues(r)
	}
	return m, nil
}

func (m *metrics) probed(r Result) {
	if m == nil {
		return
	}
	m.checks.WithLabelValues(r.Reason).Inc()
	m.duration.Observe(r.Duration.Seconds())
}

func (m *metrics) setUp(healthy bool) {
	if m == nil {
		return
	}
	v := 0.0
	if healthy {
		v = 1
	}
	m.up.Set(v)
}

func (m *metrics) setDraining(draining bool) {
	if m == nil {
		return
	}
	v := 0.0
	if draining {
		v = 1
	}
	m.draining.Set(v)
}
