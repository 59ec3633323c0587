package bgp_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// benchRecovery measures, for FRR and BIRD, the time from the router
// accepting connections again after a restart (its Start returned: the
// daemon is up with its configuration) to its kernel route to the VIP
// having every node again (IPv4 and IPv6).
func benchRecovery(t *testing.T, runs int) []BenchResult {
	e := newEnv(t, setup{nodes: 2, bird: true})
	for _, n := range e.nodes {
		n.env = append(n.env, fmt.Sprintf("VIPD_BGP_PEERS=%s:%d,[%s]:%d,%s:%d,[%s]:%d",
			e.r.IPv4, routerAS, e.r.IPv6, routerAS, e.b.IPv4, routerAS, e.b.IPv6, routerAS))
	}
	e.startAll()
	type router struct {
		name  string
		h     *lab.Host
		stop  func()
		start func(context.Context) error
	}
	var res []BenchResult
	for _, r := range []router{
		{"FRR 8.4", e.r, e.frr.Stop, e.frr.Start},
		{"BIRD 2.0", e.b, e.bird.Stop, e.bird.Start},
	} {
		br := BenchResult{Scenario: "router restart -> VIPs back in its FIB (" + r.name + ")",
			Settings: "from the router accepting connections again", TargetMS: 2000}
		for range runs {
			e.t = t
			e.waitKernelAt(r.h, vip4, 60*time.Second, e.nodes...)
			e.waitKernelAt(r.h, vip6, 30*time.Second, e.nodes...)
			r.stop()
			e.waitKernelAt(r.h, vip4, 10*time.Second)
			time.Sleep(2 * time.Second) // every session down, vipd dialling
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			if err := r.start(ctx); err != nil {
				cancel()
				t.Fatal(err)
			}
			cancel()
			t0 := time.Now()
			e.waitKernelAt(r.h, vip4, 30*time.Second, e.nodes...)
			e.waitKernelAt(r.h, vip6, 30*time.Second, e.nodes...)
			br.RunsMS = append(br.RunsMS, ms64(time.Since(t0)))
		}
		res = append(res, br)
	}
	return summarize(res)
}

// The ranges scaleVIPs takes its VIPs from.
var (
	scale4 = netip.MustParsePrefix("198.18.0.0/16")
	scale6 = netip.MustParsePrefix("2001:db8:5ca1:e::/64")
)

// scaleVIPs returns n IPv4 /32s and n IPv6 /128s.
func scaleVIPs(n int) []netip.Prefix {
	var out []netip.Prefix
	for i := range n {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte((i + 1) / 256), byte((i + 1) % 256)}), 32))
	}
	for i := range n {
		a := netip.MustParseAddr(fmt.Sprintf("2001:db8:5ca1:e::%x", i+1))
		out = append(out, netip.PrefixFrom(a, 128))
	}
	return out
}

// benchScale advertises n /32s and n /128s from one node to two routers
// (FRR and BIRD, an IPv4 and an IPv6 session each) and measures the time
// until both routers' kernels have every route, the time until they have
// none after SIGTERM, and vipd's resident memory.
func benchScale(t *testing.T, n int) []BenchResult {
	e := newEnv(t, setup{nodes: 1, bird: true, acceptAll: true, quiet: true})
	node := e.nodes[0]
	vips := scaleVIPs(n)
	var addrs []string
	for _, v := range vips {
		addrs = append(addrs, v.String())
	}
	node.env = append(node.env, "VIPD_ADDRESS="+strings.Join(addrs, ","),
		fmt.Sprintf("VIPD_BGP_PEERS=%s:%d,[%s]:%d,%s:%d,[%s]:%d", e.r.IPv4, routerAS, e.r.IPv6, routerAS, e.b.IPv4, routerAS, e.b.IPv6, routerAS))
	routers := []*lab.Host{e.r, e.b}
	count := func(h *lab.Host) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		total := 0
		// FRR installs its routes as proto bgp, BIRD as proto bird: count
		// the routes inside the scale ranges instead.
		for _, r := range []netip.Prefix{scale4, scale6} {
			fam := "-4"
			if r.Addr().Is6() {
				fam = "-6"
			}
			out, err := h.Output(ctx, "ip", fam, "route", "show", "root", r.String())
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if line != "" && line[0] != ' ' && line[0] != '\t' {
					total++
				}
			}
		}
		return total
	}
	waitCount := func(want int, timeout time.Duration) time.Duration {
		t0 := time.Now()
		for _, r := range routers {
			if !poll(timeout, func() bool { return count(r) == want }) {
				t.Fatalf("router %s: %d BGP routes in the kernel, want %d (after %v)", r.Name, count(r), want, timeout)
			}
		}
		return time.Since(t0)
	}
	settings := fmt.Sprintf("%d /32 + %d /128, 2 routers (FRR, BIRD) x IPv4+IPv6 sessions", n, n)
	start := time.Now()
	e.startVipd(node)
	waitCount(2*n, 5*time.Minute)
	up := time.Since(start)
	time.Sleep(2 * time.Second)
	rss, err := rssMB(node.vipd.Pid())
	if err != nil {
		t.Fatal(err)
	}
	// Idle CPU with every VIP held: reconcile passes, health checks,
	// keepalives, over 5 s.
	c0, err := cpuSeconds(node.vipd.Pid())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	c1, err := cpuSeconds(node.vipd.Pid())
	if err != nil {
		t.Fatal(err)
	}
	idleCPU := (c1 - c0) / 5 * 100
	if err := node.vipd.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	down := waitCount(0, 2*time.Minute)
	if code, err := node.vipd.Wait(30 * time.Second); err != nil || code != 0 {
		t.Errorf("vipd exit after SIGTERM: %d, %v\n%s", code, err, tail(node.vipd.Output(), 20))
	}
	return summarize([]BenchResult{
		{Scenario: "scale: start -> every VIP in both routers' FIBs", Settings: settings, RunsMS: []float64{ms64(up)}},
		{Scenario: "scale: SIGTERM -> no VIP left in the routers' FIBs", Settings: settings, RunsMS: []float64{ms64(down)}},
		{Scenario: "scale: vipd resident memory", Settings: settings, Unit: "MB", RunsMS: []float64{rss}},
		{Scenario: "scale: vipd idle CPU (% of one core)", Settings: settings, Unit: "%", RunsMS: []float64{idleCPU}},
	})
}

// cpuSeconds is the user+system CPU time of pid (/proc/<pid>/stat).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start at ") ".
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
