package lease

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// manyAddresses: one control-plane VIP, pools pool addresses and egress
// egress addresses.
func manyAddresses(pools, egress int) []Address {
	as := []Address{{Key: "vip", Kind: ControlPlane}}
	for i := range pools {
		as = append(as, Address{Key: fmt.Sprintf("10.0.1.%d/32", i+1), Kind: Pool})
	}
	for i := range egress {
		as = append(as, Address{Key: fmt.Sprintf("10.0.2.%d/32", i+1), Kind: Egress})
	}
	return as
}

// cluster: size voters (a bootstrapped, the others joined and promoted)
// that place want, run until the pool addresses settled over them.
func cluster(t *testing.T, size int, want []Address) *tnet {
	return clusterWith(t, size, want, nil)
}

// clusterWith is cluster with every node's config changed by edit.
func clusterWith(t *testing.T, size int, want []Address, edit func(*Config)) *tnet {
	n := newNet(t)
	n.want, n.edit = want, edit
	n.add("a", false, Voter)
	n.run(10 * time.Millisecond)
	for i := 1; i < size; i++ {
		n.add(string(rune('a'+i)), true, Voter)
	}
	for range 10 {
		n.view()
		n.run(200 * time.Millisecond)
	}
	n.run(3 * time.Second) // PoolSettle: the pool and egress addresses spread
	if st := n.nodes["a"].m.Status(); len(st.Voters) != size {
		t.Fatalf("setup: %+v", st)
	}
	return n
}

// holdTrack follows every key's holders after every millisecond of a
// run. A node that is down still holds to the end its last Output gave
// (the address stays bound on a machine that lost its process until the
// lease end: the simulator's rule too).
type holdTrack struct {
	n       *tnet
	keys    []string
	first   map[string]string        // key -> holder when tracking began
	holders map[string][]string      // key -> holders now
	moved   map[string]string        // key -> the first other node that held it
	gap     map[string]time.Duration // longest time without a holder
	gapAt   map[string]time.Time
	overlap map[string]time.Duration // longest time with two holders
	ovAt    map[string]time.Time
	lost    map[string]time.Time // key -> when its first holder stopped holding it
	dropped map[string]int       // key -> Outputs of its first holder that let it go before its end
}

func track(n *tnet) *holdTrack {
	w := &holdTrack{n: n, first: map[string]string{}, holders: map[string][]string{}, moved: map[string]string{},
		gap: map[string]time.Duration{}, gapAt: map[string]time.Time{}, overlap: map[string]time.Duration{},
		ovAt: map[string]time.Time{}, lost: map[string]time.Time{}, dropped: map[string]int{}}
	for _, a := range n.wanted() {
		w.keys = append(w.keys, a.Key)
	}
	w.sample()
	for _, k := range w.keys {
		if hs := w.holders[k]; len(hs) == 1 {
			w.first[k] = hs[0]
		}
	}
	// a release and a new grant within one delivery round shows in no
	// sample: every Output that drops a key its first holder held counts
	n.seen = func(name string, out Output) {
		for k, end := range n.nodes[name].holds {
			if _, still := out.Holds[k]; !still && w.first[k] == name && end.After(n.now) {
				w.dropped[k]++
			}
		}
	}
	prev := n.after
	n.after = func() {
		if prev != nil {
			prev()
		}
		w.check()
	}
	return w
}

func (w *holdTrack) sample() {
	n := w.n
	for _, k := range w.keys {
		var hs []string
		for _, name := range n.order {
			if end, ok := n.nodes[name].holds[k]; ok && end.After(n.now) {
				hs = append(hs, name)
			}
		}
		w.holders[k] = hs
	}
}

func (w *holdTrack) check() {
	n := w.n
	w.sample()
	for _, k := range w.keys {
		hs := w.holders[k]
		switch len(hs) {
		case 0:
			if _, ok := w.gapAt[k]; !ok {
				w.gapAt[k] = n.now
			}
			w.gap[k] = max(w.gap[k], n.now.Sub(w.gapAt[k])+time.Millisecond)
		case 1:
			delete(w.gapAt, k)
			delete(w.ovAt, k)
		default:
			delete(w.gapAt, k)
			if _, ok := w.ovAt[k]; !ok {
				w.ovAt[k] = n.now
			}
			w.overlap[k] = max(w.overlap[k], n.now.Sub(w.ovAt[k])+time.Millisecond)
		}
		held := false
		for _, h := range hs {
			held = held || h == w.first[k]
			if h != w.first[k] && w.moved[k] == "" {
				w.moved[k] = h
			}
		}
		if !held {
			if _, ok := w.lost[k]; !ok {
				w.lost[k] = n.now
			}
		}
	}
}

func leaderOf(t *testing.T, n *tnet) string {
	t.Helper()
	for _, name := range n.order {
		if tn := n.nodes[name]; tn.up && tn.m.lead != nil {
			return name
		}
	}
	t.Fatal("no leader")
	return ""
}

// TestLeaderChangeKeepsPoolHolds: whatever way the leader goes (a
// handover, a graceful stop, a crash, a partition), every address held
// by a node that stays alive, healthy and a member keeps its holder with
// no gap and no move; the addresses the old leader held move once: make-
// before-break within the overlap bound when planned, break-before-make
// after the lease when not.
func TestLeaderChangeKeepsPoolHolds(t *testing.T) {
	cfg := ProfileConfig("default")
	o := cfg.Overlap
	cases := []struct {
		name    string
		planned bool
		act     func(n *tnet, leader string)
	}{
		{"handover", true, func(n *tnet, leader string) { n.step(leader, Transfer{}) }},
		{"graceful stop", true, func(n *tnet, leader string) {
			n.step(leader, Leave{})
			n.run(2 * time.Second) // vipd stops once it holds nothing
			n.nodes[leader].up = false
		}},
		{"crash", false, func(n *tnet, leader string) { n.nodes[leader].up = false }},
		{"partition", false, func(n *tnet, leader string) {
			n.drop = func(p pkt) bool { return p.from == leader || p.to == leader }
		}},
	}
	for _, size := range []int{3, 5} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%d nodes/%s", size, tc.name), func(t *testing.T) {
				n := cluster(t, size, manyAddresses(30, 5))
				leader := leaderOf(t, n)
				w := track(n)
				perNode := map[string]int{}
				for _, k := range w.keys {
					if w.first[k] == "" {
						t.Fatalf("setup: %s held by %v", k, w.holders[k])
					}
					perNode[w.first[k]]++
				}
				t.Logf("leader %s; addresses per node %v", leader, perNode)
				tc.act(n, leader)
				n.run(5 * time.Second)
				var kept, moved []string
				var maxGap, maxOv, keyGap time.Duration
				for _, k := range w.keys {
					hs := w.holders[k]
					if len(hs) != 1 {
						t.Errorf("%s held by %v at the end", k, hs)
					}
					if w.first[k] != leader || (tc.name == "handover" && k != "vip") {
						keyGap = max(keyGap, w.gap[k])
						// Unplanned, a grant ends within the lost leader's
						// lease and the next leader grants only after its
						// own first round: a gap of the failover's length
						// is the design (docs/lease.md); the holder stays.
						if !tc.planned && w.moved[k] == "" && w.gap[k] < time.Duration(cfg.ElectionTicks)*cfg.Tick {
							kept = append(kept, k)
							continue
						}
						if w.moved[k] != "" || w.gap[k] > 0 || !w.lost[k].IsZero() || w.dropped[k] > 0 {
							t.Errorf("%s held by %s (not the leader, still up) lost at %v, moved to %q, gap %v, released %d times",
								k, w.first[k], w.lost[k].Sub(n.now), w.moved[k], w.gap[k], w.dropped[k])
						}
						kept = append(kept, k)
						continue
					}
					moved = append(moved, k)
					maxGap, maxOv = max(maxGap, w.gap[k]), max(maxOv, w.overlap[k])
					if tc.planned && w.gap[k] > 0 {
						t.Errorf("%s from the leader %s: gap %v in a planned change", k, leader, w.gap[k])
					}
					if w.overlap[k] > 0 && (!tc.planned || w.overlap[k] > o) {
						t.Errorf("%s from the leader %s: overlap %v (planned %v, bound %v)", k, leader, w.overlap[k], tc.planned, o)
					}
					if len(hs) == 1 && hs[0] == leader && tc.name != "handover" {
						t.Errorf("%s still held by the old leader %s", k, leader)
					}
				}
				sort.Strings(moved)
				t.Logf("kept %d addresses on their holders (longest gap %v); %d moved off the leader: longest gap %v, longest overlap %v; new leader %s",
					len(kept), keyGap, len(moved), maxGap, maxOv, leaderOf(t, n))
			})
		}
	}
}

// TestPlacementConverges: once the members stop changing, every pool and
// egress address ends on its rendezvous winner among the healthy voters.
// (A move the leader had to put off, its holder still the successor of a
// make-before-break overlap when a better node became eligible, was lost
// when nothing else changed: the simulator's
// TestLeaderChangeKeepsPoolHoldsSim found it, as a move at the next leader
// change.)
func TestPlacementConverges(t *testing.T) {
	for _, size := range []int{3, 5} {
		for _, hb := range []int{4, 5, 6, 7} {
			t.Run(fmt.Sprintf("%d nodes, renewal every %d ticks", size, hb), func(t *testing.T) {
				n := clusterWith(t, size, manyAddresses(30, 5), func(c *Config) { c.HeartbeatTicks = hb })
				n.run(3 * time.Second)
				for _, a := range n.wanted() {
					if a.Kind == ControlPlane {
						continue
					}
					win := ""
					for _, name := range n.order {
						if win == "" || rendezvous(name, a.Key) > rendezvous(win, a.Key) {
							win = name
						}
					}
					if hs := n.holders(a.Key); len(hs) != 1 || hs[0] != win {
						t.Errorf("%s held by %v, want its rendezvous winner %s", a.Key, hs, win)
					}
				}
			})
		}
	}
}

// TestCutOffLeaderTakesNothing: a leader that stops hearing its
// followers, first one, then the other (a partition forming), still has
// its lease for a while after the first one's grant ran out. It must not
// take that follower's address meanwhile (here the only other node that
// may hold it is the leader): no majority answers the leader, so the
// follower it cannot hear is more likely on the majority's side, where the
// next leader keeps the address with it.
func TestCutOffLeaderTakesNothing(t *testing.T) {
	want := []Address{{Key: "vip", Kind: ControlPlane}}
	n := cluster(t, 3, want)
	leader := leaderOf(t, n)
	var others []string
	for _, name := range n.order {
		if name != leader {
			others = append(others, name)
		}
	}
	holder, other := others[0], others[1]
	want = append(want, Address{Key: "10.0.1.1/32", Kind: Pool, Restricted: true, Nodes: []string{leader, holder}})
	n.want = want
	for _, name := range n.order {
		n.step(name, Want{Addresses: want})
	}
	n.run(3 * time.Second)
	if hs := n.holders("10.0.1.1/32"); len(hs) != 1 || hs[0] != holder {
		t.Fatalf("setup: 10.0.1.1/32 held by %v, not %s", hs, holder)
	}
	cfg := n.nodes[leader].cfg
	renewal := time.Duration(cfg.HeartbeatTicks) * cfg.Tick
	start := n.now
	// the holder is not heard from now on; the other follower a renewal
	// interval later: the leader's last answered round is then older than
	// a renewal interval and a tick when the holder's grant runs out
	n.drop = func(p pkt) bool {
		return p.to == leader && (p.from == holder || (p.from == other && n.now.Sub(start) >= renewal))
	}
	took := time.Duration(0)
	for n.now.Sub(start) < 2*time.Second {
		n.run(time.Millisecond)
		if took == 0 && n.nodes[leader].holds["10.0.1.1/32"].After(n.now) {
			took = n.now.Sub(start)
		}
	}
	if took > 0 {
		t.Errorf("the cut-off leader %s took %s's address %v after it stopped hearing it", leader, holder, took)
	}
}
