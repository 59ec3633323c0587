package ipam

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// Metrics are the pool controllers' Prometheus metrics (docs/pools.md):
// the pools' address counts, computed on scrape from the running
// controller's view (nothing while this instance is not the leader), and
// counters of allocation outcomes.
type Metrics struct {
	mu  sync.Mutex
	cur *controller

	addresses *prometheus.Desc
	outcomes  *prometheus.CounterVec
}

// Outcomes counted in vipd_ipam_allocations_total.
const (
	OutcomeAllocated = "allocated" // an address was taken or joined
	OutcomeReleased  = "released"  // a claimer gave an address back (or lost it as an orphan)
	OutcomeConflict  = "conflict"  // a requested address is held by another claimer
	OutcomeExhausted = "exhausted" // no free address
)

// NewMetrics returns the collector; register it once.
func NewMetrics() *Metrics {
	return &Metrics{
		addresses: prometheus.NewDesc("vipd_ippool_addresses",
			"Addresses of each IPPool by state (total usable, allocated, free), as the leading controller sees them.",
			[]string{"pool", "state"}, nil),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_ipam_allocations_total",
			Help: "Allocation outcomes by claimer kind (Service, IPAddressClaim): allocated, released, conflict, exhausted.",
		}, []string{"kind", "outcome"}),
	}
}

func (m *Metrics) set(c *controller) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.cur = c
	m.mu.Unlock()
}

func (m *Metrics) count(kind, outcome string) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(kind, outcome).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.addresses
	m.outcomes.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.outcomes.Collect(ch)
	m.mu.Lock()
	c := m.cur
	m.mu.Unlock()
	if c == nil {
		return
	}
	allocs := c.allAllocs()
	for _, p := range c.pools() {
		st := PoolStatus(p, allocs, v1alpha1.IPPoolStatus{}, 0, metav1Now())
		ch <- prometheus.MustNewConstMetric(m.addresses, prometheus.GaugeValue, float64(st.Total), p.Name, "total")
		ch <- prometheus.MustNewConstMetric(m.addresses, prometheus.GaugeValue, float64(st.Allocated), p.Name, "allocated")
		ch <- prometheus.MustNewConstMetric(m.addresses, prometheus.GaugeValue, float64(st.Free), p.Name, "free")
	}
}
