package pools

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/kubetest"
)

// TestBenchPools is `make bench`'s pool step (VIPD_BENCH_POOLS=1): 1,000
// allocated addresses over 3 nodes. It prints a table and, with
// VIPD_BENCH_POOLS_JSON, writes the numbers there.
func TestBenchPools(t *testing.T) {
	if os.Getenv("VIPD_BENCH_POOLS") == "" {
		t.Skip("a benchmark: make bench runs it (VIPD_BENCH_POOLS=1)")
	}
	const count = 1000
	p := newPoolLab(t)
	ctx := ctxT(t, 8*time.Minute)
	base := netip.MustParseAddr("10.77.0.1")
	addrs := make([]netip.Addr, count)
	a := base
	for i := range addrs {
		addrs[i] = a
		a = a.Next()
	}
	// The client reaches the pool's subnet on its LAN (on-link route).
	if out, err := p.Client.Output(ctx, "ip", "route", "add", "10.77.0.0/22", "dev", p.Client.Link); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	p.pool(ctx, "bench", "l2", nil, addrs[0].String()+"-"+addrs[count-1].String())
	for _, n := range p.Nodes {
		// Default health timings: the idle numbers are those of a real node.
		p.start(n.Name, "VIPD_LOG_LEVEL=info", "VIPD_HEALTH_INTERVAL=1s", "VIPD_HEALTH_TIMEOUT=3s")
	}
	for _, n := range p.Nodes {
		if err := p.vipd[n.Name].WaitOutput(ctx, "pool feed synced"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second)
	// Baseline: the same nodes idle with no pool address (cluster, health
	// checks, the feed's watches).
	const idle = 30 * time.Second
	base0 := map[string]float64{}
	for name, pr := range p.vipd {
		base0[name] = cpuSeconds(pr.Pid())
	}
	time.Sleep(idle)
	baseCPU := map[string]float64{}
	for name, pr := range p.vipd {
		baseCPU[name] = 100 * (cpuSeconds(pr.Pid()) - base0[name]) / idle.Seconds()
	}

	// Allocate all, as fast as the API takes them (8 writers).
	start := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				p.allocate(ctx, addrs[i], "bench", fmt.Sprintf("svc-%d", i))
			}
		}()
	}
	for i := range addrs {
		next <- i
	}
	close(next)
	wg.Wait()
	created := time.Since(start)
	share := p.waitAll(ctx, addrs, "", 60*time.Second)
	announced := time.Since(start)
	lag := announced - created
	// The client reaches a sample.
	for i := 0; i < count; i += 97 {
		if _, err := p.reach(ctx, addrs[i]); err != nil {
			t.Errorf("client cannot reach %s: %v", addrs[i], err)
		}
	}
	t.Logf("allocated %d in %v, all bound once after %v: %v", count, created, announced, share)

	// Idle: RSS and CPU of each vipd and its feed, apiserver requests.
	time.Sleep(5 * time.Second)
	srv := env.Require(t)
	reqBefore := apiserverRequests(ctx, t, srv.URL, srv.CAData)
	cpuBefore, feedBefore := map[string]float64{}, map[string]float64{}
	for name, pr := range p.vipd {
		cpuBefore[name], feedBefore[name] = cpuSeconds(pr.Pid()), cpuSeconds(feedChild(t, pr.Pid()))
	}
	time.Sleep(idle)
	reqAfter := apiserverRequests(ctx, t, srv.URL, srv.CAData)
	type nodeRow struct {
		Held           int     `json:"held"`
		RSS            float64 `json:"vipd_rss_mb"`
		FeedRSS        float64 `json:"feed_rss_mb"`
		BaseCPUPercent float64 `json:"vipd_cpu_percent_no_addresses"`
		CPUPercent     float64 `json:"vipd_cpu_percent"`
		FeedCPUPercent float64 `json:"feed_cpu_percent"`
	}
	rows := map[string]nodeRow{}
	for name, pr := range p.vipd {
		child := feedChild(t, pr.Pid())
		cpu, fcpu := cpuSeconds(pr.Pid())-cpuBefore[name], cpuSeconds(child)-feedBefore[name]
		rows[name] = nodeRow{Held: share[name], RSS: rssMB(pr.Pid()), FeedRSS: rssMB(child),
			BaseCPUPercent: baseCPU[name], CPUPercent: 100 * cpu / idle.Seconds(), FeedCPUPercent: 100 * fcpu / idle.Seconds()}
	}
	perMin := (reqAfter - reqBefore) * time.Minute.Seconds() / idle.Seconds()

	// Failover of one node's share: the host of the biggest share dies.
	victim := "n1"
	for n, c := range share {
		if c > share[victim] {
			victim = n
		}
	}
	p.vipd[victim].Kill()
	if err := p.Node(victim).SetLink(ctx, false, true); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	after := p.waitAll(ctx, addrs, victim, 30*time.Second)
	failover := time.Since(killed)
	// The client reaches a sample. A node binds its batch, then announces
	// it (the next step: bind and gratuitous ARP are two batches), so a
	// probe right after the last bind may go to the dead node's MAC, which
	// the client's neighbour cache still holds until that announcement
	// comes: each address gets until a second after the last bind, the
	// one second of the detection + 1 s budget, probed every 300 ms.
	allBound := time.Now()
	var reached time.Duration
	samples := 0
	for i := 0; i < count; i += 97 {
		if _, err := p.pollReach(ctx, addrs[i], victim, allBound.Add(time.Second)); err != nil {
			t.Errorf("after failover the client cannot reach %s within 1s of the last bind: %v", addrs[i], err)
		}
		reached = time.Since(killed)
		samples++
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\npool bench: %d addresses over 3 nodes (l2)\n", count)
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| allocations created (API, 8 writers) | %v |\n", created.Round(time.Millisecond))
	fmt.Fprintf(&b, "| all announced (bound on exactly one node) after the first allocation | %v |\n", announced.Round(time.Millisecond))
	fmt.Fprintf(&b, "| all announced after the last allocation was created | %v |\n", lag.Round(time.Millisecond))
	fmt.Fprintf(&b, "| failover of %s's share (%d addresses; host down) | %v |\n", victim, share[victim], failover.Round(time.Millisecond))
	fmt.Fprintf(&b, "| the client reached every sampled address (%d, one after another) after the host went down | %v |\n", samples, reached.Round(time.Millisecond))
	fmt.Fprintf(&b, "| apiserver requests per minute at rest (3 feeds) | %.1f |\n", perMin)
	fmt.Fprintf(&b, "\n| node | held | vipd RSS | feed RSS | vipd CPU idle, no address | vipd CPU idle | feed CPU idle | held after failover |\n|---|---|---|---|---|---|---|---|\n")
	for _, n := range []string{"n1", "n2", "n3"} {
		r := rows[n]
		fmt.Fprintf(&b, "| %s | %d | %.1f MB | %.1f MB | %.2f %% | %.2f %% | %.2f %% | %d |\n", n, r.Held, r.RSS, r.FeedRSS, r.BaseCPUPercent, r.CPUPercent, r.FeedCPUPercent, after[n])
	}
	t.Log(b.String())
	fmt.Println(b.String())
	if out := os.Getenv("VIPD_BENCH_POOLS_JSON"); out != "" {
		doc := map[string]any{"addresses": count, "created_ms": created.Milliseconds(), "announced_ms": announced.Milliseconds(), "announced_after_last_ms": lag.Milliseconds(),
			"failover_ms": failover.Milliseconds(), "failover_reached_ms": reached.Milliseconds(), "failover_node": victim, "failover_share": share[victim],
			"apiserver_requests_per_minute": perMin, "nodes": rows, "held_after_failover": after}
		bs, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err == nil {
			_ = os.WriteFile(out, bs, 0o644)
		}
	}
}

// waitAll waits until every address is bound on exactly one node other
// than skip and returns how many each node holds.
func (p *poolLab) waitAll(ctx context.Context, addrs []netip.Addr, skip string, limit time.Duration) map[string]int {
	p.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		per := map[netip.Addr][]string{}
		share := map[string]int{}
		for _, n := range p.Nodes {
			if n.Name == skip {
				continue
			}
			got, err := n.Addrs(ctx)
			if err != nil {
				p.t.Fatal(err)
			}
			for a := range got {
				per[a] = append(per[a], n.Name)
			}
		}
		ok := true
		for _, a := range addrs {
			if len(per[a]) != 1 {
				ok = false
				break
			}
			share[per[a][0]]++
		}
		if ok {
			return share
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("not every address bound once after %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rssMB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// apiserverRequests sums apiserver_request_total for the resources the
// pool feed watches.
func apiserverRequests(ctx context.Context, t *testing.T, url string, ca []byte) float64 {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+kubetest.AdminToken)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		watched := false
		for _, r := range []string{"ippools", "ipallocations", "nodes", "services", "endpointslices"} {
			if strings.Contains(line, `resource="`+r+`"`) {
				watched = true
			}
		}
		if !watched {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
