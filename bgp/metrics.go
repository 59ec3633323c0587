package bgp

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector computes the bgp metrics at scrape time from the speaker's
// state, so they can never drift from what /status reports.
type collector struct {
	s          *Speaker
	peerUp     *prometheus.Desc
	advertised *prometheus.Desc
	flaps      *prometheus.Desc
}

func newCollector(s *Speaker) *collector {
	return &collector{
		s: s,
		peerUp: prometheus.NewDesc("vipd_bgp_peer_up",
			"1 when the BGP session to the peer is Established, else 0.", []string{"peer"}, nil),
		advertised: prometheus.NewDesc("vipd_bgp_advertised",
			"1 when the VIP is in the peer's Adj-RIB-Out (sent to the router), else 0.", []string{"vip", "peer"}, nil),
		flaps: prometheus.NewDesc("vipd_bgp_peer_flaps_total",
			"Times the BGP session to the peer left Established (each is followed by an immediate reconnect).", []string{"peer"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.peerUp
	ch <- c.advertised
	ch <- c.flaps
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st := c.s.Status(ctx)
	known := c.s.knownVIPs()
	for _, p := range st.Peers {
		ch <- prometheus.MustNewConstMetric(c.peerUp, prometheus.GaugeValue, b2f(p.Established), p.Peer)
		ch <- prometheus.MustNewConstMetric(c.flaps, prometheus.CounterValue, float64(p.Flaps), p.Peer)
		sent := map[string]bool{}
		for _, v := range p.Advertised {
			sent[v] = true
		}
		for _, v := range known {
			ch <- prometheus.MustNewConstMetric(c.advertised, prometheus.GaugeValue, b2f(sent[v]), v, p.Peer)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
