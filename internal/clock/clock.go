// Package clock is the time of vipd's drivers: the loops around the pure
// machines read Now and arm timers through a Clock, so that their tests
// move a Fake instead of sleeping. Real is the process's monotonic clock.
package clock

import "time"

// Clock gives the time and timers. Now must be monotonic where it matters
// (time.Now's reading carries the monotonic clock, so a step of the wall
// clock moves no deadline).
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's timer.
type Timer interface {
	C() <-chan time.Time
	// Reset rearms the timer to fire d from now; a tick already due and
	// not read is dropped.
	Reset(d time.Duration)
	Stop()
}

// Real is the process's clock: time.Now and time.Timer.
type Real struct{}

// Now returns time.Now (with its monotonic reading).
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop()               { r.t.Stop() }
func (r realTimer) Reset(d time.Duration) {
	r.t.Stop()
	select {
	case <-r.t.C:
	default:
	}
	r.t.Reset(d)
}

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}
