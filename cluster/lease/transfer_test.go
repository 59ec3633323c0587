package lease

import (
	"slices"
	"testing"
	"time"
)

// ovWatch checks, after every millisecond of a tnet run, the invariant of
// planned transfers: two holders of a key only when both Outputs declare
// the overlap with each other, the old holder's window no longer than
// Overlap; it measures overlaps and gaps, and reports new holds to the
// machines (Held) when autoHeld, as the runtime does after a bind.
type ovWatch struct {
	t        *testing.T
	n        *tnet
	autoHeld bool
	prev     map[string]map[string]bool // node -> keys held at the last check
	ovStart  map[string]time.Time
	maxOv    map[string]time.Duration
	gapStart map[string]time.Time
	maxGap   map[string]time.Duration
	heldOnce map[string]bool
	pairs    map[string]bool // "key:old>successor" of every overlap seen
}

func watch(t *testing.T, n *tnet, autoHeld bool) *ovWatch {
	w := &ovWatch{t: t, n: n, autoHeld: autoHeld, prev: map[string]map[string]bool{},
		ovStart: map[string]time.Time{}, maxOv: map[string]time.Duration{},
		gapStart: map[string]time.Time{}, maxGap: map[string]time.Duration{}, heldOnce: map[string]bool{}, pairs: map[string]bool{}}
	n.after = w.check
	return w
}

func (w *ovWatch) check() {
	n := w.n
	o := ProfileConfig("default").Overlap
	for _, key := range []string{"vip", "p1", "p2"} {
		hs := n.holders(key)
		switch {
		case len(hs) > 2:
			w.t.Fatalf("at %v: %s held by %v", n.now, key, hs)
		case len(hs) == 2:
			a, b := n.nodes[hs[0]], n.nodes[hs[1]]
			da, oka := a.ovs[key]
			db, okb := b.ovs[key]
			if !oka || !okb || da.With != hs[1] || db.With != hs[0] || da.Old == db.Old {
				w.t.Fatalf("at %v: %s held by %v without an overlap both declared (%+v, %+v)", n.now, key, hs, da, db)
			}
			if _, ok := w.ovStart[key]; !ok {
				w.ovStart[key] = n.now
			}
			if da.Old {
				w.pairs[key+":"+hs[0]+">"+hs[1]] = true
			} else {
				w.pairs[key+":"+hs[1]+">"+hs[0]] = true
			}
			if d := n.now.Sub(w.ovStart[key]); d > o {
				w.t.Fatalf("at %v: %s overlap of %v exceeds the bound %v", n.now, key, d, o)
			}
			w.maxOv[key] = max(w.maxOv[key], n.now.Sub(w.ovStart[key])+time.Millisecond)
		default:
			delete(w.ovStart, key)
		}
		if len(hs) == 0 && w.heldOnce[key] {
			if _, ok := w.gapStart[key]; !ok {
				w.gapStart[key] = n.now
			}
			w.maxGap[key] = max(w.maxGap[key], n.now.Sub(w.gapStart[key])+time.Millisecond)
		} else {
			delete(w.gapStart, key)
		}
		if len(hs) > 0 {
			w.heldOnce[key] = true
		}
	}
	for _, name := range n.order {
		tn := n.nodes[name]
		cur := map[string]bool{}
		var fresh []string
		for k, end := range tn.holds {
			if end.After(n.now) && tn.up {
				cur[k] = true
				if !w.prev[name][k] {
					fresh = append(fresh, k)
				}
			}
		}
		w.prev[name] = cur
		if w.autoHeld && len(fresh) > 0 {
			n.step(name, Held{Keys: fresh})
		}
	}
}

func TestPlannedTransferMakeBeforeBreak(t *testing.T) {
	o := ProfileConfig("default").Overlap
	type result struct {
		maxOv, maxGap time.Duration
		holder        string
		old           string
	}
	cases := []struct {
		name     string
		autoHeld bool
		drop     func(old string) func(p pkt) bool
		during   func(n *tnet, old string) // right after the handover was asked
		check    func(t *testing.T, r result)
	}{
		{
			name: "successor confirms: overlap of a round trip, no gap, leadership follows", autoHeld: true,
			check: func(t *testing.T, r result) {
				if r.maxOv == 0 || r.maxOv > 20*time.Millisecond {
					t.Errorf("overlap %v, want a few ms (the successor confirmed)", r.maxOv)
				}
				if r.maxGap > 0 {
					t.Errorf("gap %v, want none", r.maxGap)
				}
			},
		},
		{
			name: "no confirmation (bind failed): the old holder lets go at the bound",
			check: func(t *testing.T, r result) {
				if r.maxOv < o-5*time.Millisecond || r.maxOv > o {
					t.Errorf("overlap %v, want the bound %v", r.maxOv, o)
				}
				if r.maxGap > 0 {
					t.Errorf("gap %v, want none", r.maxGap)
				}
			},
		},
		{
			name: "confirmation lost: the old holder lets go at the bound", autoHeld: true,
			drop: func(string) func(p pkt) bool {
				return func(p pkt) bool { e, err := decode(p.data); return err == nil && len(e.h.OvDone) > 0 }
			},
			check: func(t *testing.T, r result) {
				if r.maxOv < o-5*time.Millisecond || r.maxOv > o {
					t.Errorf("overlap %v, want the bound %v", r.maxOv, o)
				}
			},
		},
		{
			name: "old holder (leader) dies in the overlap: the successor keeps its grant, no two holders later", autoHeld: false,
			during: func(n *tnet, old string) {
				n.run(20 * time.Millisecond)
				n.nodes[old].up = false
			},
			check: func(t *testing.T, r result) {
				if r.holder == "" || r.holder == r.old {
					t.Errorf("holder %q after the old leader died", r.holder)
				}
			},
		},
		{
			name: "successor dies in the overlap: the old holder lets go at the bound, then the address is placed again",
			during: func(n *tnet, old string) {
				n.run(20 * time.Millisecond)
				for _, name := range n.order {
					if name != old && slices.Contains(n.holders("vip"), name) {
						n.nodes[name].up = false
					}
				}
			},
			check: func(t *testing.T, r result) {
				if r.maxOv > o {
					t.Errorf("overlap %v beyond the bound", r.maxOv)
				}
				if r.holder == "" {
					t.Errorf("nobody holds the address after the successor died")
				}
			},
		},
		{
			name: "every message lost for a while: no overlap beyond the bound, one holder after",
			drop: func(string) func(p pkt) bool {
				lost := 0
				return func(p pkt) bool { lost++; return lost < 40 }
			},
			autoHeld: true,
			check: func(t *testing.T, r result) {
				if r.holder == "" {
					t.Errorf("nobody holds the address")
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := three(t)
			w := watch(t, n, tc.autoHeld)
			n.run(300 * time.Millisecond)
			old := n.holders("vip")
			if len(old) != 1 {
				t.Fatalf("setup: vip held by %v", old)
			}
			if tc.drop != nil {
				n.drop = tc.drop(old[0])
			}
			n.step(old[0], Transfer{})
			if tc.during != nil {
				tc.during(n, old[0])
			}
			n.run(3 * time.Second)
			n.drop = nil
			n.run(3 * time.Second)
			hs := n.holders("vip")
			r := result{maxOv: w.maxOv["vip"], maxGap: w.maxGap["vip"], old: old[0]}
			if len(hs) == 1 {
				r.holder = hs[0]
			}
			t.Logf("old %s, holder %v, overlap %v, gap %v", old[0], hs, r.maxOv, r.maxGap)
			tc.check(t, r)
		})
	}
}

// A follower that holds an address and never acknowledges the overlap
// (its acks lost while it still holds): the leader falls back to
// break-before-make and the successor holds only once the old holder
// let go.
func TestOverlapNotAgreedFallsBack(t *testing.T) {
	n := three(t)
	w := watch(t, n, true)
	n.run(300 * time.Millisecond)
	var key, holder string
	for _, k := range []string{"p1", "p2"} {
		if hs := n.holders(k); len(hs) == 1 && hs[0] != "a" {
			key, holder = k, hs[0]
		}
	}
	if key == "" {
		t.Fatalf("setup: no pool address on a follower (p1 %v, p2 %v)", n.holders("p1"), n.holders("p2"))
	}
	n.drop = func(p pkt) bool {
		e, err := decode(p.data)
		return p.from == holder && err == nil && e.h.Ack != nil && len(e.h.Ack.OvHeld) > 0
	}
	n.step(holder, Leave{})
	n.run(3 * time.Second)
	if w.maxOv[key] != 0 {
		t.Errorf("%s overlapped %v although the old holder's agreement never arrived", key, w.maxOv[key])
	}
	hs := n.holders(key)
	if len(hs) != 1 || hs[0] == holder {
		t.Errorf("%s held by %v after %s left", key, hs, holder)
	}
	t.Logf("%s from %s to %v: break-before-make gap %v", key, holder, hs, w.maxGap[key])
}

// A follower's planned move with the agreement: the overlap is declared
// on both sides and ends at the confirmation.
func TestFollowerLeaveMakeBeforeBreak(t *testing.T) {
	n := three(t)
	w := watch(t, n, true)
	n.run(300 * time.Millisecond)
	var key, holder string
	for _, k := range []string{"p1", "p2"} {
		if hs := n.holders(k); len(hs) == 1 && hs[0] != "a" {
			key, holder = k, hs[0]
		}
	}
	if key == "" {
		t.Fatalf("setup: no pool address on a follower")
	}
	n.step(holder, Leave{})
	n.run(3 * time.Second)
	if w.maxOv[key] == 0 || w.maxOv[key] > 20*time.Millisecond {
		t.Errorf("%s overlap %v, want a few ms", key, w.maxOv[key])
	}
	if w.maxGap[key] != 0 {
		t.Errorf("%s gap %v, want none", key, w.maxGap[key])
	}
}

// Live successor (issue 28, Found 3): a handover goes only to a member
// that answered within a heartbeat and a half, else the next one, else
// nowhere.
func TestHandoverOnlyToLiveSuccessor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		silent []string // their messages are lost from the handover on (but they are still "alive")
		to     string
	}{
		{"best is silent: the next one", nil, ""},
		{"every other node silent: nothing handed over", []string{"*"}, ""},
		{"asked for a silent node: nothing handed over", nil, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := three(t)
			watch(t, n, true)
			n.run(300 * time.Millisecond)
			old := n.holders("vip")[0]
			others := []string{}
			for _, name := range n.order {
				if name != old {
					others = append(others, name)
				}
			}
			// the node the leader would pick first
			best := n.nodes[old].m.bestFresh(others, "control-plane")
			silent := map[string]bool{best: true}
			if len(tc.silent) > 0 {
				for _, o := range others {
					silent[o] = true
				}
			}
			to := ""
			if tc.to != "" {
				to = best
			}
			// the silence starts right after a renewal round the others
			// answered, and lasts past the freshness window (a heartbeat
			// and a half) but not the lease
			om := n.nodes[old].m
			n.run(om.nextBeat().Sub(n.now) + 5*time.Millisecond)
			n.drop = func(p pkt) bool { return silent[p.from] }
			n.run(om.freshWindow() + om.cfg.Tick)
			n.step(old, Transfer{To: to})
			n.run(100 * time.Millisecond)
			hs := n.holders("vip")
			switch {
			case tc.to != "" || len(tc.silent) > 0:
				if len(hs) != 1 || hs[0] != old {
					t.Errorf("vip held by %v, want it kept on %s (no live successor)", hs, old)
				}
			default:
				if len(hs) != 1 || hs[0] == old || hs[0] == best {
					t.Errorf("vip held by %v, want the live one of %v other than the silent %s", hs, others, best)
				}
			}
		})
	}
}

// A node that just took an address in a planned transfer (its record of
// that overlap still runs) and is stopped at once hands it on
// make-before-break too: the lab's SIGTERM right after a vipd handover
// released at once (the successor's record blocked a new overlap).
func TestSuccessorStoppedRightAfterTakingOver(t *testing.T) {
	n := three(t)
	w := watch(t, n, true)
	n.run(300 * time.Millisecond)
	old := n.holders("vip")[0]
	n.step(old, Transfer{})
	var succ string
	for i := 0; i < 200 && succ == ""; i++ {
		n.run(time.Millisecond)
		if hs := n.holders("vip"); len(hs) == 1 && hs[0] != old {
			succ = hs[0]
		}
	}
	if succ == "" {
		t.Fatalf("no successor took the vip: %v", n.holders("vip"))
	}
	n.run(100 * time.Millisecond) // well inside its overlap record (O)
	n.step(succ, Leave{})
	n.run(2 * time.Second)
	hs := n.holders("vip")
	if len(hs) != 1 || hs[0] == succ {
		t.Fatalf("vip held by %v after %s left", hs, succ)
	}
	if w.maxGap["vip"] != 0 {
		t.Errorf("gap %v when %s left right after taking over, want none", w.maxGap["vip"], succ)
	}
	if !w.pairs["vip:"+succ+">"+hs[0]] {
		t.Errorf("no make-before-break overlap from %s to %s (overlaps seen: %v)", succ, hs[0], w.pairs)
	}
	t.Logf("%s -> %s -> %v: longest overlap %v", old, succ, hs, w.maxOv["vip"])
}

// The same when the successor is stopped the moment it became leader by
// the transfer, before its first renewal round: it holds on the grant it
// carried over, and hands that on make-before-break too.
func TestTransfereeStoppedBeforeItsFirstRound(t *testing.T) {
	n := three(t)
	w := watch(t, n, true)
	n.run(300 * time.Millisecond)
	old := n.holders("vip")[0]
	n.step(old, Transfer{})
	succ := ""
	var carried bool
	for i := 0; i < 10000 && succ == ""; i++ {
		n.now = n.now.Add(100 * time.Microsecond)
		for _, name := range n.order {
			n.step(name, Tick{})
		}
		// deliver one message at a time: stop at the first Output of the
		// new leader that holds on its carried grant
		for len(n.q) > 0 && succ == "" {
			p := n.q[0]
			n.q = n.q[1:]
			if tn := n.nodes[p.to]; tn != nil && tn.up {
				n.step(p.to, Receive{From: p.from, Data: p.data})
			}
			for _, name := range n.order {
				m := n.nodes[name].m
				if name != old && m.lead != nil && !m.leaseValid() && !m.carry["vip"].IsZero() {
					succ, carried = name, true
				}
			}
		}
		w.check()
	}
	if !carried {
		t.Fatalf("no transferee caught before its first renewal round")
	}
	n.step(succ, Leave{})
	n.run(2 * time.Second)
	hs := n.holders("vip")
	if len(hs) != 1 || hs[0] == succ {
		t.Fatalf("vip held by %v after %s left", hs, succ)
	}
	if !w.pairs["vip:"+succ+">"+hs[0]] {
		t.Errorf("no make-before-break overlap from %s to %s (overlaps seen: %v)", succ, hs[0], w.pairs)
	}
}
