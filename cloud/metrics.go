package cloud

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the cloud series. A nil *Metrics records nothing.
type Metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers vipd_cloud_calls_total{provider,call,outcome} and
// vipd_cloud_call_duration_seconds{provider,call} with reg. A nil reg
// returns nil (no metrics). If the series are registered already (a second
// backend in one process), the registered ones are shared.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, nil
	}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vipd_cloud_calls_total",
		Help: "Cloud provider API and metadata calls by provider, call and outcome (success, rate_limited, server_error, transport_error, unauthorized, not_found, unprocessable, client_error, canceled).",
	}, []string{"provider", "call", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vipd_cloud_call_duration_seconds",
		Help:    "Duration of cloud provider API and metadata calls (one HTTP request each).",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"provider", "call"})
	m := &Metrics{calls: calls, duration: duration}
	if err := reg.Register(calls); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("register vipd_cloud_calls_total: %w", err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("register vipd_cloud_calls_total: %w", err)
		}
		m.calls = existing
	}
	if err := reg.Register(duration); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("register vipd_cloud_call_duration_seconds: %w", err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.HistogramVec)
		if !ok {
			return nil, fmt.Errorf("register vipd_cloud_call_duration_seconds: %w", err)
		}
		m.duration = existing
	}
	return m, nil
}

// init exports every outcome of the given calls at 0 so rate() and alerts
// work from the first failure.
func (m *Metrics) init(provider string, calls ...string) {
	if m == nil {
		return
	}
	for _, c := range calls {
		for _, o := range outcomes {
			m.calls.WithLabelValues(provider, c, o)
		}
	}
}

func (m *Metrics) observe(provider, call, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(provider, call, outcome).Inc()
	m.duration.WithLabelValues(provider, call).Observe(d.Seconds())
}
