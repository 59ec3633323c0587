package child

import "time"

// Backoff shapes the pauses between restarts of a child that stops.
type Backoff struct {
	// First is the first pause (zero: 1 s); each further stop doubles it.
	First time.Duration
	// Max caps the pause (zero: 30 s).
	Max time.Duration
	// Healthy is how long a run must last for the next stop to start
	// again from First (zero: 1 minute).
	Healthy time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.First <= 0 {
		b.First = time.Second
	}
	if b.Max <= 0 {
		b.Max = 30 * time.Second
	}
	if b.Max < b.First {
		b.Max = b.First
	}
	if b.Healthy <= 0 {
		b.Healthy = time.Minute
	}
	return b
}

// Restarts decides when a stopped child starts again: exponential
// back-off, capped, reset after a healthy run. It is fed events with
// their time and never reads a clock.
type Restarts struct {
	cfg     Backoff
	pause   time.Duration // the pause after the next stop
	started time.Time
}

// NewRestarts returns the decision for a child that has not run yet.
func NewRestarts(b Backoff) *Restarts {
	b = b.withDefaults()
	return &Restarts{cfg: b, pause: b.First}
}

// Started records that the child started at now.
func (r *Restarts) Started(now time.Time) { r.started = now }

// Exited records that the child stopped at now and returns the pause
// before it starts again.
func (r *Restarts) Exited(now time.Time) time.Duration {
	if now.Sub(r.started) >= r.cfg.Healthy {
		r.pause = r.cfg.First
	}
	p := r.pause
	r.pause = min(r.pause*2, r.cfg.Max)
	return p
}

// BadLines decides which bad lines of a child's output are logged: every
// one is counted and skipped; at most Burst are logged per Window, and the
// next logged one says how many were not.
type BadLines struct {
	Burst  int           // zero: 5
	Window time.Duration // zero: 1 minute

	windowStart time.Time
	logged      int
	suppressed  int
}

// Bad records a bad line at now. log says whether to log it; suppressed
// is the number of bad lines not logged since the last logged one.
func (b *BadLines) Bad(now time.Time) (log bool, suppressed int) {
	burst, window := b.Burst, b.Window
	if burst <= 0 {
		burst = 5
	}
	if window <= 0 {
		window = time.Minute
	}
	if b.windowStart.IsZero() || now.Sub(b.windowStart) >= window {
		b.windowStart, b.logged = now, 0
	}
	if b.logged >= burst {
		b.suppressed++
		return false, 0
	}
	b.logged++
	s := b.suppressed
	b.suppressed = 0
	return true, s
}
