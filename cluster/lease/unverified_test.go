package lease

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// runBy advances the clock by d in steps of every (coarser than run: the
// exclusions last tens of seconds), then gossips the metadata (as the
// runtime does on every change).
func (n *tnet) runBy(d, every time.Duration) {
	end := n.now.Add(d)
	for n.now.Before(end) {
		n.now = n.now.Add(every)
		for _, name := range n.order {
			n.step(name, Tick{})
		}
		n.flush()
	}
	n.view()
}

// report sets what each node reports (empty: nothing) and gossips the
// metadata.
func (n *tnet) report(rs map[string][]Report) {
	for _, name := range n.order {
		n.step(name, Unreachable{Reports: rs[name]})
	}
	n.view()
	n.run(300 * time.Millisecond)
}

func holderOf(t *testing.T, n *tnet, key string) string {
	t.Helper()
	h := n.holders(key)
	if len(h) != 1 {
		t.Fatalf("%s: holders %v", key, h)
	}
	return h[0]
}

// TestUnverifiedHolderLosesAddress: the other live nodes report that they
// cannot reach an address through its holder; with a majority of them the
// holder is not eligible for it and it moves, with fewer, or reports that
// name another holder, nothing moves.
func TestUnverifiedHolderLosesAddress(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     string
		reports func(holder string, others []string) map[string][]Report
		moves   bool
	}{
		{"majority of the others, control plane", "vip", func(h string, o []string) map[string][]Report {
			return map[string][]Report{o[0]: {{"vip", h}}, o[1]: {{"vip", h}}}
		}, true},
		{"majority of the others, pool", "p1", func(h string, o []string) map[string][]Report {
			return map[string][]Report{o[0]: {{"p1", h}}, o[1]: {{"p1", h}}}
		}, true},
		{"one of two others", "vip", func(h string, o []string) map[string][]Report {
			return map[string][]Report{o[0]: {{"vip", h}}}
		}, false},
		{"reports name another holder", "vip", func(h string, o []string) map[string][]Report {
			return map[string][]Report{o[0]: {{"vip", o[1]}}, o[1]: {{"vip", o[0]}}}
		}, false},
		{"the holder reports itself", "vip", func(h string, o []string) map[string][]Report {
			return map[string][]Report{h: {{"vip", h}}, o[0]: {{"vip", h}}}
		}, false},
		{"another address", "vip", func(h string, o []string) map[string][]Report {
			return map[string][]Report{o[0]: {{"p9", h}}, o[1]: {{"p9", h}}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := three(t)
			n.run(PoolSettle + time.Second)
			h := holderOf(t, n, tc.key)
			var others []string
			for _, name := range n.order {
				if name != h {
					others = append(others, name)
				}
			}
			n.report(tc.reports(h, others))
			n.run(3 * time.Second)
			got := holderOf(t, n, tc.key)
			if tc.moves && got == h {
				t.Fatalf("%s still holds %s after a majority reported it unverified", h, tc.key)
			}
			if !tc.moves && got != h {
				t.Fatalf("%s moved from %s to %s", tc.key, h, got)
			}
		})
	}
}

// TestUnverifiedBounded: an exclusion ends after UnverifiedFor; the next
// one of the same node for the same address lasts twice as long, up to
// UnverifiedMax: a pool address whose rendezvous winner stays filtered
// goes back to it at most once per exclusion, never flaps.
func TestUnverifiedBounded(t *testing.T) {
	n := three(t)
	n.run(PoolSettle + time.Second)
	h := holderOf(t, n, "p1")
	var others []string
	for _, name := range n.order {
		if name != h {
			others = append(others, name)
		}
	}
	bad := map[string][]Report{others[0]: {{"p1", h}}, others[1]: {{"p1", h}}}
	n.report(bad)
	n.run(2 * time.Second)
	moved := holderOf(t, n, "p1")
	if moved == h {
		t.Fatalf("p1 did not move off %s", h)
	}
	// The reporters verify the new holder: their reports about h are
	// withdrawn.
	n.report(nil)
	moves := 0
	last := moved
	start := n.now
	for n.now.Sub(start) < UnverifiedFor-5*time.Second {
		n.runBy(time.Second, 10*time.Millisecond)
		if cur := holderOf(t, n, "p1"); cur != last {
			moves++
			last = cur
		}
	}
	if moves != 0 || last != moved {
		t.Fatalf("p1 moved %d times during the exclusion (now on %s)", moves, last)
	}
	// After the exclusion p1 goes back to its rendezvous winner h, which
	// is still filtered: reported again, excluded twice as long.
	n.runBy(10*time.Second, 10*time.Millisecond)
	n.run(2 * time.Second)
	if cur := holderOf(t, n, "p1"); cur != h {
		t.Fatalf("p1 on %s after the exclusion ended, want its rendezvous winner %s", cur, h)
	}
	n.report(bad)
	n.run(2 * time.Second)
	if cur := holderOf(t, n, "p1"); cur == h {
		t.Fatalf("p1 stayed on %s when reported again", h)
	}
	n.report(nil)
	back := n.now
	for !slices.Equal(n.holders("p1"), []string{h}) && n.now.Sub(back) < 3*UnverifiedFor {
		n.runBy(time.Second, 10*time.Millisecond)
	}
	if took := n.now.Sub(back); took < 2*UnverifiedFor-5*time.Second || took > 2*UnverifiedFor+5*time.Second {
		t.Fatalf("the second exclusion lasted %v, want about %v", took, 2*UnverifiedFor)
	}
	ld := n.nodes[n.nodes[n.order[0]].m.Status().Leader]
	if ld == nil {
		t.Fatal("no leader")
	}
	if s := ld.m.unv.strikes[exclKey{"p1", h}]; s.n != 2 {
		t.Fatalf("strikes %+v, want 2", s)
	}
}

// TestUnverifiedOnlyHolder: an unverified holder keeps the address when no
// other node is eligible (one that cannot be verified beats none).
func TestUnverifiedOnlyHolder(t *testing.T) {
	n := three(t)
	n.run(PoolSettle + time.Second)
	h := holderOf(t, n, "vip")
	var others []string
	for _, name := range n.order {
		if name != h {
			others = append(others, name)
		}
	}
	for _, o := range others {
		n.step(o, Health{Healthy: false})
	}
	n.report(map[string][]Report{others[0]: {{"vip", h}}, others[1]: {{"vip", h}}})
	n.run(3 * time.Second)
	if got := holderOf(t, n, "vip"); got != h {
		t.Fatalf("vip moved from %s to %s with no other eligible node", h, got)
	}
}

// TestReportsMeta: the reports travel in the metadata, sorted, without
// duplicates or reports about this node itself, capped at MaxReports; bad
// entries from a peer are dropped.
func TestReportsMeta(t *testing.T) {
	cfg := ProfileConfig("default")
	cfg.Name = "a"
	m, err := New(cfg, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var rs []Report
	for i := 12; i > 0; i-- {
		rs = append(rs, Report{Key: "10.0.0." + string(rune('a'+i)) + "/32", Holder: "b"})
	}
	rs = append(rs, rs[0], Report{Key: "x", Holder: "a"}, Report{Key: "", Holder: "b"}, Report{Key: "y"})
	m.Step(time.Now(), Unreachable{Reports: rs})
	got, witness, ok := ReportsOf(m.metaBytes())
	if !ok || witness || len(got) != MaxReports {
		t.Fatalf("ReportsOf: %v %v %v", got, witness, ok)
	}
	if !slices.IsSortedFunc(got, func(a, b Report) int { return strings.Compare(a.Key, b.Key) }) || got[0].Key != "10.0.0.b/32" {
		t.Fatalf("not sorted: %v", got)
	}
	if len(m.metaBytes()) > 512 {
		t.Fatalf("metadata %d bytes with %d reports", len(m.metaBytes()), MaxReports)
	}
	if rs := decodeReports([]string{"unnamed", " b", "k ", "k h"}); len(rs) != 2 || rs[0] != (Report{"unnamed", ""}) || rs[1] != (Report{"k", "h"}) {
		t.Fatalf("decodeReports: %v", rs)
	}
	if _, _, ok := ReportsOf([]byte(`{"lv":1,"ur":"notalist"}`)); ok {
		t.Fatal("a bad report list parsed")
	}
	m.Step(time.Now(), Unreachable{})
	if got, _, _ := ReportsOf(m.metaBytes()); len(got) != 0 {
		t.Fatalf("reports after clearing: %v", got)
	}
}

// TestUnverifiedSurvivesLeaderChange: the control-plane addresses follow
// the leader, so the node they leave is the leader that counted the
// reports; the next leader reads the exclusion from that node's metadata:
// when the second holder is reported too, the addresses go to the third
// node, never back to the first while it is excluded.
func TestUnverifiedSurvivesLeaderChange(t *testing.T) {
	n := three(t)
	n.run(PoolSettle + time.Second)
	first := holderOf(t, n, "vip")
	others := func(h string) []string {
		var o []string
		for _, name := range n.order {
			if name != h {
				o = append(o, name)
			}
		}
		return o
	}
	o := others(first)
	n.report(map[string][]Report{o[0]: {{"vip", first}}, o[1]: {{"vip", first}}})
	n.runBy(3*time.Second, 5*time.Millisecond)
	n.run(time.Second)
	second := holderOf(t, n, "vip")
	if second == first {
		t.Fatalf("vip stayed on %s", first)
	}
	if ld := n.nodes[second].m.Status().Leader; ld != second {
		t.Fatalf("setup: leader %s, holder %s", ld, second)
	}
	if _, counted := n.nodes[second].m.unv.until[exclKey{"vip", first}]; counted {
		t.Fatalf("setup: the new leader %s counted %s's exclusion itself: the test would not show it reads the metadata", second, first)
	}
	n.report(nil)
	o = others(second)
	for _, name := range o {
		n.step(name, Unreachable{Reports: []Report{{"vip", second}}})
	}
	// Every holder on the way, the metadata gossiped every 100 ms.
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		n.view()
		for j := 0; j < 20; j++ {
			n.run(5 * time.Millisecond)
			for _, h := range n.holders("vip") {
				seen[h] = true
			}
		}
	}
	third := holderOf(t, n, "vip")
	if third == first || third == second || seen[first] {
		t.Fatalf("vip went %s -> %s -> %s (held on the way: %v): back to an excluded node", first, second, third, seen)
	}
}

// TestUnverifiedUnnamedHolder: pool and egress reports name no holder (a
// node knows only its own holds). They count against the address's
// holder once both the holding and the report have stood VerifySettle;
// a report about the previous holder that its reporter withdraws within
// that time (it verified the new holder) never counts against the new one.
func TestUnverifiedUnnamedHolder(t *testing.T) {
	n := three(t)
	n.run(PoolSettle + time.Second)
	h := holderOf(t, n, "p1")
	var others []string
	for _, name := range n.order {
		if name != h {
			others = append(others, name)
		}
	}
	bad := map[string][]Report{others[0]: {{Key: "p1"}}, others[1]: {{Key: "p1"}}}
	n.report(bad)
	n.runBy(VerifySettle/2, 5*time.Millisecond)
	if got := holderOf(t, n, "p1"); got != h {
		t.Fatalf("p1 moved to %s before the reports settled", got)
	}
	n.runBy(VerifySettle, 5*time.Millisecond)
	n.run(time.Second)
	second := holderOf(t, n, "p1")
	if second == h {
		t.Fatalf("p1 stayed on %s after settled unnamed reports", h)
	}
	// The reports stand a little longer (the reporters' next round),
	// then they are withdrawn: the new holder keeps p1.
	n.runBy(VerifySettle/3, 5*time.Millisecond)
	n.report(nil)
	n.runBy(3*VerifySettle, 5*time.Millisecond)
	n.run(time.Second)
	if got := holderOf(t, n, "p1"); got != second {
		t.Fatalf("p1 moved from %s to %s on reports about the previous holder", second, got)
	}
}

// TestUnverifiedExclusionOutlastsLeader: the excluded node publishes its
// own exclusion, so a new leader, which counted nothing, keeps it from the
// address: a pool address whose rendezvous winner is excluded does not go
// back to it when the leadership moves to a third node.
func TestUnverifiedExclusionOutlastsLeader(t *testing.T) {
	n := three(t)
	n.run(PoolSettle + time.Second)
	leader := n.nodes["a"].m.Status().Leader
	key, holder := "", ""
	for _, k := range []string{"p1", "p2"} {
		if h := holderOf(t, n, k); h != leader {
			key, holder = k, h
			break
		}
	}
	if key == "" {
		t.Fatal("setup: the leader holds every pool address (the harness is deterministic: change the keys)")
	}
	third := ""
	for _, name := range n.order {
		if name != leader && name != holder {
			third = name
		}
	}
	n.report(map[string][]Report{leader: {{Key: key}}, third: {{Key: key}}})
	n.runBy(VerifySettle+time.Second, 5*time.Millisecond)
	n.run(time.Second)
	if got := holderOf(t, n, key); got == holder {
		t.Fatalf("setup: %s stayed on %s", key, holder)
	}
	if ex := n.nodes[holder].m.exclMeta(); !slices.Contains(ex, key) {
		t.Fatalf("%s does not publish its exclusion from %s: %v", holder, key, ex)
	}
	n.report(nil)
	// The leadership goes to the third node, which counted nothing.
	n.step(leader, Transfer{To: third})
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		n.view()
		n.run(50 * time.Millisecond)
		for _, h := range n.holders(key) {
			seen[h] = true
		}
	}
	if ld := n.nodes[third].m.Status().Leader; ld != third {
		t.Fatalf("setup: leader %s, want %s", ld, third)
	}
	if _, counted := n.nodes[third].m.unv.until[exclKey{key, holder}]; counted {
		t.Fatalf("setup: the new leader counted the exclusion itself")
	}
	if seen[holder] {
		t.Fatalf("%s went back to the excluded %s after the leadership moved to %s (held by %v)", key, holder, third, seen)
	}
}

// TestUnverifiedQuiet: the pass over the reports is skipped only when
// there is nothing to find: any report (this node's, or one in a
// member's metadata, alive or not), exclusion of its own a member
// publishes, or exclusion, strike or settling report remembered keeps it.
func TestUnverifiedQuiet(t *testing.T) {
	k := exclKey{"10.0.0.1/32", "n2"}
	now := time.Unix(100, 0)
	for _, tc := range []struct {
		name  string
		u     unverifiedState
		view  map[string]meta
		quiet bool
	}{
		{"nothing", unverifiedState{}, map[string]meta{"n2": {Alive: true}}, true},
		{"empty maps", unverifiedState{until: map[exclKey]time.Time{}, strikes: map[exclKey]strike{}, heldSince: map[string]heldSince{}, seen: map[exclKey]time.Time{}}, nil, true},
		{"own report", unverifiedState{own: []Report{{Key: k.key}}}, nil, false},
		{"exclusion", unverifiedState{until: map[exclKey]time.Time{k: now}}, nil, false},
		{"strike", unverifiedState{strikes: map[exclKey]strike{k: {n: 1, last: now}}}, nil, false},
		{"settling report", unverifiedState{seen: map[exclKey]time.Time{k: now}}, nil, false},
		{"held since", unverifiedState{heldSince: map[string]heldSince{k.key: {node: "n2", since: now}}}, nil, false},
		{"a member reports", unverifiedState{}, map[string]meta{"n2": {Alive: true}, "n3": {Alive: true, Unreach: []string{k.key}}}, false},
		{"a dead member reports", unverifiedState{}, map[string]meta{"n3": {Unreach: []string{k.key}}}, false},
		{"a member is excluded", unverifiedState{}, map[string]meta{"n3": {Alive: true, Excl: []string{k.key}}}, false},
	} {
		if got := tc.u.quiet(tc.view); got != tc.quiet {
			t.Errorf("%s: quiet = %v, want %v", tc.name, got, tc.quiet)
		}
	}
}
