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
