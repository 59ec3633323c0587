package gridclock

import (
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/clock"
)

// Precise is a clock.Clock whose timers are timerfds read through the
// network poller with raw system calls, where a Go timer costs an idle
// process up to three wake-ups: the poller waits in whole milliseconds
// rounded down (epoll_pwait), so it wakes early and again a millisecond
// later, and the runtime's sysmon thread, which sleeps until the next Go
// timer, wakes too and polls until the process is idle. A timerfd wakes
// the poller once, at its nanosecond deadline. Where a timerfd cannot be
// had, NewTimer falls back to a Go timer.
type Precise struct{}

// Now returns time.Now.
func (Precise) Now() time.Time { return time.Now() }

// NewTimer returns a timer that fires d from now. Stop ends it for good
// (its file and goroutine): it is not armed again.
func (Precise) NewTimer(d time.Duration) clock.Timer {
	t, err := newFDTimer()
	if err != nil {
		return clock.Real{}.NewTimer(d)
	}
	t.Reset(d)
	return t
}

type fdTimer struct {
	f  *os.File
	rc syscall.RawConn
	c  chan time.Time

	mu       sync.Mutex
	deadline time.Time // zero: disarmed
	stopped  bool
}

func newFDTimer() (*fdTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "timer")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	t := &fdTimer{f: f, rc: rc, c: make(chan time.Time, 1)}
	go t.loop()
	return t, nil
}

func (t *fdTimer) C() <-chan time.Time { return t.c }

// loop waits for each expiry and delivers it unless the timer was
// re-armed for later or stopped meanwhile.
func (t *fdTimer) loop() {
	var (
		buf  [8]byte
		rerr error
	)
	// One callback for every read (a closure made per read was three
	// allocations per expiry).
	read := func(fd uintptr) bool {
		_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch e {
		case unix.EAGAIN, unix.EINTR:
			return false
		case 0:
		default:
			rerr = e
		}
		return true
	}
	for {
		rerr = nil
		err := t.rc.Read(read)
		if err != nil || rerr != nil {
			return // closed (Stop)
		}
		now := time.Now()
		t.mu.Lock()
		if !t.stopped && !t.deadline.IsZero() && !now.Before(t.deadline) {
			t.deadline = time.Time{}
			select {
			case t.c <- now:
			default:
			}
		}
		t.mu.Unlock()
	}
}

// arm sets the timerfd to fire after d (0 disarms).
func (t *fdTimer) arm(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_ = t.rc.Control(func(fd uintptr) {
		_, _, _ = unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	})
}

// Reset arms the timer to fire d from now; a tick due and not read is
// dropped.
func (t *fdTimer) Reset(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	select {
	case <-t.c:
	default:
	}
	d = max(d, time.Nanosecond) // a zero value disarms a timerfd
	t.deadline = time.Now().Add(d)
	t.arm(d)
}

// Stop ends the timer.
func (t *fdTimer) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	t.deadline = time.Time{}
	t.f.Close()
}
