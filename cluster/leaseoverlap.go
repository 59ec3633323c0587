package cluster

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/cluster/lease"
)

// overlapTracker follows the lease machine's planned transfers
// (Output.Overlaps, cluster/lease/transfer.go): one log line when an
// agreed make-before-break overlap starts and one when it ends, with both
// names and the overlap; vipd_handover_overlap_seconds on the old holder;
// vipd_handover_overlap_fallbacks_total for every planned transfer that
// fell back (no confirmation within the bound, no live successor). It
// tells notify (the l2 conflict guard) the window. The loop's goroutine
// only.
type overlapTracker struct {
	self      string
	log       *slog.Logger
	seconds   prometheus.Histogram
	fallbacks *prometheus.CounterVec
	open      map[string]lease.Overlap
	// notify, when set, gets every overlap that starts (on), and its end
	// when this node still holds the address then (the successor).
	notify func(key string, o lease.Overlap, on bool)
	// reported: the addresses whose bind the runtime reports (Held: the
	// vip core's); the others (pool and policy egress addresses) always
	// run to the bound, so they are neither logged at info nor measured.
	reported func(key string) bool
}

// Fallback reasons (vipd_handover_overlap_fallbacks_total{reason}).
const (
	fallbackUnconfirmed = "unconfirmed"     // the successor did not confirm within the bound: released at the bound
	fallbackNotLive     = "successor_stale" // the successor had not answered within a heartbeat: break-before-make
	fallbackNoSuccessor = "no_successor"    // vipd handover found no live successor: nothing moved
)

func newOverlapTracker(self string, log *slog.Logger) *overlapTracker {
	t := &overlapTracker{
		self: self, log: log, open: map[string]lease.Overlap{},
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vipd_handover_overlap_seconds",
			Help:    "Planned transfers away from this node: how long this node kept the address after its successor took it (make-before-break overlap, bounded by the profile's overlap).",
			Buckets: []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1},
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_handover_overlap_fallbacks_total",
			Help: "Planned transfers that did not complete as make-before-break: unconfirmed (released at the bound), successor_stale (break-before-make), no_successor (vipd handover moved nothing).",
		}, []string{"reason"}),
	}
	for _, r := range []string{fallbackUnconfirmed, fallbackNotLive, fallbackNoSuccessor} {
		t.fallbacks.WithLabelValues(r).Add(0)
	}
	return t
}

func (t *overlapTracker) collectors() []prometheus.Collector {
	return []prometheus.Collector{t.seconds, t.fallbacks}
}

// observe takes one Output: its overlaps (complete on every Output) and
// the machine's notes of break-before-make fallbacks.
func (t *overlapTracker) observe(now time.Time, out lease.Output) {
	if t == nil {
		return
	}
	for _, n := range out.Notes {
		switch {
		case strings.HasPrefix(n.Msg, "planned move to a member not heard from"):
			t.fallbacks.WithLabelValues(fallbackNotLive).Inc()
		case strings.HasPrefix(n.Msg, "handover target has not answered"), strings.HasPrefix(n.Msg, "no eligible node answered"):
			t.fallbacks.WithLabelValues(fallbackNoSuccessor).Inc()
		}
	}
	for _, k := range sortedKeys(out.Overlaps) {
		o := out.Overlaps[k]
		if cur, ok := t.open[k]; ok && cur.With == o.With && cur.Old == o.Old {
			t.open[k] = o
			continue
		}
		t.open[k] = o
		from, to := t.self, o.With
		if !o.Old {
			from, to = o.With, t.self
		}
		lvl := slog.LevelInfo
		if t.reported != nil && !t.reported(k) {
			lvl = slog.LevelDebug
		}
		t.log.Log(context.Background(), lvl, "planned transfer: make-before-break overlap", "address", k, "from", from, "to", to,
			"bound", o.Until.Sub(now).Round(time.Millisecond))
		if t.notify != nil {
			t.notify(k, o, true)
		}
	}
	for _, k := range sortedKeys(t.open) {
		if _, ok := out.Overlaps[k]; ok {
			continue
		}
		o := t.open[k]
		delete(t.open, k)
		if _, held := out.Holds[k]; held && t.notify != nil {
			t.notify(k, o, false) // over, and this node still holds it
		}
		if !o.Old || t.reported != nil && !t.reported(k) {
			continue // the old holder logs and measures the transfer of a core address
		}
		d := now.Sub(o.Since)
		confirmed := now.Before(o.Until)
		t.seconds.Observe(d.Seconds())
		if !confirmed {
			t.fallbacks.WithLabelValues(fallbackUnconfirmed).Inc()
		}
		t.log.Info("planned transfer: released after the overlap", "address", k, "from", t.self, "to", o.With,
			"overlap", d.Round(100*time.Microsecond), "confirmed", confirmed)
	}
}
