package cluster

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// Defaults of ElectionConfig.
const (
	// ReclaimPause is how long a node does not claim a VIP again after its
	// core released it, so that another node gets its chance.
	ReclaimPause = 500 * time.Millisecond
	// BootstrapGrace is how long a node with configured peers, that knows
	// no other member, waits for them before it holds VIPs alone.
	BootstrapGrace = 2 * time.Second
	// DefaultMemberExpiry is how long a member may be dead before the
	// members that still have quorum forget it (VIPD_MEMBER_EXPIRY).
	DefaultMemberExpiry = 10 * time.Minute
	// KeyVeto is how long after a gossip key mismatch a node that knows no
	// other member refuses to hold alone.
	KeyVeto = time.Minute
	// ConflictHold is how long after the last sign of another node with
	// this node's name this node stays ineligible (and longer while it
	// does not see every member it knows).
	ConflictHold = 30 * time.Second
	// StepAsideMin and StepAsideMax bound how long a node that could not
	// acquire a VIP leaves it to the others (doubling on each failure).
	StepAsideMin = 2 * time.Second
	StepAsideMax = 30 * time.Second
	// QuorumSettle is how long a node that has just regained quorum waits
	// before it claims a VIP nobody seems to hold: members it still
	// believes dead (a healed partition) may hold it, and their claims
	// reach it within a few gossip rounds. A restarted node's first
	// quorum, with every member it counted before in view, waits
	// RestartSettle instead.
	QuorumSettle = time.Second
	// RestartSettle replaces QuorumSettle for a restarted node that sees
	// every member it counted before: long enough for a claim made as it
	// rejoined to reach it (one gossip round of the default profile, 200
	// ms, and some margin); short, since every crash and restart of a
	// holder (systemd's RestartSec=1) waits it out.
	RestartSettle = 300 * time.Millisecond
	// BeatQuorumSettle replaces QuorumSettle for a node that takes member
	// heartbeats (ElectionConfig.Beat): the beat that brings a member
	// back carries the hash of its metadata, and a node that has not
	// seen that metadata pulls the member's state in the same tick
	// (MemberBeats.Tick), so a claim made meanwhile arrives with the
	// quorum, not a few gossip rounds (5 s in that profile) later. Two
	// beat intervals leave room for one lost beat or a slow pull. Under
	// heavy loss, where quorum comes and goes with the beats, a shorter
	// wait is what lets a holder be elected between two losses.
	BeatQuorumSettle = 500 * time.Millisecond
)

// quorumSettle is QuorumSettle, or BeatQuorumSettle for a node that
// takes member heartbeats.
func (e *Election) quorumSettle() time.Duration {
	if e.cfg.Beat {
		return BeatQuorumSettle
	}
	return QuorumSettle
}

// ElectionConfig shapes an Election.
type ElectionConfig struct {
	// Beat: gossip Meta.Beat (this node sends and reads member heartbeats
	// on the gossip port, beatsock.go).
	Beat     bool
	Name     string
	VIPs     []string
	Priority int
	Quorum   QuorumRule
	// Peers is set when VIPD_PEERS names other nodes: a node that knows
	// no member then waits BootstrapGrace for them before holding alone.
	Peers bool
	// ClaimSettle is how long a claim is gossiped before this node acts
	// on it. Zero for l2, where acquiring is quick and a probe guards it;
	// cloud mode waits a couple of gossip rounds, because two nodes
	// assigning the same reserved IP at once each cost an API action.
	ClaimSettle time.Duration
	// MemberExpiry: see DefaultMemberExpiry. Zero means the default.
	MemberExpiry time.Duration
	// Pools: gossip Meta.Pools (this node announces pool addresses).
	Pools bool
	// PreemptDelay (VIPD_PREEMPT_DELAY): a holder hands a VIP over to a
	// member with a higher priority that has been eligible this long
	// without a break. Zero: never preempt.
	PreemptDelay time.Duration
}

// Event is an input to the Election.
type Event interface{ isElectionEvent() }

// ViewChanged is memberlist's current membership (alive and suspect
// members, self included), with the members that left gracefully since the
// last view.
type ViewChanged struct {
	Members []Member
	Left    []string
}

// HealthChanged is the local apiserver's health.
type HealthChanged struct{ Healthy bool }

// HoldingChanged reports the core's holding state for a VIP.
type HoldingChanged struct {
	VIP  string
	Held bool
}

// AcquireFailed reports that this node could not acquire a VIP, or lost it
// (its interface went down, another holder answers on the segment): it
// steps aside for a while so that another node takes it.
type AcquireFailed struct {
	VIP    string
	Reason string
}

// Unverified reports whether this node can reach a VIP that another node
// holds (l2: the holder answers its ARP / neighbour probes). It is
// gossiped in Meta.Unverified; the election itself does not act on it.
type Unverified struct {
	VIP         string
	Unreachable bool
}

// KeyMismatch reports gossip rejected for another encryption key.
type KeyMismatch struct{}

// NameConflict reports another node gossiping under this node's name.
type NameConflict struct{ Addr string }

// Tick is the passing of time, sent at Output.Next.
type Tick struct{}

func (ViewChanged) isElectionEvent()    {}
func (HealthChanged) isElectionEvent()  {}
func (Unverified) isElectionEvent()     {}
func (HoldingChanged) isElectionEvent() {}
func (AcquireFailed) isElectionEvent()  {}
func (KeyMismatch) isElectionEvent()    {}
func (NameConflict) isElectionEvent()   {}
func (Tick) isElectionEvent()           {}
func (PeerKnown) isElectionEvent()      {}

// PeerKnown is a peer's member list, learned in a state exchange
// (memberlist's push/pull). A node that started without a member list of
// its own (a new or rebuilt machine) counts the members its peers count:
// otherwise, rebuilt on the minority side of a partition, it would count
// only the members it can see and find a quorum among them (two holders;
// cluster/sim TestScenarioWipedMinority).
type PeerKnown struct {
	Known Known
}

// AdoptWindow is how long after its first contact with another member (a
// state exchange, or a member admitted) a node that started without a
// member list of its own adopts the members its peers count (PeerKnown):
// the joins that bring it into the cluster, however late they succeed.
// Later, members are admitted by the usual rules.
const AdoptWindow = 10 * time.Second

// AdoptMax bounds the member list a node adopts (PeerKnown), itself
// included.
const AdoptMax = 32

// VIPDecision is a changed decision for one VIP.
type VIPDecision struct {
	VIP string
	Decision
}

// Output is what one step asks of the glue.
type Output struct {
	// Meta, when set, is new metadata to gossip at once.
	Meta *Meta
	// Decisions that changed, in VIP order.
	Decisions []VIPDecision
	// Known, when set, is the member list to persist.
	Known *Known
	// Logs are notable changes, for the operator's log.
	Logs []LogLine
	// Next is when the election next wants a Tick; zero: no timer needed.
	Next time.Time
	// Send are handover messages to deliver to other nodes.
	Send []Message
	// Prepare are VIPs the core should get ready to take at once
	// (answered with Prepared).
	Prepare []string
	// Handovers that ended or were refused.
	Handovers []HandoverResult
	// Sync asks the glue to exchange its whole view with the members now
	// (memberlist's push/pull): set when quorum is regained. Claims
	// gossiped while this node was cut off are not sent again, and a
	// holder this node still counts as dead may be alive in the views of
	// those it hears: their state brings that claim within the quorum
	// settle, before this node would claim the VIP itself.
	Sync bool
}

// LogLine is one message for the log.
type LogLine struct {
	Warn bool
	Msg  string
	Args []any
}

// Election is the pure election state machine of one node. Use NewElection.
type Election struct {
	cfg     ElectionConfig
	started time.Time

	healthy bool
	view    []Member // latest view, self included
	known   map[string]KnownMember
	seen    map[string]time.Time // last time each known member was alive or suspect
	// left holds the members that left gracefully (and when): one that
	// comes back is counted again even without quorum, since that only
	// restores the member list it had before it left. Without this, a node
	// that lost quorum while another restarted could never count it again.
	left map[string]KnownMember // with LeftAt

	meta      Meta
	quorum    QuorumResult
	decisions map[string]Decision

	claimedAt   map[string]time.Time
	pausedUntil map[string]time.Time
	broken      map[string]brokenVIP
	unverified  map[string]bool // VIPs this node cannot reach through their holder
	keyErrAt    time.Time
	quorumAt    time.Time // when quorum (not bootstrap) was last regained
	conflictAt  time.Time
	conflictBy  string
	// dup is set by a name clash and cleared ConflictHold after the last
	// one once every known member is in view: the other node is gone, not
	// merely behind a partition.
	dup bool
	// persisted: started with other members in its list (a restart, not a
	// new cluster forming); settledOnce: its first quorum was reached.
	// A restarted node's first quorum waits only RestartSettle; a forming
	// cluster waits the full QuorumSettle for the members still joining
	// (the best ranked one).
	persisted, settledOnce bool
	firstContact           time.Time       // first PeerKnown or member admitted (when not persisted)
	silent                 map[string]bool // claimants whose heartbeats stopped (heartbeat.go)

	ho handover // planned handovers, preemption, failover timeline
}

type brokenVIP struct {
	until    time.Time // stepping aside until then
	at       time.Time // last failure
	failures int
	reason   string
}

// NewElection starts an election at now with the persisted member list.
func NewElection(cfg ElectionConfig, known Known, now time.Time) *Election {
	if cfg.MemberExpiry <= 0 {
		cfg.MemberExpiry = DefaultMemberExpiry
	}
	e := &Election{
		cfg: cfg, started: now,
		known:     map[string]KnownMember{},
		seen:      map[string]time.Time{},
		left:      map[string]KnownMember{},
		meta:      Meta{Priority: cfg.Priority, Pools: cfg.Pools, Beat: cfg.Beat},
		decisions: map[string]Decision{},
		claimedAt: map[string]time.Time{}, pausedUntil: map[string]time.Time{}, broken: map[string]brokenVIP{}, unverified: map[string]bool{},
		ho: newHandover(),
	}
	for n, m := range known.Left {
		if _, ok := known.Members[n]; !ok && n != cfg.Name {
			e.left[n] = m
		}
	}
	for n, m := range known.Members {
		e.persisted = e.persisted || n != cfg.Name
		e.known[n] = m
		e.seen[n] = now // a member is dead for the expiry from our start, not from the file's age
	}
	e.view = []Member{{Name: cfg.Name, State: Alive}}
	return e
}

// Meta returns the metadata to gossip now.
func (e *Election) Meta() Meta { return e.meta.clone() }

// Step feeds one event that happened at now.
func (e *Election) Step(ev Event, now time.Time) Output {
	var out Output
	prevMeta := e.meta.clone()
	switch ev := ev.(type) {
	case ViewChanged:
		e.view = ev.Members
		for _, n := range ev.Left {
			if n == e.cfg.Name {
				continue
			}
			if m, ok := e.known[n]; ok {
				delete(e.known, n)
				delete(e.seen, n)
				m.LeftAt = now.UTC()
				e.left[n] = m
				out.Known = e.knownDoc()
				out.log(false, "member left gracefully: no longer counted for quorum", "member", n)
			}
		}
	case HealthChanged:
		e.healthy = ev.Healthy
	case HoldingChanged:
		e.ho.held[ev.VIP] = ev.Held
		if !ev.Held && e.onReleased(ev.VIP, now, &out) {
			break // handing over: the claim stays until the successor's is seen
		}
		if ev.Held {
			delete(e.broken, ev.VIP) // it works again
			// Only confirm a claim the election stands behind: an acquire
			// that finished after the decision changed makes no claim.
			if e.decisions[ev.VIP].Holder {
				e.claim(ev.VIP, now)
			}
		} else {
			e.unclaim(ev.VIP)
			e.pausedUntil[ev.VIP] = now.Add(ReclaimPause)
		}
	case Unverified:
		if ev.Unreachable {
			e.unverified[ev.VIP] = true
		} else {
			delete(e.unverified, ev.VIP)
		}
	case AcquireFailed:
		b := e.broken[ev.VIP]
		b.failures++
		wait := StepAsideMin << (b.failures - 1)
		if wait > StepAsideMax || wait <= 0 {
			wait = StepAsideMax
		}
		b.until, b.reason, b.at = now.Add(wait), ev.Reason, now
		e.broken[ev.VIP] = b
		e.unclaim(ev.VIP)
		out.log(true, "cannot hold the VIP: leaving it to another node", "vip", ev.VIP, "for", wait, "reason", ev.Reason)
	case KeyMismatch:
		e.keyErrAt = now
	case NameConflict:
		if !e.dup {
			out.log(true, "another node gossips under this node's name: not holding any VIP, and asking the others not to count this node, until the clash is over (give every node a unique VIPD_NODE_NAME)", "name", e.cfg.Name, "other", ev.Addr)
		}
		e.conflictAt, e.conflictBy, e.dup = now, ev.Addr, true
	case HolderSilent:
		e.silence(ev, &out)
	case PeerKnown:
		e.adopt(ev.Known, now, &out)
	case HandoverRequested:
		e.evaluate(now, &out) // decide on the latest view first
		e.requestHandover(ev, now, &out)
	case MessageReceived:
		e.onMessage(ev.Msg, now, &out)
	case SendFailed:
		e.onSendFailed(ev, now, &out)
	case Prepared:
		e.onPrepared(ev, now, &out)
	case Tick:
	}
	e.evaluate(now, &out)
	if !e.meta.equal(prevMeta) {
		m := e.meta.clone()
		out.Meta = &m
	}
	out.Next = e.next(now)
	return out
}

func (o *Output) log(warn bool, msg string, args ...any) {
	o.Logs = append(o.Logs, LogLine{Warn: warn, Msg: msg, Args: args})
}

// evaluate recomputes membership, quorum, eligibility and every decision.
func (e *Election) evaluate(now time.Time, out *Output) {
	e.updateMembership(now, out)
	e.trackMembers(now)
	e.expireHandovers(now, out)
	view := e.currentView()
	q := Quorum(view, e.knownNames(), e.cfg.Quorum)
	switch {
	case q.Bootstrap && e.cfg.Peers && now.Sub(e.started) < BootstrapGrace:
		// Nodes of a new cluster start together: give the configured peers
		// a moment to answer before holding alone, or each would bootstrap.
		q.OK = false
		q.Reason = fmt.Sprintf("bootstrap: waiting up to %v for the configured peers", BootstrapGrace)
	case q.Bootstrap && !e.keyErrAt.IsZero() && now.Sub(e.keyErrAt) < KeyVeto:
		// Alone because the peers reject our key (or we theirs): holding
		// alone would be a split brain with the real cluster.
		q.OK = false
		q.Reason = "gossip key mismatch with peers (VIPD_GOSSIP_KEY_FILE): not holding alone"
	}
	if e.dup && now.Sub(e.conflictAt) >= ConflictHold && e.allKnownInView() {
		// No clash for ConflictHold while every known member is in view
		// and counts this node: the other node is gone, not merely on the
		// other side of a partition.
		e.dup = false
		out.log(false, "name clash over: every known member is in view and none uses this node's name; taking part in the election again", "name", e.cfg.Name)
	}
	conflict := e.dup
	e.meta.Dup = e.dup
	// A stopping node stays eligible while it hands its VIPs over (it
	// keeps its claims until the successors' are seen), then it is not.
	eligible := e.healthy && q.OK && !conflict && !(e.ho.stopping && len(e.ho.out) == 0)
	if q.OK && !q.Bootstrap && (!e.quorum.OK || e.quorum.Bootstrap) {
		e.quorumAt = now
		if e.persisted && !e.settledOnce && e.allKnownInView() {
			// A restarted node that sees every member it counted before:
			// no claim can be on its way from one it has not heard yet
			// (the join's state exchange brought them all), but the
			// others learn of the restart from that same exchange and may
			// claim at once (a holder that restarts before the failure
			// detector noticed its crash seems to have released): it
			// waits RestartSettle to hear those claims.
			e.quorumAt = now.Add(RestartSettle - e.quorumSettle())
		}
		e.settledOnce = true
	}
	if q.OK != e.quorum.OK && e.quorum.Reason != "" {
		if q.OK {
			out.log(false, "quorum regained", "reason", q.Reason)
			out.Sync = true
		} else {
			out.log(true, "quorum lost: releasing every VIP", "reason", q.Reason)
		}
	}
	e.quorum = q
	e.meta.Eligible, e.meta.Healthy = eligible, e.healthy
	e.meta.Counts = e.counts()
	var broken []string
	for _, v := range e.cfg.VIPs {
		if b, ok := e.broken[v]; ok {
			// Stepping aside is for letting another node take the VIP:
			// when no other member can, a node whose last failure is
			// StepAsideMin old tries again (its fault may be repaired;
			// several such nodes elect among themselves as usual).
			lastResort := now.Sub(b.at) >= StepAsideMin && !e.othersCanHold(v)
			if now.Before(b.until) && !lastResort {
				broken = append(broken, v)
			} else if now.Sub(b.until) > StepAsideMax && b.failures > 0 {
				// A quiet spell: the next failure backs off from the
				// start again. The entry stays (status, metrics) until
				// this node holds the VIP again.
				b.failures = 0
				e.broken[v] = b
			}
		}
	}
	e.meta.Broken = broken
	var unverified []string
	for _, v := range e.cfg.VIPs {
		if e.unverified[v] && !e.meta.Holds(v) {
			unverified = append(unverified, v)
		}
	}
	e.meta.Unverified = unverified

	defer func() {
		for _, v := range e.cfg.VIPs {
			e.preempt(v, now, out)
		}
	}()
	for _, v := range e.cfg.VIPs {
		view = e.currentView() // claims below change our own metadata
		d := Decide(view, v)
		e.trackFault(v, d, now)
		in, handedIn := e.ho.handedIn[v]
		delete(e.ho.handedIn, v)
		switch {
		case e.handoverDecision(v, &d, now, out):
		case d.Holder && !e.meta.Holds(v) && now.Before(e.pausedUntil[v]):
			d = Decision{Reason: "released moments ago: letting another node take it"}
		case d.Holder && !e.meta.Holds(v) && !q.Bootstrap && now.Sub(e.quorumAt) < e.quorumSettle():
			d = Decision{Reason: "quorum regained moments ago: waiting for the claims of the others"}
		case d.Holder && !e.meta.Holds(v):
			// Claim first, act after: the claim is gossiped before (l2: as)
			// the VIP is acquired, so nodes elected at the same moment from
			// different views settle on one (highest term, then name).
			e.claim(v, now)
			if e.cfg.ClaimSettle > 0 {
				d = Decision{Leader: e.cfg.Name, Reason: "claimed; letting the claim settle"}
			}
		case d.Holder && !handedIn && now.Sub(e.claimedAt[v]) < e.cfg.ClaimSettle:
			d = Decision{Leader: e.cfg.Name, Reason: "claimed; letting the claim settle"}
		case !d.Holder && e.meta.Holds(v):
			e.unclaim(v)
		}
		d.Lone = d.Holder && q.Bootstrap && !e.cfg.Quorum.Off && e.cfg.Quorum.Fixed == 0
		old, seen := e.decisions[v]
		if d.Holder && !old.Holder {
			e.timeline(v, &d, in, handedIn)
		}
		if !seen || old.Holder != d.Holder || old.Leader != d.Leader || old.Lone != d.Lone {
			out.Decisions = append(out.Decisions, VIPDecision{VIP: v, Decision: d})
		}
		e.decisions[v] = d
	}
}

// allKnownInView reports whether every known member is alive in the view
// and counts this node.
func (e *Election) allKnownInView() bool {
	for name := range e.known {
		if name == e.cfg.Name {
			continue
		}
		i := slices.IndexFunc(e.view, func(m Member) bool { return m.Name == name })
		if i < 0 || e.view[i].State != Alive || !e.view[i].Meta.counts(e.cfg.Name) {
			return false
		}
	}
	return true
}

// othersCanHold reports whether another alive member is eligible for vip
// and not stepping aside from it.
func (e *Election) othersCanHold(vip string) bool {
	for _, m := range e.view {
		if m.Name != e.cfg.Name && m.State == Alive && m.Meta.Eligible && !m.Meta.CannotHold(vip) {
			return true
		}
	}
	return false
}

// updateMembership applies the membership rules to the current view:
//
//   - a member that left gracefully is forgotten at once (ViewChanged.Left),
//     and counted again as soon as it is back, with or without quorum:
//     that restores the member list from before it left, never a larger one
//     (its tombstone is dropped MemberExpiry after the leave while this node
//     has quorum);
//   - an alive member that is not known is remembered when this node is
//     bootstrapping or has quorum without it: a node on the minority side
//     of a partition cannot admit members (that would be a majority made
//     up on one side only);
//   - a known member dead for MemberExpiry is forgotten while this node
//     has quorum; the minority side never forgets anybody.
func (e *Election) updateMembership(now time.Time, out *Output) {
	alive := map[string]Member{}
	for _, m := range e.view {
		if m.State == Alive || m.State == Suspect {
			alive[m.Name] = m
		}
	}
	for n := range e.known {
		if _, ok := alive[n]; ok {
			e.seen[n] = now
		}
	}
	changed := false
	if _, ok := e.known[e.cfg.Name]; !ok {
		e.known[e.cfg.Name] = KnownMember{FirstSeen: now.UTC()}
		e.seen[e.cfg.Name] = now
		changed = true
	}
	names := slices.Sorted(maps.Keys(alive))
	for _, n := range names {
		m := alive[n]
		l, ok := e.left[n]
		if _, known := e.known[n]; known || !ok || m.State != Alive {
			continue
		}
		delete(e.left, n)
		l.LeftAt = time.Time{}
		e.known[n] = l
		e.seen[n] = now
		changed = true
		out.log(false, "member that left gracefully is back: counted for quorum again", "member", n, "addr", m.Addr)
	}
	before := Quorum(e.currentView(), e.knownNames(), QuorumRule{})
	admit := before.OK || e.cfg.Quorum.Off || e.cfg.Quorum.Fixed > 0
	for _, n := range names {
		m := alive[n]
		if _, ok := e.known[n]; ok || m.State != Alive {
			continue
		}
		if !admit {
			continue
		}
		e.known[n] = KnownMember{Addr: m.Addr, FirstSeen: now.UTC()}
		e.seen[n] = now
		changed = true
		if e.firstContact.IsZero() {
			e.firstContact = now
		}
		out.log(false, "new cluster member remembered", "member", n, "addr", m.Addr)
	}
	if before.OK && !before.Bootstrap {
		for n, l := range e.left {
			if now.Sub(l.LeftAt) >= e.cfg.MemberExpiry {
				delete(e.left, n)
				changed = true
			}
		}
		for _, n := range slices.Sorted(maps.Keys(e.known)) {
			if _, ok := alive[n]; ok || n == e.cfg.Name {
				continue
			}
			if now.Sub(e.seen[n]) >= e.cfg.MemberExpiry {
				delete(e.known, n)
				delete(e.seen, n)
				changed = true
				out.log(true, "member dead for longer than VIPD_MEMBER_EXPIRY forgotten: no longer counted for quorum", "member", n, "expiry", e.cfg.MemberExpiry)
			}
		}
	}
	if changed {
		out.Known = e.knownDoc()
	}
}

// adopt counts the members of a peer's list that this node does not know
// yet, if it started without a list of its own, within AdoptWindow of its
// first contact with another member. A member counted this way is dead
// for the member expiry from this node's start, like a member of a
// persisted list.
func (e *Election) adopt(k Known, now time.Time, out *Output) {
	if e.persisted {
		return
	}
	if e.firstContact.IsZero() {
		e.firstContact = now
	}
	if now.Sub(e.firstContact) >= AdoptWindow {
		return
	}
	var added []string
	limit := AdoptMax
	if _, ok := e.known[e.cfg.Name]; !ok {
		limit-- // this node counts itself too
	}
	for _, n := range slices.Sorted(maps.Keys(k.Members)) {
		if len(e.known) >= limit {
			break // a list no control plane has: its hashes would not fit the metadata
		}
		if n == e.cfg.Name {
			continue
		}
		if _, ok := e.known[n]; ok {
			continue
		}
		if _, ok := e.left[n]; ok {
			continue
		}
		e.known[n] = KnownMember{Addr: k.Members[n].Addr, FirstSeen: now.UTC()}
		if _, ok := e.seen[n]; !ok {
			// Dead for the expiry from this node's start, as a member of
			// a persisted list is: a member the peer still counts but
			// that is gone for good is forgotten no later than it would
			// have been had this node kept its list.
			e.seen[n] = e.started
		}
		added = append(added, n)
	}
	if len(added) > 0 {
		out.Known = e.knownDoc()
		out.log(false, "started without a member list: counting the members a peer counts", "members", added)
	}
}

// currentView is the latest view with our own metadata as it is now (the
// copy memberlist has may lag behind).
func (e *Election) currentView() View {
	v := View{Self: e.cfg.Name}
	self := false
	for _, m := range e.view {
		if m.Name == e.cfg.Name {
			m.Meta, m.State, self = e.meta, Alive, true
		} else if e.silent[m.Name] && (m.State == Alive || m.State == Suspect) {
			m.State = Dead // its heartbeats stopped (heartbeat.go)
		}
		v.Members = append(v.Members, m)
	}
	if !self {
		v.Members = append(v.Members, Member{Name: e.cfg.Name, State: Alive, Meta: e.meta})
	}
	return v
}

func (e *Election) knownNames() []string { return slices.Sorted(maps.Keys(e.known)) }

func (e *Election) knownDoc() *Known {
	k := Known{Members: maps.Clone(e.known)}
	if len(e.left) > 0 {
		k.Left = maps.Clone(e.left)
	}
	return &k
}

// counts returns the hashes of the known members, nil above MaxCounted.
func (e *Election) counts() Hashes {
	if len(e.known) > MaxCounted {
		return nil
	}
	h := make(Hashes, 0, len(e.known))
	for _, n := range e.knownNames() {
		h = append(h, NameHash(n))
	}
	sort.Slice(h, func(i, j int) bool { return h[i] < h[j] })
	return h
}

// claim adds vip to our claims with a term above every term seen, so the
// newest claim wins a healed partition.
func (e *Election) claim(vip string, now time.Time) {
	if e.meta.Holds(vip) {
		return
	}
	term := e.meta.Term
	for _, m := range e.view {
		if m.Meta.Term > term {
			term = m.Meta.Term
		}
	}
	e.meta.Term = nextTerm(term)
	e.meta.Holding = append(slices.Clone(e.meta.Holding), vip)
	e.claimedAt[vip] = now
}

func (e *Election) unclaim(vip string) {
	if !e.meta.Holds(vip) {
		return
	}
	e.meta.Holding = slices.DeleteFunc(slices.Clone(e.meta.Holding), func(v string) bool { return v == vip })
	delete(e.claimedAt, vip)
}

// next returns the earliest time at which a rule may change its answer.
func (e *Election) next(now time.Time) time.Time {
	var ts []time.Time
	add := func(t time.Time) {
		if t.After(now) {
			ts = append(ts, t)
		}
	}
	add(e.started.Add(BootstrapGrace))
	add(e.quorumAt.Add(e.quorumSettle()))
	if !e.keyErrAt.IsZero() {
		add(e.keyErrAt.Add(KeyVeto))
	}
	if !e.conflictAt.IsZero() {
		add(e.conflictAt.Add(ConflictHold))
	}
	for _, t := range e.pausedUntil {
		add(t)
	}
	for _, t := range e.claimedAt {
		add(t.Add(e.cfg.ClaimSettle))
	}
	for _, b := range e.broken {
		add(b.until)
		add(b.at.Add(StepAsideMin))
		if b.failures > 0 {
			add(b.until.Add(StepAsideMax + time.Millisecond))
		}
	}
	for n, t := range e.seen {
		if n != e.cfg.Name {
			add(t.Add(e.cfg.MemberExpiry))
		}
	}
	e.handoverNext(add)
	if len(ts) == 0 {
		return time.Time{}
	}
	return slices.MinFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
}

// ElectionStatus is the election's section of /status.
type ElectionStatus struct {
	Quorum    QuorumResult        `json:"quorum"`
	Known     []string            `json:"known"`
	Elections map[string]Decision `json:"elections"`
	// Broken lists the VIPs this node cannot hold now, with why.
	Broken map[string]string `json:"broken,omitempty"`
	// NameConflict is the address of another node using this node's name.
	NameConflict string `json:"name_conflict,omitempty"`
	// Handover: the last planned handover of each VIP and those under way.
	Handover HandoverStatus `json:"handover"`
}

// Status returns the election's state for /status and metrics.
func (e *Election) Status(now time.Time) ElectionStatus {
	s := ElectionStatus{Quorum: e.quorum, Known: e.knownNames(), Elections: maps.Clone(e.decisions), Handover: e.handoverStatus()}
	for v, b := range e.broken {
		if s.Broken == nil {
			s.Broken = map[string]string{}
		}
		s.Broken[v] = fmt.Sprintf("last attempt failed %s ago: %s", now.Sub(b.at).Round(time.Second), b.reason)
	}
	if e.dup {
		s.NameConflict = e.conflictBy
	}
	return s
}

func (m Meta) clone() Meta {
	c := m
	c.Holding = slices.Clone(m.Holding)
	c.Broken = slices.Clone(m.Broken)
	c.Unverified = slices.Clone(m.Unverified)
	c.Counts = slices.Clone(m.Counts)
	return c
}

func (m Meta) equal(o Meta) bool {
	return m.Leaving == o.Leaving && m.Dup == o.Dup && m.Healthy == o.Healthy && m.Eligible == o.Eligible && m.Priority == o.Priority && m.Term == o.Term &&
		slices.Equal(m.Holding, o.Holding) && slices.Equal(m.Broken, o.Broken) && slices.Equal(m.Unverified, o.Unverified) && slices.Equal(m.Counts, o.Counts) &&
		(m.Counts == nil) == (o.Counts == nil)
}

// Forgotten applies a member list edited by `vipd forget`: members missing
// from k are no longer counted (one that is alive is remembered again by
// the next step when this node has quorum without it).
func (e *Election) Forgotten(k Known) {
	for n := range e.known {
		if _, ok := k.Members[n]; !ok && n != e.cfg.Name {
			delete(e.known, n)
			delete(e.seen, n)
		}
	}
	for n := range e.left {
		if _, ok := k.Left[n]; !ok {
			delete(e.left, n) // forgotten on purpose: not counted when back
		}
	}
}
