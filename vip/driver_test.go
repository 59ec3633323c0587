package vip

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/clock"
)

// fakeAnnouncer records calls; Acquire fails while failAcquire is set.
type fakeAnnouncer struct {
	mu          sync.Mutex
	bound       map[netip.Prefix]bool
	failAcquire bool
	calls       []string
}

func (f *fakeAnnouncer) record(s string) { f.calls = append(f.calls, s) }

func (f *fakeAnnouncer) Acquire(_ context.Context, v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("acquire")
	if f.failAcquire {
		return errors.New("conflict")
	}
	f.bound[v] = true
	return nil
}

func (f *fakeAnnouncer) Release(_ context.Context, v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("release")
	delete(f.bound, v)
	return nil
}

func (f *fakeAnnouncer) Announce(context.Context, netip.Prefix) error { return nil }

func (f *fakeAnnouncer) Present(_ context.Context, v netip.Prefix) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bound[v], nil
}

func (f *fakeAnnouncer) Close() error { return nil }

func (f *fakeAnnouncer) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Count(strings.Join(f.calls, ","), call)
}

// driverClock is a fake clock for a driver test and step, which moves it
// and returns once the driver has handled every timer that fired.
func driverClock(t *testing.T) (*clock.Fake, func(time.Duration)) {
	clk := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	return clk, func(d time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := clk.Step(ctx, d); err != nil {
			t.Fatalf("the driver did not handle its timers: %v", err)
		}
	}
}

// retryArmed reports whether the driver's next deadline is the core's
// retry after a failed acquire (sooner than the next reconcile).
func retryArmed(clk *clock.Fake) bool {
	dl := clk.Deadline()
	return !dl.IsZero() && dl.Before(clk.Now().Add(ReconcileEvery))
}

func TestDriverNeverPublishesAFailedAcquire(t *testing.T) {
	ann := &fakeAnnouncer{bound: map[netip.Prefix]bool{}, failAcquire: true}
	var mu sync.Mutex
	var trans []Transition
	clk, step := driverClock(t)
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil,
		DriverOptions{Mode: "l2", Clock: clk, OnTransition: func(tr Transition) { mu.Lock(); trans = append(trans, tr); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	d.Send(HealthChanged{Healthy: true})
	waitFor(t, "first acquire failed", 5*time.Second, func() bool { return ann.count("acquire") == 1 && retryArmed(clk) })
	step(800 * time.Millisecond) // one retry (RetryMin)
	if n := ann.count("acquire"); n != 2 {
		t.Fatalf("%d acquires after 800 ms, want the first and one retry", n)
	}
	mu.Lock()
	for _, tr := range trans {
		if tr.Held {
			t.Errorf("published a hold that failed: %+v", tr)
		}
	}
	mu.Unlock()
	ann.mu.Lock()
	ann.failAcquire = false
	ann.mu.Unlock()
	step(2500 * time.Millisecond) // next retry succeeds
	if st := d.State(); len(st) != 1 || !st[0].Held {
		t.Fatalf("state after the conflict cleared: %+v", st)
	}
	cancel()
	<-done
	if ok, _ := ann.Present(context.Background(), v4); ok {
		t.Fatal("VIP left bound after shutdown")
	}
	mu.Lock()
	last := trans[len(trans)-1]
	mu.Unlock()
	if last.Held {
		t.Fatalf("last transition %+v, want a release", last)
	}
}

// countingAnnouncer counts announcements.
type countingAnnouncer struct {
	fakeAnnouncer
	announced int
}

func (c *countingAnnouncer) Announce(context.Context, netip.Prefix) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.announced++
	return nil
}

func TestDriverNeverAnnouncesAVIPItCouldNotBind(t *testing.T) {
	ann := &countingAnnouncer{fakeAnnouncer: fakeAnnouncer{bound: map[netip.Prefix]bool{}, failAcquire: true}}
	clk, step := driverClock(t)
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{Announce: true}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, DriverOptions{Mode: "l2", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	d.Send(HealthChanged{Healthy: true})
	waitFor(t, "first acquire failed", 5*time.Second, func() bool { return ann.count("acquire") == 1 && retryArmed(clk) })
	step(1600 * time.Millisecond) // two retries (RetryMin, then twice that) fail
	cancel()
	<-done
	ann.mu.Lock()
	defer ann.mu.Unlock()
	if ann.announced != 0 {
		t.Fatalf("%d announcements for a VIP that was never bound (they would steal the other host's ARP entries)", ann.announced)
	}
	if n := strings.Count(strings.Join(ann.calls, ","), "acquire"); n != 3 {
		t.Fatalf("acquire tried %d times in 1.6 s, want the first and two retries", n)
	}
}

// slowActions is an announcer that says how long its actions may take.
type slowActions struct{ fakeAnnouncer }

func (*slowActions) ActionTimeout() time.Duration { return 15 * time.Second }

// TestDriverActionTimeout: the announcer's own bound (cloud) unless the
// options set one, DefaultActionTimeout otherwise.
func TestDriverActionTimeout(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		ann  Announcer
		opt  time.Duration
		want time.Duration
	}{
		{"default", &fakeAnnouncer{}, 0, DefaultActionTimeout},
		{"the announcer's", &slowActions{}, 0, 15 * time.Second},
		{"the options'", &slowActions{}, time.Second, time.Second},
	} {
		d, err := NewDriver(New([]netip.Prefix{v4}, Options{}), tc.ann, log, nil, DriverOptions{ActionTimeout: tc.opt})
		if err != nil {
			t.Fatal(err)
		}
		if d.timeout != tc.want {
			t.Errorf("%s: action timeout %v, want %v", tc.name, d.timeout, tc.want)
		}
	}
}

func TestNodeJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for _, n := range []string{"cp-1", "cp-2", "cp-3", "cp-4"} {
		j := NodeJitter(n)
		if j < 0 || j >= 500*time.Millisecond || j != NodeJitter(n) {
			t.Fatalf("NodeJitter(%q) = %v: want a stable value in [0, 500ms)", n, j)
		}
		seen[j] = true
	}
	if len(seen) < 3 {
		t.Fatalf("four nodes share %d jitters", len(seen))
	}
}
