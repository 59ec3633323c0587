package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// manyAddrs: the control-plane VIP, 30 pool and 5 egress addresses.
func manyAddrs() []lease.Address {
	a := addrs(30)
	for i := range 5 {
		a = append(a, lease.Address{Key: fmt.Sprintf("10.0.2.%d/32", i), Kind: lease.Egress})
	}
	return a
}

// TestLeaderChangeKeepsPoolHoldsSim: the strict simulator's view of
// cluster/lease's TestLeaderChangeKeepsPoolHolds, with message delays and
// drifting clocks. Whatever way the leader goes, every address held by a
// node that stays up and healthy keeps that holder: planned (a handover),
// with no release and no gap; unplanned (a crash, a partition), with a
// gap shorter than an election timeout (a grant ends within the lost
// leader's lease: docs/lease.md). The leader's own addresses move once.
func TestLeaderChangeKeepsPoolHoldsSim(t *testing.T) {
	budget := map[string]time.Duration{"default": time.Second, "fast": 250 * time.Millisecond} // TestFailoverBudget's
	// 1-10, and 11 and 37: a partitioned leader took its unheard
	// followers' addresses for the rest of its lease (fast profile)
	seeds := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 37}
	for _, profile := range []string{"default", "fast"} {
		cfg := lease.ProfileConfig(profile)
		for _, size := range []int{3, 5} {
			for _, act := range []string{"handover", "graceful stop", "crash", "partition"} {
				for _, seed := range seeds {
					t.Run(fmt.Sprintf("%s/%d nodes/%s/seed %d", profile, size, act, seed), func(t *testing.T) {
						s := New(cfg, seed)
						s.Want(manyAddrs())
						s.AddNode("n1", NodeOpts{})
						s.Run(100 * time.Millisecond)
						for i := 2; i <= size; i++ {
							s.AddNode(fmt.Sprintf("n%d", i), NodeOpts{ExpectPeers: true})
						}
						s.Run(8 * time.Second)
						noViolations(t, s)
						leader := s.Status("n1").Leader
						var others []string
						for _, n := range s.Names() {
							if n != leader {
								others = append(others, n)
							}
						}
						first := map[string]string{}
						for _, a := range manyAddrs() {
							h := s.Holders(a.Key)
							if len(h) != 1 {
								fail(t, s, "setup: %s held by %v", a.Key, h)
							}
							first[a.Key] = h[0]
						}
						switch act {
						case "handover":
							s.Transfer(leader, "")
						case "graceful stop":
							s.Leave(leader)
						case "crash":
							s.Crash(leader, true, -1)
						case "partition":
							s.Partition([]string{leader}, others)
						}
						gap, gapAt, moved := map[string]time.Duration{}, map[string]time.Duration{}, map[string]string{}
						for range 4000 {
							s.Run(time.Millisecond)
							for k, f := range first {
								hs := s.Holders(k)
								if len(hs) == 0 {
									if _, ok := gapAt[k]; !ok {
										gapAt[k] = s.Now()
									}
									gap[k] = max(gap[k], s.Now()-gapAt[k]+time.Millisecond)
								} else {
									delete(gapAt, k)
								}
								for _, h := range hs {
									if h != f && moved[k] == "" {
										moved[k] = h
									}
								}
							}
						}
						noViolations(t, s)
						var keptGap, leaderGap time.Duration
						kept := 0
						for k, f := range first {
							planned := act == "handover" || act == "graceful stop"
							keep := f != leader || (act == "handover" && k != cpKey)
							if !keep {
								leaderGap = max(leaderGap, gap[k])
								if planned && gap[k] > 0 {
									t.Errorf("%s: gap %v moving off the leader in a %s", k, gap[k], act)
								}
								continue
							}
							kept++
							keptGap = max(keptGap, gap[k])
							switch {
							case moved[k] != "":
								t.Errorf("%s held by %s (stays up and healthy) moved to %s", k, f, moved[k])
							case planned && gap[k] > 0:
								t.Errorf("%s held by %s: gap %v in a %s", k, f, gap[k], act)
							case gap[k] > budget[profile]:
								t.Errorf("%s held by %s: gap %v, beyond the failover budget %v", k, f, gap[k], budget[profile])
							}
						}
						t.Logf("leader %s: %d addresses kept their holder (longest gap %v); the leader's moved with a longest gap of %v", leader, kept, keptGap, leaderGap)
					})
				}
			}
		}
	}
}
