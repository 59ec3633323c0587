package kube

import (
	"slices"
	"time"
)

// dnsTiming tunes when record sets are written.
type dnsTiming struct {
	// Debounce: a changed set is written once it has been stable this
	// long, so a burst of node changes (an upgrade, a drain) costs one
	// write instead of one per node.
	Debounce time.Duration
	// MaxDelay bounds the debounce when the set keeps changing.
	MaxDelay time.Duration
	// Resync re-asserts an unchanged set this often, repairing records
	// changed outside vipd. Zero disables it.
	Resync time.Duration
}

// dnsSync decides when to write one record set. It is pure: the caller
// performs the write and reports the result.
type dnsSync struct {
	written   []string // last set written successfully
	wroteOnce bool
	writtenAt time.Time
	want      []string
	wantSince time.Time // when want last changed
	diffSince time.Time // when want first differed from written
	retry     backoff
	lastErr   error
}

// decide returns whether to write want now, and otherwise when to ask
// again (zero: nothing scheduled).
func (s *dnsSync) decide(want []string, now time.Time, t dnsTiming) (bool, time.Time) {
	if !slices.Equal(want, s.want) || s.wantSince.IsZero() {
		s.want = slices.Clone(want)
		s.wantSince = now
	}
	differs := !s.wroteOnce || !slices.Equal(want, s.written)
	if !differs {
		s.diffSince = time.Time{}
		if s.lastErr == nil {
			if t.Resync <= 0 {
				return false, time.Time{}
			}
			due := s.writtenAt.Add(t.Resync)
			if now.Before(due) {
				return false, due
			}
		}
	} else if s.diffSince.IsZero() {
		s.diffSince = now
	}
	if s.retry.waiting(now) {
		return false, s.retry.next
	}
	if differs {
		stable := s.wantSince.Add(t.Debounce)
		limit := s.diffSince.Add(t.MaxDelay)
		if now.Before(stable) && now.Before(limit) {
			if limit.Before(stable) {
				return false, limit
			}
			return false, stable
		}
	}
	return true, time.Time{}
}

// done records the outcome of writing s.want.
func (s *dnsSync) done(err error, now time.Time) {
	s.lastErr = err
	if err != nil {
		s.retry.fail(retrySchedule(err), now)
		return
	}
	s.retry = backoff{}
	s.written = slices.Clone(s.want)
	s.wroteOnce = true
	s.writtenAt = now
	s.diffSince = time.Time{}
}
