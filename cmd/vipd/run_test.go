package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/health"
	"github.com/vipd/vipd/vip"
)

// memAnnouncer binds VIPs in memory only.
type memAnnouncer struct {
	mu    sync.Mutex
	bound map[netip.Prefix]bool
}

func (a *memAnnouncer) Acquire(_ context.Context, v netip.Prefix) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bound[v] = true
	return nil
}

func (a *memAnnouncer) Release(_ context.Context, v netip.Prefix) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.bound, v)
	return nil
}

func (a *memAnnouncer) Announce(context.Context, netip.Prefix) error { return nil }

func (a *memAnnouncer) Present(_ context.Context, v netip.Prefix) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bound[v], nil
}

func (a *memAnnouncer) Close() error { return nil }

// failingElector runs until fail is closed, then returns an error: a fatal
// error of the cluster part.
type failingElector struct {
	fail   chan struct{}
	closed chan struct{}
}

func (e *failingElector) SetHealthy(bool)          {}
func (e *failingElector) SetHolding(string, bool)  {}
func (e *failingElector) SetFailed(string, string) {}
func (e *failingElector) Status() any              { return nil }
func (e *failingElector) HandOver(context.Context, []string, string, bool) ([]cluster.HandoverResult, error) {
	return nil, nil
}
func (e *failingElector) Close() error { close(e.closed); return nil }
func (e *failingElector) Run(ctx context.Context, _ func(vip.Event)) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-e.fail:
		return errors.New("gossip broke")
	}
}

// TestDaemonFatalErrorStopsEverything: a fatal error of one part cancels
// the others (health checker, driver), the driver releases the VIP, the
// node leaves the cluster, and run returns the error within 2 s although
// its parent context is never cancelled.
func TestDaemonFatalErrorStopsEverything(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer api.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := netip.MustParsePrefix("192.0.2.100/32")
	c := &config.Config{Mode: config.ModeL2, Addresses: []netip.Prefix{v}, NodeName: "n1", StateDir: t.TempDir()}
	checker, err := health.NewChecker(health.Config{URL: api.URL, Interval: 20 * time.Millisecond, Timeout: time.Second,
		FailThreshold: 1, RiseThreshold: 1, TokenPath: "/nonexistent"}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ann := &memAnnouncer{bound: map[netip.Prefix]bool{}}
	driver, err := vip.NewDriver(vip.New(c.Addresses, vip.Options{}), ann, log, nil, vip.DriverOptions{Mode: "l2"})
	if err != nil {
		t.Fatal(err)
	}
	el := &failingElector{fail: make(chan struct{}), closed: make(chan struct{})}
	d := &daemon{cfg: c, log: log, checker: checker, driver: driver, ann: ann, elector: el, extra: map[string]func() any{}}

	done := make(chan error, 1)
	go func() { done <- d.run(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for held, _ := ann.Present(context.Background(), v); !held; held, _ = ann.Present(context.Background(), v) {
		if time.Now().After(deadline) {
			t.Fatal("VIP never acquired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	close(el.fail)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("run returned nil after a fatal error")
		}
		t.Logf("run returned %q after %v", err, time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("run still blocked 5 s after a fatal error")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("run returned %v after the fatal error, want within 2 s", took)
	}
	if held, _ := ann.Present(context.Background(), v); held {
		t.Error("VIP still held after run returned")
	}
	select {
	case <-el.closed:
	default:
		t.Error("the node did not leave the cluster")
	}
}
