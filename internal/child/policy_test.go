package child

import (
	"testing"
	"time"
)

func TestRestarts(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	type run struct {
		lasted time.Duration
		want   time.Duration
	}
	for _, tc := range []struct {
		name string
		cfg  Backoff
		runs []run
	}{
		{"crash loop doubles up to the cap", Backoff{First: time.Second, Max: 5 * time.Second, Healthy: time.Minute},
			[]run{{0, time.Second}, {10 * time.Millisecond, 2 * time.Second}, {time.Second, 4 * time.Second}, {0, 5 * time.Second}, {0, 5 * time.Second}}},
		{"a healthy run resets", Backoff{First: time.Second, Max: 30 * time.Second, Healthy: time.Minute},
			[]run{{0, time.Second}, {0, 2 * time.Second}, {0, 4 * time.Second}, {time.Minute, time.Second}, {59 * time.Second, 2 * time.Second}}},
		{"defaults", Backoff{},
			[]run{{0, time.Second}, {0, 2 * time.Second}, {0, 4 * time.Second}, {0, 8 * time.Second}, {0, 16 * time.Second}, {0, 30 * time.Second}, {2 * time.Minute, time.Second}}},
		{"max below first", Backoff{First: 3 * time.Second, Max: time.Second},
			[]run{{0, 3 * time.Second}, {0, 3 * time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRestarts(tc.cfg)
			now := t0
			for i, ru := range tc.runs {
				r.Started(now)
				now = now.Add(ru.lasted)
				got := r.Exited(now)
				if got != ru.want {
					t.Fatalf("stop %d after %v: pause %v, want %v", i, ru.lasted, got, ru.want)
				}
				now = now.Add(got)
			}
		})
	}
}

func TestBadLines(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	type ev struct {
		at         time.Duration
		log        bool
		suppressed int
	}
	for _, tc := range []struct {
		name string
		b    BadLines
		evs  []ev
	}{
		{"burst then quiet, the count comes with the next logged line", BadLines{Burst: 2, Window: 10 * time.Second},
			[]ev{{0, true, 0}, {1, true, 0}, {2, false, 0}, {3, false, 0}, {10 * time.Second, true, 2}, {11 * time.Second, true, 0}, {12 * time.Second, false, 0}}},
		{"defaults: five a minute", BadLines{},
			[]ev{{0, true, 0}, {1, true, 0}, {2, true, 0}, {3, true, 0}, {4, true, 0}, {5, false, 0}, {time.Minute, true, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			for i, e := range tc.evs {
				log, s := b.Bad(t0.Add(e.at))
				if log != e.log || s != e.suppressed {
					t.Fatalf("bad line %d at %v: log=%v suppressed=%d, want %v %d", i, e.at, log, s, e.log, e.suppressed)
				}
			}
		})
	}
}
