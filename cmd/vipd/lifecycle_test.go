package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/health"
	"github.com/vipd/vipd/pools"
	"github.com/vipd/vipd/vip"
	"go.uber.org/goleak"
)

// runningElector is an elector whose Run keeps a goroutine of its own
// (as memberlist or raft do) until its context is done.
type runningElector struct {
	failingElector
}

func (e *runningElector) Run(ctx context.Context, _ func(vip.Event)) error {
	done := make(chan struct{})
	go func() { defer close(done); <-ctx.Done() }()
	<-done
	return ctx.Err()
}

// slowAnnouncer takes its time to release the addresses in slow: a stop
// that does not wait for a part's release returns with one still held.
type slowAnnouncer struct {
	memAnnouncer
	slow map[netip.Prefix]bool
}

func (a *slowAnnouncer) Release(ctx context.Context, v netip.Prefix) error {
	if a.slow[v] {
		time.Sleep(300 * time.Millisecond)
	}
	return a.memAnnouncer.Release(ctx, v)
}

// TestDaemonStopLeavesNoGoroutine runs the daemon with every part that
// can run without root (status server, control socket, health checker,
// VIP driver, election, pool feed child and pool driver, controllers
// child), stops it, and checks that every goroutine it started is gone
// and that what the parts held is released before run returns.
func TestDaemonStopLeavesNoGoroutine(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer api.Close()
	// After the apiserver stand-in: its goroutines are not the daemon's.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	v := netip.MustParsePrefix("192.0.2.100/32")
	poolAddr := netip.MustParseAddr("198.51.100.7")
	c := &config.Config{Mode: config.ModeBGP, Addresses: []netip.Prefix{v}, NodeName: "n1", StateDir: dir,
		MetricsAddress: "127.0.0.1:0", HealthInterval: 20 * time.Millisecond, HealthTimeout: time.Second}
	reg := prometheus.NewRegistry()
	checker, err := health.NewChecker(health.Config{URL: api.URL, Interval: 20 * time.Millisecond, Timeout: time.Second,
		FailThreshold: 1, RiseThreshold: 1, TokenPath: "/nonexistent"}, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	poolHeld := netip.PrefixFrom(poolAddr, 32)
	ann := &slowAnnouncer{memAnnouncer{bound: map[netip.Prefix]bool{}}, map[netip.Prefix]bool{poolHeld: true}}
	driver, err := vip.NewDriver(vip.New(c.Addresses, vip.Options{}), ann, log, nil, vip.DriverOptions{Mode: "bgp"})
	if err != nil {
		t.Fatal(err)
	}
	el := &runningElector{failingElector{fail: make(chan struct{}), closed: make(chan struct{})}}
	d := &daemon{cfg: c, log: log, reg: reg, checker: checker, driver: driver, ann: ann, elector: el, extra: map[string]func() any{}}

	// The pool feed child: one snapshot, then it stays up until stopped.
	line := `{"generation":1,"addresses":[{"address":"` + poolAddr.String() + `","pool":"p","mode":"bgp","all":true}]}`
	feed, err := pools.NewFeed(pools.FeedConfig{Command: []string{"/bin/sh", "-c", "echo '" + line + "'; exec sleep 600"}}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	pdrv, err := pools.NewDriver(pools.DriverConfig{Name: "n1", BGP: ann, Healthy: func() bool { return true }}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.pools = &poolsPart{feed: feed, drv: pdrv}
	// The controllers child: stays up until stopped.
	script := filepath.Join(dir, "controllers.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d.ctrl = &controllers{bin: script, cfg: c, log: log, socket: "@vipd-test-" + t.Name(), client: &http.Client{}}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		vipHeld, _ := ann.Present(ctx, v)
		pool, _ := ann.Present(ctx, poolHeld)
		if vipHeld && pool && feed.Status().Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not running within 10 s: VIP %v, pool address %v, feed %+v", vipHeld, pool, feed.Status())
		}
	}
	// The status server answers (and its connection is closed).
	resp, err := http.Get("http://" + d.status.addr() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()

	stop := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		t.Logf("stopped in %v", time.Since(stop).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("run still running 20 s after the stop")
	}
	for _, p := range []netip.Prefix{v, poolHeld} {
		if held, _ := ann.Present(context.Background(), p); held {
			t.Errorf("%s still held after run returned", p)
		}
	}
	select {
	case <-el.closed:
	default:
		t.Error("the node did not leave the cluster")
	}
	if _, err := os.Stat(filepath.Join(dir, ControlSocket)); !os.IsNotExist(err) {
		t.Errorf("control socket left behind: %v", err)
	}
}

// TestLifecycleDocumented: docs/architecture.md "One lifecycle" lists the
// parts of a daemon with every part in the order daemon.parts starts them.
func TestLifecycleDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## One lifecycle\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## One lifecycle"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.TrimSpace(cells[1]) == "start" || strings.HasPrefix(strings.TrimSpace(cells[1]), "-") {
			continue
		}
		documented = append(documented, strings.TrimSpace(cells[2]))
	}
	d := &daemon{cfg: &config.Config{MetricsAddress: "127.0.0.1:0"}, log: slog.New(slog.DiscardHandler),
		ann: &memAnnouncer{}, elector: &runningElector{}, driver: &vip.Driver{}, pools: &poolsPart{},
		ctrl: &controllers{}, egress: &egress.Controller{}}
	if got := d.parts().Names(); !slices.Equal(got, documented) {
		t.Fatalf("daemon parts in start order\n  code %q\n  docs %q", got, documented)
	}
}
