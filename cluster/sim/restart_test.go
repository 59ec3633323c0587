package sim

import (
	"fmt"
	"testing"
	"time"
)

// TestScenarioQuickRestart: the holder's vipd crashes and is back before
// the failure detector noticed (systemd's RestartSec below the detection
// time, or a kill the others never saw). The restarted node rejoins
// without its claim; the others see that at once and one of them claims;
// the restarted node must not claim beside it: it sees every member it
// counted before and so waits only cluster.RestartSettle, long enough to
// hear that claim (without any wait both bound the VIP for a gossip
// round, in both profiles, when the restart took 50 ms to 500 ms in the
// default profile). The VIP bound before
// the crash stays until the restart's reconcile removes it: that is the
// crash case's own overlap, not a second claim.
func TestScenarioQuickRestart(t *testing.T) {
	for _, fast := range []bool{false, true} {
		for _, after := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond} {
			t.Run(fmt.Sprintf("fast=%v/restart after %v", fast, after), func(t *testing.T) {
				var before string
				claimants := 0
				script := []Step{
					holderAt(9*time.Second, &before),
					{At: 10 * time.Second, Do: func(s *Sim) {
						n := s.Node(before)
						s.stopVipd(n, false)
					}},
					{At: 10*time.Second + after, Do: func(s *Sim) { s.startVipd(s.Node(before), true) }},
				}
				scenario(t, Options{Seed: 1, Duration: 20 * time.Second, Fast: fast, Script: script, Observe: func(s *Sim) {
					if s.Now() < 10*time.Second {
						return
					}
					c := 0
					for _, n := range s.nodes {
						if n.running && n.el != nil && n.el.Meta().Holds(VIP.String()) {
							c++
						}
					}
					if c > 1 && claimants <= 1 {
						t.Errorf("%v: %d nodes claim the VIP", s.Now(), c)
					}
					claimants = c
				}})
			})
		}
	}
}
