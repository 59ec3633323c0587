package health

import "time"

// Tracker applies the fail and rise thresholds to a stream of probe
// outcomes. It does no I/O and reads no clock: time comes in with each
// observation. The zero value is not usable; call NewTracker.
type Tracker struct {
	fail, rise int
	healthy    bool
	lastOK     bool
	streak     int
	since      time.Time
}

// NewTracker returns an unhealthy tracker. fail and rise below 1 count as 1.
// start is reported by Since until the state first changes.
func NewTracker(fail, rise int, start time.Time) *Tracker {
	return &Tracker{fail: max(fail, 1), rise: max(rise, 1), since: start}
}

// Observe records one probe outcome and reports whether the health state
// changed because of it.
func (t *Tracker) Observe(ok bool, now time.Time) (changed bool) {
	if t.streak > 0 && ok == t.lastOK {
		t.streak++
	} else {
		t.lastOK, t.streak = ok, 1
	}
	switch {
	case !t.healthy && ok && t.streak >= t.rise:
		t.healthy = true
	case t.healthy && !ok && t.streak >= t.fail:
		t.healthy = false
	default:
		return false
	}
	t.since = now
	return true
}

// Healthy reports the current health state.
func (t *Tracker) Healthy() bool { return t.healthy }

// Since is when the health state last changed (or the start time).
func (t *Tracker) Since() time.Time { return t.since }

// Consecutive is how many probes in a row had the same outcome as the last.
func (t *Tracker) Consecutive() int { return t.streak }
