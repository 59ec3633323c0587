package conflict

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func verdicts(vs []Verdict) string {
	var out []string
	for _, v := range vs {
		who := "peer"
		if v.Self {
			who = "self"
		}
		state := "ok"
		if v.Unreachable {
			state = "unreachable"
		}
		out = append(out, fmt.Sprintf("%s %s %s@%s", who, state, v.Addr, v.Holder))
	}
	return strings.Join(out, ", ")
}

type vstep struct {
	at       time.Duration
	ev       Event
	probe    []netip.Addr
	read     []netip.Addr
	verdicts string
}

func TestVerifier(t *testing.T) {
	s := time.Second
	ans := func(as ...netip.Addr) Probed {
		m := map[netip.Addr]bool{}
		for _, a := range as {
			m[a] = true
		}
		return Probed{Addrs: []netip.Addr{vip, vip6}, Answered: m}
	}
	cases := []struct {
		name  string
		steps []vstep
	}{
		{"nothing to verify without a holder", []vstep{
			{ev: Tick{}},
			{ev: Holder{Addr: vip, Name: ""}},
			{at: 5 * s, ev: Tick{}},
		}},
		{"another node's address: a round a second; two misses in a row make it unreachable, one answer reachable again", []vstep{
			{ev: Holder{Addr: vip, Name: "n2"}, probe: []netip.Addr{vip}},
			{at: 300 * time.Millisecond, ev: Probed{Addrs: []netip.Addr{vip}}},
			{at: 900 * time.Millisecond, ev: Tick{}},
			{at: s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: 1300 * time.Millisecond, ev: Probed{Addrs: []netip.Addr{vip}}, verdicts: "peer unreachable 10.0.0.100@n2"},
			{at: 2 * s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: 2100 * time.Millisecond, ev: Probed{Addrs: []netip.Addr{vip}, Answered: map[netip.Addr]bool{vip: true}}, verdicts: "peer ok 10.0.0.100@n2"},
		}},
		{"a miss between answers is not a verdict", []vstep{
			{ev: Holder{Addr: vip, Name: "n2"}, probe: []netip.Addr{vip}},
			{ev: Probed{Addrs: []netip.Addr{vip}}},
			{at: s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: s, ev: Probed{Addrs: []netip.Addr{vip}, Answered: map[netip.Addr]bool{vip: true}}},
			{at: 2 * s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: 2 * s, ev: Probed{Addrs: []netip.Addr{vip}}},
		}},
		{"rounds that could not be sent (this node's interface down) say nothing about the holder", []vstep{
			{ev: Holder{Addr: vip, Name: "n2"}, probe: []netip.Addr{vip}},
			{ev: Probed{}},
			{at: s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: s, ev: Probed{}},
			{at: 2 * s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: 2 * s, ev: Probed{}},
		}},
		{"a new holder withdraws the verdict on the previous one", []vstep{
			{ev: Holder{Addr: vip, Name: "n1"}, probe: []netip.Addr{vip}},
			{ev: Probed{Addrs: []netip.Addr{vip}}},
			{at: s, ev: Tick{}, probe: []netip.Addr{vip}},
			{at: s, ev: Probed{Addrs: []netip.Addr{vip}}, verdicts: "peer unreachable 10.0.0.100@n1"},
			{at: 1500 * time.Millisecond, ev: Holder{Addr: vip, Name: "n2"}, verdicts: "peer ok 10.0.0.100@n2"},
		}},
		{"both families in one round", []vstep{
			{ev: Holder{Addr: vip, Name: "n2"}, probe: []netip.Addr{vip}},
			{ev: Holder{Addr: vip6, Name: "n3"}},
			{ev: ans()},
			{at: s, ev: Tick{}, probe: []netip.Addr{vip, vip6}},
			{at: s, ev: ans(vip), verdicts: "peer unreachable fd00::100@n3"},
		}},
		{"the holder: most others cannot reach it, after the settle time: give it up", []vstep{
			{ev: Holder{Addr: vip, Name: "n1", Self: true}, read: []netip.Addr{vip}},
			// Reports about the previous holder right after taking over.
			{at: 100 * time.Millisecond, ev: Reports{Addr: vip, Reporters: []string{"n2", "n3"}, Others: 2}},
			{at: ReportsEvery, ev: Tick{}, read: []netip.Addr{vip}},
			{at: 3 * s, ev: Reports{Addr: vip, Reporters: []string{"n2"}, Others: 2}, read: []netip.Addr{vip}},
			{at: 3100 * time.Millisecond, ev: Reports{Addr: vip, Reporters: []string{"n2", "n3"}, Others: 2}, verdicts: "self unreachable 10.0.0.100@n1"},
			{at: 3150 * time.Millisecond, ev: Reports{Addr: vip, Reporters: []string{"n2", "n3"}, Others: 2}},
			{at: 4 * s, ev: Reports{Addr: vip, Others: 2}, read: []netip.Addr{vip}, verdicts: "self ok 10.0.0.100@n1"},
		}},
		{"the holder alone (no others) is never unverified", []vstep{
			{ev: Holder{Addr: vip, Name: "n1", Self: true}, read: []netip.Addr{vip}},
			{at: 5 * s, ev: Reports{Addr: vip, Others: 0}, read: []netip.Addr{vip}},
		}},
	}
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVerifier(0)
			for i, s := range tc.steps {
				out := v.Step(s.ev, t0.Add(s.at))
				if !slices.Equal(out.Probe, s.probe) {
					t.Fatalf("step %d (%T): probe %v, want %v", i, s.ev, out.Probe, s.probe)
				}
				if !slices.Equal(out.ReadReports, s.read) {
					t.Fatalf("step %d (%T): read reports %v, want %v", i, s.ev, out.ReadReports, s.read)
				}
				if got := verdicts(out.Verdicts); got != s.verdicts {
					t.Fatalf("step %d (%T): verdicts %q, want %q", i, s.ev, got, s.verdicts)
				}
			}
		})
	}
}

// 1,000 addresses held by others cost at most VerifyMaxRound probes a
// round, and every one is verified in turn.
func TestVerifierRoundsTakeTurns(t *testing.T) {
	v := NewVerifier(0)
	t0 := time.Unix(0, 0)
	base := netip.MustParseAddr("10.1.0.0").As4()
	for i := range 1000 {
		b := base
		b[2], b[3] = byte(i>>8), byte(i)
		if out := v.Step(Holder{Addr: netip.AddrFrom4(b), Name: "n2"}, t0); len(out.Probe) > 0 {
			v.Step(Probed{Addrs: out.Probe}, t0) // the first round, with the first address
		}
	}
	seen := map[netip.Addr]bool{}
	var most int
	for r := range 20 {
		now := t0.Add(time.Duration(r+1) * VerifyEvery)
		out := v.Step(Tick{}, now)
		most = max(most, len(out.Probe))
		for _, a := range out.Probe {
			seen[a] = true
		}
		v.Step(Probed{Addrs: out.Probe, Answered: map[netip.Addr]bool{}}, now)
	}
	if most > VerifyMaxRound {
		t.Fatalf("a round probed %d addresses, want at most %d", most, VerifyMaxRound)
	}
	if len(seen) != 1000 {
		t.Fatalf("%d of 1000 addresses verified in 20 rounds", len(seen))
	}
}

// Next: a verifier wakes for a round only when it has something to probe
// (an address another node holds), and for the reports only while this
// node holds one.
func TestVerifierNext(t *testing.T) {
	t0 := time.Unix(1_000_000, 0).Truncate(7 * time.Second) // on the grids of the reads and the rounds
	for _, tc := range []struct {
		name    string
		holders []Holder
		next    time.Duration // from t0; -1: none
	}{
		{"nothing held", nil, -1},
		{"nobody holds it", []Holder{{Addr: vip, Name: ""}}, -1},
		{"this node holds every address: the reports only", []Holder{{Addr: vip, Name: "n1", Self: true}}, ReportsEvery},
		{"another node holds it: the next round", []Holder{{Addr: vip, Name: "n2"}}, VerifyEvery},
		{"both: the earlier", []Holder{{Addr: vip, Name: "n1", Self: true}, {Addr: vip6, Name: "n2"}}, ReportsEvery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVerifier(0)
			var probed []netip.Addr
			for _, h := range tc.holders {
				probed = append(probed, v.Step(h, t0).Probe...)
			}
			out := v.Step(Tick{}, t0)
			probed = append(probed, out.Probe...)
			if len(probed) > 0 {
				out = v.Step(Probed{Addrs: probed}, t0)
			}
			switch {
			case tc.next < 0 && !out.Next.IsZero():
				t.Fatalf("next %v, want none", out.Next.Sub(t0))
			case tc.next >= 0 && !out.Next.Equal(t0.Add(tc.next)):
				t.Fatalf("next %v, want %v", out.Next.Sub(t0), tc.next)
			}
		})
	}
}

// Rounds and report reads fall on the wall clock's multiples of their
// intervals (the instants of the health probes and the lease renewals),
// however late a step came.
func TestVerifierOnTheGrid(t *testing.T) {
	// t0 on both grids (the reads' and the rounds')
	t0 := time.Unix(1_000_000, 0).Truncate(7 * time.Second)
	if t0.Truncate(ReportsEvery) != t0 || t0.Truncate(VerifyEvery) != t0 {
		t.Fatalf("setup: %v is not on the grids of %v and %v", t0, ReportsEvery, VerifyEvery)
	}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	v := NewVerifier(0)
	v.Step(Holder{Addr: vip, Name: "n1", Self: true}, at(123))
	if out := v.Step(Tick{}, at(130)); !out.Next.Equal(t0.Add(ReportsEvery)) {
		t.Fatalf("reports: next %v, want %v", out.Next.Sub(t0), ReportsEvery)
	}
	out := v.Step(Holder{Addr: vip6, Name: "n2"}, at(517))
	out = v.Step(Probed{Addrs: out.Probe}, at(560))
	if !out.Next.Equal(t0.Add(ReportsEvery)) {
		t.Fatalf("next %v, want the reports at %v", out.Next.Sub(t0), ReportsEvery)
	}
	out = v.Step(Tick{}, t0.Add(VerifyEvery+time.Millisecond))
	if len(out.Probe) == 0 {
		t.Fatalf("the round due at %v was not taken at %v", VerifyEvery, VerifyEvery+time.Millisecond)
	}
	if want := gridAfter(t0.Add(VerifyEvery), ReportsEvery); !out.Next.Equal(want) {
		t.Fatalf("next %v, want the reports at %v", out.Next.Sub(t0), want.Sub(t0))
	}
}
