package kube

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// BenchmarkScale500Nodes20Pools measures, against the real apiserver and
// the DigitalOcean fake, how long 20 pools of 5 reserved IPs over 500 nodes
// (25 per pool) take to converge from a cold start, and how long after 100
// nodes (5 per pool, including every pool's first holders) become unready,
// with the provider calls each phase makes.
//
//	go test -run '^$' -bench Scale -benchtime 1x ./controllers/kube/
func BenchmarkScale500Nodes20Pools(b *testing.B) {
	const nodes, pools, ipsPerPool = 500, 20, 5
	for range b.N {
		h := newHarness(b)
		// Fast client for the setup.
		cfg := h.srv.Config()
		cfg.QPS, cfg.Burst = 2000, 4000
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		h.kc = kc
		names := make([]string, nodes)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range nodes {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				names[i] = h.nodeIn(fmt.Sprintf("n%03d", i), 1000+i, fmt.Sprintf("198.51.%d.%d", 100+i/250, i%250+1), fmt.Sprint(i%pools))
			}()
		}
		wg.Wait()
		for p := range pools {
			ips := make([]string, ipsPerPool)
			for k := range ipsPerPool {
				ips[k] = fmt.Sprintf("192.0.%d.%d", 2+p/50, (p%50)*5+k+1)
			}
			u := h.staticPool(fmt.Sprintf("pool-%02d", p), ips...)
			spec := u.Object["spec"].(map[string]any)
			spec["match"].(map[string]any)["nodeLabel"] = fmt.Sprintf("%s=%s,bench/group=%d", caseLabel, h.id, p)
			spec["dnsRecordSet"].(map[string]any)["recordName"] = fmt.Sprintf("pool-%02d", p)
			h.apply(u)
		}

		converged := func() error {
			for p := range pools {
				if n := len(activeNodes(h.pool(fmt.Sprintf("pool-%02d", p)))); n != ipsPerPool {
					return fmt.Errorf("pool %d: %d active", p, n)
				}
				if n := len(h.doRecords(fmt.Sprintf("pool-%02d", p))); n != ipsPerPool {
					return fmt.Errorf("pool %d: %d records", p, n)
				}
			}
			return nil
		}
		type counts struct{ assigns, reads, dnsWrites, dnsLists, total int }
		count := func() counts {
			var c counts
			for _, r := range h.do.Requests() {
				c.total++
				switch {
				case r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/actions"):
					c.assigns++
				case r.Method == http.MethodGet && strings.HasPrefix(r.Path, "/v2/reserved_ips/"):
					c.reads++
				case strings.Contains(r.Path, "/records") && r.Method == http.MethodGet:
					c.dnsLists++
				case strings.Contains(r.Path, "/records"):
					c.dnsWrites++
				}
			}
			return c
		}

		b.ResetTimer()
		start := time.Now()
		h.startWith("bench", func(c *Config) { c.DNSDebounce = time.Second; c.DNSMaxDelay = 10 * time.Second })
		eventually(b, 3*time.Minute, "cold start converges", converged)
		cold := time.Since(start)
		c1 := count()

		// 100 nodes go unready: the 5 first holders of each pool.
		start = time.Now()
		for p := range pools {
			pool := h.pool(fmt.Sprintf("pool-%02d", p))
			for _, node := range activeNodes(pool) {
				h.setNodeReady(node, false)
			}
		}
		eventually(b, 3*time.Minute, "converges after 100 nodes went unready", func() error {
			for p := range pools {
				pool := h.pool(fmt.Sprintf("pool-%02d", p))
				for _, node := range activeNodes(pool) {
					if h.annotation(node) == "" {
						return fmt.Errorf("%s active but not annotated", node)
					}
				}
			}
			if err := converged(); err != nil {
				return err
			}
			c := count()
			if c.assigns-c1.assigns < pools*ipsPerPool {
				return fmt.Errorf("%d reassignments so far", c.assigns-c1.assigns)
			}
			return nil
		})
		churn := time.Since(start)
		b.StopTimer()
		c2 := count()
		b.ReportMetric(cold.Seconds(), "cold-converge-s")
		b.ReportMetric(float64(c1.assigns), "cold-assigns")
		b.ReportMetric(float64(c1.total), "cold-DO-requests")
		b.ReportMetric(churn.Seconds(), "churn-converge-s")
		b.ReportMetric(float64(c2.assigns-c1.assigns), "churn-assigns")
		b.ReportMetric(float64(c2.dnsWrites-c1.dnsWrites), "churn-DNS-writes")
		b.ReportMetric(float64(c2.total-c1.total), "churn-DO-requests")
		b.Logf("cold: %v, %+v; churn of 100 nodes: %v, assigns %d, DNS writes %d, DNS lists %d, IP reads %d, DO requests %d",
			cold.Round(time.Millisecond), c1, churn.Round(time.Millisecond), c2.assigns-c1.assigns, c2.dnsWrites-c1.dnsWrites,
			c2.dnsLists-c1.dnsLists, c2.reads-c1.reads, c2.total-c1.total)
	}
}
