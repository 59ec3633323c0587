package vip

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestCoreHandoverAcquire(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	out := c.Step(Elected{VIP: v4, Holder: true, Handover: true, PrevHolder: "n1"}, t0)
	if len(out.Actions) != 1 || out.Actions[0].Kind != Acquire || !out.Actions[0].Handover {
		t.Fatalf("want one acquire without probe: %+v", out.Actions)
	}
	bound := t0.Add(2 * time.Millisecond)
	o := c.Step(Done{Action: out.Actions[0]}, bound)
	if len(o.Actions) != 1 || o.Actions[0].Kind != Announce || len(o.Timelines) != 0 {
		t.Fatalf("after the bind: %v %+v", acts(o), o.Timelines)
	}
	ann := bound.Add(time.Millisecond)
	o = c.Step(Done{Action: o.Actions[0]}, ann)
	if len(o.Timelines) != 1 {
		t.Fatalf("no timeline after the first announcement")
	}
	tl := o.Timelines[0]
	want := Timeline{VIP: v4, Handover: true, PrevHolder: "n1", DecidedAt: t0, BoundAt: bound, AnnouncedAt: ann}
	if tl != want || c.State()[0].LastFailover != want || tl.Kind() != "handover" {
		t.Fatalf("timeline %+v, want %+v", tl, want)
	}
	// The next announcements complete nothing; a later failover probes again.
	if o := c.Step(Done{Action: Action{Kind: Announce, VIP: v4}}, ann.Add(time.Second)); len(o.Timelines) != 0 {
		t.Fatal("a second timeline")
	}
	c.Step(Elected{VIP: v4, Holder: false}, t0.Add(10*time.Second))
	out = c.Step(Elected{VIP: v4, Holder: true, PrevHolder: "n2"}, t0.Add(20*time.Second))
	if len(out.Actions) != 1 || out.Actions[0].Handover {
		t.Fatalf("a failover acquire must probe: %+v", out.Actions)
	}
	// A failed acquire ends the timeline without one.
	o = c.Step(Failed{Action: out.Actions[0], Err: &ConflictError{VIP: v4.Addr()}}, t0.Add(20*time.Second))
	if len(o.Timelines) != 0 || c.vips[v4].tl != nil {
		t.Fatal("timeline kept after a failed acquire")
	}
}

func TestCoreTimelineWithoutAnnouncements(t *testing.T) {
	// cloud: bound is the end.
	c := New([]netip.Prefix{v4}, Options{Elect: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	out := c.Step(Elected{VIP: v4, Holder: true, PrevHolder: "n1"}, t0)
	o := c.Step(Done{Action: out.Actions[0]}, t0.Add(300*time.Millisecond))
	if len(o.Timelines) != 1 || o.Timelines[0].Kind() != "failover" || !o.Timelines[0].AnnouncedAt.IsZero() {
		t.Fatalf("timelines %+v", o.Timelines)
	}
	// No previous holder (first election): no timeline.
	c2 := New([]netip.Prefix{v4}, Options{Elect: true})
	c2.Step(HealthChanged{Healthy: true}, t0)
	out = c2.Step(Elected{VIP: v4, Holder: true}, t0)
	if o := c2.Step(Done{Action: out.Actions[0]}, t0); len(o.Timelines) != 0 {
		t.Fatal("a timeline without a previous holder")
	}
}

// A release is published (OnTransition, which tells a handover's successor
// to bind) only once the VIP is unbound; an acquire once it is bound.
func TestDriverPublishesAfterTheAction(t *testing.T) {
	ann := &fakeAnnouncer{bound: map[netip.Prefix]bool{}}
	var seen []string
	var d *Driver
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{Elect: true}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil,
		DriverOptions{Mode: "l2", OnTransition: func(tr Transition) {
			ann.mu.Lock()
			seen = append(seen, fmt.Sprintf("held=%v bound=%v", tr.Held, ann.bound[v4]))
			ann.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d.perform(ctx, d.core.Step(HealthChanged{Healthy: true}, time.Now()))
	d.perform(ctx, d.core.Step(Elected{VIP: v4, Holder: true}, time.Now()))
	d.perform(ctx, d.core.Step(Elected{VIP: v4, Holder: false, Reason: "handing over to n2"}, time.Now()))
	if want := []string{"held=true bound=true", "held=false bound=false"}; !slices.Equal(seen, want) {
		t.Fatalf("published %v, want %v", seen, want)
	}
}

// announces lists the Announce actions of out for v, with their causes.
func announces(out Output, v netip.Prefix) []string {
	var s []string
	for _, a := range out.Actions {
		if a.Kind == Announce && a.VIP == v {
			s = append(s, a.Cause)
		}
	}
	return s
}

// The old holder of a planned transfer's overlap stays bound but sends no
// announcement its schedule has due meanwhile: one sent after the
// successor's took clients back to the old holder just before it let go
// (make bench: a planned stop cost 140 ms in 2 runs of 10 when it fell on
// the old holder's burst). An overlap that ends with this node still the
// holder (the transfer called off) starts a new burst YieldResume later,
// not at once: the release usually follows the overlap's end by a step,
// and an announcement in between cost 140 ms at every planned stop. The
// same for a pool address (Leases).
func TestCoreYieldingHolderAnnouncesNothing(t *testing.T) {
	for _, tc := range []struct {
		name            string
		core            func() *Core
		hold, yield, on func(c *Core, now time.Time) Output
	}{
		{"control-plane VIP (Elected)",
			func() *Core {
				c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true})
				c.Step(HealthChanged{Healthy: true}, t0)
				return c
			},
			func(c *Core, now time.Time) Output {
				return stepDone(c, Elected{VIP: v4, Holder: true, Until: now.Add(time.Hour)}, now)
			},
			func(c *Core, now time.Time) Output {
				return c.Step(Elected{VIP: v4, Holder: true, Until: now.Add(3 * time.Second), Yielding: true}, now)
			},
			func(c *Core, now time.Time) Output {
				return c.Step(Elected{VIP: v4, Holder: true, Until: now.Add(time.Hour)}, now)
			}},
		{"pool address (Leases)",
			func() *Core {
				c := New(nil, Options{Coalesce: 100 * time.Millisecond, Start: t0.Add(-StartupWait)})
				c.Step(HealthChanged{Healthy: true}, t0)
				c.Step(Desired{Addresses: []Address{{VIP: v4, Props: Props{Leased: true, Announce: true, Pool: true}}}}, t0)
				return c
			},
			func(c *Core, now time.Time) Output {
				return stepDone(c, Leases{Until: map[netip.Prefix]time.Time{v4: now.Add(time.Hour)}}, now)
			},
			func(c *Core, now time.Time) Output {
				return c.Step(Leases{Until: map[netip.Prefix]time.Time{v4: now.Add(3 * time.Second)}, Yielding: map[netip.Prefix]bool{v4: true}}, now)
			},
			func(c *Core, now time.Time) Output {
				return c.Step(Leases{Until: map[netip.Prefix]time.Time{v4: now.Add(time.Hour)}}, now)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.core()
			if got := announces(tc.hold(c, t0), v4); len(got) != 1 {
				t.Fatalf("acquire: announcements %q, want the first of the burst", got)
			}
			// A transfer agreed just before the second announcement of the burst.
			at := t0.Add(BurstSpacing - 50*time.Millisecond)
			if got := announces(tc.yield(c, at), v4); len(got) != 0 {
				t.Fatalf("yielding: announcements %q, want none", got)
			}
			for d := time.Duration(0); d <= 2*BurstSpacing; d += 10 * time.Millisecond {
				o := c.Step(Tick{}, at.Add(d))
				if got := announces(o, v4); len(got) != 0 {
					t.Fatalf("%v into the overlap: announcements %q, want none", d, got)
				}
				if !o.Next.After(at.Add(d)) {
					t.Fatalf("%v into the overlap: next wake-up %v, not after now (the skipped announcement's deadline: a busy loop)", d, o.Next)
				}
			}
			if st := c.State(); len(st) != 1 || !st[0].Held {
				t.Fatalf("the old holder let go before its overlap ended: %+v", st)
			}
			// The overlap over, this node still the holder (the transfer
			// called off): a new burst from YieldResume on, not at once
			// (the election's release usually follows within a step).
			back := at.Add(2*BurstSpacing + time.Millisecond)
			if got := announces(tc.on(c, back), v4); len(got) != 0 {
				t.Fatalf("overlap over: announcements %q at once, want none before YieldResume", got)
			}
			if got := announces(c.Step(Tick{}, back.Add(YieldResume/2)), v4); len(got) != 0 {
				t.Fatalf("overlap over: announcements %q before YieldResume", got)
			}
			if got := announces(c.Step(Tick{}, back.Add(YieldResume)), v4); len(got) != 1 {
				t.Fatalf("called off: announcements %q at YieldResume, want the first of a new burst", got)
			}
			if got := announces(c.Step(Tick{}, back.Add(YieldResume+BurstSpacing)), v4); len(got) != 1 {
				t.Fatalf("called off: announcements %q a burst spacing later, want the burst's next", got)
			}
		})
	}
}
