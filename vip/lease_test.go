package vip

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// The lease election hands the core a lease end with every Elected: the
// core must let go at that end by itself, whatever the election does next.
func TestCoreLeaseEnd(t *testing.T) {
	up := HealthChanged{Healthy: true, Reason: "ok"}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tests := []struct {
		name  string
		steps []step
	}{
		{"released at the lease end without another Elected", []step{
			{0, up, nil},
			{0, Elected{VIP: v4, Holder: true, Until: at(2 * time.Second)}, []string{"acquire 10.0.0.100/32"}},
			{1999 * time.Millisecond, Tick{}, nil},
			{2 * time.Second, Tick{}, []string{"release 10.0.0.100/32"}},
			{3 * time.Second, Tick{}, nil}, // stays released
		}},
		{"a renewal moves the end", []step{
			{0, up, nil},
			{0, Elected{VIP: v4, Holder: true, Until: at(2 * time.Second)}, []string{"acquire 10.0.0.100/32"}},
			{time.Second, Elected{VIP: v4, Holder: true, Until: at(3 * time.Second)}, nil},
			{2 * time.Second, Tick{}, nil},
			{3 * time.Second, Tick{}, []string{"release 10.0.0.100/32"}},
		}},
		{"a renewal after the end acquires again", []step{
			{0, up, nil},
			{0, Elected{VIP: v4, Holder: true, Until: at(time.Second)}, []string{"acquire 10.0.0.100/32"}},
			{time.Second, Tick{}, []string{"release 10.0.0.100/32"}},
			{1500 * time.Millisecond, Elected{VIP: v4, Holder: true, Until: at(3 * time.Second)}, []string{"acquire 10.0.0.100/32"}},
		}},
		{"a decision that arrives after its end is not acted on", []step{
			{0, up, nil},
			{2 * time.Second, Elected{VIP: v4, Holder: true, Until: at(time.Second)}, nil},
			{3 * time.Second, Tick{}, nil},
		}},
		{"health returning after the end does not acquire", []step{
			{0, Elected{VIP: v4, Holder: true, Until: at(time.Second)}, nil},
			{2 * time.Second, up, nil},
		}},
		{"zero Until: no end", []step{
			{0, up, nil},
			{0, Elected{VIP: v4, Holder: true}, []string{"acquire 10.0.0.100/32"}},
			{time.Hour, Tick{}, nil},
		}},
		{"a release decision clears the end", []step{
			{0, up, nil},
			{0, Elected{VIP: v4, Holder: true, Until: at(5 * time.Second)}, []string{"acquire 10.0.0.100/32"}},
			{time.Second, Elected{VIP: v4, Holder: false, Until: at(5 * time.Second)}, []string{"release 10.0.0.100/32"}},
			{5 * time.Second, Tick{}, nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, New([]netip.Prefix{v4}, Options{Elect: true}), tt.steps)
		})
	}
}

// Next must wake the driver at the lease end, so that a held address is
// released then even if nothing else happens.
func TestCoreLeaseEndIsADeadline(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	end := t0.Add(700 * time.Millisecond)
	out := stepDone(c, Elected{VIP: v4, Holder: true, Until: end}, t0)
	if !out.Next.Equal(end) {
		t.Fatalf("Next = %v after the acquire, want the lease end %v", out.Next.Sub(t0), end.Sub(t0))
	}
	out = c.Step(Tick{}, out.Next)
	if got := strings.Join(acts(out), "; "); got != "release 10.0.0.100/32" {
		t.Fatalf("at the lease end: %s", got)
	}
	st := c.State()[0]
	if st.Held || !strings.Contains(st.Last.Cause, "lease ended") {
		t.Fatalf("state after the end: %+v", st)
	}
	if !out.Next.IsZero() {
		t.Fatalf("Next = %v after the release, want none", out.Next.Sub(t0))
	}
}

// The driver releases a VIP at its lease end by itself: the election sends
// one Elected and then nothing (its goroutine is stuck), and the address
// is gone from the announcer at the end, not later.
func TestDriverReleasesAtLeaseEnd(t *testing.T) {
	d, ann, trans := electedDriver(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx, time.Second) }()
	defer func() { cancel(); <-done }()
	d.Send(HealthChanged{Healthy: true})
	until := time.Now().Add(300 * time.Millisecond)
	d.Send(Elected{VIP: v4, Holder: true, Until: until, Reason: "lease granted"})
	wait := func() Transition {
		select {
		case tr := <-trans:
			return tr
		case <-time.After(5 * time.Second):
			t.Fatal("no transition within 5 s")
		}
		return Transition{}
	}
	if tr := wait(); !tr.Held {
		t.Fatalf("first transition %+v", tr)
	}
	tr := wait()
	late := time.Since(until)
	if tr.Held || !strings.Contains(tr.Cause, "lease ended") {
		t.Fatalf("second transition %+v", tr)
	}
	if tr.At.Before(until) {
		t.Fatalf("released %v before the lease end", until.Sub(tr.At))
	}
	if late > 200*time.Millisecond {
		t.Fatalf("released %v after the lease end", late)
	}
	ann.mu.Lock()
	defer ann.mu.Unlock()
	if ann.bound[v4] {
		t.Fatal("still bound after the lease end")
	}
}

// electedDriver is a driver of an elected v4 on the process's clock, with
// its announcer and its transitions.
func electedDriver(t *testing.T) (*Driver, *fakeAnnouncer, <-chan Transition) {
	t.Helper()
	ann := &fakeAnnouncer{bound: map[netip.Prefix]bool{}}
	trans := make(chan Transition, 8)
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{Elect: true}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil,
		DriverOptions{Mode: "l2", OnTransition: func(tr Transition) { trans <- tr }})
	if err != nil {
		t.Fatal(err)
	}
	return d, ann, trans
}

// timerfds counts this process's open timerfds.
func timerfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == "anon_inode:[timerfd]" {
			n++
		}
	}
	return n
}

// With the process's clock, the driver waits for the core's deadline on a
// timerfd, not a Go timer: the holder moves that deadline at every lease
// renewal, and a Go timer moved later leaves the runtime's monitor thread
// and poller to wake at each deadline it passed. Renewed for a while, then
// no more: the VIP goes at the last lease end, not at an earlier one that
// a renewal had moved, nor much later; the timerfd is closed with Run.
func TestDriverDeadlineOnTimerfd(t *testing.T) {
	d, _, trans := electedDriver(t)
	before := timerfds(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx, time.Second) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()
	d.Send(HealthChanged{Healthy: true})
	const lease = 120 * time.Millisecond
	until := time.Now().Add(lease)
	d.Send(Elected{VIP: v4, Holder: true, Until: until, Reason: "lease granted"})
	select {
	case tr := <-trans:
		if !tr.Held {
			t.Fatalf("first transition %+v", tr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not acquired within 5 s")
	}
	if got := timerfds(t); got != before+1 {
		t.Fatalf("%d timerfds while running, %d before: the deadline is not on a timerfd", got, before)
	}
	for range 8 { // renewals well inside each lease, as a holder's
		time.Sleep(lease / 3)
		until = time.Now().Add(lease)
		d.Send(Elected{VIP: v4, Holder: true, Until: until, Reason: "lease renewed"})
	}
	select {
	case tr := <-trans:
		if tr.Held || !strings.Contains(tr.Cause, "lease ended") {
			t.Fatalf("second transition %+v", tr)
		}
		if tr.At.Before(until) {
			t.Fatalf("released %v before the last lease end", until.Sub(tr.At))
		}
		if late := tr.At.Sub(until); late > 100*time.Millisecond {
			t.Fatalf("released %v after the last lease end", late)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not released within 5 s of the last renewal")
	}
	stop()
	if got := timerfds(t); got != before {
		t.Fatalf("%d timerfds after Run returned, %d before", got, before)
	}
}
