package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// TestFreshPoolAddressesMoveOnce: 30 pool addresses wanted at once
// shortly after a 3-node cluster forms (test/pools allocates them 2.5 s
// after the feeds synced). Once all three are eligible voters, a fresh
// address is placed on its holder for good, even while the nodes'
// PoolSettle runs: before, the leader placed it over the settled nodes
// only (often itself alone) and moved it again as each of the others
// settled, sometimes twice (n1, n2, then n3), and the l2 executor made
// every such move a window with no holder. Wanted before the joiners are
// voters, an address moves at most once per joiner (the promised share:
// to a joiner eligible while no node is settled at once, to a later one
// once it settled), never through a window without a holder.
func TestFreshPoolAddressesMoveOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		together bool            // started together (the lab); else node 1 first, then two joiners (kubeadm)
		offs     []time.Duration // when the addresses are wanted, after the start
		moves    int             // holder changes allowed per address after its first holder (planned, make-before-break)
	}{
		{name: "kubeadm, all voters, settling", offs: []time.Duration{1900 * time.Millisecond, 2 * time.Second, 2100 * time.Millisecond}},
		{name: "together, all voters, settling", together: true, offs: []time.Duration{3 * time.Second, 3100 * time.Millisecond}},
		{name: "together, joiners not voters yet", together: true, offs: []time.Duration{0, 500 * time.Millisecond, time.Second}, moves: 2},
		{name: "kubeadm, joiners not voters yet", offs: []time.Duration{0, 100 * time.Millisecond}, moves: 2},
	} {
		for _, off := range tc.offs {
			for seed := int64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%s/at %v/seed %d", tc.name, off, seed), func(t *testing.T) {
					s := New(lease.ProfileConfig("default"), seed)
					s.Want(addrs(0))
					if tc.together {
						for _, n := range []string{"n1", "n2", "n3"} {
							s.AddNode(n, NodeOpts{ExpectPeers: true})
						}
					} else {
						s.AddNode("n1", NodeOpts{})
						s.Run(100 * time.Millisecond)
						s.AddNode("n2", NodeOpts{ExpectPeers: true})
						s.AddNode("n3", NodeOpts{ExpectPeers: true})
					}
					s.Run(off)
					s.Want(addrs(30))
					// every holder set each key goes through, sampled each ms
					hist := map[string][]string{}
					for range 8000 {
						s.Run(time.Millisecond)
						for i := range 30 {
							k := fmt.Sprintf("10.0.1.%d/32", i)
							hs := fmt.Sprint(s.Holders(k))
							h := hist[k]
							if len(h) == 0 && hs == "[]" {
								continue // not placed yet
							}
							if len(h) == 0 || h[len(h)-1] != hs {
								hist[k] = append(h, hs)
							}
						}
					}
					noViolations(t, s)
					for i := range 30 {
						k := fmt.Sprintf("10.0.1.%d/32", i)
						h := hist[k]
						moves := 0
						for _, hs := range h {
							if hs == "[]" {
								t.Errorf("%s had no holder after its first: %v", k, h)
							}
							if len(s.Holders(k)) != 1 {
								t.Errorf("%s held by %v at the end: %v", k, s.Holders(k), h)
							}
						}
						for j := 1; j < len(h); j++ {
							if h[j-1] != "[]" && len(h[j]) < len(h[j-1]) {
								moves++ // from an overlap [a b] to one holder, or from one to none
							}
						}
						if moves > tc.moves {
							t.Errorf("%s moved %d times after its first holder, want at most %d: %v", k, moves, tc.moves, h)
						}
					}
				})
			}
		}
	}
}
