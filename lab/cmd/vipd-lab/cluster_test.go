package main

import (
	"encoding/json"
	"testing"

	vcluster "github.com/vipd/vipd/cluster"
)

// TestFormedAlive reads /status documents built from the lease election's
// own status type, so a change of its JSON breaks this test rather than
// every bench run ("the nodes did not all see each other alive").
func TestFormedAlive(t *testing.T) {
	members := func(alive ...bool) []vcluster.LeaseMemberStatus {
		var out []vcluster.LeaseMemberStatus
		for i, a := range alive {
			out = append(out, vcluster.LeaseMemberStatus{Name: string(rune('2' + i)), Alive: a})
		}
		return out
	}
	tests := []struct {
		name string
		doc  vcluster.LeaseStatusDoc
		want int
	}{
		{"formed", vcluster.LeaseStatusDoc{Quorum: true, Voters: []string{"n1", "n2", "n3"}, Members: members(true, true)}, 3},
		{"one dead", vcluster.LeaseStatusDoc{Quorum: true, Voters: []string{"n1", "n2", "n3"}, Members: members(true, false)}, 2},
		{"learners not promoted yet", vcluster.LeaseStatusDoc{Quorum: true, Voters: []string{"n1"}, Learners: []string{"n2", "n3"}, Members: members(true, true)}, 1},
		{"witness counts", vcluster.LeaseStatusDoc{Quorum: true, Voters: []string{"n1", "n2"}, Witnesses: []string{"w"}, Members: members(true, true)}, 3},
		{"no majority", vcluster.LeaseStatusDoc{Quorum: false, Voters: []string{"n1", "n2", "n3"}, Members: members(true, true)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(map[string]any{"node": "n1", "components": map[string]any{"cluster": tt.doc}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := formedAlive(b)
			if err != nil || got != tt.want {
				t.Fatalf("formedAlive = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}
