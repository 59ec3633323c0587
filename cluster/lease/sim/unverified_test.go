package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// wireModel plays the l2 verification of every up node against a node
// whose switch port drops its announcements: every second each other up
// node reports the addresses the filtered node has held for two rounds
// (named holder for the control-plane address, none for pool addresses,
// as vipd does) and withdraws a report once the holder changed.
func wireModel(s *Sim, filtered string, every time.Duration, keys []string) {
	var tick func()
	heldSince := map[string]time.Duration{}
	tick = func() {
		var rs []lease.Report
		for _, k := range keys {
			h := s.Holders(k)
			if len(h) != 1 || h[0] != filtered {
				delete(heldSince, k)
				continue
			}
			if _, ok := heldSince[k]; !ok {
				heldSince[k] = s.Now()
			}
			if s.Now()-heldSince[k] < 2*every {
				continue
			}
			r := lease.Report{Key: k}
			if k == cpKey {
				r.Holder = filtered
			}
			rs = append(rs, r)
		}
		for _, nm := range s.Up() {
			if nm != filtered {
				s.step(s.nodes[nm], lease.Unreachable{Reports: rs})
			}
		}
		s.After(every, tick)
	}
	s.After(every, tick)
}

// TestUnverifiedNoFlap: a node whose port stays filtered for 15 minutes
// gets each address back at most once per exclusion, the exclusions
// doubling (30 s, 60 s, 120 s, 240 s, 480 s): no flapping, never two
// holders, and every address held throughout but for the moves. The
// simulator's safety checks run all along.
func TestUnverifiedNoFlap(t *testing.T) {
	for _, seed := range []int64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := threeNodes(t, "default", seed)
			s.Want(addrs(9))
			s.Run(5 * time.Second)
			keys := []string{cpKey}
			for i := 0; i < 9; i++ {
				keys = append(keys, fmt.Sprintf("10.0.1.%d/32", i))
			}
			filtered := s.Holders(cpKey)[0]
			var pools []string
			for _, k := range keys[1:] {
				if h := s.Holders(k); len(h) == 1 && h[0] == filtered {
					pools = append(pools, k)
				}
			}
			if len(pools) == 0 {
				fail(t, s, "setup: the filtered node %s holds no pool address", filtered)
			}
			returns := map[string]int{}
			last := map[string]string{}
			for _, k := range keys {
				last[k] = s.Holders(k)[0]
			}
			s.OnHold = func(key, node string, _ time.Time) {
				if node == filtered && last[key] != filtered {
					returns[key]++
				}
				last[key] = node
			}
			wireModel(s, filtered, time.Second, keys)
			s.Run(15 * time.Minute)
			noViolations(t, s)
			for _, k := range keys {
				// 15 min of exclusions 30+60+120+240+480 s: at most 5
				// returns (plus the detection time each).
				if returns[k] > 5 {
					fail(t, s, "%s went back to the filtered node %s %d times in 15 min", k, filtered, returns[k])
				}
				if h := s.Holders(k); len(h) != 1 {
					fail(t, s, "%s held by %v at the end", k, h)
				}
			}
			t.Logf("seed %d: filtered %s (pool addresses %v); returns to it in 15 min: %v; exclusions noted %d", seed, filtered, pools, returns,
				s.NoteCount["address unverified: most other nodes cannot reach it through its holder; that node is not eligible for it for a while"])
		})
	}
}
