package egress

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestDrain(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 11, 24, 46, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name string
		in   DrainInput
		step DrainStep
		next time.Time
	}{
		{"never a gateway: nothing routes here, remove at once",
			DrainInput{Now: t0, Start: t0, Held: false, Left: false}, DrainRemove, time.Time{}},
		{"a gateway long ago: remove at once",
			DrainInput{Now: t0, Start: t0, LastGateway: t0.Add(-DrainMemory - time.Millisecond)}, DrainRemove, time.Time{}},
		// The CI failure: the hand-over at stop made the node a director
		// 200 ms before the stop began; it must drain all the same.
		{"stepped down by the hand-over at stop, not left yet: wait",
			DrainInput{Now: t0, Start: t0, LastGateway: ms(-200)}, DrainWait, ms(20)},
		{"still the gateway (held): wait",
			DrainInput{Now: ms(100), Start: t0, LastGateway: ms(100), Held: true, Left: true}, DrainWait, ms(120)},
		{"released and left: the stopping state goes in",
			DrainInput{Now: ms(400), Start: t0, LastGateway: ms(-10), Left: true}, DrainGuard, time.Time{}},
		{"guarded, quiet for less than DrainQuiet: wait",
			DrainInput{Now: ms(450), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400)}, DrainWait, ms(470)},
		{"guarded, quiet ends before the next poll: wake at its end",
			DrainInput{Now: ms(590), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400)}, DrainWait, ms(600)},
		{"guarded, quiet for DrainQuiet: remove",
			DrainInput{Now: ms(600), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400)}, DrainRemove, time.Time{}},
		{"a director's packet arrived 100 ms ago: wait",
			DrainInput{Now: ms(700), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400), LastArrival: ms(600)}, DrainWait, ms(720)},
		{"the last packet arrived DrainQuiet ago: remove",
			DrainInput{Now: ms(800), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400), LastArrival: ms(600)}, DrainRemove, time.Time{}},
		{"packets keep arriving: bounded by DrainMax",
			DrainInput{Now: ms(2000), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(400), LastArrival: ms(1990)}, DrainRemove, time.Time{}},
		{"the leave never completes: bounded by DrainMax",
			DrainInput{Now: ms(2000), Start: t0, LastGateway: ms(-10)}, DrainRemove, time.Time{}},
		{"the next look never goes past DrainMax",
			DrainInput{Now: ms(1990), Start: t0, LastGateway: ms(-10), Left: true, Guarded: ms(1900)}, DrainWait, ms(2000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, next := Drain(tt.in)
			if step != tt.step || !next.Equal(tt.next) {
				t.Fatalf("Drain = %s, %v; want %s, %v", step, next.Sub(t0), tt.step, tt.next.Sub(t0))
			}
		})
	}
}

// TestDrainTimeline runs a stop with a fake clock, as the controller
// does: the node stepped down by a hand-over before the stop, leaves the
// cluster 300 ms in, and a director's packets keep arriving until 450 ms.
// Nothing is removed while packets arrive or before the leave, and the
// stopping state goes in once, after the leave.
func TestDrainTimeline(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 11, 24, 46, 0, time.UTC)
	in := DrainInput{Start: t0, LastGateway: t0.Add(-130 * time.Millisecond)}
	now := t0
	var steps []string
	for i := 0; i < 1000; i++ {
		in.Now = now
		in.Left = !now.Before(t0.Add(300 * time.Millisecond))
		if !in.Guarded.IsZero() && now.Before(t0.Add(450*time.Millisecond)) {
			in.LastArrival = now // the counter grew since the last look
		}
		step, next := Drain(in)
		switch step {
		case DrainRemove:
			if now.Before(in.LastArrival.Add(DrainQuiet)) || in.LastArrival.Before(t0.Add(450*time.Millisecond-DrainPoll)) {
				t.Fatalf("removed at %v: the last packet was seen at %v", now.Sub(t0), in.LastArrival.Sub(t0))
			}
			if now.After(t0.Add(450*time.Millisecond + DrainQuiet + DrainPoll)) {
				t.Fatalf("removed only at %v", now.Sub(t0))
			}
			if !slices.Equal(steps, []string{"guard@300ms"}) {
				t.Fatalf("steps %v", steps)
			}
			return
		case DrainGuard:
			if !in.Left {
				t.Fatalf("guard before the leave at %v", now.Sub(t0))
			}
			steps = append(steps, "guard@"+now.Sub(t0).String())
			in.Guarded = now
			continue
		}
		if !next.After(now) {
			t.Fatalf("wait without progress at %v (next %v)", now.Sub(t0), next.Sub(t0))
		}
		now = next
	}
	t.Fatal("no end")
}

func TestPlanStopping(t *testing.T) {
	in := Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Self: true}, eip6: {Addr: netip.MustParseAddr("10.0.0.12")}}, Settings: settings()}
	st := PlanStopping(in)
	// Nothing routes or marks any more: no ip rules, no routes, no marks.
	if len(st.IPRules)+len(st.Routes) != 0 || chain(st, "mark") != nil || chain(st, "forward") != nil {
		t.Fatalf("stopping state keeps more than the guard: %+v", st)
	}
	s := chain(st, "snat")
	if s == nil || s.Type != "nat" || s.Hook != "postrouting" || s.Priority != PrioritySNAT {
		t.Fatalf("snat chain %+v", s)
	}
	want := []string{"return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return fd00:10:244::/56", "drop", "drop"}
	if got := kinds(s); !slices.Equal(got, want) {
		t.Fatalf("snat chain %q, want %q", got, want)
	}
	a := chain(st, ChainArrivals)
	if a == nil || a.Hook != "prerouting" || a.Type != "filter" {
		t.Fatalf("arrivals chain %+v", a)
	}
	last := a.Rules[len(a.Rules)-2]
	if last.Action.Kind != Count || last.Iif != 2 || last.Src != pods || last.Dst != any4 {
		t.Fatalf("arrivals rule %+v: want a count of the selected packets from the node link", last)
	}
	// Its comments differ from the running state's guards only where the
	// rules do: stopping after running replaces the table.
	if Diff(st, Plan(in).Observe()).Empty() {
		t.Fatal("stopping state equals the running one")
	}
}

// TestPlanGuard: in every role the snat chain ends with a drop of every
// selected flow, after every SNAT and masquerade bypass, so that a flow
// this node does not SNAT or send to a gateway is dropped, never left to
// the CNI's masquerade.
func TestPlanGuard(t *testing.T) {
	gw2 := netip.MustParseAddr("10.0.0.12")
	for _, gws := range []map[netip.Addr]Gateway{
		{},                                       // no gateway known
		{eip4: {Addr: gw2}, eip6: {Addr: gw2}},   // director
		{eip4: {Self: true}, eip6: {Self: true}}, // gateway
		{eip4: {Self: true}, eip6: {Addr: gw2}},  // both
	} {
		in := Input{Rules: rules(), Gateways: gws, Settings: settings()}
		for _, st := range []State{Plan(in), PlanStopping(in)} {
			s := chain(st, "snat")
			if s == nil {
				t.Fatalf("%v: no snat chain", gws)
			}
			var drops []NftRule
			for i, r := range s.Rules {
				if r.Action.Kind == Drop {
					drops = append(drops, r)
					continue
				}
				if len(drops) > 0 {
					t.Fatalf("%v: rule %d (%s) after a guard", gws, i, r.Label)
				}
			}
			for _, r := range rules() {
				for _, from := range r.From {
					for _, to := range r.To {
						if !slices.ContainsFunc(drops, func(d NftRule) bool { return d.Src == from && d.Dst == to && d.Mark == 0 }) {
							t.Errorf("%v: no guard for %s -> %s", gws, from, to)
						}
					}
				}
			}
		}
	}
	// Two egress IPs selecting the same flows: one guard.
	r := append(rules(), Rule{IP: netip.MustParseAddr("10.0.0.201"), From: []netip.Prefix{pods}, To: []netip.Prefix{any4}})
	st := Plan(Input{Rules: r, Gateways: map[netip.Addr]Gateway{}, Settings: settings()})
	n := 0
	for _, x := range chain(st, "snat").Rules {
		if x.Action.Kind == Drop && x.Family == 4 {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d IPv4 guards, want 1", n)
	}
}
