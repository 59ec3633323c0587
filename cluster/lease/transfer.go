package lease

import (
	"sort"
	"time"
)

// Planned transfers, make-before-break.
//
// When the leader moves an address from a healthy, responsive holder A to
// a successor B that answered within the last heartbeat interval (fresh),
// and Config.Overlap (O) > 0, the move is agreed and bounded:
//
//  1. A agrees first. If A is the leader, at its decision; otherwise A
//     receives an assignment without the key carrying ovSpec{Peer: B, O}
//     and keeps the key until min(its receipt + O, its grant end) on its
//     own clock (never past what it was granted, so the leader's lease
//     still bounds it), then acknowledges with the key in OvHeld.
//  2. Only after that agreement does the leader assign the key to B, with
//     ovSpec{Peer: A, O}. B receives it after A agreed, so A's hold ends
//     before B's receipt + O(1+D)/(1-D) on B's clock: B knows the window.
//     B holds once granted, as usual.
//  3. When B's runtime reports the key bound and announced (Held), B tells
//     A (OvDone) and A lets go at once; otherwise A lets go when O passed.
//
// In true time the overlap lasts at most O/(1-D) and both Outputs declare
// it (Output.Overlaps). Every failure falls back to a safe path: A that
// never gets or never acknowledges the spec is released break-before-make
// as before (the leader waits for an acknowledgement without the key in
// OvHeld, or for A's grant to run out); a lost OvDone, a successor that
// never binds, a dead successor or a lost leader end the overlap at O; a
// dead old holder simply stops holding. While A still holds the key under
// an overlap the leader assigns it to nobody but B, and it transfers
// leadership only once no overlap runs (the handoff lists one holder per
// key).

// ovSpec is one key's make-before-break in an assignment.
type ovSpec struct {
	Peer string `json:"p"`
	O    int64  `json:"o"` // nanoseconds
}

// ovState is this node's side of one key's overlap.
type ovState struct {
	peer  string
	old   bool // this node is the old holder
	since time.Time
	until time.Time // old: holds no longer; successor: the old holder holds no longer
	told  bool      // successor: OvDone sent
}

// freshWindow: a successor must have answered within this (one heartbeat
// interval and a half: one renewal round's answer may be late, a second
// missing one means the member is not answering now).
func (m *Machine) freshWindow() time.Duration {
	return time.Duration(m.cfg.HeartbeatTicks) * m.cfg.Tick * 3 / 2
}

// fresh: name answered the leader within freshWindow (this node always).
func (m *Machine) fresh(name string) bool {
	if name == m.cfg.Name {
		return true
	}
	p := m.lead.peers[name]
	return p != nil && p.acked && m.now.Sub(p.lastHeard) <= m.freshWindow()
}

// bestFresh is the best ranked of names for key that answered within
// freshWindow, or "" when none did.
func (m *Machine) bestFresh(names []string, key string) string {
	best := ""
	for _, n := range names {
		if !m.fresh(n) {
			continue
		}
		if best == "" || better(m.candidateOf(n), m.candidateOf(best), key) {
			best = n
		}
	}
	return best
}

// preferFresh returns the members of names that answered within
// freshWindow, or names when none did (then a move is break-before-make).
func (m *Machine) preferFresh(names []string) []string {
	var out []string
	for _, n := range names {
		if m.fresh(n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return names
	}
	return out
}

func (m *Machine) ovFactor() float64 { return (1 + m.cfg.Drift) / (1 - m.cfg.Drift) }

// plannedMove: moving key from cur to desired is make-before-break.
func (m *Machine) plannedMove(key, cur, desired string) bool {
	if m.cfg.Overlap <= 0 || cur == "" || desired == "" || cur == desired || m.cfg.Role == Witness {
		return false
	}
	if o := m.ov[key]; o != nil && o.old && o.until.After(m.now) {
		return false // one overlap per key at a time (a successor's record of the last one is only its declaration: the leader lets a successor pass the key on once the old holder let go)
	}
	if r, ok := m.lead.releasing[key]; ok && r.ovTo != "" {
		return false
	}
	if !m.fresh(desired) {
		m.note("planned move to a member not heard from within a heartbeat: break-before-make", "address", key, "from", cur, "to", desired)
		return false
	}
	if m.unverifiedExcluded(key, cur) {
		// most others cannot reach it through cur (unverified.go): an
		// overlap would serve nobody, and cur's answers only confuse
		return false
	}
	if cur == m.cfg.Name {
		// the leader holds it on its lease, or (a transferee, before its
		// first renewal round) on the grant it carried over
		return m.health && m.lead.assign[key] == m.cfg.Name && m.selfHoldEnd(key).After(m.now)
	}
	p := m.lead.peers[cur]
	return p != nil && p.healthy && m.fresh(cur) && p.grantEnd.After(m.now)
}

// selfHoldEnd: until when the leader may hold key itself: its lease, or
// the grant a transferee carried over (zero: not at all).
func (m *Machine) selfHoldEnd(key string) time.Time {
	if m.leaseValid() {
		return m.leaseEnd
	}
	if end := m.carry[key]; end.After(m.now) && m.lead != nil && m.lead.transferTo == "" {
		return end
	}
	return time.Time{}
}

// ovWait: a leader younger than freshWindow has not heard every member
// answer yet; a move away from a holder that still holds waits for the
// successor's (or, with no successor yet, every voter's) first answer,
// within a heartbeat, rather than going break-before-make (a transferee
// stopped right after it became leader released at once).
func (m *Machine) ovWait(key, cur, desired string) bool {
	if m.cfg.Overlap <= 0 || cur == "" || cur == desired || m.now.Sub(m.lead.since) >= m.freshWindow() {
		return false
	}
	if desired != "" {
		if p := m.lead.peers[desired]; m.fresh(desired) || p == nil || p.acked {
			return false // fresh, or acked and silent since: not a new leader's gap
		}
	} else {
		// nobody eligible: a new leader may not have heard the others yet
		waiting := false
		for _, p := range m.lead.peers {
			waiting = waiting || (!p.acked && p.role == Voter)
		}
		if !waiting {
			return false
		}
	}
	if cur == m.cfg.Name {
		return m.selfHoldEnd(key).After(m.now)
	}
	p := m.lead.peers[cur]
	return p != nil && p.grantEnd.After(m.now)
}

// ovBegin starts a planned move of key from cur (already unassigned) to
// desired. The leader as old holder agrees at once; a peer agrees with
// its acknowledgement of the assignment that carries the spec.
func (m *Machine) ovBegin(key, cur, desired string) {
	if cur == m.cfg.Name {
		m.ovOld(key, desired, m.selfHoldEnd(key), m.cfg.Overlap)
		return
	}
	l := m.lead
	p := l.peers[cur]
	r, ok := l.releasing[key]
	if p == nil || !ok {
		return
	}
	if p.ov == nil {
		p.ov = map[string]ovSpec{}
	}
	p.ov[key] = ovSpec{Peer: desired, O: int64(m.cfg.Overlap)}
	r.ovTo = desired
	l.releasing[key] = r
}

// ovSource: may key be assigned to desired now, and from whom it moves
// make-before-break ("": an ordinary assignment).
func (m *Machine) ovSource(key, desired string) (string, bool) {
	l := m.lead
	if o := m.ov[key]; o != nil && o.old && o.until.After(m.now) {
		if desired == m.cfg.Name {
			delete(m.ov, key) // back to this node: it holds on its lease
			return "", true
		}
		return m.cfg.Name, desired == o.peer
	}
	r, busy := l.releasing[key]
	if !busy {
		return "", true
	}
	p := l.peers[r.from]
	if r.ovTo != "" && r.ovTo == desired && p != nil && p.ackedGen >= r.gen && p.ovHeld[key] {
		return r.from, true // the old holder agreed: the successor may hold too
	}
	return "", false
}

// ovSuccessor: cur is the successor of key's running overlap; the key
// stays with it until the old holder let go (one release per key).
func (m *Machine) ovSuccessor(key, cur string) bool {
	if cur == "" {
		return false
	}
	if o := m.ov[key]; o != nil && o.old && o.until.After(m.now) && o.peer == cur {
		return true
	}
	r, ok := m.lead.releasing[key]
	return ok && r.ovTo == cur
}

// ovAssigned records key's assignment to desired, from src in a planned
// overlap ("" none).
func (m *Machine) ovAssigned(key, desired, src string) {
	if desired == m.cfg.Name {
		if src != "" {
			m.ovNew(key, src, m.cfg.Overlap)
		}
		return
	}
	p := m.lead.peers[desired]
	if p == nil {
		return
	}
	if p.ov == nil {
		p.ov = map[string]ovSpec{}
	}
	delete(p.ov, key)
	if src != "" {
		p.ov[key] = ovSpec{Peer: src, O: int64(m.cfg.Overlap)}
	}
}

// ovSpecs is what a full assignment to p carries.
func (p *peerState) ovSpecs() map[string]ovSpec {
	if len(p.ov) == 0 {
		return nil
	}
	out := map[string]ovSpec{}
	for k, s := range p.ov {
		out[k] = s
	}
	return out
}

// ovPending: an overlap involving the leader's assignments still runs
// (its own as old holder, or a peer's the leader waits for).
func (m *Machine) ovPending() bool {
	for _, o := range m.ov {
		if o.old && o.until.After(m.now) {
			return true
		}
	}
	for _, r := range m.lead.releasing {
		if r.ovTo != "" {
			return true
		}
	}
	return false
}

// ovOld: this node, the old holder, keeps key until min(now+o, end).
func (m *Machine) ovOld(key, to string, end time.Time, o time.Duration) {
	if m.cfg.Overlap <= 0 || o <= 0 || !end.After(m.now) {
		return
	}
	if cur := m.ov[key]; cur != nil && cur.old && cur.until.After(m.now) {
		return // one overlap per key at a time: this one is break-before-make
	}
	o = min(o, m.cfg.Overlap)
	until := m.now.Add(o)
	if end.Before(until) {
		until = end
	}
	if m.ov == nil {
		m.ov = map[string]*ovState{}
	}
	m.ov[key] = &ovState{peer: to, old: true, since: m.now, until: until}
	m.note("make-before-break: holding until the successor holds", "address", key, "successor", to, "at most", until.Sub(m.now))
}

// ovNew: this node, the successor, may overlap with the old holder from
// on key; the old holder lets go before now + o(1+D)/(1-D) here.
func (m *Machine) ovNew(key, from string, o time.Duration) {
	if o <= 0 {
		return
	}
	if m.ov == nil {
		m.ov = map[string]*ovState{}
	}
	// Every receipt follows the old holder's agreement, so each one bounds
	// the window anew: a repeated or later assignment (the old holder may
	// have agreed again meanwhile) extends it, never shortens it.
	until := m.now.Add(time.Duration(float64(o) * m.ovFactor()))
	if cur := m.ov[key]; cur != nil && !cur.old && cur.peer == from && cur.until.After(m.now) {
		if until.After(cur.until) {
			cur.until = until
		}
		return
	}
	m.ov[key] = &ovState{peer: from, since: m.now, until: until}
}

// ovHolds adds the keys this node still holds as an old holder to h and
// ends the overlaps whose bound passed.
func (m *Machine) ovHolds(h map[string]time.Time) {
	for _, k := range sortedKeys(m.ov) {
		o := m.ov[k]
		if !o.until.After(m.now) {
			if o.old {
				m.note("make-before-break: the successor did not confirm within the bound: released", "address", k, "successor", o.peer, "overlap", o.until.Sub(o.since))
			}
			delete(m.ov, k)
			continue
		}
		if o.old {
			if cur, ok := h[k]; !ok || o.until.Before(cur) {
				h[k] = o.until
			}
		}
	}
}

// carryHolds: a transferee holds what it was granted as leader too, until
// its own first renewal round (or the grant's end): no gap at the
// transfer. The grant ends within the old leader's lease.
func (m *Machine) carryHolds(h map[string]time.Time) {
	for _, k := range sortedKeys(m.carry) {
		end := m.carry[k]
		if !end.After(m.now) || m.lead == nil || m.leaseValid() || m.lead.assign[k] != m.cfg.Name {
			delete(m.carry, k)
			continue
		}
		if cur, ok := h[k]; !ok || end.After(cur) {
			h[k] = end
		}
	}
}

// keepOwnAcrossTransfer runs when this node, the leader, starts a
// leadership transfer: its lease ends before the transferee may win, and
// the keys it holds itself (the control-plane addresses have moved to the
// transferee first) it holds on as a grantee of its own term until that
// lease's end, as it would have on the lease. The handoff names this node
// their holder and covers that end, so the transferee assigns them to it
// and renews them like any other running grant: an old leader that stays
// healthy keeps its pool and egress addresses through the transfer, with
// no release and no gap. Never past the lease it had: the transferee
// respects it as it respects every grant this leader gave, and any other
// candidate needs a voter that acknowledged that lease (its promise).
// A leaving or unhealthy leader does not keep them (they are moving).
func (m *Machine) keepOwnAcrossTransfer() {
	m.hold.reset(m.lead.term)
	if !m.leaseValid() || m.cfg.Role != Voter || !m.health || m.leaving {
		return
	}
	for _, a := range m.want {
		if m.lead.assign[a.Key] == m.cfg.Name {
			m.hold.keys[a.Key] = true
			m.hold.holds[a.Key] = m.leaseEnd
		}
	}
}

// unheardHolder: cur holds on a grant a transfer handed over and has not
// answered this leader yet. Its key stays with it until its first ack
// says whether it is still eligible, or the grant ran out: a new leader
// that has heard nobody yet must not strip the handoff's holders of their
// keys (they released at its first assignment and took them back a
// round later). Keeping an assignment adds no holder; a dead holder's
// key moves when its grant ends, as it would have released then.
func (m *Machine) unheardHolder(cur string) bool {
	if cur == "" || cur == m.cfg.Name {
		return false
	}
	p := m.lead.peers[cur]
	return p != nil && !p.acked && p.grantEnd.After(m.now)
}

// keepGrantsAsLeader runs when this node becomes leader: the keys it
// holds under the old leader's grants stay its own (assigned to itself)
// and held until its lease is valid.
func (m *Machine) keepGrantsAsLeader(l *leaderState) {
	m.carry = map[string]time.Time{}
	for k, end := range m.hold.holds {
		if m.hold.keys[k] && end.After(m.now) && m.cfg.Role == Voter {
			m.carry[k] = end
			l.assign[k] = m.cfg.Name
		}
	}
	m.hold.reset(0)
}

// overlaps: the running overlaps of held keys, for Output.Overlaps.
func (m *Machine) overlaps(h map[string]time.Time) map[string]Overlap {
	var out map[string]Overlap
	for k, o := range m.ov {
		if _, held := h[k]; !held || !o.until.After(m.now) {
			continue
		}
		if out == nil {
			out = map[string]Overlap{}
		}
		out[k] = Overlap{With: o.peer, Old: o.old, Since: o.since, Until: o.until}
	}
	return out
}

// ovHeldKeys: keys held as an old holder (for the ack).
func (m *Machine) ovHeldKeys() []string {
	var out []string
	for k, o := range m.ov {
		if o.old && o.until.After(m.now) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// onHeld: the runtime bound and announced keys. A successor in an overlap
// tells the old holder to let go.
func (m *Machine) onHeld(keys []string) {
	held := m.holds()
	by := map[string][]string{}
	for _, k := range keys {
		o := m.ov[k]
		if o == nil || o.old || o.told || !o.until.After(m.now) {
			continue
		}
		if _, ok := held[k]; !ok {
			continue
		}
		o.told = true
		by[o.peer] = append(by[o.peer], k)
	}
	for _, peer := range sortedKeys(by) {
		if peer == m.cfg.Name {
			continue
		}
		e := m.env(peer)
		e.h.OvDone = append(e.h.OvDone, by[peer]...)
	}
}

// onOvDone: the successor holds keys: the old holder lets go now.
func (m *Machine) onOvDone(from string, keys []string) {
	for _, k := range keys {
		o := m.ov[k]
		if o == nil || !o.old || o.peer != from {
			continue
		}
		delete(m.ov, k)
		m.note("make-before-break: the successor holds: released", "address", k, "successor", from, "overlap", m.now.Sub(o.since))
	}
}
