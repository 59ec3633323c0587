package kube

import "time"

// schedule names a backoff ladder: attempt n waits step n, and the last step
// repeats. The ladders are FLIPOP's.
type schedule int

const (
	// retryFast is for conditions expected to clear soon (an assignment in
	// progress, rate limiting, transient errors):
	// 1s 1s 5s 5s 10s 10s 10s 1m 1m 1m 1m 1m, then 5m.
	retryFast schedule = iota
	// retrySlow is for conditions a human must fix (not found,
	// misconfigured): 1m 5m, then 10m.
	retrySlow
)

// healthyRecheck is how often an IP that looks settled is re-read from the
// provider, to notice changes made outside vipd.
const healthyRecheck = 5 * time.Minute

func (s schedule) steps() []time.Duration {
	if s == retrySlow {
		return []time.Duration{time.Minute, 5 * time.Minute, 10 * time.Minute}
	}
	return []time.Duration{time.Second, time.Second, 5 * time.Second, 5 * time.Second,
		10 * time.Second, 10 * time.Second, 10 * time.Second,
		time.Minute, time.Minute, time.Minute, time.Minute, time.Minute, 5 * time.Minute}
}

// after returns the wait before retry number attempts (0-based).
func (s schedule) after(attempts int) time.Duration {
	st := s.steps()
	if attempts < 0 {
		attempts = 0
	}
	if attempts >= len(st) {
		return st[len(st)-1]
	}
	return st[attempts]
}

// backoff tracks consecutive failures of one thing.
type backoff struct {
	attempts int
	next     time.Time
}

// fail records a failure at now and returns when to retry.
func (b *backoff) fail(s schedule, now time.Time) time.Time {
	b.next = now.Add(s.after(b.attempts))
	b.attempts++
	return b.next
}

// waiting reports whether now is before the next allowed attempt.
func (b *backoff) waiting(now time.Time) bool { return now.Before(b.next) }
