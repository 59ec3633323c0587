package conflict

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	vip   = netip.MustParseAddr("10.0.0.100")
	vip6  = netip.MustParseAddr("fd00::100")
	other = netip.MustParseAddr("10.0.0.101")
	macA  = net.HardwareAddr{2, 0, 0, 0, 0, 0xa}
	macB  = net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
)

// step is one event at an offset from t0 and what must come out.
type step struct {
	at      time.Duration
	ev      Event
	defend  []netip.Addr
	reports string // "start 10.0.0.100 02:00:00:00:00:0a, end ..." in order
	next    time.Duration
	never   bool // Next is zero
}

func reports(rs []Report) string {
	var out []string
	for _, r := range rs {
		k := "start"
		if r.Ended {
			k = "end"
		}
		out = append(out, fmt.Sprintf("%s %s %s", k, r.Addr, r.MAC))
	}
	return strings.Join(out, ", ")
}

func TestGuard(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		steps []step
	}{
		{"a claim for an address not bound is ignored", []step{
			{ev: Claim{Addr: vip, MAC: macA}, never: true},
			{ev: Bound{Addr: vip}, never: true},
			{at: 10 * ms, ev: Claim{Addr: other, MAC: macA}, never: true},
		}},
		{"a foreign claim is defended at once and reported with its MAC", []step{
			{ev: Bound{Addr: vip}, never: true},
			{at: 100 * ms, ev: Claim{Addr: vip, MAC: macA}, defend: []netip.Addr{vip}, reports: "start 10.0.0.100 02:00:00:00:00:0a", next: 100*ms + Quiet},
		}},
		{"claims that go on: one defence per gap, the last one at most a gap after the last claim", []step{
			{ev: Bound{Addr: vip}, never: true},
			{at: 0, ev: Claim{Addr: vip, MAC: macA}, defend: []netip.Addr{vip}, reports: "start 10.0.0.100 02:00:00:00:00:0a", next: Quiet},
			{at: 200 * ms, ev: Claim{Addr: vip, MAC: macA}, next: DefendGap},
			{at: 400 * ms, ev: Claim{Addr: vip, MAC: macA}, next: DefendGap},
			{at: DefendGap, ev: Tick{}, defend: []netip.Addr{vip}, next: 400*ms + Quiet},
			{at: DefendGap + 10*ms, ev: Tick{}, next: 400*ms + Quiet},
			{at: 400*ms + Quiet, ev: Tick{}, reports: "end 10.0.0.100 02:00:00:00:00:0a", never: true},
		}},
		{"a second foreign MAC ends the first conflict and starts another", []step{
			{ev: Bound{Addr: vip}, never: true},
			{ev: Claim{Addr: vip, MAC: macA}, defend: []netip.Addr{vip}, reports: "start 10.0.0.100 02:00:00:00:00:0a", next: Quiet},
			{at: 2 * DefendGap, ev: Claim{Addr: vip, MAC: macB}, defend: []netip.Addr{vip}, reports: "end 10.0.0.100 02:00:00:00:00:0a, start 10.0.0.100 02:00:00:00:00:0b", next: 2*DefendGap + Quiet},
		}},
		{"released during a conflict: it ends, nothing more is defended", []step{
			{ev: Bound{Addr: vip6}, never: true},
			{ev: Claim{Addr: vip6, MAC: macA}, defend: []netip.Addr{vip6}, reports: "start fd00::100 02:00:00:00:00:0a", next: Quiet},
			{at: 100 * ms, ev: Claim{Addr: vip6, MAC: macA}, next: DefendGap},
			{at: 200 * ms, ev: Unbound{Addr: vip6}, reports: "end fd00::100 02:00:00:00:00:0a", never: true},
			{at: DefendGap, ev: Tick{}, never: true},
		}},
		{"two addresses are defended independently", []step{
			{ev: Bound{Addr: vip}, never: true},
			{ev: Bound{Addr: vip6}, never: true},
			{ev: Claim{Addr: vip, MAC: macA}, defend: []netip.Addr{vip}, reports: "start 10.0.0.100 02:00:00:00:00:0a", next: Quiet},
			{at: 10 * ms, ev: Claim{Addr: vip6, MAC: macB}, defend: []netip.Addr{vip6}, reports: "start fd00::100 02:00:00:00:00:0b", next: Quiet},
		}},
	}
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := New(0, 0)
			for i, s := range tc.steps {
				out := g.Step(s.ev, t0.Add(s.at))
				if !slices.Equal(out.Defend, s.defend) {
					t.Fatalf("step %d (%T): defend %v, want %v", i, s.ev, out.Defend, s.defend)
				}
				if got := reports(out.Reports); got != s.reports {
					t.Fatalf("step %d (%T): reports %q, want %q", i, s.ev, got, s.reports)
				}
				switch {
				case s.never && !out.Next.IsZero():
					t.Fatalf("step %d (%T): next %v, want none", i, s.ev, out.Next.Sub(t0))
				case !s.never && !out.Next.Equal(t0.Add(s.next)):
					t.Fatalf("step %d (%T): next %v, want %v", i, s.ev, out.Next.Sub(t0), s.next)
				}
			}
		})
	}
}

// A host that keeps claiming is never answered more than once per gap,
// however fast it claims (bounded defence, no storm).
func TestGuardRateLimit(t *testing.T) {
	g := New(0, 0)
	t0 := time.Unix(0, 0)
	g.Step(Bound{Addr: vip}, t0)
	defences := 0
	for i := range 10_000 { // a claim every millisecond for 10 s
		now := t0.Add(time.Duration(i) * time.Millisecond)
		defences += len(g.Step(Claim{Addr: vip, MAC: macA}, now).Defend)
		defences += len(g.Step(Tick{}, now).Defend)
	}
	if defences < 10 || defences > 11 {
		t.Fatalf("%d defences in 10 s of claims, want one a second", defences)
	}
	st := g.Status()
	if len(st) != 1 || st[0].Current == nil || st[0].Current.Claims != 10_000 || st[0].Current.Defended != defences {
		t.Fatalf("status %+v", st)
	}
}

func TestGuardStatusKeepsRecent(t *testing.T) {
	g := New(0, time.Second)
	t0 := time.Unix(0, 0)
	g.Step(Bound{Addr: vip}, t0)
	for i := range keepEnded + 3 {
		at := t0.Add(time.Duration(i) * 10 * time.Second)
		g.Step(Claim{Addr: vip, MAC: macA}, at)
		g.Step(Tick{}, at.Add(2*time.Second))
	}
	st := g.Status()
	if len(st) != 1 || st[0].Current != nil || len(st[0].Recent) != keepEnded {
		t.Fatalf("status %+v, want %d recent conflicts and none current", st, keepEnded)
	}
}

// TestGuardOverlap: during an agreed overlap (make-before-break) the other
// holder's claims are no conflict and are not defended; a MAC that is not
// the agreed one still is, and once the overlap ends the agreed MAC is a
// conflict again.
func TestGuardOverlap(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.100")
	agreed, _ := net.ParseMAC("02:00:00:00:00:02")
	other, _ := net.ParseMAC("02:00:00:00:00:03")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		macs     []string
		mac      net.HardwareAddr
		at       time.Duration
		conflict bool
	}{
		{"agreed MAC during the overlap", []string{agreed.String()}, agreed, time.Second, false},
		{"any MAC when none is named", nil, other, time.Second, false},
		{"another MAC during the overlap", []string{agreed.String()}, other, time.Second, true},
		{"agreed MAC after the overlap", []string{agreed.String()}, agreed, 3 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(0, 0)
			g.Step(Bound{Addr: a}, t0)
			g.Step(Overlap{Addr: a, MACs: tc.macs, Until: t0.Add(2 * time.Second)}, t0)
			out := g.Step(Claim{Addr: a, MAC: tc.mac}, t0.Add(tc.at))
			if got := len(out.Reports) > 0 && len(out.Defend) > 0; got != tc.conflict {
				t.Fatalf("conflict %v (reports %v, defend %v), want %v", got, out.Reports, out.Defend, tc.conflict)
			}
		})
	}
	// Agreed before this node binds the address (the new holder of a
	// make-before-break binds during the overlap).
	g0 := New(0, 0)
	g0.Step(Overlap{Addr: a, Until: t0.Add(time.Hour)}, t0)
	g0.Step(Bound{Addr: a}, t0.Add(time.Millisecond))
	if out := g0.Step(Claim{Addr: a, MAC: agreed}, t0.Add(time.Second)); len(out.Reports) != 0 {
		t.Fatalf("an overlap agreed before binding was lost: %v", out.Reports)
	}
	// Ended early by a zero Until.
	g := New(0, 0)
	g.Step(Bound{Addr: a}, t0)
	g.Step(Overlap{Addr: a, Until: t0.Add(time.Hour)}, t0)
	g.Step(Overlap{Addr: a}, t0.Add(time.Second))
	if out := g.Step(Claim{Addr: a, MAC: agreed}, t0.Add(2*time.Second)); len(out.Reports) == 0 {
		t.Fatal("a claim after the overlap was ended is no conflict")
	}
}
