package pools

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func members(names ...string) View {
	var v View
	for _, n := range names {
		v.Members = append(v.Members, Member{Name: n, Eligible: true, Pools: true})
	}
	return v
}

func l2(addr string, nodes ...string) Address {
	a := Address{Addr: netip.MustParseAddr(addr), Pool: "p", Mode: ModeL2, Nodes: nodes}
	if len(nodes) == 0 {
		a.All = true
	}
	return a
}

func addrs(ts []Target) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Addr.String())
	}
	return out
}

// firstAddrWonBy returns an address in 10.0.0.0/24 that node wins among names.
func firstAddrWonBy(t *testing.T, node string, names ...string) string {
	t.Helper()
	for i := 1; i < 255; i++ {
		a := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
		if Winner(a, names) == node {
			return a.String()
		}
	}
	t.Fatalf("no address won by %s", node)
	return ""
}

func TestWinnerIsDeterministicAndIndependentOfOrder(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.7")
	w := Winner(a, []string{"a", "b", "c"})
	for _, order := range [][]string{{"c", "b", "a"}, {"b", "a", "c"}} {
		if got := Winner(a, order); got != w {
			t.Fatalf("winner depends on order: %s vs %s", got, w)
		}
	}
	if Winner(a, nil) != "" {
		t.Fatal("winner among nobody")
	}
}

// TestMachine walks one node through the rules with a fake clock.
func TestMachine(t *testing.T) {
	type step struct {
		at      time.Duration
		ev      Event
		acquire []string
		release []string
		announc []string
		confl   []string
	}
	won := firstAddrWonBy(t, "a", "a", "b", "c")
	lost := firstAddrWonBy(t, "b", "a", "b", "c")
	ok := func(a string) Event { return Acquired{Results: []Result{{Addr: netip.MustParseAddr(a)}}} }
	cases := []struct {
		name  string
		steps []step
	}{
		{"waits for the view to settle, then takes what it wins, not what it loses", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won), l2(lost)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait + 10*time.Millisecond, ev: ok(won), announc: []string{won}},
			{at: StartupWait + BurstSpacing, ev: Tick{}, announc: []string{won}},
		}},
		{"an address removed from the pool is withdrawn at once", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait, ev: ok(won), announc: []string{won}},
			{at: 3 * time.Second, ev: Desired{}, release: []string{won}},
		}},
		{"not eligible: releases everything", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait, ev: ok(won), announc: []string{won}},
			{at: 3 * time.Second, ev: View{Members: []Member{{Name: "a", Pools: true}}}, release: []string{won}},
			{at: 4 * time.Second, ev: Tick{}}, // released once, not on every step
		}},
		{"node selector excludes this node: the next one holds", []step{
			{at: 0, ev: members("a", "b")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won, "b")}}},
			{at: StartupWait, ev: Tick{}},
		}},
		{"a suspect previous holder is waited for until it is gone", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: StartupWait, ev: Tick{}},
			{at: 3 * time.Second, ev: View{Members: []Member{{Name: "a", Eligible: true, Pools: true}, {Name: "b", Suspect: true, Eligible: true, Pools: true}, {Name: "c", Eligible: true, Pools: true}}}},
			{at: 5 * time.Second, ev: Tick{}},
			// b dead: whoever of a, c wins now takes it; a only if it wins.
			{at: 6 * time.Second, ev: members("a", "c"), acquire: ifWins(netip.MustParseAddr(lost), "a", "a", "c")},
		}},
		{"the eligible nodes change to favour this node: it probes until the old holder released", []step{
			{at: 0, ev: members("a", "b")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won, "b")}}},
			{at: StartupWait, ev: Tick{}},
			{at: 10 * time.Second, ev: Desired{Addresses: []Address{l2(won, "a", "b")}}, acquire: []string{won}},
			// The probe is answered: the old holder has not released yet.
			{at: 10*time.Second + 50*time.Millisecond, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), ConflictMAC: "02:00:00:00:00:0b"}}}},
			{at: 10*time.Second + 50*time.Millisecond + ProbeRetry, ev: Tick{}, acquire: []string{won}},
			{at: 10*time.Second + 350*time.Millisecond, ev: ok(won), announc: []string{won}},
		}},
		{"the old holder became ineligible: no wait", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: StartupWait, ev: Tick{}},
			{at: 5 * time.Second, ev: View{Members: []Member{{Name: "a", Eligible: true, Pools: true}, {Name: "b", Pools: true}, {Name: "c", Eligible: true, Pools: true}}},
				acquire: ifWins(netip.MustParseAddr(lost), "a", "a", "c")},
		}},
		{"an address another host answers for is a conflict: not bound, reported once, retried", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait + 50*time.Millisecond, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), ConflictMAC: "02:00:00:00:00:99"}}}},
			{at: StartupWait + 300*time.Millisecond, ev: Tick{}, acquire: []string{won}},
			{at: 10 * time.Second, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), ConflictMAC: "02:00:00:00:00:99"}}}, confl: []string{won}},
			{at: 12 * time.Second, ev: Tick{}},
			{at: 15 * time.Second, ev: Tick{}, acquire: []string{won}},
			{at: 15 * time.Second, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), ConflictMAC: "02:00:00:00:00:99"}}}},
			{at: 20 * time.Second, ev: Tick{}, acquire: []string{won}},
			{at: 20 * time.Second, ev: ok(won), announc: []string{won}},
		}},
		{"a member that joins later counts after JoinSettle, then takes what it wins", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{lost}},
			{at: StartupWait, ev: ok(lost), announc: []string{lost}},
			{at: 10 * time.Second, ev: members("a", "b"), announc: []string{lost}},
			{at: 10*time.Second + JoinSettle - time.Millisecond, ev: Tick{}, announc: []string{lost}},
			{at: 10*time.Second + JoinSettle, ev: Tick{}, release: []string{lost}},
		}},
		{"a failed bind is retried after FailRetry", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), Err: errors.New("link down")}}}},
			{at: StartupWait + FailRetry, ev: Tick{}, acquire: []string{won}},
		}},
		{"leftovers of a previous run: adopted when won, removed when not, after the view settled", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won), l2(lost)}}},
			{at: 0, ev: Observed{Bound: []netip.Addr{netip.MustParseAddr(won), netip.MustParseAddr(lost)}}},
			{at: time.Second, ev: Tick{}},
			{at: StartupWait, ev: Tick{}, release: []string{lost}, acquire: []string{won}},
			{at: StartupWait + 50*time.Millisecond, ev: ok(won), announc: []string{won}},
		}},
		{"a leftover another node answers for is dropped, then taken after a probe", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: 0, ev: Observed{Bound: []netip.Addr{netip.MustParseAddr(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait + 50*time.Millisecond, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won), ConflictMAC: "02:00:00:00:00:0b"}}}, release: []string{won}},
			{at: StartupWait + 50*time.Millisecond + ProbeRetry, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait + 400*time.Millisecond, ev: ok(won), announc: []string{won}},
		}},
		{"an address removed by hand while held is bound again", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait, ev: ok(won), announc: []string{won}},
			{at: 5 * time.Second, ev: Observed{}, acquire: []string{won}},
		}},
		{"bound after it stopped being wanted: undone", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won)}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won}},
			{at: StartupWait, ev: Desired{}, release: []string{won}},
			{at: StartupWait, ev: ok(won), release: []string{won}},
		}},
		{"shutdown releases every held address", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(won), {Addr: netip.MustParseAddr("10.9.0.1"), Pool: "b", Mode: ModeBGP, All: true}}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{won, "10.9.0.1"}},
			{at: StartupWait, ev: Acquired{Results: []Result{{Addr: netip.MustParseAddr(won)}, {Addr: netip.MustParseAddr("10.9.0.1")}}}, announc: []string{won}},
			{at: 3 * time.Second, ev: Shutdown{}, release: []string{won, "10.9.0.1"}},
		}},
		{"bgp: every eligible node advertises, no probe, no wait for others", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{{Addr: netip.MustParseAddr(lost), Pool: "b", Mode: ModeBGP, All: true}}}},
			{at: StartupWait, ev: Tick{}, acquire: []string{lost}},
			{at: StartupWait, ev: ok(lost)},
			{at: 5 * time.Second, ev: Desired{Addresses: []Address{{Addr: netip.MustParseAddr(lost), Pool: "b", Mode: ModeBGP, Nodes: []string{"b"}}}}, release: []string{lost}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMachine(Config{Name: "a", Probe: true}, t0)
			for i, s := range tc.steps {
				out := m.Step(s.ev, t0.Add(s.at))
				if got := addrs(out.Acquire); !slices.Equal(got, s.acquire) {
					t.Fatalf("step %d (%T at %v): acquire %v, want %v", i, s.ev, s.at, got, s.acquire)
				}
				if got := addrs(out.Release); !slices.Equal(got, s.release) {
					t.Fatalf("step %d (%T at %v): release %v, want %v", i, s.ev, s.at, got, s.release)
				}
				var ann []string
				for _, a := range out.Announce {
					ann = append(ann, a.String())
				}
				if !slices.Equal(ann, s.announc) {
					t.Fatalf("step %d (%T at %v): announce %v, want %v", i, s.ev, s.at, ann, s.announc)
				}
				var cf []string
				for _, c := range out.Conflicts {
					cf = append(cf, c.Addr.String())
				}
				if !slices.Equal(cf, s.confl) {
					t.Fatalf("step %d (%T at %v): conflicts %v, want %v", i, s.ev, s.at, cf, s.confl)
				}
				for _, a := range out.Acquire {
					if a.Probe != (a.Mode == ModeL2) {
						t.Fatalf("step %d: probe %v for a %s address", i, a.Probe, a.Mode)
					}
				}
			}
		})
	}
}

func ifWins(a netip.Addr, node string, names ...string) []string {
	if Winner(a, names) == node {
		return []string{a.String()}
	}
	return nil
}

// TestAnnouncementsAreBatched: a thousand held addresses need one timer,
// and announcements due together come out in one step.
func TestAnnouncementsAreBatched(t *testing.T) {
	m := NewMachine(Config{Name: "a"}, t0)
	var as []Address
	for i := range 1000 {
		as = append(as, Address{Addr: addrN(netip.MustParseAddr("10.1.0.0"), i), Pool: "p", Mode: ModeL2, All: true})
	}
	m.Step(members("a"), t0)
	m.Step(Desired{Addresses: as}, t0)
	out := m.Step(Tick{}, t0.Add(StartupWait))
	if len(out.Acquire) != 1000 {
		t.Fatalf("acquire %d in one step, want 1000", len(out.Acquire))
	}
	var rs []Result
	for _, a := range out.Acquire {
		rs = append(rs, Result{Addr: a.Addr})
	}
	out = m.Step(Acquired{Results: rs}, t0.Add(StartupWait+20*time.Millisecond))
	if len(out.Announce) != 1000 {
		t.Fatalf("announce %d, want 1000", len(out.Announce))
	}
	steps := 0
	total := 0
	for !out.Next.After(t0.Add(StartupWait + Refresh + 5*time.Second)) {
		now := out.Next
		out = m.Step(Tick{}, now)
		if len(out.Announce) > 0 {
			steps++
		}
		total += len(out.Announce)
		if len(out.Announce) != 0 && len(out.Announce) != 1000 {
			t.Fatalf("at %v: %d announcements in a step: not batched", now.Sub(t0), len(out.Announce))
		}
	}
	if total != 1000*Burst || steps != Burst {
		t.Fatalf("%d announcements in %d wake-ups after the first, want %d in %d", total, steps, 1000*Burst, Burst)
	}
	if c := m.Counts(); c.Held != 1000 || c.Desired != 1000 {
		t.Fatalf("counts %+v", c)
	}
}

// TestSpread: rendezvous hashing spreads addresses evenly and moves only
// the share of a node that leaves or joins.
func TestSpread(t *testing.T) {
	nodes := []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}
	const n = 10000
	count := map[string]int{}
	for i := range n {
		count[Winner(addrN(netip.MustParseAddr("10.64.0.0"), i), nodes)]++
	}
	lo, hi := n, 0
	for _, c := range count {
		lo, hi = min(lo, c), max(hi, c)
	}
	if float64(hi)/float64(lo) > 1.1 {
		t.Fatalf("spread of %d addresses over %d nodes: %v (max/min %.2f, want <= 1.1)", n, len(nodes), count, float64(hi)/float64(lo))
	}
	moved := 0
	for i := range n {
		a := addrN(netip.MustParseAddr("10.64.0.0"), i)
		before, after := Winner(a, nodes), Winner(a, nodes[:4])
		if before != after {
			if before != "worker-2" {
				t.Fatalf("%s moved from %s to %s when worker-2 left", a, before, after)
			}
			moved++
		}
	}
	if moved != count["worker-2"] {
		t.Fatalf("moved %d, want worker-2's %d", moved, count["worker-2"])
	}
}
