package lease

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// A small synchronous network with one fake clock (no drift) for table
// tests of single rules; cluster/lease/sim is the randomized one.
type tnet struct {
	t     *testing.T
	now   time.Time
	nodes map[string]*tnode
	order []string
	q     []pkt
	drop  func(p pkt) bool
	after func()                        // called after every millisecond of run
	want  []Address                     // what every node wants (nil: vip, p1, p2)
	seen  func(name string, out Output) // called with every Output
	edit  func(c *Config)               // changes the profile's config of every node added (nil: none)
}

// wanted is what every node is told to place.
func (n *tnet) wanted() []Address {
	if n.want != nil {
		return n.want
	}
	return []Address{{Key: "vip", Kind: ControlPlane}, {Key: "p1", Kind: Pool}, {Key: "p2", Kind: Pool}}
}

type tnode struct {
	m         *Machine
	cfg       Config
	persisted []byte
	holds     map[string]time.Time
	ovs       map[string]Overlap
	up        bool
}

type pkt struct {
	from, to string
	data     []byte
}

func newNet(t *testing.T) *tnet {
	return &tnet{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), nodes: map[string]*tnode{}}
}

func (n *tnet) add(name string, expect bool, role Role) *tnode {
	cfg := ProfileConfig("default")
	cfg.Name, cfg.ExpectPeers, cfg.Role = name, expect, role
	if n.edit != nil {
		n.edit(&cfg)
	}
	cfg.Incarnation = uint64(len(n.order)+1) * 7919
	m, err := New(cfg, nil, n.now)
	if err != nil {
		n.t.Fatal(err)
	}
	tn := &tnode{m: m, cfg: cfg, up: true}
	n.nodes[name] = tn
	n.order = append(n.order, name)
	n.step(name, Health{Healthy: true})
	n.step(name, Want{Addresses: n.wanted()})
	return tn
}

func (n *tnet) restart(name string, keep bool) {
	tn := n.nodes[name]
	var st []byte
	if keep {
		st = tn.persisted
	}
	m, err := New(tn.cfg, st, n.now)
	if err != nil {
		n.t.Fatal(err)
	}
	tn.m = m
	n.step(name, Health{Healthy: true})
	n.step(name, Want{Addresses: n.wanted()})
}

func (n *tnet) step(name string, ev Event) Output {
	tn := n.nodes[name]
	if !tn.up {
		return Output{}
	}
	out := tn.m.Step(n.now, ev)
	if out.Persist != nil {
		tn.persisted = out.Persist
	}
	if n.seen != nil {
		n.seen(name, out)
	}
	tn.holds = out.Holds
	tn.ovs = out.Overlaps
	for _, s := range out.Send {
		n.q = append(n.q, pkt{from: name, to: s.To, data: s.Data})
	}
	return out
}

func (n *tnet) view() {
	var ms []Member
	for _, name := range n.order {
		tn := n.nodes[name]
		ms = append(ms, Member{Name: name, Alive: tn.up, Meta: tn.m.metaBytes()})
	}
	for _, name := range n.order {
		n.step(name, View{Members: ms})
	}
}

// flush delivers queued messages until none are left (drop filters).
func (n *tnet) flush() {
	for i := 0; i < 10000 && len(n.q) > 0; i++ {
		p := n.q[0]
		n.q = n.q[1:]
		if tn := n.nodes[p.to]; tn == nil || !tn.up || (n.drop != nil && n.drop(p)) {
			continue
		}
		n.step(p.to, Receive{From: p.from, Data: p.data})
	}
}

// run advances the clock by d in 1 ms steps, ticking and delivering.
func (n *tnet) run(d time.Duration) {
	end := n.now.Add(d)
	for n.now.Before(end) {
		n.now = n.now.Add(time.Millisecond)
		for _, name := range n.order {
			n.step(name, Tick{})
		}
		n.flush()
		if n.after != nil {
			n.after()
		}
	}
}

func (n *tnet) holders(key string) []string {
	var out []string
	for _, name := range n.order {
		tn := n.nodes[name]
		if end, ok := tn.holds[key]; ok && tn.up && end.After(n.now) {
			out = append(out, name)
		}
	}
	return out
}

// three: a bootstrapped a, then b and c joined and promoted.
func three(t *testing.T) *tnet {
	n := newNet(t)
	n.add("a", false, Voter)
	n.run(10 * time.Millisecond)
	n.add("b", true, Voter)
	n.add("c", true, Voter)
	for i := 0; i < 5; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if st := n.nodes["a"].m.Status(); len(st.Voters) != 3 || st.Leader != "a" {
		t.Fatalf("setup: %+v", st)
	}
	return n
}

func TestConfigValidate(t *testing.T) {
	ok := ProfileConfig("default")
	ok.Name = "n1"
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no name", func(c *Config) { c.Name = "" }, "Name is empty"},
		{"tick", func(c *Config) { c.Tick = 0 }, "Tick=0s"},
		{"election", func(c *Config) { c.ElectionTicks = 2 }, "ElectionTicks=2"},
		{"heartbeat", func(c *Config) { c.HeartbeatTicks = 8 }, "HeartbeatTicks=8"},
		{"drift", func(c *Config) { c.Drift = 0.5 }, "Drift=0.5"},
		{"role", func(c *Config) { c.Role = 7 }, "Role=7"},
	} {
		c := ok
		tc.mod(&c)
		_, err := New(c, nil, time.Now())
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestLeaseLength(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    time.Duration
	}{{"default", 685 * time.Millisecond}, {"fast", 127200 * time.Microsecond}} {
		if got := ProfileConfig(tc.profile).LeaseLength(); got != tc.want {
			t.Errorf("%s: L = %v, want %v", tc.profile, got, tc.want)
		}
	}
}

func TestStateFromAnotherNodeIsRefused(t *testing.T) {
	n := three(t)
	cfg := n.nodes["b"].cfg
	cfg.Name = "z"
	_, err := New(cfg, n.nodes["b"].persisted, n.now)
	if err == nil || !strings.Contains(err.Error(), `belongs to node "b"`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := New(n.nodes["b"].cfg, []byte("{broken"), n.now); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("broken state: err = %v", err)
	}
}

// The kubeadm first node holds as soon as it is healthy, in the same Step.
func TestFirstNodeHoldsAtHealth(t *testing.T) {
	cfg := ProfileConfig("default")
	cfg.Name = "n1"
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, err := New(cfg, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	out := m.Step(now, Want{Addresses: []Address{{Key: "vip", Kind: ControlPlane}}})
	if len(out.Holds) != 0 {
		t.Fatalf("holds while unhealthy: %v", out.Holds)
	}
	now = now.Add(3 * time.Second)
	out = m.Step(now, Health{Healthy: true})
	if end, ok := out.Holds["vip"]; !ok || end.Sub(now) > cfg.LeaseLength() || end.Sub(now) < cfg.LeaseLength()-cfg.Tick*time.Duration(cfg.HeartbeatTicks) {
		t.Fatalf("holds %v at %v, want vip for about L", out.Holds, now)
	}
	if out.Next.Sub(now) > time.Duration(cfg.HeartbeatTicks)*cfg.Tick || !out.Next.After(now) {
		t.Fatalf("Next %v, want within one heartbeat", out.Next.Sub(now))
	}
	if out.Persist == nil && m.persist() == nil {
		t.Fatal("no state to persist")
	}
}

func voteFrom(t *testing.T, n *tnet, from, to string, term uint64, forced bool) []byte {
	fm := n.nodes[from].m
	msg := &pb.Message{Type: pb.MsgVote.Enum(), To: new(n.nodes[to].m.id), From: new(fm.id), Term: new(term), LogTerm: new(uint64(1 << 40)), Index: new(uint64(1 << 40))}
	if forced {
		msg.Context = campaignTransfer
	}
	b, err := encode(&envelope{h: header{From: from, ID: fm.id, Cluster: fm.cluster, Term: term}, msgs: []*pb.Message{msg}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func votes(out Output) int {
	c := 0
	for _, s := range out.Send {
		e, _ := decode(s.Data)
		for _, m := range e.msgs {
			if m.GetType() == pb.MsgVoteResp && !m.GetReject() {
				c++
			}
		}
	}
	return c
}

// Vote fences: in lease, after a restart, a forced vote not announced by
// the leader; raft's own answer once the fence has passed.
func TestVoteFences(t *testing.T) {
	t.Run("in lease", func(t *testing.T) {
		n := three(t)
		term := n.nodes["b"].m.Status().Term
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, false)})); got != 0 {
			t.Fatal("b voted while its leader is alive")
		}
	})
	t.Run("forced, not announced", func(t *testing.T) {
		n := three(t)
		term := n.nodes["b"].m.Status().Term
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, true)})); got != 0 {
			t.Fatal("b granted a forced vote its leader did not announce")
		}
	})
	t.Run("restart", func(t *testing.T) {
		n := three(t)
		n.nodes["a"].up = false // the leader is gone
		n.restart("b", true)
		term := n.nodes["b"].m.Status().Term
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, false)})); got != 0 {
			t.Fatal("b voted right after a restart")
		}
		cfg := n.nodes["b"].cfg
		// E ticks, and the rest of the grid tick it restarted in
		n.now = n.now.Add(time.Duration(cfg.ElectionTicks+1) * cfg.Tick)
		n.step("b", Tick{})
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, false)})); got != 1 {
			t.Fatal("b never votes after its restart fence")
		}
	})
	t.Run("silent leader", func(t *testing.T) {
		n := three(t)
		n.nodes["a"].up = false
		cfg := n.nodes["b"].cfg
		// E-2 ticks after the last message b had from the leader (up to
		// a renewal interval before a went down)
		mb := n.nodes["b"].m
		n.now = mb.base.Add(time.Duration(mb.lastLeaderTick+int64(cfg.ElectionTicks)-2) * cfg.Tick)
		n.step("b", Tick{})
		term := n.nodes["b"].m.Status().Term
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, false)})); got != 0 {
			t.Fatal("b voted before E ticks of silence")
		}
		n.now = n.now.Add(3 * cfg.Tick)
		n.step("b", Tick{})
		if got := votes(n.step("b", Receive{From: "c", Data: voteFrom(t, n, "c", "b", term+1, false)})); got != 1 {
			t.Fatal("b never votes after E ticks of silence")
		}
	})
}

// A MsgTimeoutNow of a transfer that was aborted arrives late: the
// transferee campaigns, but the voters heard the leader call the transfer
// off, so the leader (which holds again) stays the only holder.
func TestStaleTransferCannotWin(t *testing.T) {
	n := three(t)
	var stale []pkt
	n.drop = func(p pkt) bool {
		e, err := decode(p.data)
		if p.to != "c" || err != nil || e.h.Transfer != "c" {
			return false
		}
		for _, m := range e.msgs {
			if m.GetType() == pb.MsgTimeoutNow {
				stale = append(stale, p)
				return true
			}
		}
		return false
	}
	n.step("a", Transfer{To: "c"})
	for i := 0; i < 100 && len(stale) == 0; i++ {
		n.run(10 * time.Millisecond)
	}
	n.step("c", Health{Healthy: false}) // the handover target is no longer eligible
	n.run(2 * time.Second)              // raft aborts the transfer after an election timeout
	if st := n.nodes["a"].m.Status(); st.Leader != "a" || st.LeaseUntil.IsZero() {
		t.Fatalf("a should lead with a lease again: %+v", st)
	}
	n.drop = nil
	hasTimeoutNow := false
	for _, p := range stale {
		e, _ := decode(p.data)
		for _, m := range e.msgs {
			hasTimeoutNow = hasTimeoutNow || m.GetType() == pb.MsgTimeoutNow
		}
		n.step("c", Receive{From: p.from, Data: p.data})
	}
	if !hasTimeoutNow {
		t.Fatal("no MsgTimeoutNow captured")
	}
	n.flush()
	for i := 0; i < 100; i++ {
		n.run(10 * time.Millisecond)
		if h := n.holders("vip"); len(h) > 1 {
			t.Fatalf("two holders: %v", h)
		}
	}
	if st := n.nodes["c"].m.Status(); st.Leader == "c" {
		t.Fatalf("c won with a stale transfer: %+v", st)
	}
}

// A grant never outlives the granting leader's lease.
func TestGrantWithinLeaderLease(t *testing.T) {
	n := three(t)
	for i := 0; i < 300; i++ {
		n.run(5 * time.Millisecond)
		lease := n.nodes["a"].m.Status().LeaseUntil
		for _, name := range []string{"b", "c"} {
			for k, end := range n.nodes[name].holds {
				if end.After(lease) {
					t.Fatalf("%s holds %s until %v, after a's lease %v", name, k, end, lease)
				}
			}
		}
	}
	spread := map[string]bool{}
	for _, k := range []string{"p1", "p2"} {
		for _, h := range n.holders(k) {
			spread[h] = true
		}
	}
	if len(n.holders("vip")) != 1 || n.holders("vip")[0] != "a" {
		t.Fatalf("vip holders %v", n.holders("vip"))
	}
}

// A new leader holds only after its first ReadIndex round completed.
func TestNewLeaderHoldsAfterItsFirstRound(t *testing.T) {
	n := three(t)
	n.nodes["a"].up = false
	n.drop = func(p pkt) bool { return p.to != "b" && p.from != "b" && false }
	// run until b or c becomes leader, inspecting every output
	for i := 0; i < 3000; i++ {
		n.now = n.now.Add(time.Millisecond)
		for _, name := range []string{"b", "c"} {
			out := n.step(name, Tick{})
			st := n.nodes[name].m.Status()
			if st.State == "StateLeader" && len(out.Holds) > 0 && st.LeaseUntil.IsZero() {
				t.Fatalf("%s holds without a lease", name)
			}
		}
		n.flush()
		if len(n.holders("vip")) == 1 {
			return
		}
	}
	t.Fatal("no new holder")
}

func TestEnvelopeRoundTrip(t *testing.T) {
	e := &envelope{h: header{From: "a", ID: 7, Cluster: 9, Assign: &assign{Term: 2, Gen: 3, Full: true, Keys: []string{"k"}}},
		msgs: []*pb.Message{{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(1)), Context: []byte("x")}}}
	b, err := encode(e)
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode(b)
	if err != nil || d.h.From != "a" || d.h.Assign.Keys[0] != "k" || len(d.msgs) != 1 || string(d.msgs[0].GetContext()) != "x" {
		t.Fatalf("round trip: %+v %v", d, err)
	}
	for _, bad := range [][]byte{nil, {9}, {1, 200}, append(append([]byte{}, b...), 5)} {
		if _, err := decode(bad); err == nil {
			t.Errorf("decode(%v) accepted", bad)
		}
	}
}

func FuzzDecode(f *testing.F) {
	e := &envelope{h: header{From: "a", Ack: &ack{Seq: 1}}, msgs: []*pb.Message{{Type: pb.MsgApp.Enum()}}}
	b, _ := encode(e)
	f.Add(b)
	f.Add([]byte{1, 2, '{', '}'})
	full, _ := encode(&envelope{h: fullHeader()})
	f.Add(full)
	f.Fuzz(func(t *testing.T, b []byte) {
		// Whatever decodes encodes again to the same header.
		if e, err := decode(b); err == nil {
			again, err := encode(e)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			e2, err := decode(again)
			if err != nil || !reflect.DeepEqual(e2.h, e.h) || len(e2.msgs) != len(e.msgs) {
				t.Fatalf("decode(encode(%+v)) = %+v, %v", e.h, e2, err)
			}
		}
		cfg := ProfileConfig("fast")
		cfg.Name = "x"
		m, err := New(cfg, nil, time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		m.Step(time.Unix(1, 0), Receive{From: "y", Data: b})
	})
}

// four: three, then d joined and promoted.
func four(t *testing.T) *tnet {
	n := three(t)
	n.join("d")
	return n
}

// join adds a voter that expects peers and waits until a (the leader)
// counts every node a voter.
func (n *tnet) join(name string) {
	n.t.Helper()
	n.add(name, true, Voter)
	for i := 0; i < 5; i++ {
		n.view()
		n.run(200 * time.Millisecond)
	}
	if st := n.nodes["a"].m.Status(); len(st.Voters) != len(n.order) {
		n.t.Fatalf("setup: %s did not join: %+v", name, st)
	}
}

// TestStaleLeaveKeepsLaterIncarnation: a leave request names the incarnation
// (raft id) that leaves. A late or duplicated copy of an old incarnation's
// leave (UDP duplication, or a member forwarding it after the node came back
// under its name with a new id) must not remove the node that rejoined; the
// current incarnation's own leave does. c is unhealthy first, so it holds
// nothing and a leave naming it would be carried out at once.
func TestStaleLeaveKeepsLaterIncarnation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leaveID func(cur uint64) uint64 // nil: c leaves itself (Leave event)
		removed bool
	}{
		{"an older incarnation's leave", func(cur uint64) uint64 { return cur + 1 }, false},
		{"a leave without an id (no raft state yet)", func(uint64) uint64 { return 0 }, true},
		{"this incarnation leaves", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := four(t) // three voters would not shrink (the floor)
			n.step("c", Health{Healthy: false})
			n.run(3 * time.Second)
			if h := n.holders("p1"); slices.Contains(h, "c") {
				t.Fatalf("setup: unhealthy c still holds p1")
			}
			cid := n.nodes["c"].m.id
			if tc.leaveID == nil {
				n.step("c", Leave{})
			} else {
				b, c := n.nodes["b"].m, n.nodes["c"].m
				leave, err := encode(&envelope{h: header{From: "b", ID: b.id, Cluster: b.cluster, Term: b.rn.Status().GetTerm(),
					Leave: "c", LeaveID: tc.leaveID(c.id)}})
				if err != nil {
					t.Fatal(err)
				}
				n.step("a", Receive{From: "b", Data: leave})
			}
			n.run(3 * time.Second)
			// A removed c rejoins under a new raft id: the old id is what
			// tells whether this incarnation was removed.
			a := n.nodes["a"].m
			if got := slices.Contains(a.conf.Voters, cid) || slices.Contains(a.conf.Learners, cid); got == tc.removed {
				st := a.Status()
				t.Fatalf("voters %v learners %v: c's incarnation %d still a member = %v, want %v", st.Voters, st.Learners, cid, got, !tc.removed)
			}
		})
	}
}

// TestLeaveKeepsLiveMajority: a graceful stop never shrinks the
// configuration below the voter floor (3), nor to one whose live voters are
// no majority (another voter is dead: the survivor would sit with one dead
// voter of two, no holder, forever). The leader declines such a leave: the
// leaving node stops as a voter with its state and, restarted, resumes and
// the live voters hold again. Above the floor with a live majority the
// leave is carried out.
func TestLeaveKeepsLiveMajority(t *testing.T) {
	for _, tc := range []struct {
		name    string
		four    bool
		dead    int
		removed bool
	}{
		{"three voters, another one dead", false, 1, false},
		{"three voters, all alive (the floor)", false, 0, false},
		{"four voters, all alive", true, 0, true},
		{"four voters, two others dead", true, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n *tnet
			if tc.four {
				n = four(t)
			} else {
				n = three(t)
			}
			n.run(2 * time.Second)
			hs := n.holders("vip")
			if len(hs) != 1 {
				t.Fatalf("setup: holders %v", hs)
			}
			h := hs[0]
			var dead []string
			survivor := ""
			for _, x := range n.order {
				switch {
				case x == h:
				case len(dead) < tc.dead:
					dead = append(dead, x)
				case survivor == "":
					survivor = x
				}
			}
			for _, d := range dead {
				n.nodes[d].up = false
			}
			n.view()
			n.run(2 * time.Second)
			hid := n.nodes[h].m.id
			n.step(h, Leave{})
			n.run(3 * time.Second)
			s := n.nodes[survivor].m
			if got := !slices.Contains(s.conf.Voters, hid); got != tc.removed {
				t.Fatalf("%s removed = %v, want %v (voters %v)", h, got, tc.removed, s.Status().Voters)
			}
			if got := n.holders("vip"); slices.Contains(got, h) {
				t.Fatalf("the leaving node %s still holds: %v", h, got)
			}
			if tc.removed {
				if got := n.holders("vip"); len(got) != 1 {
					t.Fatalf("after the leave: holders %v", got)
				}
				return
			}
			// The leaving node stops and starts again with its state: it
			// resumes as a voter and, with it, the live voters hold.
			n.nodes[h].up = false
			n.view()
			n.run(time.Second)
			n.nodes[h].up = true
			n.restart(h, true)
			for i := 0; i < 5; i++ {
				n.view()
				n.run(time.Second)
			}
			// (two of four dead: no majority with or without the leave,
			// until one of them is back)
			if got := n.holders("vip"); tc.dead == 1 && (len(got) != 1 || slices.Contains(dead, got[0])) {
				t.Fatalf("after %s restarted beside dead %v: holders %v", h, dead, got)
			}
			if !slices.Contains(n.nodes[survivor].m.conf.Voters, hid) {
				t.Fatalf("%s is no longer a voter after its restart", h)
			}
		})
	}
}

// TestRestrictedAddressesGoOnlyToAllowedNodes: a pool or egress address
// that only some nodes may hold (an IPPool's node selector, a Service's
// local traffic policy, an EgressPolicy's nodeSelector) is granted only to
// one of them, moves when the set changes, and is held by nobody when no
// node may hold it; the others are spread as before.
func TestRestrictedAddressesGoOnlyToAllowedNodes(t *testing.T) {
	n := three(t)
	want := func(p1 []string) {
		for _, name := range n.order {
			n.step(name, Want{Addresses: []Address{{Key: "vip", Kind: ControlPlane},
				{Key: "p1", Kind: Pool, Restricted: true, Nodes: p1},
				{Key: "p2", Kind: Egress, Restricted: true},
				{Key: "p3", Kind: Pool}}})
		}
		n.run(3 * time.Second)
	}
	for _, tc := range []struct {
		nodes []string
		want  []string
	}{
		{[]string{"c"}, []string{"c"}},
		{[]string{"b", "zz"}, []string{"b"}},
		{[]string{"zz"}, nil},
		{[]string{"a", "c"}, nil}, // one of them
	} {
		want(tc.nodes)
		got := n.holders("p1")
		switch {
		case tc.want == nil && len(tc.nodes) == 2:
			if len(got) != 1 || !slices.Contains(tc.nodes, got[0]) {
				t.Fatalf("p1 for %v: holders %v", tc.nodes, got)
			}
		case !slices.Equal(got, tc.want):
			t.Fatalf("p1 for %v: holders %v, want %v", tc.nodes, got, tc.want)
		}
		if h := n.holders("p2"); len(h) != 0 {
			t.Fatalf("p2 (no node allowed) held by %v", h)
		}
		if h := n.holders("p3"); len(h) != 1 {
			t.Fatalf("p3 (any node) held by %v", h)
		}
	}
	// The allowed holder dies: the address goes to the other allowed node
	// only.
	h := n.holders("p1")[0]
	n.nodes[h].up = false
	n.view()
	n.run(5 * time.Second)
	other := "a"
	if h == "a" {
		other = "c"
	}
	if got := n.holders("p1"); !slices.Equal(got, []string{other}) {
		t.Fatalf("after %s died: p1 holders %v, want [%s]", h, got, other)
	}
}

// TestFollowersKnowWhoHolds: followers learn from the leader's renewals who
// holds the control-plane and egress addresses (status, the egress
// directors' route to the gateway, the l2 wire checks); pool addresses are
// each holder's own. After the holder dies they learn the new one.
func TestFollowersKnowWhoHolds(t *testing.T) {
	n := three(t)
	for _, name := range n.order {
		n.step(name, Want{Addresses: []Address{{Key: "vip", Kind: ControlPlane}, {Key: "e1", Kind: Egress}, {Key: "p1", Kind: Pool}}})
	}
	n.run(3 * time.Second)
	check := func(nodes ...string) {
		t.Helper()
		for _, key := range []string{"vip", "e1"} {
			h := n.holders(key)
			if len(h) != 1 {
				t.Fatalf("%s: holders %v", key, h)
			}
			for _, name := range nodes {
				if got := n.nodes[name].m.Status().Holders[key]; got != h[0] {
					t.Fatalf("%s says %s holds %s, it is %s", name, got, key, h[0])
				}
			}
		}
		for _, name := range nodes {
			st := n.nodes[name].m.Status()
			if got, ok := st.Holders["p1"]; ok && st.Leader != name && got != name {
				t.Fatalf("%s reports the pool address's holder %s", name, got)
			}
		}
	}
	check(n.order...)
	h := n.holders("vip")[0]
	n.nodes[h].up = false
	n.view()
	n.run(5 * time.Second)
	var alive []string
	for _, name := range n.order {
		if name != h {
			alive = append(alive, name)
		}
	}
	check(alive...)
}

// TestPlannedMovesNameTheGiver: a node that takes an address over in a
// planned move (vipd handover) learns which node let it go for it (the
// status timeline "handed over by"); after a failure nobody is named.
func TestPlannedMovesNameTheGiver(t *testing.T) {
	n := three(t)
	n.run(2 * time.Second)
	h := n.holders("vip")[0]
	to := "b"
	if h == "b" {
		to = "c"
	}
	n.step(h, Transfer{To: to})
	n.run(3 * time.Second)
	if got := n.holders("vip"); !slices.Equal(got, []string{to}) {
		t.Fatalf("after the handover to %s: holders %v", to, got)
	}
	if got := n.nodes[to].m.Status().From["vip"]; got != h {
		t.Fatalf("%s says %q handed the VIP over, want %s", to, got, h)
	}
	n.nodes[to].up = false
	n.view()
	n.run(5 * time.Second)
	got := n.holders("vip")
	if len(got) != 1 || got[0] == to {
		t.Fatalf("after %s died: holders %v", to, got)
	}
	if f := n.nodes[got[0]].m.Status().From["vip"]; f != "" {
		t.Fatalf("%s says %q handed the VIP over after a failure", got[0], f)
	}
}

// TestHandoverWaitsForTheSuccessor: vipd handover --to a voter whose
// healthy ack has not reached the leader yet (its apiserver just came back)
// waits for it, two election timeouts at most; a successor still not
// eligible then does not get the addresses later (no delayed preemption).
func TestHandoverWaitsForTheSuccessor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		after  time.Duration // b healthy again this long after the request
		movesB bool
	}{
		{"healthy a renewal later", 100 * time.Millisecond, true},
		{"healthy only after the request lapsed", 3 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := three(t)
			n.run(2 * time.Second)
			h := n.holders("vip")[0]
			to := "b"
			if h == "b" {
				to = "c"
			}
			n.step(to, Health{Healthy: false})
			n.run(time.Second)
			n.step(h, Transfer{To: to})
			n.run(tc.after)
			n.step(to, Health{Healthy: true})
			n.run(3 * time.Second)
			got := n.holders("vip")
			if moved := slices.Equal(got, []string{to}); moved != tc.movesB {
				t.Fatalf("holders %v: moved to %s = %v, want %v", got, to, moved, tc.movesB)
			}
		})
	}
}

// TestMetaReadableByTheGossipElection: in a rolling upgrade the nodes of
// the previous releases decode this election's metadata into their own
// (0.1.0 drops a member whose metadata does not decode, and so counted two
// of three members alive) and read the holder's claim from "v".
func TestMetaReadableByTheGossipElection(t *testing.T) {
	n := three(t)
	holder := n.holders("vip")
	if len(holder) != 1 {
		t.Fatalf("holders of vip: %v", holder)
	}
	// 0.1.0's Meta (cluster/election.go at 2ea267d), and the keys the
	// later gossip Meta added with their types.
	type gossipMeta struct {
		Healthy  bool     `json:"h,omitempty"`
		Eligible bool     `json:"e,omitempty"`
		Priority int      `json:"p,omitempty"`
		Term     uint64   `json:"t,omitempty"`
		Holding  []string `json:"v,omitempty"`
		Broken   []string `json:"b,omitempty"`
		Unverif  []string `json:"u,omitempty"`
		Counts   string   `json:"k,omitempty"`
		Leaving  bool     `json:"l,omitempty"`
		Dup      bool     `json:"d,omitempty"`
		Pools    bool     `json:"o,omitempty"`
		Beat     bool     `json:"hb,omitempty"`
	}
	for _, name := range n.order {
		b := n.nodes[name].m.metaBytes()
		var g gossipMeta
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatalf("%s's metadata %s does not decode as the gossip election's: %v", name, b, err)
		}
		if g.Eligible || len(g.Unverif) > 0 || g.Leaving {
			t.Errorf("%s's metadata %s tells the gossip election more than a claim", name, b)
		}
		want := []string(nil)
		if name == holder[0] {
			want = []string{"vip"} // control-plane addresses only, not p1/p2
		}
		if !slices.Equal(g.Holding, want) {
			t.Errorf("%s claims %v for the gossip election, want %v (metadata %s)", name, g.Holding, want, b)
		}
		if _, ok := parseMeta(b); !ok {
			t.Errorf("%s's metadata %s is not this election's", name, b)
		}
	}
}
