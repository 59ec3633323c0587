package lease

import (
	"encoding/json"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// leaderState is what only the leader keeps: who holds what, and what it
// knows of each member from their acks.
type leaderState struct {
	term      uint64
	since     time.Time
	peers     map[string]*peerState
	assign    map[string]string // key -> node that holds it (or is being granted it)
	releasing map[string]release
	from      map[string]string // key -> the node that let it go for its holder (a planned move)
	eligSince map[string]time.Time
	placed    placeKey // what the last placement pass decided on
	redo      bool     // a move waited in the last pass: the next one runs whatever changed
	beat      bool

	transferTo   string
	transferAt   time.Time
	lastTransfer time.Time
	handover     string    // a requested holder of the control-plane addresses
	handoverBy   time.Time // a request for a node not eligible yet lapses then (zero: none)

	confPending bool
	confAt      time.Time
	joins       []join
	leaves      map[string]uint64 // name -> raft id of the incarnation that leaves (0: any)
	forgets     map[string]bool
}

// PoolSettle is how long a node must have been eligible before pool and
// egress addresses whose rendezvous winner it is move to it (a joining node
// is ready before it gets its share; one move per address, not a flap).
const PoolSettle = 2 * time.Second

type peerState struct {
	name         string
	lastHeard    time.Time
	acked        bool
	healthy      bool
	healthySince time.Time
	priority     int
	role         Role
	leaving      bool

	gen        uint64
	sentGen    uint64
	keys       map[string]bool
	ackedGen   uint64 // gen of the latest ack (by Seq)
	ackSeq     uint64
	ackAt      time.Time // when the ack ackSeq arrived (this leader's clock)
	boot       int64
	grantedGen uint64
	grantEnd   time.Time // leader's clock: every grant it gave ends before this
	heldTo     time.Time // leader's clock, about: when p's hold from the grants sent so far ends (liveness only)
	pending    *grant
	ov         map[string]ovSpec // planned transfers' specs for its next full assignment (transfer.go)
	ovHeld     map[string]bool   // keys it still holds in an overlap (its latest ack)

	placedSig string    // the placement last sent (placed)
	placedAt  time.Time // when
}

// placedRefresh: a follower hears the placement again this often even if
// it did not change (a lost message is repaired).
const placedRefresh = 5 * time.Second

// placement is who holds each control-plane and egress address (an
// address on its way from A to B is A's until A let go), and a signature
// of it. Pool addresses are left out: there may be thousands, and their
// status is each holder's own.
func (m *Machine) placement() (holders, from map[string]string, sig string) {
	l := m.lead
	holders, from = map[string]string{}, map[string]string{}
	for _, a := range m.want {
		if a.Kind == Pool {
			continue
		}
		if r, ok := l.releasing[a.Key]; ok {
			holders[a.Key] = r.from
		} else if n := l.assign[a.Key]; n != "" {
			holders[a.Key] = n
			if f := l.from[a.Key]; f != "" {
				from[a.Key] = f
			}
		}
	}
	var b strings.Builder
	for _, k := range sortedKeys(holders) {
		b.WriteString(k + "=" + holders[k] + "<" + from[k] + ",")
	}
	return holders, from, b.String()
}

type release struct {
	from  string
	gen   uint64
	until time.Time
	ovTo  string // a planned transfer's successor (transfer.go)
}

func (l *leaderState) peer(name string) *peerState { return l.peers[name] }

func (l *leaderState) releasingFrom(name string) bool {
	for _, r := range l.releasing {
		if r.from == name {
			return true
		}
	}
	return false
}

func (m *Machine) becomeLeader() {
	l := &leaderState{
		term:      m.rn.BasicStatus().GetTerm(),
		since:     m.now,
		peers:     map[string]*peerState{},
		assign:    map[string]string{},
		releasing: map[string]release{},
		from:      map[string]string{},
		eligSince: map[string]time.Time{},
		leaves:    map[string]uint64{},
		forgets:   map[string]bool{},
	}
	m.lead = l
	m.keepGrantsAsLeader(l)
	m.syncPeers()
	if h := m.pendingHandoff; h != nil && h.until.After(m.now) {
		for k, n := range h.holders {
			if n == m.cfg.Name {
				continue // this node released its own grants above
			}
			p := l.peers[n]
			if p == nil {
				// not a member any more: nobody gets k before its grant ran out
				l.releasing[k] = release{from: n, gen: ^uint64(0), until: h.until}
				continue
			}
			l.assign[k] = n
			p.keys[k] = true
			p.gen = 1
			if h.until.After(p.grantEnd) {
				p.grantEnd = h.until
			}
		}
	}
	if h := m.pendingHandoff; h != nil {
		// A planned transfer: what the old leader held itself, and what
		// it had moved planned, moved planned.
		for k, n := range m.placedFrom {
			l.from[k] = n
		}
		for k, n := range m.placed {
			if n == h.from {
				l.from[k] = h.from
			}
		}
	}
	m.pendingHandoff = nil
	m.reads = map[string]time.Time{}
	m.note("became leader", "term", l.term)
	m.renew()
}

// syncPeers keeps one peerState per member other than this node.
func (m *Machine) syncPeers() {
	l := m.lead
	names := map[string]bool{}
	for id, info := range m.members {
		if id == m.id {
			continue
		}
		names[info.Name] = true
		if _, ok := l.peers[info.Name]; !ok {
			l.peers[info.Name] = &peerState{name: info.Name, lastHeard: m.now, role: info.Role, keys: map[string]bool{}}
		}
	}
	for n, p := range l.peers {
		if !names[n] {
			for k := range p.keys {
				delete(l.assign, k)
				l.releasing[k] = release{from: n, gen: ^uint64(0), until: p.grantEnd}
			}
			delete(l.peers, n)
		}
	}
}

func (m *Machine) electionTimeout() time.Duration {
	return time.Duration(m.cfg.ElectionTicks) * m.cfg.Tick
}

func (m *Machine) alive(p *peerState) bool {
	return m.now.Sub(p.lastHeard) < m.electionTimeout()
}

func (m *Machine) isVoter(id uint64) bool {
	for _, v := range m.conf.Voters {
		if v == id {
			return true
		}
	}
	return false
}

// eligible: may hold addresses (healthy voter, alive, not leaving).
func (m *Machine) eligible(name string) bool {
	if name == m.cfg.Name {
		return m.cfg.Role == Voter && m.health && !m.leaving && m.isVoter(m.id)
	}
	p := m.lead.peers[name]
	return p != nil && p.acked && p.role == Voter && p.healthy && !p.leaving && m.alive(p) && m.isVoter(m.idOf(name))
}

type candidate struct {
	name     string
	healthy  bool
	priority int
}

// better ranks a over b for key: healthy first, then priority, then the
// rendezvous hash of (name, key).
func better(a, b candidate, key string) bool {
	if a.healthy != b.healthy {
		return a.healthy
	}
	if a.priority != b.priority {
		return a.priority > b.priority
	}
	ha, hb := rendezvous(a.name, key), rendezvous(b.name, key)
	if ha != hb {
		return ha > hb
	}
	return a.name < b.name
}

func rendezvous(name, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(key))
	x := h.Sum64()
	// finalise (fnv's low bits mix poorly for similar inputs)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

func (m *Machine) candidateOf(name string) candidate {
	if name == m.cfg.Name {
		return candidate{name: name, healthy: m.health, priority: m.cfg.Priority}
	}
	p := m.lead.peers[name]
	return candidate{name: name, healthy: p.healthy, priority: p.priority}
}

func (m *Machine) eligibleNames() []string {
	var out []string
	if m.eligible(m.cfg.Name) {
		out = append(out, m.cfg.Name)
	}
	for n := range m.lead.peers {
		if m.eligible(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// controlPlaneHolder: keep the current holder unless a higher-priority
// node has been healthy for PreemptDelay; otherwise the best ranked.
func (m *Machine) controlPlaneHolder(elig []string) string {
	l := m.lead
	if l.handover != "" && m.eligible(l.handover) && (l.handoverBy.IsZero() || !m.now.After(l.handoverBy)) && m.fresh(l.handover) {
		return l.handover
	}
	cur := ""
	for _, a := range m.want {
		if a.Kind == ControlPlane && l.assign[a.Key] != "" {
			cur = l.assign[a.Key]
			break
		}
	}
	best := ""
	for _, n := range elig {
		if best == "" || better(m.candidateOf(n), m.candidateOf(best), "control-plane") {
			best = n
		}
	}
	if cur == "" || !slices.Contains(elig, cur) {
		if f := m.bestFresh(elig, "control-plane"); f != "" {
			return f // a successor that answers now (transfer.go)
		}
		return best
	}
	if best != cur && m.cfg.PreemptDelay > 0 && m.candidateOf(best).priority > m.candidateOf(cur).priority {
		since := m.healthySince
		if best != m.cfg.Name {
			since = l.peers[best].healthySince
		}
		if m.now.Sub(since) >= m.cfg.PreemptDelay {
			return best
		}
	}
	return cur
}

func (m *Machine) legacyClaims() map[string]bool {
	c := map[string]bool{}
	for _, mb := range m.view {
		if !mb.Alive || mb.Name == m.cfg.Name {
			continue
		}
		if _, ours := m.viewMeta[mb.Name]; ours {
			continue
		}
		for _, k := range mb.Claims {
			c[k] = true
		}
	}
	return c
}

// place decides who holds what and moves addresses break-before-make.
func (m *Machine) place() {
	l := m.lead
	elig := m.eligibleNames()
	cp := m.controlPlaneHolder(m.unverifiedCP(elig))
	legacy := m.legacyClaims()
	wanted := map[string]bool{}
	in := map[string]bool{}
	var poolCands []string
	settled := map[string]bool{}
	for _, n := range elig {
		in[n] = true
		if _, ok := l.eligSince[n]; !ok {
			l.eligSince[n] = m.now
		}
		if m.now.Sub(l.eligSince[n]) >= PoolSettle {
			poolCands = append(poolCands, n)
			settled[n] = true
		}
	}
	for n := range l.eligSince {
		if !in[n] {
			delete(l.eligSince, n)
		}
	}
	if len(poolCands) == 0 {
		// none settled (a new cluster, a new leader, which has not seen
		// anyone eligible for long): every eligible node counts as settled
		poolCands = elig
		for _, n := range elig {
			settled[n] = true
		}
	}
	// Nothing that decides placement changed, nothing is being released and
	// every address is placed: skip the pass over every address (a leader
	// with 1,000 addresses steps on every message it receives).
	key := placeKey{elig: elig, poolCands: poolCands, legacy: sortedKeys(legacy), cp: cp, unv: m.unv.sig, wantGen: m.wantGen}
	if !l.redo && key.equal(&l.placed) && len(l.releasing) == 0 && len(l.assign) == len(m.want) {
		return
	}
	l.placed = key.clone()
	l.redo = false
	for k, r := range l.releasing {
		p := l.peers[r.from]
		// released when its ack shows it let go (also of an overlap:
		// transfer.go; planned: the next holder takes it over from
		// r.from), or when its last grant ran out (a removed member can
		// only run out)
		if p != nil && p.ackedGen >= r.gen && !p.ovHeld[k] {
			delete(l.releasing, k)
			l.from[k] = r.from
			if l.assign[k] != r.from {
				delete(p.ov, k)
			}
		} else if !m.now.Before(r.until) {
			delete(l.releasing, k)
			delete(l.from, k)
		}
	}
	for _, a := range m.want {
		wanted[a.Key] = true
		cur := l.assign[a.Key]
		desired := ""
		switch {
		case legacy[a.Key]:
		case a.Kind == ControlPlane:
			desired = cp
		default:
			desired = m.poolHolder(a, cur, elig, settled)
		}
		if r, ok := l.releasing[a.Key]; ok && cur == "" && r.ovTo != "" && desired != "" && m.eligible(r.ovTo) {
			desired = r.ovTo // the successor the old holder agreed to
		}
		if desired == cur {
			continue
		}
		if m.ovSuccessor(a.Key, cur) || m.ovWait(a.Key, cur, desired) || m.unheardHolder(cur) {
			// the move waits (an overlap under way, a holder not heard
			// yet): the next pass decides again, whatever else changed
			l.redo = true
			continue
		}
		planned := m.plannedMove(a.Key, cur, desired)
		if cur != "" {
			m.unassign(a.Key, cur)
		}
		if planned {
			m.ovBegin(a.Key, cur, desired)
		}
		if desired == "" {
			continue
		}
		src, ok := m.ovSource(a.Key, desired)
		if !ok {
			l.redo = true // not before the overlap or release under way ends
			continue
		}
		l.assign[a.Key] = desired
		if p := l.peers[desired]; p != nil {
			p.keys[a.Key] = true
			p.gen++
		}
		m.ovAssigned(a.Key, desired, src)
	}
	for k, n := range l.assign {
		if !wanted[k] {
			m.unassign(k, n)
		}
	}
}

// poolHolder is where a pool or egress address goes: the rendezvous
// winner of (name, address) over the eligible nodes it allows. An address
// without a holder (fresh, or its holder lost: not eligible, no longer
// allowed, unverified) goes to that winner at once, settled or not, so a
// fresh address is placed once rather than on a settled node first and
// moved again when the winner settles. A holder that may keep it keeps it
// until the winner has been eligible for PoolSettle (a joining node gets
// its share once, ready, and a flapping one none): then it moves once,
// straight to the winner, never through a settled runner-up.
func (m *Machine) poolHolder(a Address, cur string, elig []string, settled map[string]bool) string {
	if cur == "" && m.newLeaderUnheard() {
		return "" // placed once the members answered (newLeaderUnheard)
	}
	cands := elig
	if a.Restricted {
		cands = allowed(elig, a)
	}
	if cur != m.cfg.Name && !m.quorumFresh() {
		// a leader no majority answers now (cut off, its lease running
		// out) takes nothing new: the holder it cannot hear is more
		// likely on the other side with the majority, and the address
		// would move to this node only to move back after the election
		cands = without(cands, m.cfg.Name)
	}
	if cur != "" && !m.eligible(cur) {
		cands = m.preferFresh(cands) // a successor that answers now (transfer.go)
	}
	best := ""
	for _, n := range m.unverifiedFilter(a.Key, cands) {
		if best == "" || rendezvous(n, a.Key) > rendezvous(best, a.Key) {
			best = n
		}
	}
	// an unverified holder keeps it only when no verified node can take it
	blocked := best != "" && m.unverifiedExcluded(a.Key, cur) && !m.unverifiedExcluded(a.Key, best)
	if cur == "" || !m.eligible(cur) || !a.allows(cur) || blocked || best == cur || best == "" {
		return best
	}
	if settled[best] {
		return best // rebalance: the winner has been eligible for PoolSettle
	}
	return cur
}

// newLeaderUnheard: this leader is younger than a tick and some member
// has not answered it yet. The eligible nodes it knows are then those
// that answered first: a pool or egress address without a holder (its
// holder's grant ended with the old leader) placed now would go to the
// winner among them and move again as soon as the others answer, a
// moment later (a new leader's first heartbeat goes out at once). It
// waits for them, at most a tick (Machine.next wakes it then).
func (m *Machine) newLeaderUnheard() bool {
	l := m.lead
	if !m.now.Before(m.newLeaderPlaces()) {
		return false
	}
	for _, p := range l.peers {
		if !p.acked {
			return true
		}
	}
	return false
}

// newLeaderPlaces is when a new leader places pool and egress addresses
// without a holder even if some member has not answered.
func (m *Machine) newLeaderPlaces() time.Time { return m.lead.since.Add(m.cfg.Tick) }

// quorumFresh: a majority answered a renewal round sent within the last
// renewal interval and a tick (the leader's lease is being renewed now).
func (m *Machine) quorumFresh() bool {
	last := m.leaseEnd.Add(-m.cfg.LeaseLength())
	return m.now.Sub(last) <= time.Duration(m.cfg.HeartbeatTicks+1)*m.cfg.Tick
}

// without returns names without name (a new slice when it was there).
func without(names []string, name string) []string {
	i := slices.Index(names, name)
	if i < 0 {
		return names
	}
	return slices.Delete(slices.Clone(names), i, i+1)
}

// allowed returns the names that may hold a.
func allowed(names []string, a Address) []string {
	var out []string
	for _, n := range names {
		if a.allows(n) {
			out = append(out, n)
		}
	}
	return out
}

func (m *Machine) unassign(key, from string) {
	l := m.lead
	delete(l.assign, key)
	delete(l.from, key)
	if from == m.cfg.Name {
		l.from[key] = from // the leader lets go at once
	}
	if p := l.peers[from]; p != nil {
		delete(p.keys, key)
		delete(p.ov, key)
		p.gen++
		if p.grantEnd.After(m.now) {
			l.releasing[key] = release{from: from, gen: p.gen, until: p.grantEnd}
		}
	}
}

// leaderDecide runs the leader's decisions after every event.
func (m *Machine) leaderDecide() {
	l := m.lead
	m.syncPeers()
	m.checkTransfer()
	if l.transferTo == "" {
		m.place()
		m.membership()
		m.maybeTransfer()
		if m.lead == nil {
			return // the last member left (a nil leader state below panicked in vipd-sim)
		}
	}
	// assignments and grants; with the renewals, who holds what
	var pl, plFrom map[string]string
	var plSig string
	plDone := false
	for name, p := range l.peers {
		changed := p.ackedGen != p.gen
		if !l.beat && !(changed && p.sentGenDiffers()) {
			continue
		}
		a := &assign{Term: l.term, Gen: p.gen}
		if changed {
			a.Full = true
			a.Keys = sortedKeys(p.keys)
			a.Ov = p.ovSpecs()
		}
		e := m.env(name)
		e.h.Assign = a
		// with the renewals, and with a new assignment (a node taking an
		// address over hears whom from before its grant)
		if (l.beat || changed) && !plDone {
			pl, plFrom, plSig = m.placement()
			plDone = true
		}
		if plDone && (plSig != p.placedSig || m.now.Sub(p.placedAt) >= placedRefresh) {
			e.h.Placed = &placed{Term: l.term, Holders: pl, From: plFrom}
			p.placedSig, p.placedAt = plSig, m.now
		}
		p.markSent()
		if p.pending != nil {
			m.sendGrant(name, p, m.freshen(p, p.pending))
		}
	}
	l.beat = false
}

// markSent/sentGenDiffers avoid resending a full assignment on every event
// while its ack is in flight (the heartbeat resends it).
func (p *peerState) markSent() { p.sentGen = p.gen }
func (p *peerState) sentGenDiffers() bool {
	return p.sentGen != p.gen
}

// placeKey is what decides a placement pass besides the releases and
// the addresses not placed yet: while it is unchanged the pass is skipped.
// It is compared field by field; it was a formatted string, built on every
// step of the leader (a fiftieth of its CPU).
type placeKey struct {
	elig, poolCands, legacy []string // legacy: the keys, sorted
	cp, unv                 string
	wantGen                 int
}

func (k *placeKey) equal(o *placeKey) bool {
	return k.cp == o.cp && k.unv == o.unv && k.wantGen == o.wantGen &&
		slices.Equal(k.elig, o.elig) && slices.Equal(k.poolCands, o.poolCands) && slices.Equal(k.legacy, o.legacy)
}

// clone returns k with slices of its own: the pass's slices are not kept.
func (k placeKey) clone() placeKey {
	k.elig, k.poolCands, k.legacy = slices.Clone(k.elig), slices.Clone(k.poolCands), slices.Clone(k.legacy)
	return k
}

func sortedKeys[V any](s map[string]V) []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (m *Machine) onAck(from string, a *ack) {
	l := m.lead
	p := l.peers[from]
	if p == nil {
		return
	}
	p.lastHeard = m.now
	p.acked = true
	if a.Healthy && (!p.healthy || p.healthySince.IsZero()) {
		p.healthySince = m.now.Add(-time.Duration(a.HealthyFor))
	}
	p.healthy = a.Healthy
	p.priority = a.Priority
	p.role = a.Role
	p.leaving = a.Leaving
	if a.Term != l.term {
		return
	}
	if a.Boot != p.boot {
		// the node restarted: what it holds is what it says now
		p.boot, p.ackSeq, p.ackedGen = a.Boot, 0, a.Gen
	}
	if a.Seq > p.ackSeq {
		p.ackSeq, p.ackedGen, p.ackAt = a.Seq, a.Gen, m.now
		p.ovHeld = map[string]bool{}
		for _, k := range a.OvHeld {
			p.ovHeld[k] = true
		}
	}
	if a.Gen != p.gen || len(p.keys) == 0 || !m.leaseValid() {
		return
	}
	g := m.grantOn(p, a.Seq, m.now)
	if g == nil {
		return
	}
	// The grant rides on the next heartbeat (no packet of its own) when
	// what p already holds lasts past it with a tick to spare; otherwise
	// it goes now. The first answers of a round are granted against the
	// lease before the round completes (a renewal interval shorter), so a
	// rule on this grant's own length let a hold run out before the next
	// heartbeat once the renewal interval was more than a third of the
	// lease. For the same reason an answer that comes while its round is
	// still open waits for the round (grantPending, at most a tick: the
	// round completes or is sent again) as long as what p holds lasts
	// that tick: granted from the lease before the round, a hold that must
	// reach the next heartbeat could end short of it.
	if p.grantedGen != p.gen {
		p.heldTo = time.Time{} // what it held was another assignment
	}
	p.grantedGen = p.gen
	if len(m.reads) > 0 && p.heldTo.After(m.now.Add(m.cfg.Tick)) {
		p.pending = g
		return
	}
	m.grantNowOrAtBeat(from, p, g)
}

// nextBeat is when the leader's next renewal round goes out.
func (m *Machine) nextBeat() time.Time {
	h := int64(m.cfg.HeartbeatTicks)
	return m.base.Add(time.Duration((m.ticks/h+1)*h) * m.cfg.Tick)
}

// grantNowOrAtBeat sends g to p now unless what p holds outlasts the next
// heartbeat by a tick; then g rides on that heartbeat.
func (m *Machine) grantNowOrAtBeat(name string, p *peerState, g *grant) {
	if p.heldTo.After(m.nextBeat().Add(m.cfg.Tick)) {
		p.pending = g
		return
	}
	m.sendGrant(name, p, g)
}

// sendGrant puts g in this step's envelope to p and notes how long p
// holds on it.
func (m *Machine) sendGrant(name string, p *peerState, g *grant) {
	m.env(name).h.Grant = g
	p.pending = nil
	if g.Seq == p.ackSeq {
		p.heldTo = later(p.heldTo, p.ackAt.Add(time.Duration(g.D)))
	}
}

// grantPending: a renewal round completed and extended the lease; the
// grants held back for it (onAck) are reckoned against the new lease and
// go now or with the next heartbeat.
func (m *Machine) grantPending() {
	l := m.lead
	if l == nil || !m.leaseValid() {
		return
	}
	held := false
	for _, p := range l.peers {
		held = held || p.pending != nil
	}
	if !held {
		return // the common case, every renewal: no sorted list to build
	}
	for _, name := range sortedKeys(l.peers) {
		if p := l.peers[name]; p.pending != nil {
			m.grantNowOrAtBeat(name, p, m.freshen(p, p.pending))
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// grantWaiting: the lease was just acquired (a new leader's first round,
// or one after a lapse); the followers that acknowledged their current
// assignment while there was no lease to grant from are granted now, as
// freshen would (the same ack, the lease as it stands), instead of at
// their next ack a renewal later. In a planned handover that renewal
// could come after what the old leader granted them ran out.
func (m *Machine) grantWaiting() {
	l := m.lead
	if l == nil || !m.leaseValid() {
		return
	}
	for _, name := range sortedKeys(l.peers) {
		p := l.peers[name]
		if len(p.keys) == 0 || p.ackedGen != p.gen || p.ackSeq == 0 || p.grantedGen == p.gen {
			continue
		}
		g := m.grantOn(p, p.ackSeq, p.ackAt)
		if g == nil {
			continue
		}
		m.sendGrant(name, p, g)
		p.grantedGen = p.gen
	}
}

// grantOn is a grant to p for its ack seq of the current assignment,
// which arrived at at: p holds until its send time + D on its own clock,
// before this leader's lease ends in true time (the ack was sent before
// at). p.grantEnd bounds it on this leader's clock. nil: the lease left
// nothing to grant.
func (m *Machine) grantOn(p *peerState, seq uint64, at time.Time) *grant {
	d := min(m.cfg.GrantFor, time.Duration(float64(m.leaseEnd.Sub(at))*(1-m.cfg.Drift)/(1+m.cfg.Drift)))
	if d <= 0 {
		return nil
	}
	end := at.Add(time.Duration(float64(d) * (1 + m.cfg.Drift) / (1 - m.cfg.Drift)))
	if end.After(p.grantEnd) {
		p.grantEnd = end
	}
	return &grant{Term: m.lead.term, Seq: seq, Gen: p.gen, D: int64(d)}
}

// freshen: a grant held back for the next heartbeat is reckoned anew
// against the lease as it stands when it is sent (the ack it answers
// may have arrived before the round that extended the lease completed):
// the same rule and the same ack, only a later lease. Without it a
// holder's grant ran up to two heartbeats behind the lease, and that much
// longer was it without a holder when the leader was lost.
func (m *Machine) freshen(p *peerState, g *grant) *grant {
	if !m.leaseValid() || g.Seq != p.ackSeq || g.Gen != p.gen || p.ackedGen != p.gen {
		return g
	}
	if f := m.grantOn(p, p.ackSeq, p.ackAt); f != nil && f.D > g.D {
		return f
	}
	return g
}

// handoff: what the transferee must respect.
func (l *leaderState) handoff(m *Machine) *handoff {
	h := &handoff{Holders: map[string]string{}}
	var end time.Time
	for k, n := range l.assign {
		if n != m.cfg.Name || m.hold.keys[k] {
			h.Holders[k] = n // this node too, for what it holds on as a grantee
		}
	}
	// an address on its way from A to B is still A's until A let go
	for k, r := range l.releasing {
		h.Holders[k] = r.from
	}
	for _, p := range l.peers {
		if p.grantEnd.After(end) {
			end = p.grantEnd
		}
	}
	for _, r := range l.releasing {
		if r.until.After(end) {
			end = r.until
		}
	}
	for _, e := range m.hold.holds {
		if e.After(end) {
			end = e
		}
	}
	if end.After(m.now) {
		h.For = int64(end.Sub(m.now))
	}
	return h
}

// checkTransfer notices a transfer raft aborted.
func (m *Machine) checkTransfer() {
	l := m.lead
	if l.transferTo == "" {
		return
	}
	if m.rn.BasicStatus().LeadTransferee == raft.None {
		m.note("leadership transfer did not complete", "to", l.transferTo)
		l.transferTo = ""
		l.lastTransfer = m.now
		m.reads = map[string]time.Time{}
		// it holds its own on its lease again, from its next round (the
		// keys it held on as a grantee must not outlive a later move)
		m.hold.reset(0)
		// voters must hear that the transfer is off before a renewal counts:
		// the next renewal's heartbeat carries the header without it
		for n := range l.peers {
			m.env(n)
		}
	}
}

// maybeTransfer hands leadership to the node that should hold the
// control-plane addresses, or away from a witness or a leaving leader.
func (m *Machine) maybeTransfer() {
	l := m.lead
	if m.leaving && len(m.conf.Voters) == 1 && len(m.conf.Learners) == 0 {
		// the last member: nothing to hand over to
		m.left = true
		m.lead = nil
		m.note("left the cluster (last member)")
		return
	}
	if !l.lastTransfer.IsZero() && m.now.Sub(l.lastTransfer) < m.electionTimeout() {
		return
	}
	if m.ovPending() {
		return // the handoff names one holder per key: let the overlap end first
	}
	target := ""
	cpHolder := ""
	for _, a := range m.want {
		if a.Kind == ControlPlane {
			cpHolder = l.assign[a.Key]
			break
		}
	}
	selfOK := m.cfg.Role == Voter && !m.leaving
	switch {
	case cpHolder != "" && cpHolder != m.cfg.Name:
		p := l.peers[cpHolder]
		if p != nil && p.role == Voter && p.grantedGen == p.gen && p.grantEnd.After(m.now) {
			target = cpHolder
		}
	case !selfOK:
		best := ""
		for n, p := range l.peers {
			if p.role != Voter || p.leaving || !m.alive(p) || !p.acked || !m.isVoter(m.idOf(n)) {
				continue
			}
			if best == "" || better(m.candidateOf(n), m.candidateOf(best), "control-plane") {
				best = n
			}
		}
		target = best
	}
	if target == "" {
		return
	}
	id := m.idOf(target)
	if id == 0 {
		return
	}
	pr, ok := m.rn.Status().Progress[id]
	if !ok || pr.IsLearner || pr.State == tracker.StateSnapshot {
		return
	}
	// The lease ends before the transferee may win; what this node holds
	// itself it holds on as a grantee, to the lease's end (transfer.go).
	m.keepOwnAcrossTransfer()
	l.transferTo = target
	l.transferAt = m.now
	m.leaseEnd = m.now
	m.reads = map[string]time.Time{}
	for n := range l.peers {
		m.env(n) // every voter hears the announcement
	}
	m.note("transferring leadership", "to", target)
	m.rn.TransferLeader(id)
}

// transferRequest: vipd handover. to "" means the best eligible node other
// than except (the node that asked, which holds the control-plane
// addresses).
func (m *Machine) transferRequest(to, except string) {
	if m.lead == nil {
		if m.leaderName != "" {
			m.env(m.leaderName).h.Handover = orBest(to, m.cfg.Name)
		}
		return
	}
	if to == "" || to == except {
		// the best eligible node that answered within a heartbeat and a
		// half (transfer.go): never one whose answers just stopped
		var cands []string
		for _, n := range m.eligibleNames() {
			if n != except {
				cands = append(cands, n)
			}
		}
		to = m.bestFresh(cands, "control-plane")
		if to == "" && len(cands) > 0 {
			m.note("no eligible node answered within a heartbeat: nothing handed over", "eligible", cands)
			return
		}
	}
	if to != "" && !m.eligible(to) && m.isVoter(m.idOf(to)) && m.cfg.Name != to {
		// A voter not eligible yet in this leader's eyes (its healthy
		// ack is one renewal away after its apiserver came back): the
		// request waits for it, two election timeouts at most.
		m.lead.handover, m.lead.handoverBy = to, m.now.Add(2*m.electionTimeout())
		m.note("handover requested: waiting for the successor to be eligible", "to", to)
		return
	}
	if to == "" || !m.eligible(to) {
		m.note("no eligible node to hand over to", "asked", to)
		return
	}
	if !m.fresh(to) {
		m.note("handover target has not answered within a heartbeat: nothing handed over", "asked", to)
		return
	}
	m.lead.handover, m.lead.handoverBy = to, time.Time{}
	m.note("handover requested", "to", to)
}

func orBest(to, self string) string {
	if to == "" {
		return "*" + self // "any node but self"
	}
	return to
}

func (m *Machine) forgetRequest(name string) {
	if m.lead != nil {
		m.lead.forgets[name] = true
		return
	}
	if m.leaderName != "" {
		m.env(m.leaderName).h.Forget = name
	}
}

// request handles join/leave/forget at the leader, forwards elsewhere.
func (m *Machine) request(h *header) {
	if m.lead == nil {
		if m.leaderName == "" || m.leaderName == h.From || m.rn == nil {
			return
		}
		e := m.env(m.leaderName)
		if h.Join != nil {
			e.h.Join = h.Join
			m.routes[h.Join.ID] = h.Join.Name
		}
		if h.Leave != "" {
			e.h.Leave, e.h.LeaveID = h.Leave, h.LeaveID
		}
		if h.Forget != "" {
			e.h.Forget = h.Forget
		}
		return
	}
	if h.Join != nil {
		m.routes[h.Join.ID] = h.Join.Name
		for _, j := range m.lead.joins {
			if j.ID == h.Join.ID {
				return
			}
		}
		m.lead.joins = append(m.lead.joins, *h.Join)
	}
	if h.Leave != "" {
		m.lead.leaves[h.Leave] = h.LeaveID
	}
	if h.Forget != "" {
		m.lead.forgets[h.Forget] = true
	}
	if h.Handover != "" {
		if h.Handover[0] == '*' {
			m.transferRequest("", h.Handover[1:])
		} else {
			m.transferRequest(h.Handover, "")
		}
	}
}

func (m *Machine) proposeConf(typ pb.ConfChangeType, id uint64, info memberInfo) {
	ctx, _ := json.Marshal(info)
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: typ.Enum(), NodeId: new(id)}}, Context: ctx}
	if err := m.rn.ProposeConfChange(cc); err != nil {
		m.note("configuration change not proposed", "err", err)
		return
	}
	m.lead.confPending = true
	m.lead.confAt = m.now
	m.note("configuration change", "change", typ.String(), "node", info.Name)
}

// membership: joins, promotions, leaves, forgets and autopilot, one
// agreed change at a time.
func (m *Machine) membership() {
	l := m.lead
	if l.confPending && m.now.Sub(l.confAt) > 4*m.electionTimeout() {
		l.confPending = false
	}
	if l.confPending || !m.leaseValid() || len(m.conf.VotersOutgoing) > 0 {
		return // one change at a time; a joint configuration leaves by itself
	}
	// joins
	for len(l.joins) > 0 {
		j := l.joins[0]
		if _, ok := m.members[j.ID]; ok {
			l.joins = l.joins[1:]
			continue
		}
		dup := uint64(0)
		for id, info := range m.members {
			if info.Name == j.Name {
				dup = id
			}
		}
		if dup == m.id {
			m.env(j.Name).h.JoinRefused = "duplicate name: " + j.Name + " is this cluster's leader"
			l.joins = l.joins[1:]
			continue
		}
		if dup != 0 {
			if p := l.peers[j.Name]; p != nil && m.alive(p) && p.acked {
				m.routes[j.ID] = j.Name
				m.env(j.Name).h.JoinRefused = "duplicate name: a live member is called " + j.Name
				m.note("refused a duplicate name", "name", j.Name)
				l.joins = l.joins[1:]
				continue
			}
			m.proposeConf(pb.ConfChangeRemoveNode, dup, memberInfo{Name: j.Name})
			return
		}
		l.joins = l.joins[1:]
		m.proposeConf(pb.ConfChangeAddLearnerNode, j.ID, memberInfo{Name: j.Name, Role: j.Role})
		return
	}
	// leaves and forgets
	for _, name := range sortedKeys(l.leaves) {
		if p := l.peers[name]; p != nil && (len(p.keys) > 0 || l.releasingFrom(name)) {
			continue // hand its addresses over first
		}
		want := l.leaves[name]
		id := m.idOf(name)
		if id != 0 && id != m.id && (want == 0 || id == want) && m.isVoter(id) && len(m.conf.Voters)-1 < m.cfg.MinVoters {
			// The floor autopilot keeps: a 3-voter cluster does not shrink
			// on a graceful stop. The node stops as a voter, keeps its
			// state and resumes on restart (a restart is not a rejoin, so
			// no window with two voters and a learner that one more
			// failure would leave without a majority); a machine gone for
			// good is removed with vipd forget.
			delete(l.leaves, name)
			m.note("leave declined: the voters would fall below the floor", "node", name, "voters", len(m.conf.Voters), "floor", m.cfg.MinVoters)
			continue
		}
		if id != 0 && id != m.id && (want == 0 || id == want) && !m.liveMajorityWithout(id) {
			if m.now.Sub(l.since) < m.electionTimeout() {
				continue // a new leader: the others' acks are on their way
			}
			// Removing it would leave a configuration whose live voters
			// are no majority (another voter is dead): nobody could hold
			// until the dead one came back. It stops as a voter instead,
			// keeps its state and resumes on restart (Consul:
			// leave_on_terminate=false). It asks again every election
			// timeout while it runs.
			delete(l.leaves, name)
			m.note("leave declined: without it the live voters would be no majority", "node", name)
			continue
		}
		delete(l.leaves, name)
		if id != 0 && id != m.id && (want == 0 || id == want) {
			m.proposeConf(pb.ConfChangeRemoveNode, id, memberInfo{Name: name})
			return
		}
	}
	for _, name := range sortedKeys(l.forgets) {
		delete(l.forgets, name)
		if id := m.idOf(name); id != 0 && id != m.id {
			m.proposeConf(pb.ConfChangeRemoveNode, id, memberInfo{Name: name})
			return
		}
	}
	// promote every caught-up learner in one change (joint consensus when
	// more than one): a cluster of one that three nodes join goes to three
	// voters at once, not through a fragile two
	var promote []*pb.ConfChangeSingle
	var names []string
	if len(m.conf.Learners) > 0 {
		// raft's Status copies every member's progress: only with a
		// learner to look at (the leader runs this at every step)
		st := m.rn.Status()
		for _, id := range m.conf.Learners {
			pr, ok := st.Progress[id]
			info := m.members[id]
			p := l.peers[info.Name]
			if ok && p != nil && m.alive(p) && p.acked && pr.Match >= st.GetCommit() {
				promote = append(promote, &pb.ConfChangeSingle{Type: pb.ConfChangeAddNode.Enum(), NodeId: new(id)})
				names = append(names, info.Name)
			}
		}
	}
	if len(promote) > 0 {
		if err := m.rn.ProposeConfChange(&pb.ConfChangeV2{Changes: promote}); err != nil {
			m.note("configuration change not proposed", "err", err)
			return
		}
		l.confPending, l.confAt = true, m.now
		m.note("configuration change", "change", "promote", "nodes", names)
		return
	}
	// autopilot: remove a member silent for RemoveAfter while the rest keep
	// a majority of the current configuration and the voters stay >= MinVoters
	if m.cfg.RemoveAfter <= 0 || m.now.Sub(l.since) < m.cfg.RemoveAfter {
		return
	}
	aliveVoters := 0
	for _, v := range m.conf.Voters {
		if v == m.id {
			aliveVoters++
			continue
		}
		if p := l.peers[m.nameOf(v)]; p != nil && m.alive(p) {
			aliveVoters++
		}
	}
	for _, id := range m.conf.Learners {
		if p := l.peers[m.nameOf(id)]; p != nil && m.now.Sub(p.lastHeard) >= m.cfg.RemoveAfter {
			m.proposeConf(pb.ConfChangeRemoveNode, id, memberInfo{Name: p.name})
			return
		}
	}
	n := len(m.conf.Voters)
	if n-1 < m.cfg.MinVoters || aliveVoters < n/2+1 {
		return
	}
	for _, id := range m.conf.Voters {
		if id == m.id {
			continue
		}
		if p := l.peers[m.nameOf(id)]; p != nil && m.now.Sub(p.lastHeard) >= m.cfg.RemoveAfter {
			m.note("autopilot removes a silent voter", "node", p.name, "silent", m.now.Sub(p.lastHeard))
			m.proposeConf(pb.ConfChangeRemoveNode, id, memberInfo{Name: p.name})
			return
		}
	}
}

// liveMajorityWithout reports whether the voters that acked this leader
// within an election timeout would be a majority of the configuration
// without voter id (true when id is not a voter: removing a learner changes
// no majority).
func (m *Machine) liveMajorityWithout(id uint64) bool {
	if !m.isVoter(id) {
		return true
	}
	n, live := 0, 0
	for _, v := range m.conf.Voters {
		if v == id {
			continue
		}
		n++
		if v == m.id {
			live++
		} else if p := m.lead.peers[m.nameOf(v)]; p != nil && p.acked && m.alive(p) {
			live++ // heard by this leader, recently (a new leader assumes every peer alive)
		}
	}
	return live >= n/2+1
}

// followerLeave asks the leader to remove this node, again every election
// timeout until it is gone.
func (m *Machine) followerLeave() {
	if !m.leaving || m.leaderName == "" {
		return
	}
	if m.now.Sub(m.lastJoin) < m.electionTimeout() {
		return
	}
	m.lastJoin = m.now
	e := m.env(m.leaderName)
	e.h.Leave, e.h.LeaveID = m.cfg.Name, m.id
}
