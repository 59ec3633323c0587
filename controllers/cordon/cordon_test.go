package cordon

import (
	"testing"
	"time"
)

// TestCordon feeds the cordon decision a Node's flag and the clock.
func TestCordon(t *testing.T) {
	type step struct {
		at       time.Duration
		observe  *bool // Observe(flag); nil: Tick
		answered bool  // Answered(at) instead
		ask      bool
		deadline time.Duration // -1: none
	}
	on, off := true, false
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"uncordoned asks nothing", []step{
			{at: 0, observe: &off, deadline: -1},
			{at: time.Minute, deadline: -1},
		}},
		{"cordon asks at once, then every DefaultRetry after the answer", []step{
			{at: 0, observe: &off, deadline: -1},
			{at: time.Second, observe: &on, ask: true, deadline: -1},
			{at: 2 * time.Second, observe: &on, deadline: -1}, // in flight: not twice
			{at: 3 * time.Second, answered: true, deadline: 3*time.Second + DefaultRetry},
			{at: 4 * time.Second, deadline: 3*time.Second + DefaultRetry},
			{at: 3*time.Second + DefaultRetry, ask: true, deadline: -1},
			{at: 9 * time.Second, answered: true, deadline: 9*time.Second + DefaultRetry},
		}},
		{"uncordon stops the retries", []step{
			{at: 0, observe: &on, ask: true, deadline: -1},
			{at: time.Second, answered: true, deadline: time.Second + DefaultRetry},
			{at: 2 * time.Second, observe: &off, deadline: -1},
			{at: time.Minute, deadline: -1},
		}},
		{"cordon again asks at once, not after the retry time", []step{
			{at: 0, observe: &on, ask: true, deadline: -1},
			{at: time.Second, answered: true, deadline: time.Second + DefaultRetry},
			{at: 2 * time.Second, observe: &off, deadline: -1},
			{at: 3 * time.Second, observe: &on, ask: true, deadline: -1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Cordon
			t0 := time.Unix(5000, 0)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				var ask bool
				switch {
				case s.answered:
					c.Answered(now)
				case s.observe != nil:
					ask = c.Observe(*s.observe, now)
				default:
					ask = c.Tick(now)
				}
				if ask != s.ask {
					t.Fatalf("step %d: ask=%v, want %v", i, ask, s.ask)
				}
				d := c.Deadline()
				if s.deadline < 0 != d.IsZero() || (s.deadline >= 0 && !d.Equal(t0.Add(s.deadline))) {
					t.Fatalf("step %d: deadline %v, want %v", i, d, s.deadline)
				}
			}
		})
	}
}
