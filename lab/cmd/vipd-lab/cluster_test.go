package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// The stress bench counts the lease loop's lateness warnings as vipd
// writes them (slog's text handler), and nothing else.
func TestLateWarnings(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("VIP held", "vip", "10.0.0.1/32")
	log.Warn(vcluster.LateWakeWarning, "late", 90*time.Millisecond, "limit", 33*time.Millisecond)
	log.Warn("lease election queue full: event dropped")
	log.Warn(vcluster.LongStepWarning, "took", 200*time.Millisecond, "event", "lease.Receive")
	got := lateWarnings(buf.String())
	if len(got) != 2 || !strings.Contains(got[0], "late=90ms") || !strings.Contains(got[1], "took=200ms") {
		t.Fatalf("lateWarnings = %q, want the two lateness warnings", got)
	}
}
