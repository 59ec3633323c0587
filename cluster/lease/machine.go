package lease

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Machine is one node's lease state machine. It is not safe for concurrent
// use: the runtime calls Step from one goroutine.
//
// # Why two holders never overlap
//
// Let D be the bound on how far any node's clock rate may differ from true
// time (Config.Drift; all clocks are monotonic, no synchronisation needed)
// and E the election ticks. Raft runs with CheckQuorum and PreVote.
//
//  1. A voter that received a message from a leader refuses every vote and
//     pre-vote (except a transfer the leader announced, 4.) until E of its
//     ticks have passed since: raft's in-lease check, plus this machine's
//     own fence (lastLeaderTick), which does not depend on raft's lead field.
//     Ticks fall on a grid, so E ticks after a receipt are more than (E-1)
//     Tick of local time, at least (E-1)Tick/(1+D) of true time.
//  2. The leader renews by ReadIndex(ctx): it notes its local time s before
//     the heartbeat carrying ctx is sent; raft returns the ReadState only
//     when a majority answered that heartbeat, each after receiving it,
//     so after s. The leader holds until s+L with
//     L = (E-1)*Tick*(1-2D) - Tick, which is at most
//     (E-1)Tick/(1+D)*(1-D) ... in true time it ends before the first
//     of those voters will vote again (1.).
//  3. A new leader needs a majority of votes; any majority meets the
//     majority that acknowledged the last renewal, and that voter refuses
//     until the lease ended (1., 2.). A voter that voted in a higher term
//     first cannot acknowledge the old leader's heartbeat any more (it
//     answers with its higher term), so its acknowledgement does not count.
//     Message loss, duplication, reordering and one-way or non-transitive
//     links only remove acknowledgements (shorter leases) or votes (no
//     leader); they never create one. A duplicated old heartbeat answer
//     carries an old ctx and counts only for that old, earlier renewal.
//  4. Holes raft leaves open, closed here: a restarted node (raft's lead is
//     None and its counter 0) drops votes and does not campaign for E ticks
//     after New; a node that was leader drops votes until its lease and
//     every grant it gave have ended; a leadership transfer (MsgTimeoutNow
//     makes the transferee campaign past every lease) starts only after the
//     leader ended its lease (what it holds itself it holds on as a grantee
//     to that lease's end, named in the handoff) and stopped granting, the
//     leader announces it in the header of every envelope (voters accept
//     the forced vote only while their leader announces that transfer, so a
//     late MsgTimeoutNow of an aborted transfer cannot win), and the
//     transferee learns from the handoff which grants still run and until
//     when. A leader elected while voters had no leader (lead == None)
//     holds only after its own first ReadIndex round, which raft answers
//     only once an entry of its term is committed.
//  5. A grant to a non-leader N for address X ends at N's own send time T of
//     an ack the leader received at R, plus d = min(GrantFor,
//     (leaseEnd-R)(1-D)/(1+D)): in true time it ends before the granting
//     leader's lease, so a new leader needs no wait. Within one leader an
//     address moves from A to B only after A acknowledged the assignment
//     without it or A's last grant has run out (break-before-make).
//
// Clocks: D bounds each node's rate against true time; the default 1 %
// is far above what NTP-free monotonic clocks of servers drift (tens of
// ppm).
type Machine struct {
	cfg Config
	// base is the tick grid's origin: New's now, moved back to the wall
	// clock's last multiple of the heartbeat interval, so that a leader's
	// renewals fall on the instants of the other periodic work (the health
	// probes and the l2 verification tick on that grid too: gridclock),
	// one wake-up for all of them. start is New's now.
	base, start time.Time
	now         time.Time

	ticks int64 // grid ticks elapsed since base

	// raft state; rn is nil while this node has no state (discovering or joining)
	id      uint64
	cluster uint64
	st      *raft.MemoryStorage
	rn      *raft.RawNode
	members map[uint64]memberInfo // applied configuration: id -> name, role
	routes  map[uint64]string     // id -> name, learned from envelopes (joiners)
	conf    *pb.ConfState
	applied uint64

	// raft's election counter is bounded so raft never campaigns by itself
	// (its randomized timeout is not deterministic); this machine decides.
	electionBound  int64
	lastLeaderTick int64 // tick of the last message from a leader
	lastCampaign   int64
	fenceTick      int64     // no votes and no campaign before this tick (restart)
	fenceUntil     time.Time // no votes before this time (former leader: its lease and grants)
	fenceExcept    string    // ... except the forced vote of the transferee it handed them to
	prevState      raft.StateType
	prevTerm       uint64
	prevLead       uint64
	leaderTransfer string    // what our leader's last header announced (Transfer)
	heldVote       *heldVote // a transferee's vote request that came before our leader's announcement (receive.go)
	leaderName     string
	lastLead       uint64 // the last leader this node followed (not a rival when it falls silent)

	// leader lease
	readSeq  uint64
	reads    map[string]time.Time // ctx -> send time, this term: the rounds no majority answered yet
	renewed  time.Time            // when the last renewal round went out
	leaseEnd time.Time
	lead     *leaderState

	// this node as a holder under grants
	hold holderState

	health       bool
	healthySince time.Time
	want         []Address
	wantGen      int
	view         []Member
	viewMeta     map[string]meta

	// discovery / join
	joinCluster uint64
	lastJoin    time.Time
	refused     string

	pendingHandoff *pendingHandoff
	noBootstrap    bool
	wipedAt        time.Time
	snapNeeded     bool

	leaving bool
	left    bool

	// forkTerm: the term of a leader whose log replaced entries this node
	// knew committed (receive.go): this node dropped its log and ignores
	// that leader until a later term
	forkTerm uint64

	// planned transfers (transfer.go)
	ov    map[string]*ovState  // make-before-break overlaps this node is in
	carry map[string]time.Time // transferee: grants held on as leader until its lease is valid

	// who holds the control-plane and egress addresses, as the leader of
	// term placedTerm told this follower (status and routing only)
	placed     map[string]string
	placedFrom map[string]string
	placedTerm uint64

	unv unverifiedState // reports and exclusions of unverified holders (unverified.go)

	// per Step output
	out      map[string]*envelope
	outOrder []string
	notes    []Note
	// startNotes: what New decided, given out by the first Step
	startNotes []Note
	dirty      bool
	lastMeta   []byte
	// heldMemo: holds() as the last Step's output gave it (nil during a
	// Step): Status and the metadata ask for it after every step.
	heldMemo map[string]time.Time
	// metaMemo: the metadata metaBytes encoded last and its encoding;
	// every Step asks for it, and it seldom changes (json.Marshal was a
	// sixth of an idle holder's Step).
	metaMemo struct {
		ids []uint64 // voterSum's scratch
		md  meta
		b   []byte
	}
}

type memberInfo struct {
	Name string `json:"n"`
	Role Role   `json:"r,omitempty"`
}

// holderState is the grantee side: the keys the leader assigned to this
// node and how long each may be held.
type holderState struct {
	term  uint64
	gen   uint64
	keys  map[string]bool
	seq   uint64
	sent  map[uint64]ackSent
	holds map[string]time.Time
	from  string
}

type ackSent struct {
	at  time.Time
	gen uint64
}

// New returns a machine for cfg. persisted is the last Output.Persist, or
// nil for a node without state.
func New(cfg Config, persisted []byte, now time.Time) (*Machine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Machine{
		cfg:      cfg,
		base:     gridOrigin(now, time.Duration(cfg.HeartbeatTicks)*cfg.Tick),
		start:    now,
		now:      now,
		members:  map[uint64]memberInfo{},
		routes:   map[uint64]string{},
		reads:    map[string]time.Time{},
		viewMeta: map[string]meta{},
		health:   cfg.Role == Witness,

		lastLeaderTick: -1 << 40,
	}
	m.ticks = int64(now.Sub(m.base) / cfg.Tick)
	m.hold.reset(0)
	// A restarted node must not vote or campaign for E ticks: before the
	// restart it may have acknowledged a leader's renewal (see Machine).
	// One more: now lies within the grid's current tick.
	m.fenceTick = m.ticks + int64(cfg.ElectionTicks) + 1
	if persisted != nil {
		if err := m.restore(persisted); err != nil {
			return nil, err
		}
		if !m.restoredMember() {
			// This node left (a graceful stop) or was removed before it
			// stopped, or its state went back to a life of this name
			// that had (a reverted VM): the configuration it restored has
			// not its id, so it promised nothing under that id that
			// still counts. Resumed, it would sit outside the cluster,
			// never voting, never answering what is sent to its newer
			// self. It joins again as a new member.
			if cfg.Incarnation == m.id {
				cfg.Incarnation = 0 // never the id it left with
			}
			fresh, err := New(cfg, nil, now)
			if err != nil {
				return nil, err
			}
			fresh.startNotes = []Note{{Msg: "this node left the cluster before it stopped: joining again as a new member", Attrs: []any{"cluster", fmt.Sprintf("%016x", m.cluster), "before", fmt.Sprintf("%016x", m.id)}}}
			return fresh, nil
		}
		return m, nil
	}
	m.id = cfg.Incarnation
	if m.id == 0 {
		m.id = deriveID(cfg.Name, now)
	}
	if !cfg.ExpectPeers {
		if err := m.bootstrap(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// restoredMember reports whether the configuration restored from the
// state has this node's id (a state without a configuration yet, a
// joiner's, counts as a member's).
func (m *Machine) restoredMember() bool {
	if m.rn == nil || m.conf == nil || len(m.conf.Voters) == 0 {
		return true
	}
	for _, ids := range [][]uint64{m.conf.Voters, m.conf.VotersOutgoing, m.conf.Learners, m.conf.LearnersNext} {
		if slices.Contains(ids, m.id) {
			return true
		}
	}
	return false
}

func (c Config) validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("lease: Name is empty: set the node name (VIPD_NODE_NAME)")
	case c.Tick <= 0:
		return fmt.Errorf("lease: Tick=%v: must be a positive duration", c.Tick)
	case c.ElectionTicks < 4:
		return fmt.Errorf("lease: ElectionTicks=%d: must be at least 4", c.ElectionTicks)
	case c.HeartbeatTicks < 1 || c.HeartbeatTicks*2 >= c.ElectionTicks:
		return fmt.Errorf("lease: HeartbeatTicks=%d: must be at least 1 and less than half of ElectionTicks (%d)", c.HeartbeatTicks, c.ElectionTicks)
	case c.Drift < 0 || c.Drift > 0.1:
		return fmt.Errorf("lease: Drift=%v: must be between 0 and 0.1", c.Drift)
	case c.Role != Voter && c.Role != Witness:
		return fmt.Errorf("lease: Role=%d: must be voter or witness", c.Role)
	case c.Overlap < 0:
		return fmt.Errorf("lease: Overlap=%v: must be 0 (break-before-make) or a positive duration", c.Overlap)
	case c.LeaseLength() <= 0:
		return fmt.Errorf("lease: ElectionTicks=%d with Tick=%v and Drift=%v leave no lease", c.ElectionTicks, c.Tick, c.Drift)
	}
	return nil
}

// LeaseLength is L: how long after the send of a renewal a majority
// acknowledged the leader may hold, (E-1)*Tick*(1-2*Drift) minus one tick.
func (c Config) LeaseLength() time.Duration {
	return time.Duration(float64(time.Duration(c.ElectionTicks-1)*c.Tick)*(1-2*c.Drift)) - c.Tick
}

func deriveID(name string, now time.Time) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(now.UnixNano()))
	h.Write(b[:])
	id := h.Sum64()
	if id == 0 {
		id = 1
	}
	return id
}

type discardLogger struct{}

func (discardLogger) Debug(...any)            {}
func (discardLogger) Debugf(string, ...any)   {}
func (discardLogger) Error(...any)            {}
func (discardLogger) Errorf(string, ...any)   {}
func (discardLogger) Info(...any)             {}
func (discardLogger) Infof(string, ...any)    {}
func (discardLogger) Warning(...any)          {}
func (discardLogger) Warningf(string, ...any) {}
func (discardLogger) Fatal(v ...any)          { panic(fmt.Sprint(v...)) }
func (discardLogger) Fatalf(f string, v ...any) {
	panic(fmt.Sprintf(f, v...))
}
func (discardLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (discardLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }

func (m *Machine) raftConfig(applied uint64) *raft.Config {
	return &raft.Config{
		ID:              m.id,
		ElectionTick:    m.cfg.ElectionTicks,
		HeartbeatTick:   m.cfg.ElectionTicks - 1, // renewals (ReadIndex) carry the heartbeats
		Storage:         m.st,
		Applied:         applied,
		MaxSizePerMsg:   64 << 10,
		MaxInflightMsgs: 64,
		CheckQuorum:     true,
		PreVote:         true,
		ReadOnlyOption:  raft.ReadOnlySafe,
		Logger:          discardLogger{},
	}
}

// bootstrap starts a cluster of this node alone (kubeadm's first node).
func (m *Machine) bootstrap() error {
	m.cluster = m.id
	m.members = map[uint64]memberInfo{m.id: {Name: m.cfg.Name, Role: m.cfg.Role}}
	m.st = raft.NewMemoryStorage()
	cs := &pb.ConfState{Voters: []uint64{m.id}}
	snap := &pb.Snapshot{Data: m.appData(), Metadata: &pb.SnapshotMetadata{ConfState: cs, Index: new(uint64(1)), Term: new(uint64(1))}}
	if err := m.st.ApplySnapshot(snap); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := m.st.SetHardState(&pb.HardState{Term: new(uint64(1)), Commit: new(uint64(1))}); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	m.conf = cs
	m.applied = 1
	rn, err := raft.NewRawNode(m.raftConfig(1))
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	m.rn = rn
	m.dirty = true
	m.fenceTick = 0 // nobody else can have counted on this new id
	m.note("bootstrapped a new cluster", "cluster", fmt.Sprintf("%016x", m.cluster))
	_ = m.rn.Campaign()
	return nil
}

// startJoined creates raft for a node the leader added (empty log: the
// leader sends a snapshot).
func (m *Machine) startJoined(cluster uint64) error {
	m.cluster = cluster
	m.st = raft.NewMemoryStorage()
	rn, err := raft.NewRawNode(m.raftConfig(0))
	if err != nil {
		return err
	}
	m.rn = rn
	m.fenceTick = 0
	m.dirty = true
	m.note("joined cluster", "cluster", fmt.Sprintf("%016x", cluster))
	return nil
}

// wipe forgets all state and starts over without it (removed from the
// configuration, or the losing side of a merge).
func (m *Machine) wipe(reason string) {
	m.note("wiping state and rejoining", "reason", reason)
	m.rn = nil
	m.st = nil
	m.cluster = 0
	m.members = map[uint64]memberInfo{}
	m.conf = nil
	m.applied = 0
	m.lead = nil
	m.leaseEnd = time.Time{}
	m.reads = map[string]time.Time{}
	m.hold.reset(0)
	m.ov, m.carry = nil, nil
	m.placed, m.placedFrom, m.placedTerm = nil, nil, 0
	m.id = deriveID(m.cfg.Name, m.now.Add(time.Duration(m.id)))
	m.joinCluster = 0
	m.lastJoin = time.Time{}
	m.prevState, m.prevTerm, m.prevLead = 0, 0, 0
	m.dirty = true
	// E ticks without votes from the new identity: it may not matter, but a
	// wipe must not open a hole.
	m.fenceTick = m.ticks + int64(m.cfg.ElectionTicks)
	m.noBootstrap = true
	m.wipedAt = m.now
}

func (m *Machine) note(msg string, attrs ...any) {
	m.notes = append(m.notes, Note{Msg: msg, Attrs: attrs})
}

// Step feeds one event at now and returns what the runtime must do.
func (m *Machine) Step(now time.Time, ev Event) Output {
	if now.Before(m.now) {
		now = m.now
	}
	m.now = now
	m.out = map[string]*envelope{}
	m.outOrder = nil
	m.notes, m.startNotes = m.startNotes, nil
	m.heldMemo = nil
	m.advance()
	switch e := ev.(type) {
	case Tick:
	case Receive:
		m.receive(e)
	case Health:
		if m.cfg.Role == Witness {
			break
		}
		if e.Healthy && !m.health {
			m.healthySince = now
		}
		m.health = e.Healthy
	case Want:
		m.want = append([]Address(nil), e.Addresses...)
		m.wantGen++
		sort.Slice(m.want, func(i, j int) bool { return m.want[i].Key < m.want[j].Key })
	case View:
		m.setView(e.Members)
	case Transfer:
		m.transferRequest(e.To, m.cfg.Name)
	case Leave:
		if !m.leaving {
			m.leaving = true
			m.note("leaving the cluster")
		}
	case Forget:
		m.forgetRequest(e.Name)
	case Unreachable:
		m.setReports(e.Reports)
	case Held:
		m.onHeld(e.Keys)
	}
	m.updateUnverified()
	m.drive()
	return m.output()
}

// gridOrigin is now moved back to the wall clock's last multiple of
// period (keeping now's monotonic reading: the grid moves with it, not
// with steps of the wall clock).
func gridOrigin(now time.Time, period time.Duration) time.Time {
	if period <= 0 {
		return now
	}
	return now.Add(-now.Sub(now.Truncate(period)))
}

// advance delivers the grid ticks that elapsed up to now.
func (m *Machine) advance() {
	target := int64(m.now.Sub(m.base) / m.cfg.Tick)
	for m.ticks < target {
		m.ticks++
		m.tickOnce()
	}
}

func (m *Machine) tickOnce() {
	if m.rn == nil {
		return
	}
	e := int64(m.cfg.ElectionTicks)
	if m.rn.BasicStatus().RaftState == raft.StateLeader {
		m.rn.Tick()
		m.ready()
		if m.ticks%int64(m.cfg.HeartbeatTicks) == 0 || m.renewalOverdue() {
			m.renew()
		}
		return
	}
	// Follower, candidate, pre-candidate: never let raft's own counter
	// reach its randomized timeout; forget the leader ourselves after E
	// silent ticks so raft's in-lease check lets votes through.
	if m.electionBound < e-1 {
		m.rn.Tick()
		m.electionBound++
		m.ready()
	}
	if m.ticks-m.lastLeaderTick >= e && m.rn.BasicStatus().Lead != raft.None {
		_ = m.rn.ForgetLeader()
		m.ready()
	}
}

// campaignTick is when this node campaigns next (0: never).
func (m *Machine) campaignTick() int64 {
	if m.rn == nil || !m.promotable() || m.leaving {
		return 0
	}
	if m.rn.BasicStatus().RaftState == raft.StateLeader {
		return 0
	}
	// Campaign timing is liveness only: voters refuse while they promised a
	// lease, whoever asks. A failed campaign (split votes, or a voter whose
	// promise to the old leader runs a little longer) is retried after an
	// eighth of an election timeout.
	e := int64(m.cfg.ElectionTicks)
	st := m.stagger()
	retry := max(2, e/8) // the campaign was lost: rejections from a majority
	if rs := m.rn.BasicStatus().RaftState; rs == raft.StateCandidate || rs == raft.StatePreCandidate {
		retry = e / 2 // answers may still be on their way
	}
	t := max(m.lastLeaderTick+e+st, m.lastCampaign+retry+2*st)
	return max(t, m.fenceTick)
}

func (m *Machine) promotable() bool {
	if m.conf == nil {
		return false
	}
	for _, v := range m.conf.Voters {
		if v == m.id {
			return true
		}
	}
	return false
}

// stagger delays this node's campaign by its rank among the voters it
// knows (1 tick per rank), so the node that should hold usually wins first.
func (m *Machine) stagger() int64 {
	if m.cfg.Role == Witness {
		return int64(m.cfg.ElectionTicks / 2)
	}
	rank := int64(0)
	me := candidate{name: m.cfg.Name, healthy: m.health, priority: m.cfg.Priority}
	for _, v := range m.conf.Voters {
		info, ok := m.members[v]
		if !ok || v == m.id || v == m.lastLead {
			continue // the silent leader is not a rival
		}
		md, ok := m.viewMeta[info.Name]
		if !ok {
			continue
		}
		if md.Role == Witness {
			continue
		}
		other := candidate{name: info.Name, healthy: md.Healthy, priority: md.Priority}
		if better(other, me, "control-plane") {
			rank++
		}
	}
	// ranks at least 20 ms and one tick apart: voters' promises end a
	// little apart (receipt times), and each node campaigns on its own
	// tick grid, up to one tick off another's (two nodes one rank apart
	// campaigned within a millisecond of each other and split the vote)
	unit := max(1, int64((20*time.Millisecond+m.cfg.Tick-1)/m.cfg.Tick)) + 1
	return min(rank*unit, int64(m.cfg.ElectionTicks/2))
}

func (m *Machine) maybeCampaign() {
	t := m.campaignTick()
	if t == 0 || m.ticks < t {
		return
	}
	m.lastCampaign = m.ticks
	m.note("campaigning", "term", m.rn.BasicStatus().GetTerm())
	_ = m.rn.Campaign()
	m.ready()
}

// drive runs the decisions that follow any event.
func (m *Machine) drive() {
	if m.left {
		return
	}
	if m.rn == nil {
		m.discover()
		return
	}
	m.maybeMerge()
	if m.rn == nil {
		m.discover()
		return
	}
	m.ready()
	m.maybeCampaign()
	if m.lead != nil {
		m.leaderDecide()
		if m.left {
			return
		}
		m.ready()
	} else if m.leaving || m.refused != "" {
		m.followerLeave()
	}
	m.ready()
}

// ready drains raft's Ready: storage, messages, committed entries, read
// states and role changes.
func (m *Machine) ready() {
	if m.rn == nil {
		return
	}
	for m.rn.HasReady() {
		rd := m.rn.Ready()
		if rd.Snapshot != nil && !raft.IsEmptySnap(rd.Snapshot) {
			if err := m.st.ApplySnapshot(rd.Snapshot); err == nil {
				m.restoreApp(rd.Snapshot.GetData())
				m.conf = rd.Snapshot.GetMetadata().GetConfState()
				m.applied = rd.Snapshot.GetMetadata().GetIndex()
				m.dirty = true
			}
		}
		if len(rd.Entries) > 0 {
			_ = m.st.Append(rd.Entries)
			m.dirty = true
		}
		if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
			_ = m.st.SetHardState(rd.HardState)
			m.dirty = true
		}
		for _, msg := range rd.Messages {
			m.queueRaft(msg)
		}
		for _, ent := range rd.CommittedEntries {
			m.apply(ent)
			if m.rn == nil {
				return // wiped
			}
		}
		for _, rs := range rd.ReadStates {
			m.readDone(string(rs.RequestCtx))
		}
		m.rn.Advance(rd)
		m.roleChange()
	}
	m.compact()
}

func (m *Machine) apply(ent *pb.Entry) {
	if ent.GetIndex() <= m.applied {
		return
	}
	m.applied = ent.GetIndex()
	m.dirty = true
	switch ent.GetType() {
	case pb.EntryConfChange, pb.EntryConfChangeV2:
		var cc pb.ConfChangeI
		if ent.GetType() == pb.EntryConfChange {
			c := &pb.ConfChange{}
			if err := unmarshalPB(ent.GetData(), c); err != nil {
				return
			}
			cc = c
		} else {
			c := &pb.ConfChangeV2{}
			if err := unmarshalPB(ent.GetData(), c); err != nil {
				return
			}
			cc = c
		}
		v2 := cc.AsV2()
		var info memberInfo
		_ = json.Unmarshal(v2.GetContext(), &info)
		for _, ch := range v2.GetChanges() {
			switch ch.GetType() {
			case pb.ConfChangeAddNode, pb.ConfChangeAddLearnerNode:
				if info.Name != "" {
					m.members[ch.GetNodeId()] = info
				}
			case pb.ConfChangeRemoveNode:
				delete(m.members, ch.GetNodeId())
			}
		}
		m.conf = m.rn.ApplyConfChange(cc)
		m.snapNeeded = true // a joiner's snapshot must include it
		if m.lead != nil {
			m.lead.confPending = false
		}
		removedSelf := true
		for _, v := range append(append([]uint64{}, m.conf.Voters...), m.conf.Learners...) {
			if v == m.id {
				removedSelf = false
			}
		}
		if removedSelf && len(m.conf.Voters) > 0 {
			m.hold.reset(0)
			if m.leaving {
				m.left = true
				m.note("left the cluster")
				m.lead = nil
				return
			}
			m.wipe("removed from the configuration")
		}
	}
}

// compact keeps the log short: the state is tiny (the configuration and
// the names of its members), so every applied entry becomes a snapshot.
func (m *Machine) compact() {
	if m.st == nil || m.applied == 0 {
		return
	}
	first, _ := m.st.FirstIndex()
	if m.applied < first+8 && !m.snapNeeded {
		return
	}
	m.snapNeeded = false
	if _, err := m.st.CreateSnapshot(m.applied, m.conf, m.appData()); err != nil {
		return
	}
	_ = m.st.Compact(m.applied)
	m.dirty = true
}

type appState struct {
	Cluster uint64                `json:"c"`
	Members map[uint64]memberInfo `json:"m"`
}

func (m *Machine) appData() []byte {
	b, _ := json.Marshal(appState{Cluster: m.cluster, Members: m.members})
	return b
}

func (m *Machine) restoreApp(b []byte) {
	var a appState
	if err := json.Unmarshal(b, &a); err != nil {
		return
	}
	if a.Members != nil {
		m.members = a.Members
	}
}

// roleChange reacts to raft's role, term and leader changes.
func (m *Machine) roleChange() {
	bs := m.rn.BasicStatus()
	state, term, lead := bs.RaftState, bs.GetTerm(), bs.Lead
	if state == m.prevState && term == m.prevTerm && lead == m.prevLead {
		return
	}
	// raft resets its election counter in becomeFollower, becomeCandidate
	// and becomeLeader (not becomePreCandidate).
	if term != m.prevTerm || (state != m.prevState && state != raft.StatePreCandidate) {
		m.electionBound = 0
	}
	wasLeader := m.prevState == raft.StateLeader
	m.prevState, m.prevTerm, m.prevLead = state, term, lead
	if lead != raft.None && lead != m.id {
		m.lastLead = lead
		m.leaderName = m.nameOf(lead)
	} else if lead == raft.None {
		m.leaderName = ""
	}
	if wasLeader && state != raft.StateLeader {
		// A former leader keeps its promise: no vote before its lease and
		// every grant it gave have ended.
		end := m.leaseEnd
		if m.lead != nil {
			for _, p := range m.lead.peers {
				if p.grantEnd.After(end) {
					end = p.grantEnd
				}
			}
		}
		for _, e := range m.hold.holds {
			if e.After(end) {
				end = e // what it holds on across a transfer (transfer.go)
			}
		}
		if end.After(m.fenceUntil) {
			m.fenceUntil = end
		}
		// the transferee was handed every running grant: its forced vote
		// may pass the fence
		m.fenceExcept = ""
		if m.lead != nil {
			m.fenceExcept = m.lead.transferTo
		}
		m.lastLeaderTick = m.ticks // no campaign for an election timeout
		m.lead = nil
		m.leaseEnd = time.Time{}
		m.reads = map[string]time.Time{}
		m.note("lost leadership", "term", term)
	}
	if state == raft.StateLeader && !wasLeader {
		m.becomeLeader()
	}
}

func (m *Machine) nameOf(id uint64) string {
	if info, ok := m.members[id]; ok {
		return info.Name
	}
	return m.routes[id]
}

func (m *Machine) idOf(name string) uint64 {
	var best uint64
	for id, info := range m.members {
		if info.Name == name {
			best = id
		}
	}
	return best
}

// renew starts a lease renewal round (leader, every HeartbeatTicks).
func (m *Machine) renew() {
	if m.lead == nil || m.lead.transferTo != "" {
		return
	}
	m.readSeq++
	// "term/seq", the bytes the voters echo (fmt's "%d/%d", without fmt:
	// it runs five times a second on the leader).
	ctx := strconv.AppendUint(append(strconv.AppendUint(make([]byte, 0, 24), m.rn.BasicStatus().GetTerm(), 10), '/'), m.readSeq, 10)
	m.reads[string(ctx)] = m.now
	m.renewed = m.now
	m.rn.ReadIndex(ctx)
	m.lead.beat = true
	m.ready()
}

// renewalOverdue: no majority answered the last renewal round within a
// tick (a heartbeat or its answers lost, or a voter slow to answer). The
// leader sends another round at once instead of waiting for the next
// renewal: a lost packet then costs the lease a tick, not a renewal
// interval, and the lease outlives several lost rounds in a row. Answered
// rounds cost nothing: on a healthy network the answers arrive within a
// millisecond and no retry goes out. A leader cut off from its majority
// retries every tick until raft's CheckQuorum makes it step down.
func (m *Machine) renewalOverdue() bool {
	return len(m.reads) > 0 && m.now.Sub(m.renewed) >= m.cfg.Tick/2
}

// readDone: a majority acknowledged the renewal ctx after it was sent.
func (m *Machine) readDone(ctx string) {
	sent, ok := m.reads[ctx]
	if !ok || m.lead == nil {
		return
	}
	for k, t := range m.reads {
		if !t.After(sent) {
			delete(m.reads, k)
		}
	}
	end := sent.Add(m.cfg.LeaseLength())
	if end.After(m.leaseEnd) {
		acquired := !m.leaseEnd.After(m.now)
		if acquired {
			m.note("lease acquired", "until", end)
		}
		m.leaseEnd = end
		if acquired {
			m.grantWaiting()
		}
		m.grantPending()
	}
}

func (m *Machine) leaseValid() bool {
	return m.lead != nil && m.lead.transferTo == "" && m.now.Before(m.leaseEnd)
}

// envelope for name, created on first use.
func (m *Machine) env(name string) *envelope {
	e, ok := m.out[name]
	if !ok {
		e = &envelope{}
		m.out[name] = e
		m.outOrder = append(m.outOrder, name)
	}
	return e
}

func (m *Machine) queueRaft(msg *pb.Message) {
	to := m.nameOf(msg.GetTo())
	if to == "" || to == m.cfg.Name {
		return
	}
	m.env(to).msgs = append(m.env(to).msgs, msg)
	if t := msg.GetType(); (t == pb.MsgVoteResp || t == pb.MsgPreVoteResp) && !msg.GetReject() {
		// this node backs a candidate: give it its round before campaigning
		// (a candidate this node rejects, e.g. one with an older log, does
		// not hold it back)
		m.lastCampaign = m.ticks
	}
	if msg.GetType() == pb.MsgSnap {
		// the snapshot is handed to the transport now; if it is lost, the
		// follower's next rejection makes raft probe (and send it) again
		m.rn.ReportSnapshot(msg.GetTo(), raft.SnapshotFinish)
	}
}

func (m *Machine) output() Output {
	out := Output{Notes: m.notes, Holds: m.holds()}
	// The step has changed what it will: until the next Step, what this
	// node holds is this (metaBytes and Status ask again).
	m.heldMemo = out.Holds
	out.Overlaps = m.overlaps(out.Holds)
	if m.dirty {
		out.Persist = m.persist()
		m.dirty = false
	}
	sort.Strings(m.outOrder) // deterministic: the simulator replays runs
	for _, name := range m.outOrder {
		e := m.out[name]
		e.h.From = m.cfg.Name
		e.h.ID = m.id
		e.h.Cluster = m.cluster
		if m.rn != nil {
			e.h.Term = m.rn.BasicStatus().GetTerm()
		}
		if m.lead != nil {
			e.h.Transfer = m.lead.transferTo
			if m.lead.transferTo == name {
				e.h.Handoff = m.lead.handoff(m)
			}
		}
		b, err := encode(e)
		if err != nil {
			m.note("dropping a message that does not encode", "to", name, "err", err)
			continue
		}
		out.Send = append(out.Send, Message{To: name, Data: b})
	}
	out.Notes = m.notes
	if md := m.metaBytes(); string(md) != string(m.lastMeta) {
		m.lastMeta = md
		out.Meta = md
	}
	out.Next = m.next()
	return out
}

// held is holds, from the last Step's output when there is one: the map
// is shared, and nobody writes to it.
func (m *Machine) held() map[string]time.Time {
	if m.heldMemo != nil {
		return m.heldMemo
	}
	return m.holds()
}

// holds: what this node may hold now, each until its end.
func (m *Machine) holds() map[string]time.Time {
	h := map[string]time.Time{}
	if m.left || m.cfg.Role == Witness {
		return h
	}
	if m.leaseValid() {
		for _, a := range m.want {
			if m.lead.assign[a.Key] == m.cfg.Name {
				h[a.Key] = m.leaseEnd
			}
		}
	}
	m.carryHolds(h)
	m.ovHolds(h)
	for k, end := range m.hold.holds {
		if end.After(m.now) && m.hold.keys[k] {
			if cur, ok := h[k]; !ok || end.After(cur) {
				h[k] = end
			}
		}
	}
	return h
}

// next is the earliest time a Tick matters.
func (m *Machine) next() time.Time {
	far := m.now.Add(time.Hour)
	best := far
	atTick := func(t int64) {
		if t <= m.ticks {
			t = m.ticks + 1
		}
		at := m.base.Add(time.Duration(t) * m.cfg.Tick)
		if at.Before(best) {
			best = at
		}
	}
	at := func(t time.Time) {
		if t.After(m.now) && t.Before(best) {
			best = t
		}
	}
	if m.rn == nil {
		if !m.left {
			at(m.start.Add(m.cfg.Discover))
			atTick(m.ticks + int64(m.cfg.ElectionTicks))
		}
		return best
	}
	e := int64(m.cfg.ElectionTicks)
	for _, o := range m.ov {
		at(o.until) // an overlap ends (transfer.go)
	}
	if m.lead != nil {
		h := int64(m.cfg.HeartbeatTicks)
		atTick((m.ticks/h + 1) * h)
		if len(m.reads) > 0 && m.lead.transferTo == "" {
			atTick(m.ticks + 1) // renewalOverdue
		}
		at(m.newLeaderPlaces()) // leader.go: newLeaderUnheard
		return best
	}
	if m.rn.BasicStatus().Lead != raft.None {
		atTick(m.lastLeaderTick + e)
	}
	if t := m.campaignTick(); t != 0 {
		atTick(t)
	}
	if m.leaving || m.refused != "" {
		atTick(m.ticks + e)
	}
	for _, end := range m.hold.holds {
		at(end)
	}
	return best
}

func unmarshalPB(b []byte, msg proto.Message) error {
	return proto.Unmarshal(b, msg)
}

// ClusterID is the id of the cluster this node belongs to (0: none yet).
func (m *Machine) ClusterID() uint64 { return m.cluster }
