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

// TestLeaderBackBeforeItsEntries: the leader reverted to a state from
// before its followers were promoted (the single voter of a configuration
// of itself with two learners) leads again alone while the two cannot
// elect (cut off from each other), and sends its followers appends that
// replace entries they know committed. raft panics on such an entry, and
// on the entry before it leader and follower traded appends and
// rejections without end (vipd-sim -rollback seed 671: 200,000 messages
// in a second). Each follower notes the fork and takes the leader's log,
// keeping its id (the leader's configuration counts it among the voters
// it needs: as a new incarnation it left the leader without a majority);
// the cluster ends with three voters, one leader and one holder of each
// address, never two.
func TestLeaderBackBeforeItsEntries(t *testing.T) {
	n := newNet(t)
	n.add("a", false, Voter)
	n.run(10 * time.Millisecond)
	var early []byte
	n.seen = func(name string, out Output) {
		if a := n.nodes["a"].m; name == "a" && out.Persist != nil && early == nil && len(a.conf.Voters) == 1 && len(a.conf.Learners) == 2 {
			early = append([]byte(nil), out.Persist...)
		}
	}
	n.add("b", true, Voter)
	n.add("c", true, Voter)
	for i := 0; i < 5; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if st := n.nodes["a"].m.Status(); len(st.Voters) != 3 || st.Leader != "a" || early == nil {
		t.Fatalf("setup: %+v, early state saved: %v", st, early != nil)
	}
	var forks, steps int
	n.seen = func(name string, out Output) {
		if steps++; steps > 200000 {
			t.Fatalf("at %v: a message storm (%d steps; a few thousand is the norm)", n.now, steps)
		}
		for _, nt := range out.Notes {
			t.Logf("%v %s: %s %v", n.now.Format("05.000"), name, nt.Msg, nt.Attrs)
			if nt.Msg == "the leader's log replaces entries this node knows committed: taking the leader's" {
				forks++
			}
		}
	}
	watch(t, n, true) // two holders only in a planned overlap both declared, within its bound
	n.drop = func(p pkt) bool { return p.from == "b" && p.to == "c" || p.from == "c" && p.to == "b" }
	n.nodes["a"].up = false
	n.run(2 * time.Second)
	n.nodes["a"].up = true
	n.nodes["a"].persisted = early
	n.restart("a", true)
	for i := 0; i < 10; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	n.drop = nil
	for i := 0; i < 10; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if forks == 0 {
		t.Errorf("no follower noted the fork")
	}
	var leader string
	for _, name := range []string{"a", "b", "c"} {
		st := n.nodes[name].m.Status()
		if len(st.Voters) != 3 {
			t.Errorf("%s: voters %v, want three", name, st.Voters)
		}
		if leader == "" {
			leader = st.Leader
		} else if st.Leader != leader {
			t.Errorf("%s follows %q, a %q", name, st.Leader, leader)
		}
	}
	for _, key := range []string{"vip", "p1", "p2"} {
		if h := n.holders(key); len(h) != 1 {
			t.Errorf("%s held by %v, want one", key, h)
		}
	}
}
