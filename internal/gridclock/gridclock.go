// Package gridclock ticks on the wall clock's multiples of an interval
// through a timerfd read via Go's network poller, without a Go timer.
//
// An idle vipd wakes a few times a second: the member heartbeats and the
// health probe. A Go timer also wakes the runtime's sysmon thread, which
// sleeps until the next Go timer, and a timer and a timerfd due at the
// same instant wake two threads one after the other. On a VM each wake-up
// is most of what an idle node costs. Clocks of the same grid fire
// together: the poller returns them in one wake-up.
//
// A clock runs on CLOCK_MONOTONIC, so a step of the wall clock never stops
// it; Realign puts it back on the wall clock's grid after one.
package gridclock

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Clock is one timerfd ticking every interval on the wall-clock grid.
type Clock struct {
	f  *os.File
	rc syscall.RawConn
	iv time.Duration
}

// New returns a clock whose first tick is the next multiple of iv after
// now.
func New(iv time.Duration, now time.Time) (*Clock, error) {
	if iv <= 0 {
		return nil, fmt.Errorf("grid clock: interval %v, want > 0", iv)
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("grid clock: %w", err)
	}
	f := os.NewFile(uintptr(fd), "grid-clock")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("grid clock: %w", err)
	}
	c := &Clock{f: f, rc: rc, iv: iv}
	if err := c.Arm(now); err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

// Arm makes the clock tick at the next multiple of the interval after
// now, then every interval. A tick already due and not read is dropped.
func (c *Clock) Arm(now time.Time) error { return c.armAt(now, 1) }

// armAt makes the clock tick at the n-th multiple of the interval after
// now, then every interval.
func (c *Clock) armAt(now time.Time, n int) error {
	return c.set(now.Truncate(c.iv).Add(time.Duration(n) * c.iv).Sub(now))
}

// set makes the clock tick after first (at least 1 ns: zero disarms),
// then every interval.
func (c *Clock) set(first time.Duration) error {
	spec := unix.ItimerSpec{Interval: unix.NsecToTimespec(int64(c.iv)), Value: unix.NsecToTimespec(int64(max(first, time.Nanosecond)))}
	var serr error
	if err := c.rc.Control(func(fd uintptr) { serr = unix.TimerfdSettime(int(fd), 0, &spec, nil) }); err != nil {
		return fmt.Errorf("grid clock: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("grid clock: %w", serr)
	}
	return nil
}

// Wait blocks until the next tick (at once if one is due and not read
// yet), or until Close.
func (c *Clock) Wait() error { return c.read(true) }

// Drain reads a tick that is due, without waiting: after work that ran
// past a tick, the next Wait waits for the tick after.
func (c *Clock) Drain() error { return c.read(false) }

func (c *Clock) read(wait bool) error {
	var buf [8]byte
	var rerr error
	// The read is a raw system call: a regular one also wakes sysmon.
	err := c.rc.Read(func(fd uintptr) bool {
		_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch e {
		case unix.EAGAIN:
			return !wait // not yet: wait in the poller
		case 0:
		default:
			rerr = e
		}
		return true
	})
	if err != nil {
		return err
	}
	return rerr
}

// Realign re-arms the clock when now is off the grid by more than a
// quarter interval (the wall clock was stepped or slewed).
func (c *Clock) Realign(now time.Time) error {
	phase := now.Sub(now.Truncate(c.iv))
	if phase > c.iv/4 && phase < c.iv-c.iv/4 {
		return c.Arm(now)
	}
	return nil
}

// Fire makes the clock tick now (a Wait in progress returns); it then
// ticks every interval from now, off the grid until Arm. Safe to call
// from any goroutine.
func (c *Clock) Fire() error { return c.set(time.Nanosecond) }

// Close stops the clock; a Wait in progress returns an error.
func (c *Clock) Close() error { return c.f.Close() }

// Ticker returns a wait for the next multiple of iv on the wall clock: a
// Clock, or a Go timer on the same grid if the clock cannot be had (onErr
// hears why; also when a clock cannot be re-armed). The wait returns
// false once ctx is done; the clock is closed then. kick, from any
// goroutine, makes the wait in progress (or the next one) return at once,
// in place of the next multiple: the wait after it returns at the
// multiple after that, so a kick moves a tick earlier and never adds one
// (a probe's fail threshold spans the same time with or without kicks).
func Ticker(ctx context.Context, iv time.Duration, onErr func(error)) (wait func() bool, drain func(), kick func()) {
	clock, err := New(iv, time.Now())
	if err == nil {
		var kicked atomic.Bool
		stop := context.AfterFunc(ctx, func() { clock.Close() })
		wait = func() bool {
			if err := clock.Wait(); err != nil || ctx.Err() != nil {
				stop()
				clock.Close()
				return false
			}
			if kicked.Swap(false) {
				// Fired off the grid in place of the next multiple:
				// back on the grid at the one after it.
				err = clock.armAt(time.Now(), 2)
			} else {
				err = clock.Realign(time.Now())
			}
			if err != nil {
				onErr(err)
			}
			return true
		}
		drain = func() { _ = clock.Drain() }
		kick = func() {
			kicked.Store(true)
			if err := clock.Fire(); err != nil && ctx.Err() == nil {
				onErr(err)
			}
		}
		return wait, drain, kick
	}
	onErr(err)
	timer := time.NewTimer(time.Until(time.Now().Truncate(iv).Add(iv)))
	kicks := make(chan struct{}, 1)
	wait = func() bool {
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		case <-kicks:
			timer.Stop()
			timer.Reset(time.Until(time.Now().Add(iv).Truncate(iv).Add(iv)))
			return true
		}
		timer.Reset(time.Until(time.Now().Truncate(iv).Add(iv)))
		return true
	}
	drain = func() { timer.Reset(time.Until(time.Now().Truncate(iv).Add(iv))) }
	kick = func() {
		select {
		case kicks <- struct{}{}:
		default:
		}
	}
	return wait, drain, kick
}
