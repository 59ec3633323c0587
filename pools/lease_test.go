package pools

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/clock"
)

// fakeDriver runs a driver on a fake clock until the test ends.
type fakeDriver struct {
	t   *testing.T
	d   *Driver
	clk *clock.Fake
	l2  *fakeL2
}

// runFake starts a driver on a fake clock; before, if given, runs before
// Run starts (a previous run's bindings, a saved desired set).
func runFake(t *testing.T, cfg DriverConfig, before func(*fakeL2, *Driver)) *fakeDriver {
	t.Helper()
	l2 := newFakeL2()
	clk := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	cfg.L2, cfg.Clock = l2, clk
	d, err := NewDriver(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(l2, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &fakeDriver{t: t, d: d, clk: clk, l2: l2}
}

func (f *fakeDriver) step(d time.Duration) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.clk.Step(ctx, d); err != nil {
		f.t.Fatalf("the driver did not handle its timers: %v", err)
	}
}

func (f *fakeDriver) waitUntil(what string, cond func() bool) {
	f.t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			f.t.Fatalf("%s: not within 5 s; status %+v, bound %v", what, f.d.Status(), f.l2.boundList())
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fakeDriver) bound(want ...netip.Addr) func() bool {
	return func() bool { return slices.Equal(f.l2.boundList(), want) }
}

// With DriverConfig.Leased the lease election places l2 addresses: the
// driver binds exactly what its leases say, releases one whose lease is
// withdrawn at once and one whose lease ends without a renewal at its end,
// whatever else happens; an address this node may not hold (its node
// restriction) is not bound although leased.
func TestDriverLeased(t *testing.T) {
	a1, a2, a3 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	f := runFake(t, DriverConfig{Name: "n1", Leased: true}, nil)
	f.d.SetDesired([]Address{
		{Addr: a1, Pool: "a", Mode: ModeL2, All: true},
		{Addr: a2, Pool: "a", Mode: ModeL2, All: true},
		{Addr: a3, Pool: "a", Mode: ModeL2, Nodes: []string{"n2"}},
	})
	f.waitUntil("the feed's addresses reach the machine", func() bool { return f.d.Status().Desired == 3 })
	f.step(StartupWait)
	if b := f.l2.boundList(); len(b) != 0 {
		t.Fatalf("bound %v without a lease", b)
	}
	start := f.clk.Now()
	f.d.SetLeases(map[netip.Addr]time.Time{a1: start.Add(10 * time.Second), a2: start.Add(time.Second), a3: start.Add(10 * time.Second)}, nil, nil)
	f.waitUntil("the leased addresses bound", f.bound(a1, a2))
	st := f.d.Status()
	if st.Held != 2 || st.Addresses[0].Holder != "n1" || st.Addresses[2].Holder != "" || st.Addresses[2].Eligible != 0 {
		t.Fatalf("status %+v", st)
	}
	// a2's lease ends without a renewal: released at its end, not before.
	f.step(time.Second - time.Millisecond)
	if !slices.Contains(f.l2.boundList(), a2) {
		t.Fatal("a2 released before its lease end")
	}
	f.step(time.Millisecond)
	if b := f.l2.boundList(); !slices.Equal(b, []netip.Addr{a1}) {
		t.Fatalf("bound %v at a2's lease end, want only %v", b, a1)
	}
	// a1's lease withdrawn: released at once.
	f.d.SetLeases(map[netip.Addr]time.Time{}, nil, nil)
	f.waitUntil("a1 released when its lease is withdrawn", f.bound())
}

// Addresses a previous run left bound: left alone during StartupWait;
// then the one this node may hold is adopted after a probe (never
// unbound), the one it may not hold is released.
func TestDriverLeftovers(t *testing.T) {
	a1, a2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	f := runFake(t, DriverConfig{Name: "n1"}, func(l2 *fakeL2, d *Driver) {
		l2.bound[a1], l2.bound[a2] = true, true
		d.SetDesired([]Address{{Addr: a1, Pool: "a", Mode: ModeL2, All: true}, {Addr: a2, Pool: "a", Mode: ModeL2, Nodes: []string{"n2"}}})
	})
	f.waitUntil("the saved addresses reach the machine", func() bool { return f.d.Status().Desired == 2 })
	f.step(StartupWait - 100*time.Millisecond)
	if b := f.l2.boundList(); !slices.Equal(b, []netip.Addr{a1, a2}) {
		t.Fatalf("bound %v during StartupWait, want the leftovers untouched", b)
	}
	f.step(100 * time.Millisecond)
	f.waitUntil("a2 released, a1 kept", f.bound(a1))
	if n := f.l2.count(f.l2.probes, a1); n != 1 {
		t.Fatalf("a1 probed %d times before it was adopted, want 1", n)
	}
	if n := f.l2.count(f.l2.released, a1); n != 0 {
		t.Fatalf("a1 released %d times: a leftover this node may hold is adopted, not rebound", n)
	}
	f.waitUntil("a1 held", func() bool { return f.d.Status().Held == 1 })
}

// A lease granted in a planned transfer's overlap (make-before-break):
// the old holder still answers for the address, so the successor binds it
// without the conflict probe and reports the bind (OnBound, after the
// first announcement), which lets the old holder go at once. Before, the
// successor probed, took the old holder's answer for a conflict, and
// bound only at a retry after the old holder let go at the overlap's
// bound: a window with no holder on every planned move of a pool address.
// An ordinary grant is probed first, and a conflict is not bound.
func TestDriverLeasedHandover(t *testing.T) {
	a1 := netip.MustParseAddr("192.0.2.1")
	for _, tc := range []struct {
		name     string
		handover bool
		answered bool // the old holder (another MAC) answers a1
		bound    bool
		probes   int
	}{
		{"planned transfer: bound without the probe while the old holder answers", true, true, true, 0},
		{"planned transfer, nobody answers: bound without the probe", true, false, true, 0},
		{"ordinary grant: probed, bound", false, false, true, 1},
		{"ordinary grant, another host answers: not bound", false, true, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var reported []netip.Addr
			announcedFirst := true
			var f *fakeDriver
			f = runFake(t, DriverConfig{Name: "n1", Leased: true, OnBound: func(as []netip.Addr) {
				mu.Lock()
				defer mu.Unlock()
				reported = append(reported, as...)
				for _, a := range as {
					announcedFirst = announcedFirst && f.l2.count(f.l2.announced, a) > 0
				}
			}}, func(l2 *fakeL2, d *Driver) {
				if tc.answered {
					l2.answers[a1] = "02:00:00:00:00:99"
				}
				d.SetDesired([]Address{{Addr: a1, Pool: "a", Mode: ModeL2, All: true}})
			})
			f.waitUntil("the feed's addresses reach the machine", func() bool { return f.d.Status().Desired == 1 })
			f.step(StartupWait)
			f.d.SetLeases(map[netip.Addr]time.Time{a1: f.clk.Now().Add(10 * time.Second)}, map[netip.Addr]bool{a1: tc.handover}, nil)
			if tc.bound {
				f.waitUntil("a1 bound", f.bound(a1))
				f.waitUntil("a1's bind reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(reported) == 1 })
				mu.Lock()
				if !slices.Equal(reported, []netip.Addr{a1}) || !announcedFirst {
					t.Errorf("reported %v (announced first: %v), want %v once, after its first announcement", reported, announcedFirst, a1)
				}
				mu.Unlock()
			} else {
				f.waitUntil("a1 answered", func() bool {
					st := f.d.Status().Addresses[0].State
					return st == "backoff" || st == "conflict" // answered in the start-up grace, or after
				})
				if b := f.l2.boundList(); len(b) != 0 {
					t.Fatalf("bound %v while another host answers", b)
				}
			}
			if n := f.l2.count(f.l2.probes, a1); n != tc.probes {
				t.Errorf("a1 probed %d times, want %d", n, tc.probes)
			}
		})
	}
}
