package vip

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// watchingAnnouncer is a fakeAnnouncer with a Watch the test drives and a
// Check that counts.
type watchingAnnouncer struct {
	fakeAnnouncer
	checks  int
	wmu     sync.Mutex
	ch      chan WatchEvent
	closed  bool
	stopped chan struct{} // closed as the watch's goroutine ends
}

func newWatchingAnnouncer() *watchingAnnouncer {
	return &watchingAnnouncer{fakeAnnouncer: fakeAnnouncer{bound: map[netip.Prefix]bool{}}, ch: make(chan WatchEvent, 1), stopped: make(chan struct{})}
}

func (w *watchingAnnouncer) Check(context.Context, netip.Prefix, bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checks++
	return nil
}

func (w *watchingAnnouncer) Watch(ctx context.Context) <-chan WatchEvent {
	go func() {
		<-ctx.Done()
		w.wmu.Lock()
		w.closed = true
		close(w.stopped)
		close(w.ch) // the last thing this goroutine does
		w.wmu.Unlock()
	}()
	return w.ch
}

// signal sends ev the way L2 does: the latest replaces one still pending.
func (w *watchingAnnouncer) signal(ev WatchEvent) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.closed {
		return
	}
	select {
	case <-w.ch:
	default:
	}
	w.ch <- ev
}

func (w *watchingAnnouncer) checkCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checks
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// TestDriverWatch: without a live watch the driver polls every second;
// with one it reconciles and checks on each change, coalesces bursts, and
// polls only as a backstop; losing the watch brings the polling back.
func TestDriverWatch(t *testing.T) {
	ann := newWatchingAnnouncer()
	clk, step := driverClock(t)
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{Elect: true, Check: true}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, DriverOptions{Mode: "l2", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	defer func() { cancel(); <-done }()
	// Elected (vouched for): no lone-holder probes, whose schedule is not
	// the watch's business.
	d.Send(HealthChanged{Healthy: true})
	d.Send(Elected{VIP: v4, Holder: true, Reason: "test"})
	waitFor(t, "VIP held", 5*time.Second, func() bool { return ann.has(v4) })

	// Not live yet: polling every second (reconcile and check).
	r0, c0 := d.reconciles.Load(), ann.checkCount()
	step(3500 * time.Millisecond)
	if r, c := d.reconciles.Load()-r0, ann.checkCount()-c0; r < 2 || c < 2 {
		t.Fatalf("without a watch: %d reconciles and %d checks in 3.5 s, want one a second", r, c)
	}

	// Live: one reconcile and check at once, then quiet.
	r0, c0 = d.reconciles.Load(), ann.checkCount()
	ann.signal(WatchEvent{Live: true})
	waitFor(t, "reconcile when the watch goes live", 2*time.Second, func() bool { return d.reconciles.Load() > r0 && ann.checkCount() > c0 })
	r0, c0 = d.reconciles.Load(), ann.checkCount()
	step(3 * time.Second)
	if r, c := d.reconciles.Load()-r0, ann.checkCount()-c0; r != 0 || c != 0 {
		t.Fatalf("live watch, nothing changed: %d reconciles and %d checks in 3 s, want none (backstop %v)", r, c, WatchedReconcileEvery)
	}

	// Somebody removes the VIP: the change brings it back at once.
	ann.mu.Lock()
	delete(ann.bound, v4)
	ann.mu.Unlock()
	ann.signal(WatchEvent{Live: true})
	took := waitFor(t, "VIP re-added after a change", 2*time.Second, func() bool { return ann.has(v4) })
	t.Logf("re-added %v after the change", took)

	// A burst of changes costs at most two passes (one now, one after watchGap).
	step(2 * watchGap)
	r0 = d.reconciles.Load()
	for range 20 {
		ann.signal(WatchEvent{Live: true})
		step(time.Millisecond)
	}
	waitFor(t, "reconcile after the first change of a burst", 2*time.Second, func() bool { return d.reconciles.Load() > r0 })
	step(5 * watchGap)
	if r := d.reconciles.Load() - r0; r < 1 || r > 3 {
		t.Fatalf("a burst of 20 changes over ~20 ms: %d reconciles, want 1 to 3", r)
	}

	// The watch is lost: reconcile at once, then poll every second again.
	r0 = d.reconciles.Load()
	ann.signal(WatchEvent{Live: false})
	waitFor(t, "reconcile when the watch is lost", 2*time.Second, func() bool { return d.reconciles.Load() > r0 })
	r0, c0 = d.reconciles.Load(), ann.checkCount()
	step(3500 * time.Millisecond)
	if r, c := d.reconciles.Load()-r0, ann.checkCount()-c0; r < 2 || c < 2 {
		t.Fatalf("watch lost: %d reconciles and %d checks in 3.5 s, want one a second", r, c)
	}

	// Stop: Run returns only after the watch has stopped.
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	select {
	case <-ann.stopped:
	default:
		t.Fatal("Run returned before the watch stopped")
	}
	if ann.has(v4) {
		t.Fatal("VIP left bound after shutdown")
	}
}
