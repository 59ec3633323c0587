package lease

import (
	"testing"
	"time"
)

func TestGridOrigin(t *testing.T) {
	for _, tc := range []struct {
		now    time.Time
		period time.Duration
		want   time.Time
	}{
		{time.Unix(1000, 123_000_000), 200 * time.Millisecond, time.Unix(1000, 0)},
		{time.Unix(1000, 250_000_000), 200 * time.Millisecond, time.Unix(1000, 200_000_000)},
		{time.Unix(1000, 200_000_000), 200 * time.Millisecond, time.Unix(1000, 200_000_000)},
		{time.Unix(1000, 39_999_999), 40 * time.Millisecond, time.Unix(1000, 0)},
		{time.Unix(1000, 5), 0, time.Unix(1000, 5)},
	} {
		if got := gridOrigin(tc.now, tc.period); !got.Equal(tc.want) {
			t.Errorf("gridOrigin(%v, %v) = %v, want %v", tc.now, tc.period, got, tc.want)
		}
	}
	// A monotonic reading survives (the grid moves with it, not with the
	// wall clock).
	now := time.Now()
	if g := gridOrigin(now, 200*time.Millisecond); g.String() == g.Round(0).String() {
		t.Errorf("gridOrigin(time.Now()) lost the monotonic reading: %v", g)
	}
}

// A leader's renewals fall on the wall clock's multiples of the heartbeat
// interval, whenever the machine started: the instants of the health
// probes and the l2 verification (gridclock), so one wake-up serves all.
// A restarted node's fence still lasts at least E ticks.
func TestLeaderRenewsOnTheWallClockGrid(t *testing.T) {
	for _, profile := range []string{"default", "fast"} {
		cfg := ProfileConfig(profile)
		cfg.Name = "n1"
		period := time.Duration(cfg.HeartbeatTicks) * cfg.Tick
		for _, off := range []time.Duration{0, 7 * time.Millisecond, period - time.Millisecond, period / 2} {
			start := time.Unix(1_000_000, 0).Add(off)
			m, err := New(cfg, nil, start)
			if err != nil {
				t.Fatal(err)
			}
			now := start
			out := m.Step(now, Health{Healthy: true})
			var renewals int
			var persisted []byte
			for now.Sub(start) < 5*time.Second {
				if out.Persist != nil {
					persisted = out.Persist
				}
				if out.Next.IsZero() || !out.Next.After(now) {
					t.Fatalf("%s: no deadline after %v", profile, now.Sub(start))
				}
				now = out.Next
				before := m.readSeq
				out = m.Step(now, Tick{})
				if m.lead != nil && m.readSeq > before {
					renewals++
					if d := now.Sub(now.Truncate(period)); d != 0 {
						t.Fatalf("%s, start +%v: renewal at %v, %v past the %v grid", profile, off, now.Format("15:04:05.000"), d, period)
					}
				}
			}
			if m.lead == nil || renewals < 10 {
				t.Fatalf("%s, start +%v: leader=%v, %d renewals in 5 s", profile, off, m.lead != nil, renewals)
			}
			restart := now.Add(time.Second + off)
			r, err := New(cfg, persisted, restart)
			if err != nil {
				t.Fatal(err)
			}
			if fence := r.base.Add(time.Duration(r.fenceTick) * cfg.Tick).Sub(restart); fence < time.Duration(cfg.ElectionTicks)*cfg.Tick {
				t.Errorf("%s, restart +%v: fence %v, want at least %d ticks", profile, off, fence, cfg.ElectionTicks)
			}
		}
	}
}
