package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// The pool and egress addresses (Props.Pool) through the Core: every
// behaviour the pools driver relies on, (event, now) in, actions,
// conflicts and the next deadline out.

var (
	p1 = netip.MustParsePrefix("10.1.0.1/32")
	p2 = netip.MustParsePrefix("10.1.0.2/32")
	p3 = netip.MustParsePrefix("fd00:1::3/128")
)

var (
	poolL2  = Props{Announce: true, Pool: true}
	poolBGP = Props{Pool: true}
	leased  = Props{Leased: true, Announce: true, Pool: true}
	barred  = Props{Announce: true, Pool: true, Barred: true}
)

const (
	macA = "02:00:00:00:00:0a"
	macB = "02:00:00:00:00:0b"
)

func newPoolCore() *Core { return New(nil, Options{Coalesce: 100 * time.Millisecond, Start: t0}) }

func desired(as ...any) Desired {
	var d Desired
	for i := 0; i < len(as); i += 2 {
		d.Addresses = append(d.Addresses, Address{VIP: as[i].(netip.Prefix), Props: as[i+1].(Props)})
	}
	return d
}

func acq(v netip.Prefix) Action { return Action{Kind: Acquire, VIP: v} }

func bindOK(vs ...netip.Prefix) Event {
	var b Batch
	for _, v := range vs {
		b.Events = append(b.Events, Done{Action: acq(v)})
	}
	return b
}

func answered(v netip.Prefix, mac string) Event {
	hw, _ := net.ParseMAC(mac)
	return Failed{Action: acq(v), Err: &ConflictError{VIP: v.Addr(), MAC: hw}}
}

func observed(present ...netip.Prefix) func(...netip.Prefix) Event {
	return func(known ...netip.Prefix) Event {
		var b Batch
		for _, v := range known {
			b.Events = append(b.Events, Observed{VIP: v, Present: slices.Contains(present, v)})
		}
		return b
	}
}

func leases(until map[netip.Prefix]time.Duration) Leases {
	l := Leases{Until: map[netip.Prefix]time.Time{}}
	for v, d := range until {
		l.Until[v] = t0.Add(d)
	}
	return l
}

// poolActs is acts with the conflicts reported.
func poolActs(out Output) string {
	s := acts(out)
	for _, c := range out.Conflicts {
		s = append(s, "conflict "+c.VIP.String()+" "+c.MAC)
	}
	return strings.Join(s, "; ")
}

var healthy = HealthChanged{Healthy: true, Reason: "ok"}

func TestCorePoolAddresses(t *testing.T) {
	sw := StartupWait
	type pstep struct {
		at   time.Duration
		ev   Event
		want string // the actions, as poolActs writes them
	}
	tests := []struct {
		name  string
		steps []pstep
	}{
		{"waits StartupWait, then takes what it may, not what it may not; announces a burst", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, barred), ""},
			{sw - time.Millisecond, Tick{}, ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw + 10*time.Millisecond, bindOK(p1), "announce 10.1.0.1/32"},
			{sw + 10*time.Millisecond + BurstSpacing - 150*time.Millisecond, Tick{}, ""},
			{sw + 10*time.Millisecond + BurstSpacing - 100*time.Millisecond, Tick{}, "announce 10.1.0.1/32"},
		}},
		{"an address removed from the desired set is released at once", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, bindOK(p1), "announce 10.1.0.1/32"},
			{3 * time.Second, Desired{}, "release 10.1.0.1/32"},
			{4 * time.Second, Tick{}, ""},
		}},
		{"unhealthy: releases everything, once", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, poolBGP), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32; acquire 10.1.0.2/32"},
			{sw, bindOK(p1, p2), "announce 10.1.0.1/32"},
			{3 * time.Second, HealthChanged{Reason: "down"}, "release 10.1.0.1/32; release 10.1.0.2/32"},
			{4 * time.Second, Tick{}, ""},
			{5 * time.Second, healthy, "acquire 10.1.0.1/32; acquire 10.1.0.2/32"},
		}},
		{"the node restriction stops matching this node: released at once, taken again when it matches", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, bindOK(p1), "announce 10.1.0.1/32"},
			{3 * time.Second, desired(p1, barred), "release 10.1.0.1/32"},
			{4 * time.Second, Tick{}, ""},
			{5 * time.Second, desired(p1, poolL2), "acquire 10.1.0.1/32"},
		}},
		{"another host answers: within the start-up grace retried after ProbeRetry unreported; then a conflict reported once per episode, retried every ConflictRetry", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw + 50*time.Millisecond, answered(p1, macA), ""},
			{sw + 50*time.Millisecond + ProbeRetry - time.Millisecond, Tick{}, ""},
			{sw + 50*time.Millisecond + ProbeRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10 * time.Second, answered(p1, macA), "conflict 10.1.0.1/32 02:00:00:00:00:0a"},
			{10*time.Second + ConflictRetry - time.Millisecond, Tick{}, ""},
			{10*time.Second + ConflictRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10*time.Second + ConflictRetry, answered(p1, macA), ""},
			{10*time.Second + 2*ConflictRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10*time.Second + 2*ConflictRetry, answered(p1, macB), "conflict 10.1.0.1/32 02:00:00:00:00:0b"},
			{10*time.Second + 3*ConflictRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10*time.Second + 3*ConflictRetry, bindOK(p1), "announce 10.1.0.1/32"},
		}},
		{"leased: another host answers (a killed holder's stale binding): reported once, retried every ElectedConflictRetry for ElectedConflictTries, then every ConflictRetry", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased), ""},
			{10 * time.Second, leases(map[netip.Prefix]time.Duration{p1: time.Hour}), "acquire 10.1.0.1/32"},
			{10 * time.Second, answered(p1, macA), "conflict 10.1.0.1/32 02:00:00:00:00:0a"},
			{10*time.Second + ElectedConflictRetry - time.Millisecond, Tick{}, ""},
			{10*time.Second + ElectedConflictRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10*time.Second + ElectedConflictRetry, answered(p1, macA), ""},
			{10*time.Second + 2*ElectedConflictRetry, Tick{}, "acquire 10.1.0.1/32"},
			{10*time.Second + 2*ElectedConflictRetry, bindOK(p1), "announce 10.1.0.1/32"},
		}},
		{"a failed bind is retried after FailRetry", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, Failed{Action: acq(p1), Err: errors.New("link down")}, ""},
			{sw + FailRetry - time.Millisecond, Tick{}, ""},
			{sw + FailRetry, Tick{}, "acquire 10.1.0.1/32"},
		}},
		{"leftovers of a previous run: alone during the start-up, then adopted when it may hold them, released when not", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, barred), ""},
			{0, observed(p1, p2)(p1, p2), ""},
			{time.Second, Tick{}, ""},
			{time.Second, observed(p1, p2)(p1, p2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32; release 10.1.0.2/32"},
			{sw + 50*time.Millisecond, bindOK(p1), "announce 10.1.0.1/32"},
		}},
		{"a leftover found after the start-up is released at once when this node may not hold it", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased), ""},
			{sw + time.Second, observed(p1)(p1), "release 10.1.0.1/32"},
			{sw + time.Second, leases(map[netip.Prefix]time.Duration{p1: 10 * time.Second}), "acquire 10.1.0.1/32"},
		}},
		{"a leftover found during a retry is adopted at the retry", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, Failed{Action: acq(p1), Err: errors.New("no")}, ""},
			{sw + 10*time.Millisecond, observed(p1)(p1), ""},
			{sw + FailRetry, Tick{}, "acquire 10.1.0.1/32"},
			{sw + FailRetry, answered(p1, macA), "release 10.1.0.1/32"},
		}},
		{"a leftover another host answers for is dropped, then taken after a probe", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{0, observed(p1)(p1), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw + 50*time.Millisecond, answered(p1, macB), "release 10.1.0.1/32"},
			{sw + 50*time.Millisecond + ProbeRetry, Tick{}, "acquire 10.1.0.1/32"},
			{sw + 400*time.Millisecond, bindOK(p1), "announce 10.1.0.1/32"},
		}},
		{"removed by hand while held: bound again", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, bindOK(p1), "announce 10.1.0.1/32"},
			{5 * time.Second, observed()(p1), "acquire 10.1.0.1/32"},
			{5 * time.Second, bindOK(p1), "announce 10.1.0.1/32"},
		}},
		{"bound after it stopped being desired or allowed: undone", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, poolL2), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32; acquire 10.1.0.2/32"},
			{sw, desired(p2, barred), "release 10.1.0.1/32; release 10.1.0.2/32"},
			{sw, bindOK(p1, p2), "release 10.1.0.1/32; release 10.1.0.2/32"},
		}},
		{"an address desired once and bound again later is released; one never desired is not ours", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2), ""},
			{time.Second, Desired{}, ""},
			{10 * time.Second, observed(p1, p3)(p1, p3), "release 10.1.0.1/32"},
		}},
		{"shutdown releases what is held and what is left bound", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, poolBGP, p3, poolL2), ""},
			{0, observed(p3)(p1, p3), ""},
			{time.Second, Shutdown{Reason: "stop"}, "release fd00:1::3/128"},
			{2 * time.Second, Tick{}, ""},
		}},
		{"shutdown after the start-up", []pstep{
			{0, healthy, ""},
			{0, desired(p1, poolL2, p2, poolBGP), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32; acquire 10.1.0.2/32"},
			{sw, bindOK(p1, p2), "announce 10.1.0.1/32"},
			{3 * time.Second, Shutdown{Reason: "stop"}, "release 10.1.0.1/32; release 10.1.0.2/32"},
			{4 * time.Second, healthy, ""},
		}},
		{"bgp: held while healthy, no announcements, no lease", []pstep{
			{0, healthy, ""},
			{0, desired(p2, poolBGP), ""},
			{sw, Tick{}, "acquire 10.1.0.2/32"},
			{sw, bindOK(p2), ""},
			{sw + time.Minute, Tick{}, ""},
		}},
		{"leased: holds what is leased; released at the lease end without another event", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased, p2, leased), ""},
			{0, leases(map[netip.Prefix]time.Duration{p1: sw + time.Second}), ""},
			{sw, Tick{}, "acquire 10.1.0.1/32"},
			{sw, bindOK(p1), "announce 10.1.0.1/32"},
			{sw + time.Second - time.Millisecond, Tick{}, ""},
			{sw + time.Second, Tick{}, "release 10.1.0.1/32"},
		}},
		{"leased: a renewal keeps it; a lease that is gone releases at once", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased, p2, leased), ""},
			{sw, leases(map[netip.Prefix]time.Duration{p1: sw + time.Second, p2: sw + time.Second}), "acquire 10.1.0.1/32; acquire 10.1.0.2/32"},
			{sw, bindOK(p1, p2), "announce 10.1.0.1/32; announce 10.1.0.2/32"},
			{sw + 800*time.Millisecond, leases(map[netip.Prefix]time.Duration{p1: sw + 2*time.Second}), "release 10.1.0.2/32"},
			{sw + time.Second, Tick{}, "announce 10.1.0.1/32"}, // due at +1.1 s: within Coalesce
			{sw + 2*time.Second, Tick{}, "release 10.1.0.1/32"},
		}},
		{"leased: a lease whose end has passed is not acted on; nor one for an address this node may not hold", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased, p2, Props{Leased: true, Announce: true, Pool: true, Barred: true}), ""},
			{sw, leases(map[netip.Prefix]time.Duration{p1: sw, p2: sw + time.Second}), ""},
		}},
		{"leased: an acquire under way when the lease ends is undone", []pstep{
			{0, healthy, ""},
			{0, desired(p1, leased), ""},
			{sw, leases(map[netip.Prefix]time.Duration{p1: sw + 100*time.Millisecond}), "acquire 10.1.0.1/32"},
			{sw + 100*time.Millisecond, Tick{}, "release 10.1.0.1/32"},
			{sw + 150*time.Millisecond, bindOK(p1), "release 10.1.0.1/32"},
		}},
		{"leased: a grant that arrives before the address does applies to it", []pstep{
			{0, healthy, ""},
			{sw, leases(map[netip.Prefix]time.Duration{p1: sw + time.Second}), ""},
			{sw, desired(p1, leased), "acquire 10.1.0.1/32"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newPoolCore()
			for i, st := range tc.steps {
				out := c.Step(st.ev, t0.Add(st.at))
				if got := poolActs(out); got != st.want {
					t.Fatalf("step %d (%T at %v): got [%s], want [%s]", i, st.ev, st.at, got, st.want)
				}
			}
		})
	}
}

// TestCorePoolStatus: the states the pools status shows come from the
// core's view of each address.
func TestCorePoolStatus(t *testing.T) {
	c := newPoolCore()
	c.Step(healthy, t0)
	c.Step(desired(p1, poolL2, p2, poolL2, p3, barred), t0)
	c.Step(Tick{}, t0.Add(StartupWait))
	c.Step(Batch{Events: []Event{Done{Action: acq(p1)}, answered(p2, macA)}}, t0.Add(10*time.Second))
	st := c.State()
	if !st[0].Held || st[1].Held || st[1].Conflict != macA || st[1].RetryAt.IsZero() || !st[2].Barred || st[2].Acquiring {
		t.Fatalf("state %+v", st)
	}
	if !c.Wants(p1, t0.Add(10*time.Second)) || c.Wants(p3, t0.Add(10*time.Second)) {
		t.Fatal("Wants: want p1, not p3")
	}
}

// TestCorePoolNext: the next deadline is the end of the start-up, a retry,
// the earliest announcement less the coalescing window, or a lease end.
func TestCorePoolNext(t *testing.T) {
	c := newPoolCore()
	c.Step(healthy, t0)
	if out := c.Step(desired(p1, leased, p2, poolL2), t0); !out.Next.Equal(t0.Add(StartupWait)) {
		t.Fatalf("Next %v, want the end of the start-up", out.Next.Sub(t0))
	}
	end := t0.Add(StartupWait + 300*time.Millisecond)
	c.Step(Tick{}, t0.Add(StartupWait))
	c.Step(leases(map[netip.Prefix]time.Duration{p1: end.Sub(t0)}), t0.Add(StartupWait))
	out := c.Step(Batch{Events: []Event{Done{Action: acq(p1)}, Failed{Action: acq(p2), Err: errors.New("no")}}}, t0.Add(StartupWait))
	if !out.Next.Equal(end) {
		t.Fatalf("Next %v, want the lease end %v", out.Next.Sub(t0), end.Sub(t0))
	}
	out = c.Step(Leases{Until: map[netip.Prefix]time.Time{p1: t0.Add(time.Hour)}}, t0.Add(StartupWait))
	if want := t0.Add(StartupWait + BurstSpacing - 100*time.Millisecond); !out.Next.Equal(want) {
		t.Fatalf("Next %v, want the next announcement less Coalesce %v", out.Next.Sub(t0), want.Sub(t0))
	}
	c.Step(Desired{Addresses: []Address{{VIP: p2, Props: poolL2}}}, t0.Add(StartupWait))
	out = c.Step(Tick{}, t0.Add(StartupWait))
	if want := t0.Add(StartupWait + FailRetry); !out.Next.Equal(want) {
		t.Fatalf("Next %v, want the retry %v", out.Next.Sub(t0), want.Sub(t0))
	}
}

// TestCorePoolThousand: a thousand addresses are acquired in one step,
// bound in one batch, and announced together: one wake-up per burst
// announcement, none in between.
func TestCorePoolThousand(t *testing.T) {
	c := newPoolCore()
	c.Step(healthy, t0)
	var d Desired
	for i := range 1000 {
		d.Addresses = append(d.Addresses, Address{VIP: netip.MustParsePrefix(fmt.Sprintf("10.2.%d.%d/32", i/250, i%250+1)), Props: poolL2})
	}
	c.Step(d, t0)
	out := c.Step(Tick{}, t0.Add(StartupWait))
	var b Batch
	for _, a := range out.Actions {
		if a.Kind != Acquire {
			t.Fatalf("%v", a)
		}
		// Bound a little apart, as a batch bind is: coalesced below.
		b.Events = append(b.Events, Done{Action: a})
	}
	if len(b.Events) != 1000 {
		t.Fatalf("acquire %d in one step, want 1000", len(b.Events))
	}
	out = c.Step(b, t0.Add(StartupWait+20*time.Millisecond))
	if n := len(out.Actions); n != 1000 {
		t.Fatalf("announce %d, want 1000", n)
	}
	steps, total := 0, 0
	for !out.Next.After(t0.Add(StartupWait + RefreshEvery + 5*time.Second)) {
		now := out.Next
		out = c.Step(Tick{}, now)
		if len(out.Actions) > 0 {
			steps++
		}
		total += len(out.Actions)
		if len(out.Actions) != 0 && len(out.Actions) != 1000 {
			t.Fatalf("at %v: %d announcements in a step: not batched", now.Sub(t0), len(out.Actions))
		}
	}
	if total != 1000*BurstCount || steps != BurstCount {
		t.Fatalf("%d announcements in %d wake-ups after the first, want %d in %d", total, steps, 1000*BurstCount, BurstCount)
	}
}

// TestCorePoolLeasedConflictBackOff: a leased pool address whose probe
// keeps being answered is probed ElectedConflictTries times quickly, then
// every ConflictRetry (a host that keeps the address is not probed ten
// times a second for ever).
func TestCorePoolLeasedConflictBackOff(t *testing.T) {
	c := newPoolCore()
	c.Step(healthy, t0)
	c.Step(desired(p1, leased), t0)
	now := t0.Add(10 * time.Second)
	out := c.Step(leases(map[netip.Prefix]time.Duration{p1: time.Hour}), now)
	for i := 0; i <= ElectedConflictTries; i++ {
		if poolActs(out) != "acquire 10.1.0.1/32" {
			t.Fatalf("try %d: %q, want an acquire", i, poolActs(out))
		}
		out = c.Step(answered(p1, macA), now)
		want := ElectedConflictRetry
		if i == ElectedConflictTries {
			want = ConflictRetry
		}
		if got := out.Next.Sub(now); got != want {
			t.Fatalf("try %d: next probe after %v, want %v", i, got, want)
		}
		now = out.Next
		out = c.Step(Tick{}, now)
	}
}

// TestCorePoolLeaseHandover: a new lease granted in a planned transfer's
// overlap (Leases.Handover) is acquired without the conflict probe
// (Action.Handover): the old holder answers until the successor's bind
// lets it go. An ordinary grant, a renewal or a grant after the overlap's
// lease was lost is probed.
func TestCorePoolLeaseHandover(t *testing.T) {
	at := t0.Add(StartupWait)
	grant := func(handover bool) Leases {
		l := Leases{Until: map[netip.Prefix]time.Time{p1: at.Add(time.Hour)}}
		if handover {
			l.Handover = map[netip.Prefix]bool{p1: true}
		}
		return l
	}
	for _, tc := range []struct {
		name   string
		before []Event // stepped (and every acquire done) before the grant
		ev     Event
		want   []bool // Handover of each Acquire of p1 in the grant's step
	}{
		{"planned transfer", nil, grant(true), []bool{true}},
		{"ordinary grant", nil, grant(false), []bool{false}},
		{"a renewal of a held lease acquires nothing", []Event{grant(false)}, grant(true), nil},
		{"lost, then granted again in no overlap", []Event{grant(true), Leases{}}, grant(false), []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPoolCore()
			c.Step(healthy, t0)
			c.Step(desired(p1, leased), t0)
			c.Step(Tick{}, at)
			for _, ev := range tc.before {
				stepDone(c, ev, at)
			}
			var got []bool
			for _, a := range c.Step(tc.ev, at).Actions {
				if a.Kind == Acquire && a.VIP == p1 {
					got = append(got, a.Handover)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("acquires of p1 with Handover %v, want %v", got, tc.want)
			}
		})
	}
}
