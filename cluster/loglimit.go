package cluster

import "time"

// logLimit lets one log line through per every and counts the lines it
// held back, for the next line to report (more_since_last_warning): a
// condition that repeats many times a second (a starved loop, a flood of
// packets) is logged, but does not flood the journal.
type logLimit struct {
	every  time.Duration
	logged time.Time // the last line let through
	missed int       // lines held back since
}

// allow reports whether a line may be logged at now and, if so, how many
// were held back since the last one.
func (r *logLimit) allow(now time.Time) (ok bool, missed int) {
	if !r.logged.IsZero() && now.Sub(r.logged) < r.every {
		r.missed++
		return false, 0
	}
	missed = r.missed
	r.logged, r.missed = now, 0
	return true, missed
}
