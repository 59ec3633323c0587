package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a manual clock for tests: time moves only when Advance or Step
// moves it, and a timer fires when the clock reaches its deadline.
//
// A timer that fired is pending until its owner resets or stops it: a
// loop that resets or stops each timer once it has handled its tick lets
// a test know it has caught up without sleeping (Step).
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	arms   uint64
	armed  chan struct{} // closed and replaced at every arm
}

type fakeTimer struct {
	clk *Fake
	c   chan time.Time
	at  time.Time
	on  bool
	// pending: fired, not yet reset or stopped by its owner.
	pending bool
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, armed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer firing d from now.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clk: f, c: make(chan time.Time, 1)}
	f.mu.Lock()
	f.timers = append(f.timers, t)
	f.mu.Unlock()
	t.Reset(d)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() {
	f := t.clk
	f.mu.Lock()
	defer f.mu.Unlock()
	t.on, t.pending = false, false
	f.armedLocked()
}

func (t *fakeTimer) Reset(d time.Duration) {
	f := t.clk
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-t.c:
	default:
	}
	t.at, t.on, t.pending = f.now.Add(d), true, false
	f.armedLocked()
	f.fireLocked()
}

func (f *Fake) armedLocked() {
	f.arms++
	close(f.armed)
	f.armed = make(chan struct{})
}

// fireLocked delivers every timer that is due.
func (f *Fake) fireLocked() bool {
	fired := false
	for _, t := range f.timers {
		if t.on && !t.at.After(f.now) {
			t.on, t.pending = false, true
			fired = true
			select {
			case t.c <- f.now:
			default:
			}
		}
	}
	return fired
}

// Advance moves the clock by d and fires the timers now due, without
// waiting for anyone to handle them.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.fireLocked()
}

// Deadline is the earliest armed timer's deadline (zero: none armed).
func (f *Fake) Deadline() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadlineLocked()
}

func (f *Fake) deadlineLocked() time.Time {
	var d time.Time
	for _, t := range f.timers {
		if t.on && (d.IsZero() || t.at.Before(d)) {
			d = t.at
		}
	}
	return d
}

// Arms counts the NewTimer, Reset and Stop calls so far.
func (f *Fake) Arms() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arms
}

// WaitArms waits until Arms reaches n or ctx is done.
func (f *Fake) WaitArms(ctx context.Context, n uint64) error {
	for {
		f.mu.Lock()
		arms, ch := f.arms, f.armed
		f.mu.Unlock()
		if arms >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Step moves the clock by d one deadline at a time: at each armed
// deadline on the way it fires the timers due and waits until their owner
// has reset or stopped each of them (it handled the tick) before going
// on; then it sets the clock to the end. It returns ctx's error if an
// owner never does.
func (f *Fake) Step(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	end := f.now.Add(d)
	f.mu.Unlock()
	for {
		if err := f.WaitHandled(ctx); err != nil {
			return err
		}
		f.mu.Lock()
		next := f.deadlineLocked()
		if next.IsZero() || next.After(end) {
			f.now = end
			f.mu.Unlock()
			return nil
		}
		if next.After(f.now) {
			f.now = next
		}
		f.fireLocked()
		f.mu.Unlock()
	}
}

// WaitHandled waits until no timer that fired is pending (each was reset
// or stopped since) or ctx is done.
func (f *Fake) WaitHandled(ctx context.Context) error {
	for {
		f.mu.Lock()
		ch, pending := f.armed, false
		for _, t := range f.timers {
			pending = pending || t.pending
		}
		f.mu.Unlock()
		if !pending {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
