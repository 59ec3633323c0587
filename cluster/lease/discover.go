package lease

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// meta is what a node publishes in memberlist metadata: enough for a node
// without state to find the cluster, and for two clusters to notice each
// other. It never decides who holds what.
type meta struct {
	// The keys avoid the previous releases' gossip metadata keys with
	// other types ("v", "l", "u"), so that their nodes can read this
	// metadata in a rolling upgrade (0.1.0 ignores a member whose
	// metadata does not decode) and see Holding as its claims.
	V        int    `json:"lv"`
	Cluster  uint64 `json:"c,omitempty"`
	ID       uint64 `json:"i,omitempty"`
	Role     Role   `json:"r,omitempty"`
	Leader   string `json:"ld,omitempty"`
	Term     uint64 `json:"t,omitempty"`
	Voters   int    `json:"n,omitempty"`
	VoterSum uint64 `json:"vh,omitempty"`
	Healthy  bool   `json:"h,omitempty"`
	Priority int    `json:"p,omitempty"`
	// Unreach: the addresses this node cannot reach through their
	// holder, "key holder" (unverified.go; at most MaxReports).
	Unreach []string `json:"ur,omitempty"`
	// Excl: the addresses this node is not eligible for now, unverified.
	Excl []string `json:"x,omitempty"`
	// Holding: the control-plane addresses this node holds, under the
	// key the gossip election of the previous releases reads its
	// members' claims from: their nodes defer to it (the upgrade
	// meeting, docs/lease.md).
	Holding []string `json:"v,omitempty"`
	Alive   bool     `json:"-"`
}

const metaVersion = 1

func (m *Machine) metaBytes() []byte {
	md := meta{V: metaVersion, ID: m.id, Role: m.cfg.Role, Healthy: m.health && m.cfg.Role == Voter, Priority: m.cfg.Priority, Unreach: m.reportsMeta(), Excl: m.exclMeta(), Holding: m.oldClaims()}
	if m.rn != nil && !m.left {
		bs := m.rn.BasicStatus()
		md.Cluster = m.cluster
		md.Term = bs.GetTerm()
		if bs.Lead == m.id {
			md.Leader = m.cfg.Name
		} else if bs.Lead != raft.None {
			md.Leader = m.nameOf(bs.Lead)
		}
		if m.conf != nil {
			md.Voters = len(m.conf.Voters)
			md.VoterSum = voterSum(m.conf.Voters, &m.metaMemo.ids)
		}
	}
	if m.metaMemo.b != nil && md.equal(m.metaMemo.md) {
		return m.metaMemo.b
	}
	b, _ := json.Marshal(md)
	m.metaMemo.md, m.metaMemo.b = md, b
	return b
}

// voterSum is the FNV-64a hash of the voter ids, sorted, each in decimal
// followed by a comma ("1,5,9,"): members compare it to see the same
// configuration. scratch is reused between calls (metaBytes runs at every
// step of the machine).
func voterSum(voters []uint64, scratch *[]uint64) uint64 {
	vs := append((*scratch)[:0], voters...)
	slices.Sort(vs)
	*scratch = vs
	h := fnv.New64a()
	var buf [24]byte
	for _, v := range vs {
		_, _ = h.Write(append(strconv.AppendUint(buf[:0], v, 10), ','))
	}
	return h.Sum64()
}

// equal: a and b encode the same (Alive is not encoded).
func (a meta) equal(b meta) bool {
	return a.V == b.V && a.Cluster == b.Cluster && a.ID == b.ID && a.Role == b.Role &&
		a.Leader == b.Leader && a.Term == b.Term && a.Voters == b.Voters &&
		a.VoterSum == b.VoterSum && a.Healthy == b.Healthy && a.Priority == b.Priority &&
		slices.Equal(a.Unreach, b.Unreach) && slices.Equal(a.Excl, b.Excl) &&
		slices.Equal(a.Holding, b.Holding)
}

// oldClaims are the control-plane addresses this node holds now, sorted.
func (m *Machine) oldClaims() []string {
	hs := m.held()
	var out []string
	for _, a := range m.want {
		if _, ok := hs[a.Key]; ok && a.Kind == ControlPlane {
			out = append(out, a.Key)
		}
	}
	sort.Strings(out)
	return out
}

func parseMeta(b []byte) (meta, bool) {
	var md meta
	if len(b) == 0 || b[0] != '{' {
		return md, false
	}
	if err := json.Unmarshal(b, &md); err != nil || md.V != metaVersion {
		return md, false
	}
	return md, true
}

// MetaHealthy reads whether the node that published metadata b reported
// its apiserver healthy (a voter; a witness never does); ok is false when
// b is not this election's metadata.
func MetaHealthy(b []byte) (healthy, ok bool) {
	md, ok := parseMeta(b)
	return md.Healthy, ok
}

func (m *Machine) setView(ms []Member) {
	m.view = append([]Member(nil), ms...)
	m.viewMeta = map[string]meta{}
	for _, mb := range ms {
		if mb.Name == m.cfg.Name {
			continue
		}
		if md, ok := parseMeta(mb.Meta); ok {
			md.Alive = mb.Alive
			m.viewMeta[mb.Name] = md
		}
	}
	m.maybeMerge()
}

// clusterView is what the metadata shows of one cluster.
type clusterView struct {
	id     uint64
	led    bool // a live member names a leader
	voters int
}

// wins is the deterministic comparison of two clusters that meet: one
// with a leader beats one without, then more voters, then the lower id.
func (a clusterView) wins(b clusterView) bool {
	if a.led != b.led {
		return a.led
	}
	if a.voters != b.voters {
		return a.voters > b.voters
	}
	return a.id < b.id
}

// clusters seen in the view.
func (m *Machine) clusters() map[uint64]clusterView {
	cs := map[uint64]clusterView{}
	for _, md := range m.viewMeta {
		if !md.Alive || md.Cluster == 0 {
			continue
		}
		c := cs[md.Cluster]
		c.id = md.Cluster
		c.led = c.led || md.Leader != ""
		c.voters = max(c.voters, md.Voters)
		cs[md.Cluster] = c
	}
	return cs
}

// maybeMerge: a live member of another cluster whose cluster wins the
// comparison makes this node wipe its state and join that cluster.
func (m *Machine) maybeMerge() {
	if m.rn == nil || m.cluster == 0 {
		return
	}
	mine := clusterView{id: m.cluster} // a joiner that never received the configuration counts none
	if m.conf != nil {
		mine.voters = len(m.conf.Voters)
	}
	mine.led = m.rn.BasicStatus().Lead != raft.None
	if c, ok := m.clusters()[m.cluster]; ok {
		mine.led = mine.led || c.led
		mine.voters = max(mine.voters, c.voters)
	}
	best := mine
	for _, c := range m.clusters() {
		if c.id != m.cluster && c.wins(best) {
			best = c
		}
	}
	if best.id != m.cluster {
		m.note("another cluster wins the merge: joining it", "cluster", fmt.Sprintf("%016x", best.id))
		m.wipe("merging into another cluster")
	}
}

// discover: a node without state looks for a cluster to join, or
// bootstraps one when it is the lowest name among the stateless nodes it
// sees once the discovery window has passed.
func (m *Machine) discover() {
	var bc clusterView
	for _, c := range m.clusters() {
		if c.led && (bc.id == 0 || c.wins(bc)) {
			bc = c
		}
	}
	best := bc.id
	if best != 0 {
		if m.joinCluster != best {
			m.joinCluster = best
			m.lastJoin = time.Time{}
			m.refused = ""
		}
		if !m.lastJoin.IsZero() && m.now.Sub(m.lastJoin) < m.electionTimeout() {
			return
		}
		// ask the leader if it is in view, else every member of the cluster
		var to []string
		for name, md := range m.viewMeta {
			if md.Alive && md.Cluster == best && md.Leader == name {
				to = []string{name}
			}
		}
		if to == nil {
			for name, md := range m.viewMeta {
				if md.Alive && md.Cluster == best {
					to = append(to, name)
				}
			}
			sort.Strings(to)
		}
		m.lastJoin = m.now
		for _, n := range to {
			m.env(n).h.Join = &join{Name: m.cfg.Name, ID: m.id, Role: m.cfg.Role}
		}
		return
	}
	if m.now.Before(m.start.Add(m.cfg.Discover)) || (m.noBootstrap && m.now.Before(m.wipedAt.Add(5*m.cfg.Discover))) {
		return
	}
	for name, md := range m.viewMeta {
		if md.Alive && md.Cluster == 0 && name < m.cfg.Name {
			return // the lowest stateless name bootstraps
		}
	}
	if err := m.bootstrap(); err != nil {
		m.note("bootstrap failed", "err", err)
		return
	}
	m.ready()
}

// persisted state: raft's hard state, snapshot and log, plus identity.
type persistState struct {
	V       int      `json:"v"`
	Name    string   `json:"name"`
	ID      uint64   `json:"id"`
	Cluster uint64   `json:"cluster"`
	Hard    []byte   `json:"hard,omitempty"`
	Snap    []byte   `json:"snap,omitempty"`
	Ents    [][]byte `json:"ents,omitempty"`
}

const persistVersion = 1

func (m *Machine) persist() []byte {
	ps := persistState{V: persistVersion, Name: m.cfg.Name, ID: m.id, Cluster: m.cluster}
	if m.st != nil {
		hs, _, _ := m.st.InitialState()
		ps.Hard, _ = proto.Marshal(hs)
		if snap, err := m.st.Snapshot(); err == nil {
			ps.Snap, _ = proto.Marshal(snap)
		}
		first, _ := m.st.FirstIndex()
		last, _ := m.st.LastIndex()
		if last >= first {
			ents, _ := m.st.Entries(first, last+1, 1<<30)
			for _, e := range ents {
				b, _ := proto.Marshal(e)
				ps.Ents = append(ps.Ents, b)
			}
		}
	}
	b, _ := json.Marshal(ps)
	return b
}

func (m *Machine) restore(b []byte) error {
	var ps persistState
	if err := json.Unmarshal(b, &ps); err != nil {
		return fmt.Errorf("lease: state does not parse (%v): remove the state file to rejoin as a new member", err)
	}
	if ps.V != persistVersion {
		return fmt.Errorf("lease: state version %d, this release reads %d: remove the state file to rejoin as a new member", ps.V, persistVersion)
	}
	if ps.Name != m.cfg.Name {
		return fmt.Errorf("lease: state belongs to node %q, this node is %q: remove the state file to rejoin as a new member", ps.Name, m.cfg.Name)
	}
	m.id, m.cluster = ps.ID, ps.Cluster
	if m.cluster == 0 || m.id == 0 {
		m.id = m.cfg.Incarnation
		if m.id == 0 {
			m.id = deriveID(m.cfg.Name, m.now)
		}
		return nil // state without raft: start over
	}
	m.st = raft.NewMemoryStorage()
	snap := &pb.Snapshot{}
	if err := proto.Unmarshal(ps.Snap, snap); err != nil {
		return fmt.Errorf("lease: state snapshot does not parse: %w", err)
	}
	if !raft.IsEmptySnap(snap) {
		if err := m.st.ApplySnapshot(snap); err != nil {
			return fmt.Errorf("lease: state snapshot: %w", err)
		}
		m.restoreApp(snap.GetData())
		m.conf = snap.GetMetadata().GetConfState()
		m.applied = snap.GetMetadata().GetIndex()
	}
	var ents []*pb.Entry
	for _, eb := range ps.Ents {
		e := &pb.Entry{}
		if err := proto.Unmarshal(eb, e); err != nil {
			return fmt.Errorf("lease: state log entry does not parse: %w", err)
		}
		ents = append(ents, e)
	}
	if len(ents) > 0 {
		if err := m.st.Append(ents); err != nil {
			return fmt.Errorf("lease: state log: %w", err)
		}
	}
	hs := &pb.HardState{}
	if err := proto.Unmarshal(ps.Hard, hs); err != nil {
		return fmt.Errorf("lease: state hard state does not parse: %w", err)
	}
	if err := m.st.SetHardState(hs); err != nil {
		return fmt.Errorf("lease: state hard state: %w", err)
	}
	rn, err := raft.NewRawNode(m.raftConfig(m.applied))
	if err != nil {
		return fmt.Errorf("lease: state: %w", err)
	}
	m.rn = rn
	bs := rn.BasicStatus()
	m.prevState, m.prevTerm = bs.RaftState, bs.GetTerm()
	return nil
}

// Status returns a snapshot of the machine.
func (m *Machine) Status() Status {
	s := Status{Name: m.cfg.Name, ClusterID: m.cluster, ID: m.id, Healthy: m.health, Leaving: m.leaving, Removed: m.left, Holders: map[string]string{}, Holds: m.held(), Unverified: m.UnverifiedStatus()}
	if m.rn == nil {
		s.State = "Discovering"
		return s
	}
	bs := m.rn.BasicStatus()
	s.Term = bs.GetTerm()
	s.State = bs.RaftState.String()
	if bs.Lead == m.id {
		s.Leader = m.cfg.Name
	} else {
		s.Leader = m.nameOf(bs.Lead)
	}
	if m.conf != nil {
		for _, v := range m.conf.Voters {
			n := m.nameOf(v)
			if m.members[v].Role == Witness {
				s.Witnesses = append(s.Witnesses, n)
			} else {
				s.Voters = append(s.Voters, n)
			}
		}
		for _, v := range m.conf.Learners {
			s.Learners = append(s.Learners, m.nameOf(v))
		}
	}
	sort.Strings(s.Voters)
	sort.Strings(s.Witnesses)
	sort.Strings(s.Learners)
	if m.leaseValid() {
		s.LeaseUntil = m.leaseEnd
		s.Quorum = true
		for k, n := range m.lead.assign {
			s.Holders[k] = n
		}
		s.From = maps.Clone(m.lead.from)
	} else if m.lead == nil && bs.Lead != raft.None && m.ticks-m.lastLeaderTick < int64(m.cfg.ElectionTicks) {
		s.Quorum = true
		if m.placedTerm == bs.GetTerm() {
			for k, n := range m.placed {
				if n != m.cfg.Name {
					s.Holders[k] = n
				}
			}
		}
		for k := range m.hold.keys {
			s.Holders[k] = m.cfg.Name
		}
	}
	if m.lead == nil {
		// What the last leader said (also while a transfer makes this
		// node a candidate): the runtime names a giver only if it is the
		// holder it last knew.
		s.From = maps.Clone(m.placedFrom)
	}
	return s
}
