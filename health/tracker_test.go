package health

import (
	"testing"
	"time"
)

// TestTracker feeds probe outcomes ("+" success, "-" failure) and checks the
// health state after each one ("H" healthy, "U" unhealthy).
func TestTracker(t *testing.T) {
	tests := []struct {
		name       string
		fail, rise int
		in, want   string
	}{
		{"fail3 rise1: first success is healthy at once", 3, 1, "+", "H"},
		{"fail3 rise1: failures from start stay unhealthy", 3, 1, "----", "UUUU"},
		{"fail3 rise1: three failures make unhealthy", 3, 1, "+---", "HHHU"},
		{"fail3 rise1: two failures are tolerated", 3, 1, "+--+--+", "HHHHHHH"},
		{"fail3 rise1: recovery after one success", 3, 1, "+---+", "HHHUH"},
		{"fail3 rise2: one success is not enough", 3, 2, "+", "U"},
		{"fail3 rise2: two successes make healthy", 3, 2, "++", "UH"},
		{"fail3 rise2: failure resets the rise count", 3, 2, "+-+-++", "UUUUUH"},
		{"fail3 rise2: fall then rise again", 3, 2, "++----++", "UHHHUUUH"},
		{"fail3 rise2: flapping never becomes healthy", 3, 2, "+-+-+-+-", "UUUUUUUU"},
		{"fail3 rise1: flapping stays healthy", 3, 1, "+-+-+-+-", "HHHHHHHH"},
		{"fail3 rise1: flapping with double failures stays healthy", 3, 1, "+--+--+--", "HHHHHHHHH"},
		{"fail1 rise1: follows every probe", 1, 1, "+-+-", "HUHU"},
		{"zero thresholds count as one", 0, 0, "+-", "HU"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			tr := NewTracker(tt.fail, tt.rise, start)
			if tr.Healthy() {
				t.Fatal("new tracker is healthy, want unhealthy")
			}
			prevHealthy, lastChange := false, start
			for i, c := range tt.in {
				now := start.Add(time.Duration(i+1) * time.Second)
				changed := tr.Observe(c == '+', now)
				got := tr.Healthy()
				if want := tt.want[i] == 'H'; got != want {
					t.Fatalf("after %q: healthy=%v, want %v", tt.in[:i+1], got, want)
				}
				if changed != (got != prevHealthy) {
					t.Fatalf("after %q: changed=%v but state went %v -> %v", tt.in[:i+1], changed, prevHealthy, got)
				}
				if changed {
					lastChange = now
				}
				if !tr.Since().Equal(lastChange) {
					t.Fatalf("after %q: Since=%v, want %v", tt.in[:i+1], tr.Since(), lastChange)
				}
				prevHealthy = got
			}
		})
	}
}

func TestTrackerConsecutive(t *testing.T) {
	tr := NewTracker(3, 1, time.Time{})
	want := []int{1, 2, 1, 2, 3, 1}
	for i, ok := range []bool{true, true, false, false, false, true} {
		tr.Observe(ok, time.Time{})
		if got := tr.Consecutive(); got != want[i] {
			t.Fatalf("probe %d: Consecutive=%d, want %d", i, got, want[i])
		}
	}
}
