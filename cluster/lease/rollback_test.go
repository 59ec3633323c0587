package lease

import (
	"slices"
	"testing"
	"time"
)

// TestRolledBackStateRejoins: a node restarted from state older than what
// it had acknowledged (a VM reverted to a snapshot, a state directory
// restored from a backup, taken before a member joined). The leader's
// first heartbeat commits entries the node no longer has: raft would
// panic there (the daemon crashed on every start until an operator
// deleted the state). The node drops the state and rejoins as a new
// incarnation; the cluster replaces the old one, and at no time do two
// nodes hold an address.
func TestRolledBackStateRejoins(t *testing.T) {
	n := three(t)
	old := append([]byte(nil), n.nodes["c"].persisted...)
	oldID := n.nodes["c"].m.id
	n.join("d")
	var wiped []Note
	n.seen = func(name string, out Output) {
		if name == "c" {
			for _, nt := range out.Notes {
				if nt.Msg == "wiping state and rejoining" || nt.Msg == "the leader commits entries this node no longer has" {
					wiped = append(wiped, nt)
				}
			}
		}
	}
	two := 0
	n.after = func() {
		for _, key := range []string{"vip", "p1", "p2"} {
			if len(n.holders(key)) > 1 {
				two++
			}
		}
	}
	n.nodes["c"].persisted = old
	n.restart("c", true)
	for i := 0; i < 15; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if len(wiped) != 2 {
		t.Fatalf("c's notes: %v, want the rolled-back state seen and wiped", wiped)
	}
	c := n.nodes["c"].m
	if c.id == oldID {
		t.Errorf("c kept its old incarnation %d", oldID)
	}
	st := n.nodes["a"].m.Status()
	if len(st.Voters) != 4 || !slices.Contains(st.Voters, "c") {
		t.Errorf("voters %v, want a, b, c (its new incarnation) and d", st.Voters)
	}
	if cs := c.Status(); cs.ClusterID != st.ClusterID || cs.Leader != st.Leader {
		t.Errorf("c: cluster %x leader %q; a: cluster %x leader %q", cs.ClusterID, cs.Leader, st.ClusterID, st.Leader)
	}
	if two != 0 {
		t.Errorf("two holders of an address for %d ms", two)
	}
	if h := n.holders("vip"); len(h) != 1 {
		t.Errorf("vip holders %v, want one", h)
	}
}

// TestLeftNodeRestartsAsNewMember: a node that left gracefully keeps the
// state of a configuration without it. Restarted from that state (vipd
// started again after `systemctl stop`, or a VM reverted to a snapshot
// taken after it left), it must join again as a new member: resumed, it
// sat outside the cluster, never voting and answering nothing sent to its
// newer self (simulator seed 454 with -rollback, a voter lost for good).
// The decision is the machine's, so the simulator and the daemon share it.
func TestLeftNodeRestartsAsNewMember(t *testing.T) {
	n := four(t) // three voters would not shrink (the floor)
	oldID := n.nodes["c"].m.id
	n.step("c", Leave{})
	n.run(3 * time.Second)
	if st := n.nodes["c"].m.Status(); !st.Removed {
		t.Fatalf("setup: c did not leave: %+v", st)
	}
	if a := n.nodes["a"].m; slices.Contains(a.conf.Voters, oldID) {
		t.Fatalf("setup: c's incarnation still a voter")
	}
	n.nodes["c"].up = false
	n.run(2 * time.Second)
	var notes []string
	n.seen = func(name string, out Output) {
		if name == "c" {
			for _, nt := range out.Notes {
				notes = append(notes, nt.Msg)
			}
		}
	}
	watch(t, n, true) // two holders only in a planned overlap both declared, within its bound
	n.nodes["c"].up = true
	n.restart("c", true)
	for i := 0; i < 15; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if !slices.Contains(notes, "this node left the cluster before it stopped: joining again as a new member") {
		t.Errorf("c's notes %q: want it to say it joins again", notes)
	}
	c := n.nodes["c"].m
	if c.id == oldID {
		t.Errorf("c rejoined under the id it left with (%d)", oldID)
	}
	st := n.nodes["a"].m.Status()
	if len(st.Voters) != 4 || !slices.Contains(st.Voters, "c") || !slices.Contains(n.nodes["a"].m.conf.Voters, c.id) {
		t.Errorf("voters %v, want a, b, c (its new incarnation) and d", st.Voters)
	}
	if cs := c.Status(); cs.ClusterID != st.ClusterID || cs.Leader != st.Leader {
		t.Errorf("c: cluster %x leader %q; a: cluster %x leader %q", cs.ClusterID, cs.Leader, st.ClusterID, st.Leader)
	}
}
