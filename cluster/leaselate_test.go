package cluster

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/internal/testenv"
)

// syncBuf is a log sink the loop's goroutine writes and the test reads.
type syncBuf struct{ testenv.Buffer }

func (s *syncBuf) lines() []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// The limit is half the silence each profile's lease outlives (L - R - T,
// docs/lease.md: 285 ms default, 67 ms fast).
func TestLatenessLimits(t *testing.T) {
	for _, tc := range []struct {
		profile          string
		limit, tolerance time.Duration
	}{
		{"default", 142500 * time.Microsecond, 285 * time.Millisecond},
		{"fast", 33600 * time.Microsecond, 67200 * time.Microsecond},
	} {
		w := newLateness(lease.ProfileConfig(tc.profile))
		if w.limit != tc.limit || w.tolerance != tc.tolerance {
			t.Errorf("%s: limit %v, tolerance %v; want %v, %v", tc.profile, w.limit, w.tolerance, tc.limit, tc.tolerance)
		}
	}
	// A configuration whose lease outlives no silence is not watched.
	c := lease.ProfileConfig("fast")
	c.HeartbeatTicks = 12
	if w := newLateness(c); w.limit != 0 {
		t.Errorf("no tolerance: limit %v, want 0 (not watched)", w.limit)
	}
}

// Steps and wake-ups at and past the limit; one warning per 10 s with the
// count of those in between; nothing when not watched.
func TestLatenessWarnings(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	var buf syncBuf
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := newLateness(lease.ProfileConfig("fast")) // limit 33.6 ms
	w.due = t0
	type step struct {
		name string
		do   func()
		want string // the new log line contains it; "" for none
	}
	for _, s := range []step{
		{"on time", func() { w.woke(t0.Add(time.Millisecond), log) }, ""},
		{"at the limit", func() { w.woke(t0.Add(33600*time.Microsecond), log) }, ""},
		{"a short step", func() { w.stepped(t0, t0.Add(30*time.Millisecond), lease.Tick{}, log) }, ""},
		{"woke 90 ms late", func() { w.woke(t0.Add(90*time.Millisecond), log) },
			`level=WARN msg="lease election: this node woke late for its deadline (starved of CPU?)" late=90ms limit=33.6ms lease_outlives=67ms`},
		{"a long step 2 s later: within 10 s", func() {
			w.stepped(t0.Add(2*time.Second), t0.Add(2*time.Second+50*time.Millisecond), lease.Receive{}, log)
		}, ""},
		{"woke late 11 s later", func() { w.due = t0.Add(11 * time.Second); w.woke(t0.Add(11*time.Second+40*time.Millisecond), log) },
			`late=40ms limit=33.6ms lease_outlives=67ms more_since_last_warning=1`},
		{"a long step 22 s later", func() {
			w.stepped(t0.Add(22*time.Second), t0.Add(22*time.Second+200*time.Millisecond), lease.Receive{}, log)
		}, `msg="lease election: one step took long" took=200ms event=lease.Receive limit=33.6ms`},
	} {
		before := len(buf.lines())
		s.do()
		got := buf.lines()[before:]
		switch {
		case s.want == "" && len(got) > 0:
			t.Errorf("%s: logged %q, want nothing", s.name, got)
		case s.want != "" && (len(got) != 1 || !strings.Contains(got[0], s.want)):
			t.Errorf("%s: logged %q, want one line with %q", s.name, got, s.want)
		}
	}
	var off lateness
	off.due = t0
	off.woke(t0.Add(time.Hour), log)
	off.stepped(t0, t0.Add(time.Hour), lease.Tick{}, log)
	if n := len(buf.lines()); n != 3 {
		t.Errorf("an unwatched loop logged: %d lines, want the 3 above", n)
	}
}

// The loop arms its deadline and warns when its timer fires well past it
// (the fake clock jumps past the deadline, as a starved process wakes).
func TestLeaseLoopWarnsWhenLate(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		return lease.Output{Next: now.Add(50 * time.Millisecond)}
	}}
	var buf syncBuf
	j := &journal{}
	l := newLeaseLoop(m, clk, j, j, slog.New(slog.NewTextHandler(&buf, nil)))
	l.decide = j.decide
	l.late = newLateness(lease.ProfileConfig("fast"))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	_, _, stepped := l.snapshot()
	go func() { errc <- l.run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != context.Canceled {
			t.Errorf("run: %v", err)
		}
	}()
	waitStep(t, stepped)
	advance(t, l, clk, 50*time.Millisecond) // on time
	advance(t, l, clk, 60*time.Millisecond) // 10 ms late
	if got := buf.lines(); len(got) != 0 {
		t.Fatalf("on time and 10 ms late: logged %q", got)
	}
	advance(t, l, clk, 150*time.Millisecond) // 100 ms late
	got := buf.lines()
	if len(got) != 1 || !strings.Contains(got[0], "woke late") || !strings.Contains(got[0], "late=100ms") {
		t.Fatalf("100 ms late: logged %q, want one warning with late=100ms", got)
	}
}
