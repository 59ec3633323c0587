package lease

import (
	"bytes"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// stateWentBack is the wipe's reason when what the cluster sends shows
// that this node's state went back in time.
const stateWentBack = "the lease state went back in time (a reverted VM, a restored backup)"

// campaignTransfer is raft's context of a forced (transfer) vote.
var campaignTransfer = []byte("CampaignTransfer")

func (m *Machine) receive(r Receive) {
	e, err := decode(r.Data)
	if err != nil {
		m.note("dropped a message that does not decode", "from", r.From, "err", err)
		return
	}
	h := &e.h
	if h.From == "" || h.From == m.cfg.Name {
		return
	}
	if h.ID != 0 {
		m.routes[h.ID] = h.From
	}
	if m.left {
		return
	}
	// Requests any member forwards to the leader, whatever its state.
	if h.Join != nil || h.Leave != "" || h.Forget != "" || h.Handover != "" {
		m.request(h)
	}
	if m.rn == nil {
		if h.JoinRefused != "" && h.Cluster == m.joinCluster {
			if m.refused == "" {
				m.note("join refused", "by", h.From, "reason", h.JoinRefused)
			}
			m.refused = h.JoinRefused
			return
		}
		joined := false
		for _, msg := range e.msgs {
			if msg.GetTo() == m.id && h.Cluster != 0 && h.Cluster == m.joinCluster {
				joined = true
			}
		}
		if !joined {
			return
		}
		if err := m.startJoined(h.Cluster); err != nil {
			m.note("cannot start raft", "err", err)
			return
		}
		m.refused = ""
	}
	if h.Cluster != m.cluster {
		// Another cluster: the View decides whether to merge.
		return
	}
	if h.Removed == m.id && h.Term >= m.rn.BasicStatus().GetTerm() && !m.leaving {
		m.wipe("the leader says this node is not in the configuration")
		return
	}
	bs := m.rn.BasicStatus()
	fromLeader := false
	for _, msg := range e.msgs {
		switch msg.GetType() {
		case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap:
			if msg.GetTerm() >= bs.GetTerm() {
				fromLeader = true
			}
		}
	}
	if fromLeader || (h.From == m.leaderName && h.Term == bs.GetTerm()) {
		m.leaderTransfer = h.Transfer
		m.answerHeldVote()
	}
	if m.lead != nil && h.Ack != nil {
		// the sender is alive even if its ack is for an older term
		if p := m.lead.peer(h.From); p != nil {
			p.lastHeard = m.now
		}
	}
	known := m.knownID(h.ID)
	for _, msg := range e.msgs {
		if msg.GetTo() != m.id {
			continue
		}
		t := msg.GetType()
		if !known && m.lead != nil && m.membersKnown() && (t == pb.MsgVote || t == pb.MsgPreVote || t == pb.MsgHeartbeatResp || t == pb.MsgAppResp) {
			// a node removed from the configuration (e.g. during a partition)
			// must wipe and rejoin
			rm := m.env(h.From)
			rm.h.Removed = h.ID
			continue
		}
		if (t == pb.MsgVote || t == pb.MsgPreVote) && m.refuseVote(msg, h) {
			m.holdVote(msg, h)
			continue
		}
		if t == pb.MsgTimeoutNow && (h.Transfer != m.cfg.Name || h.Handoff == nil || msg.GetTerm() != m.rn.BasicStatus().GetTerm()) {
			m.note("ignored a transfer the sender does not announce", "from", h.From)
			continue
		}
		if t == pb.MsgTimeoutNow {
			m.takeHandoff(h.From, h.Handoff)
		}
		before := m.rn.BasicStatus().GetTerm()
		if m.lead != nil && !known && msg.GetTerm() == before && (t == pb.MsgHeartbeat || t == pb.MsgApp || t == pb.MsgSnap) {
			// Another leader of this cluster in this node's own term,
			// whose configuration has this node while this node's has
			// not it: one term has one leader, so this node's state went
			// back in time (a first node back at its bootstrap state,
			// the single voter of a configuration of itself) and it
			// forked the cluster. raft ignores the other's heartbeats,
			// and both would lead on after a partition healed.
			m.note("another leader of this cluster in this term, unknown to this node's configuration", "leader", h.From, "term", before)
			m.wipe(stateWentBack)
			return
		}
		if m.forkTerm != 0 && msg.GetTerm() == m.forkTerm && (t == pb.MsgApp || t == pb.MsgHeartbeat || t == pb.MsgSnap) {
			// That leader counts this node's old log as acknowledged
			// for its whole term (raft never lowers what a follower
			// matched): its heartbeats would commit entries this node
			// dropped. Silent, this node leaves it without this vote;
			// the next term's leader starts from a snapshot.
			continue
		}
		if m.forkTerm != 0 && msg.GetTerm() > m.forkTerm {
			m.forkTerm = 0
		}
		if t == pb.MsgHeartbeat && msg.GetTerm() >= before {
			// A leader's heartbeat commits at most what this node
			// acknowledged, and this node saves before it acknowledges.
			// A commit past its log means its state went back in time (a
			// VM reverted to a snapshot, a state directory restored from
			// a backup): raft would panic here, and the term and vote it
			// resumed cannot be trusted either. It rejoins as a new
			// incarnation, as after a lost disk.
			if last, err := m.st.LastIndex(); err == nil && msg.GetCommit() > last {
				m.note("the leader commits entries this node no longer has", "leader", h.From, "commit", msg.GetCommit(), "last_index", last)
				m.wipe(stateWentBack)
				return
			}
		}
		if (t == pb.MsgApp || t == pb.MsgSnap) && msg.GetTerm() >= before {
			if at, ok := m.forkedAt(msg); ok {
				// A leader's log agrees with every entry a majority
				// committed; this one replaces an entry this node knows
				// committed. One side's state went back in time (this
				// node's, or the leader's: a node that led, was reverted
				// to before it had, and leads again). raft would panic on
				// an entry, or trade rejections with the leader without
				// end on the entry before. This node gives way: it drops
				// its log and takes the leader's (a snapshot), keeping its
				// id, term and vote. A new incarnation would not do: the
				// leader's configuration may count this id among the
				// voters it needs.
				m.note("the leader's log replaces entries this node knows committed: taking the leader's", "leader", h.From, "index", at)
				m.forkTerm = msg.GetTerm()
				if err := m.dropLog(); err != nil {
					m.note("cannot restart raft", "err", err)
					m.wipe(stateWentBack)
					return
				}
				continue
			}
		}
		if err := m.rn.Step(msg); err != nil {
			continue
		}
		switch t {
		case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap:
			if msg.GetTerm() >= before {
				m.lastLeaderTick = m.ticks
				m.electionBound = 0
			}
		}
		m.ready()
		if m.rn == nil {
			return
		}
	}
	if h.Placed != nil && m.lead == nil && h.Placed.Term == m.rn.BasicStatus().GetTerm() {
		// one leader per term: this term's placement
		m.placed, m.placedFrom, m.placedTerm = h.Placed.Holders, h.Placed.From, h.Placed.Term
	}
	if h.Assign != nil && h.Cluster == m.cluster {
		m.onAssign(h.From, h.Assign)
	}
	if h.Grant != nil && h.Cluster == m.cluster {
		m.onGrant(h.Grant)
	}
	if h.Ack != nil && m.lead != nil {
		m.onAck(h.From, h.Ack)
	}
	if len(h.OvDone) > 0 {
		m.onOvDone(h.From, h.OvDone)
	}
}

// dropLog empties this node's log and configuration and restarts raft with
// its term and vote: the leader sends a snapshot, as to a joiner. Whatever
// it held under the old log's leaders is released.
func (m *Machine) dropLog() error {
	hs := &pb.HardState{Term: new(m.rn.BasicStatus().GetTerm()), Vote: new(m.rn.BasicStatus().GetVote())}
	st := raft.NewMemoryStorage()
	if err := st.SetHardState(hs); err != nil {
		return err
	}
	m.st = st
	m.conf = nil
	m.members = map[uint64]memberInfo{}
	m.applied = 0
	m.lead = nil
	m.leaseEnd = time.Time{}
	m.hold.reset(0)
	m.ov, m.carry = nil, nil
	rn, err := raft.NewRawNode(m.raftConfig(0))
	if err != nil {
		return err
	}
	m.rn = rn
	bs := rn.BasicStatus()
	m.prevState, m.prevTerm, m.prevLead = bs.RaftState, bs.GetTerm(), bs.Lead
	m.dirty = true
	return nil
}

// forkedAt reports the first index at which msg (an append or a
// snapshot from a leader) differs from an entry this node knows committed.
// Entries compacted into this node's snapshot are not compared, but the
// snapshot's own index is.
func (m *Machine) forkedAt(msg *pb.Message) (uint64, bool) {
	committed := m.rn.BasicStatus().GetCommit()
	differs := func(index, term uint64) bool {
		if index == 0 || index > committed {
			return false
		}
		ours, err := m.st.Term(index)
		return err == nil && ours != term
	}
	if msg.GetType() == pb.MsgSnap {
		md := msg.GetSnapshot().GetMetadata()
		if differs(md.GetIndex(), md.GetTerm()) {
			return md.GetIndex(), true
		}
		return 0, false
	}
	if differs(msg.GetIndex(), msg.GetLogTerm()) {
		return msg.GetIndex(), true
	}
	for _, e := range msg.GetEntries() {
		if differs(e.GetIndex(), e.GetTerm()) {
			return e.GetIndex(), true
		}
	}
	return 0, false
}

func (m *Machine) knownID(id uint64) bool {
	if id == 0 {
		return true
	}
	_, ok := m.members[id]
	return ok
}

// membersKnown: the configuration is applied (not a fresh joiner).
func (m *Machine) membersKnown() bool { return m.conf != nil && len(m.conf.Voters) > 0 }

// refuseVote is this machine's vote fence, on top of raft's in-lease check.
func (m *Machine) refuseVote(msg *pb.Message, h *header) bool {
	if m.ticks < m.fenceTick {
		m.note("refused a vote: restarted less than an election timeout ago", "from", h.From)
		return true
	}
	if m.now.Before(m.fenceUntil) && !(m.fenceExcept == h.From && bytes.Equal(msg.GetContext(), campaignTransfer)) {
		m.note("refused a vote: former leader's lease or grants still run", "from", h.From)
		return true
	}
	if msg.GetTerm() <= m.rn.BasicStatus().GetTerm() {
		return false // raft answers (a rejection, or a repeat of its vote)
	}
	if m.lead != nil && m.lead.transferTo != h.From {
		return true // a leader with or without lease never helps another
	}
	inLease := m.ticks-m.lastLeaderTick < int64(m.cfg.ElectionTicks)
	if !inLease {
		return false
	}
	if bytes.Equal(msg.GetContext(), campaignTransfer) && (m.leaderTransfer == h.From || m.fenceExcept == h.From) {
		return false // the transfer our leader announced
	}
	if m.lead != nil && m.lead.transferTo == h.From && bytes.Equal(msg.GetContext(), campaignTransfer) {
		return false
	}
	return true
}

// heldVote is a transfer campaign's vote request this voter refused only
// because its leader's announcement of that transfer had not arrived yet:
// the leader sends the announcement and the transferee's MsgTimeoutNow
// together, and the transferee's votes may overtake the announcement.
// Refused outright, the transfer failed and the cluster waited out the
// leader's lease for an election (the simulator, 5 nodes, a graceful stop:
// kept pool addresses without a holder for 500 to 850 ms).
type heldVote struct {
	msg  *pb.Message
	h    *header
	term uint64 // this node's term when it came
	at   time.Time
}

// holdVote keeps a refused transfer vote for up to a tick, to be answered
// if the announcement follows (answerHeldVote). The decision is the same
// rule (refuseVote), taken when this node knows what its leader announced.
func (m *Machine) holdVote(msg *pb.Message, h *header) {
	if msg.GetType() != pb.MsgVote || !bytes.Equal(msg.GetContext(), campaignTransfer) || m.leaderTransfer != "" || m.lead != nil {
		return
	}
	m.heldVote = &heldVote{msg: msg, h: h, term: m.rn.BasicStatus().GetTerm(), at: m.now}
}

// answerHeldVote: our leader's header arrived; a held vote request from
// the transferee it announces is stepped now, one from anyone else dropped.
func (m *Machine) answerHeldVote() {
	v := m.heldVote
	if v == nil {
		return
	}
	m.heldVote = nil
	if v.h.From != m.leaderTransfer || m.now.Sub(v.at) > m.cfg.Tick || m.rn.BasicStatus().GetTerm() != v.term {
		return
	}
	if m.refuseVote(v.msg, v.h) {
		return
	}
	if err := m.rn.Step(v.msg); err == nil {
		m.ready()
	}
}

// --- grantee side ---

func (s *holderState) reset(term uint64) {
	s.term = term
	s.gen = 0
	s.keys = map[string]bool{}
	s.sent = map[uint64]ackSent{}
	s.holds = map[string]time.Time{}
}

func (m *Machine) onAssign(from string, a *assign) {
	if m.lead != nil || a.Term < m.hold.term || a.Term < m.rn.BasicStatus().GetTerm() {
		return
	}
	if a.Term > m.hold.term {
		keep := m.hold.holds
		keys := m.hold.keys
		m.hold.reset(a.Term)
		// grants of an older term ran out before this leader was elected,
		// except those a transfer handed over: keep them, the new leader
		// assigned them to this node (or does so now)
		if a.Full {
			for _, k := range a.Keys {
				if keys[k] {
					m.hold.holds[k] = keep[k]
				}
			}
		}
	}
	m.hold.from = from
	if a.Gen >= m.hold.gen && a.Full {
		m.hold.gen = a.Gen
		m.hold.keys = map[string]bool{}
		for _, k := range a.Keys {
			m.hold.keys[k] = true
		}
		for k, end := range m.hold.holds {
			if !m.hold.keys[k] {
				if o, ok := a.Ov[k]; ok {
					// a planned transfer: keep it a bounded while (transfer.go)
					m.ovOld(k, o.Peer, end, time.Duration(o.O))
				}
				delete(m.hold.holds, k) // released now, before the ack says so
			}
		}
		for _, k := range a.Keys {
			if o, ok := a.Ov[k]; ok && o.Peer != m.cfg.Name {
				m.ovNew(k, o.Peer, time.Duration(o.O))
			}
		}
	}
	m.hold.seq++
	m.hold.sent[m.hold.seq] = ackSent{at: m.now, gen: m.hold.gen}
	delete(m.hold.sent, m.hold.seq-32)
	var hf int64
	if m.health {
		hf = int64(m.now.Sub(m.healthySince))
	}
	m.env(from).h.Ack = &ack{Term: m.hold.term, Seq: m.hold.seq, Gen: m.hold.gen, Healthy: m.health && m.cfg.Role == Voter, HealthyFor: hf, Priority: m.cfg.Priority, Role: m.cfg.Role, Leaving: m.leaving, Boot: m.start.UnixNano(), OvHeld: m.ovHeldKeys()}
}

func (m *Machine) onGrant(g *grant) {
	if m.lead != nil || g.Term != m.hold.term || g.Gen != m.hold.gen || m.cfg.Role == Witness || m.leaving {
		return
	}
	s, ok := m.hold.sent[g.Seq]
	if !ok || s.gen != g.Gen || g.D <= 0 {
		return
	}
	d := min(time.Duration(g.D), m.cfg.GrantFor)
	end := s.at.Add(d)
	if !end.After(m.now) {
		return
	}
	for k := range m.hold.keys {
		if cur := m.hold.holds[k]; end.After(cur) {
			m.hold.holds[k] = end
		}
	}
}

// takeHandoff: this node becomes leader by transfer; the old leader's
// grants to others may still run for h.For (its clock).
func (m *Machine) takeHandoff(from string, h *handoff) {
	k := (1 + m.cfg.Drift) / (1 - m.cfg.Drift)
	until := m.now.Add(time.Duration(float64(h.For) * k))
	m.pendingHandoff = &pendingHandoff{holders: h.Holders, until: until, from: from}
}

type pendingHandoff struct {
	holders map[string]string
	until   time.Time
	from    string
}

var _ = raft.None
