package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestScenarioWipedMinority: five nodes, the holder's side keeps three;
// on the other side of the partition one of the two restarts with its
// state directory wiped (a rebuilt machine). Before PeerKnown it knew no
// members but those it saw, the other minority node, so "2 of 2 known
// members" was a quorum and it took the VIP while the majority's holder
// kept it: two holders for as long as the partition lasted (cloud
// semantics: no l2 conflict probe). memberlist's join brings alive
// members only; the join's state exchange now also brings the peer's
// member list, which a node without its own counts.
func TestScenarioWipedMinority(t *testing.T) {
	for _, beats := range []bool{false, true} {
		t.Run(fmt.Sprintf("beats=%v", beats), func(t *testing.T) { testWipedMinority(t, beats) })
	}
}

func testWipedMinority(t *testing.T, beats bool) {
	var minority []*node
	r := Run(Options{Seed: 1, Nodes: 5, Duration: 60 * time.Second, Beats: beats, NoProbe: true, NoHandovers: true, Trace: true, Script: []Step{
		{At: 20 * time.Second, Do: func(s *Sim) {
			var majority []*node
			for _, n := range s.nodes {
				if !s.holding(n) && len(minority) < 2 {
					minority = append(minority, n)
				} else {
					majority = append(majority, n)
				}
			}
			for _, a := range majority {
				for _, b := range minority {
					s.block[[2]int{a.id, b.id}], s.block[[2]int{b.id, a.id}] = true, true
				}
			}
		}},
		{At: 35 * time.Second, Do: func(s *Sim) {
			n := minority[0]
			s.stopVipd(n, true)
			s.startVipd(n, false)
			s.logf("%s restarted with its state wiped, on the minority side", n.name)
		}},
	}})
	if len(r.Violations) > 0 {
		t.Errorf("%s\n%s", strings.Join(r.Violations, "\n"), strings.Join(r.Trace[max(0, len(r.Trace)-60):], "\n"))
	}
}
