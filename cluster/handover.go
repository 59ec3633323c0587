package cluster

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/wire"
)

// Planned handover: the holder of a VIP moves it to a successor it names,
// without a moment where both answer for it and without waiting for
// gossip or the failure detector.
//
//	holder H                                   successor S
//	  | --- Offer{vip, id} ---------------------> |  eligible, able?  Prepare (core)
//	  | <-------------------------- Ready{id} --- |  (or Declined)
//	  | core releases (Decision{Holder:false})    |
//	  | --- Released{id} -----------------------> |  claim (term above H's), bind
//	  | keeps its claim until S's claim is seen   |  without the conflict probe,
//	  |                                           |  announce
//
// H keeps its claim in its metadata until it sees S's (higher term) claim,
// so no third node takes the VIP in between. Every step has a deadline:
// without Ready within AckTimeout H keeps the VIP (a stop falls back to
// release and leave); a Released that cannot be sent makes H take the VIP
// back (or, stopping, leave it to the election); S forgets an offer whose
// Released does not come within TakeTimeout; H drops its claim when S's
// claim is not seen within SettleTimeout after Released.
const (
	AckTimeout     = 500 * time.Millisecond
	ReleaseTimeout = 2 * time.Second
	TakeTimeout    = 2 * time.Second
	SettleTimeout  = time.Second
)

// MsgKind is the kind of a handover message.
type MsgKind string

// Handover messages.
const (
	MsgOffer    MsgKind = "offer"
	MsgReady    MsgKind = "ready"
	MsgDeclined MsgKind = "declined"
	MsgReleased MsgKind = "released"
)

// Message is one handover message between two nodes, sent directly
// (memberlist's reliable user messages, authenticated like the gossip).
type Message struct {
	Kind   MsgKind `json:"k"`
	From   string  `json:"f"`
	To     string  `json:"t"`
	VIP    string  `json:"v"`
	ID     uint64  `json:"i"`
	Reason string  `json:"r,omitempty"`
}

// HandoverRequested asks this node to hand VIPs it holds to another node:
// `vipd handover` (To: a node name or "" for the best one; VIPs: nil for
// every VIP it holds), SIGTERM (Stopping: whatever happens, this node does
// not take the VIPs back).
type HandoverRequested struct {
	VIPs     []string
	To       string
	Stopping bool
}

// MessageReceived is a handover message from another node.
type MessageReceived struct{ Msg Message }

// SendFailed reports that a handover message could not be delivered.
type SendFailed struct {
	Msg Message
	Err string
}

// Prepared reports that the core is ready to take a VIP at once (or why
// not), after Output.Prepare asked for it.
type Prepared struct {
	VIP string
	Err string
}

func (HandoverRequested) isElectionEvent() {}
func (MessageReceived) isElectionEvent()   {}
func (SendFailed) isElectionEvent()        {}
func (Prepared) isElectionEvent()          {}

// HandoverResult is how a handover ended (or why it was refused): the
// control socket's answer, declared once in internal/wire for vipd and
// vipd-controllers. Took runs from the request to the successor's Released
// message (or the end); Refused: nothing was tried (no successor, not the
// holder, ...).
type HandoverResult = wire.HandoverResult

type hoPhase int

const (
	hoOffered   hoPhase = iota + 1 // Offer sent, waiting for Ready
	hoReleasing                    // Ready received, the core releases
	hoReleased                     // Released sent, waiting for S's claim
)

// outgoing is a handover this node (the holder) runs.
type outgoing struct {
	to       string
	id       uint64
	phase    hoPhase
	started  time.Time
	deadline time.Time
	stopping bool
	preempt  bool
}

// incoming is an offer this node (the successor) accepted.
type incoming struct {
	from  string
	id    uint64
	ready bool
	at    time.Time
	until time.Time
}

// handover is the Election's handover and preemption state.
type handover struct {
	stopping bool
	seq      uint64
	out      map[string]*outgoing
	in       map[string]*incoming
	held     map[string]bool           // the core holds it (HoldingChanged)
	handedIn map[string]incoming       // claimed by handover, for the decision
	last     map[string]HandoverResult // last result per VIP, for status
	// eligibleSince: since when each other member has been alive,
	// eligible and able to hold every VIP without a break (preemption).
	eligibleSince map[string]time.Time
	preemptPause  map[string]time.Time // no preemption of a VIP before then
	// Failover timeline: when the VIP last lost its holder in this node's
	// view, who that was, and when each member was last heard alive.
	faultAt   map[string]time.Time
	prevOf    map[string]string
	steady    map[string]string // last leader that held the VIP steadily
	lastAlive map[string]time.Time
}

func newHandover() handover {
	return handover{out: map[string]*outgoing{}, in: map[string]*incoming{}, held: map[string]bool{},
		handedIn: map[string]incoming{}, last: map[string]HandoverResult{}, eligibleSince: map[string]time.Time{},
		preemptPause: map[string]time.Time{}, faultAt: map[string]time.Time{}, prevOf: map[string]string{},
		steady: map[string]string{}, lastAlive: map[string]time.Time{}}
}

// member returns the view's member with this name.
func (e *Election) member(name string) (Member, bool) {
	for _, m := range e.view {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// canTake says why a member cannot take vip now ("" when it can).
func canTake(m Member, vip string) string {
	switch {
	case m.State != Alive:
		return fmt.Sprintf("%s is %s", m.Name, m.State)
	case m.Meta.Leaving:
		return m.Name + " is stopping"
	case !m.Meta.Healthy:
		return m.Name + " is not eligible: its apiserver is unhealthy"
	case !m.Meta.Eligible:
		return m.Name + " is not eligible (no quorum, or a duplicate name)"
	case m.Meta.CannotHold(vip):
		return m.Name + " cannot hold " + vip + " now (an acquire failed or its VIP interface is down)"
	}
	return ""
}

// successor picks the best member to take vip, or says why there is none.
func (e *Election) successor(vip string) (string, string) {
	var cands []Member
	var why []string
	for _, m := range e.view {
		if m.Name == e.cfg.Name {
			continue
		}
		if r := canTake(m, vip); r != "" {
			why = append(why, r)
			continue
		}
		cands = append(cands, m)
	}
	if len(cands) == 0 {
		r := "no eligible successor for " + vip + ": no other member is alive, healthy, with quorum and able to hold it"
		if len(why) > 0 {
			r += " (" + strings.Join(why, "; ") + ")"
		}
		return "", r
	}
	slices.SortFunc(cands, func(a, b Member) int {
		if better(a, b, vip) {
			return -1
		}
		return 1
	})
	return cands[0].Name, ""
}

// holding reports whether this node holds vip and the election stands
// behind it.
func (e *Election) holding(vip string) bool {
	return e.ho.held[vip] && e.meta.Holds(vip) && e.decisions[vip].Holder
}

func (e *Election) requestHandover(ev HandoverRequested, now time.Time, out *Output) {
	if ev.Stopping {
		e.ho.stopping = true
	}
	vips := ev.VIPs
	if len(vips) == 0 {
		for _, v := range e.cfg.VIPs {
			if e.holding(v) {
				vips = append(vips, v)
			}
		}
		if len(vips) == 0 && !ev.Stopping {
			out.refuse("", ev.To, "this node holds no VIP", now)
		}
	}
	for _, v := range vips {
		if !slices.Contains(e.cfg.VIPs, v) {
			out.refuse(v, ev.To, v+" is not one of this node's VIPs (VIPD_ADDRESS: "+strings.Join(e.cfg.VIPs, ",")+")", now)
			continue
		}
		if o, ok := e.ho.out[v]; ok {
			o.stopping = o.stopping || ev.Stopping
			out.refuse(v, ev.To, "a handover of "+v+" to "+o.to+" is already under way", now)
			continue
		}
		if !e.holding(v) {
			leader := e.decisions[v].Leader
			if leader == "" {
				leader = "nobody"
			}
			out.refuse(v, ev.To, "this node does not hold "+v+" (held by "+leader+")", now)
			continue
		}
		to := ev.To
		if to == e.cfg.Name {
			out.refuse(v, to, to+" is this node, which holds "+v+" already", now)
			continue
		}
		if to != "" {
			m, ok := e.member(to)
			if !ok {
				var names []string
				for _, m := range e.view {
					if m.Name != e.cfg.Name {
						names = append(names, m.Name)
					}
				}
				out.refuse(v, to, "no member named "+to+" (members: "+strings.Join(names, ", ")+")", now)
				continue
			}
			if r := canTake(m, v); r != "" {
				out.refuse(v, to, r, now)
				continue
			}
		} else {
			var r string
			if to, r = e.successor(v); to == "" {
				out.refuse(v, "", r, now)
				continue
			}
		}
		e.startHandover(v, to, now, ev.Stopping, false, out)
	}
}

func (e *Election) startHandover(v, to string, now time.Time, stopping, preempt bool, out *Output) {
	e.ho.seq++
	o := &outgoing{to: to, id: e.ho.seq, phase: hoOffered, started: now, deadline: now.Add(AckTimeout), stopping: stopping, preempt: preempt}
	e.ho.out[v] = o
	out.send(Message{Kind: MsgOffer, From: e.cfg.Name, To: to, VIP: v, ID: o.id})
	what := "handing the VIP over"
	if preempt {
		what = "handing the VIP over to a node with a higher VIPD_PRIORITY, eligible for VIPD_PREEMPT_DELAY"
	}
	out.log(false, what, "vip", v, "to", to)
}

func (o *Output) refuse(vip, to, reason string, now time.Time) {
	o.Handovers = append(o.Handovers, HandoverResult{VIP: vip, To: to, Reason: reason, At: now, Refused: true})
}

func (o *Output) send(m Message) { o.Send = append(o.Send, m) }

// finish ends this node's handover of v.
func (e *Election) finish(v string, ok bool, reason string, now time.Time, out *Output) {
	o := e.ho.out[v]
	if o == nil {
		return
	}
	delete(e.ho.out, v)
	r := HandoverResult{VIP: v, To: o.to, OK: ok, Reason: reason, At: now, Took: now.Sub(o.started), Preempt: o.preempt}
	e.ho.last[v] = r
	out.Handovers = append(out.Handovers, r)
	if !ok && o.preempt {
		e.ho.preemptPause[v] = now.Add(e.cfg.PreemptDelay)
	}
	out.log(!ok, "handover "+map[bool]string{true: "done", false: "failed"}[ok], "vip", v, "to", o.to, "reason", reason)
}

// abort ends a handover that did not complete. Before Released was sent
// the VIP simply stays (or, released already, is taken back); once the
// successor may have it, or when stopping, the claim is dropped and the
// election decides.
func (e *Election) abort(v, reason string, now time.Time, out *Output) {
	e.abortHandover(v, reason, false, now, out)
}

// abortHandover: takeBack keeps the claim after the release (the successor
// certainly did not get the Released message), so this node takes the VIP
// back at once unless it is stopping.
func (e *Election) abortHandover(v, reason string, takeBack bool, now time.Time, out *Output) {
	o := e.ho.out[v]
	if o == nil {
		return
	}
	if o.phase == hoReleased && !takeBack || o.stopping {
		e.unclaim(v)
		// The successor may hold it: give its claim time to arrive.
		e.pausedUntil[v] = now.Add(ReclaimPause)
	}
	e.finish(v, false, reason, now, out)
}

func (e *Election) onMessage(m Message, now time.Time, out *Output) {
	if m.To != e.cfg.Name || !slices.Contains(e.cfg.VIPs, m.VIP) {
		return
	}
	v := m.VIP
	switch m.Kind {
	case MsgOffer:
		self, _ := e.currentView().self()
		holder, ok := e.member(m.From)
		reason := ""
		switch {
		case e.ho.stopping:
			reason = e.cfg.Name + " is stopping"
		case !self.Meta.Eligible:
			reason = e.cfg.Name + " is not eligible"
		case self.Meta.CannotHold(v):
			reason = e.cfg.Name + " cannot hold " + v + " now"
		case !ok || !holder.Meta.Holds(v):
			reason = m.From + " does not claim " + v + " in " + e.cfg.Name + "'s view"
		case e.ho.in[v] != nil && e.ho.in[v].from != m.From:
			reason = e.cfg.Name + " is taking " + v + " from " + e.ho.in[v].from
		}
		if reason != "" {
			out.send(Message{Kind: MsgDeclined, From: e.cfg.Name, To: m.From, VIP: v, ID: m.ID, Reason: reason})
			return
		}
		e.ho.in[v] = &incoming{from: m.From, id: m.ID, at: now, until: now.Add(AckTimeout)}
		out.Prepare = append(out.Prepare, v)
	case MsgReleased:
		in := e.ho.in[v]
		if in == nil || in.from != m.From || in.id != m.ID || !in.ready {
			// Not (or no longer) expected: say so, so the holder takes
			// the VIP back at once.
			out.send(Message{Kind: MsgDeclined, From: e.cfg.Name, To: m.From, VIP: v, ID: m.ID, Reason: "no offer of " + v + " pending on " + e.cfg.Name})
			return
		}
		delete(e.ho.in, v)
		self, _ := e.currentView().self()
		if e.ho.stopping || !self.Meta.Eligible || self.Meta.CannotHold(v) {
			out.send(Message{Kind: MsgDeclined, From: e.cfg.Name, To: m.From, VIP: v, ID: m.ID, Reason: e.cfg.Name + " can no longer take " + v})
			return
		}
		e.claim(v, now)
		in.at = now
		e.ho.handedIn[v] = *in
	case MsgReady, MsgDeclined:
		o := e.ho.out[v]
		if o == nil || o.to != m.From || o.id != m.ID {
			return
		}
		if m.Kind == MsgDeclined {
			e.abortHandover(v, m.From+" declined: "+m.Reason, true, now, out)
			return
		}
		if o.phase == hoOffered {
			o.phase, o.deadline = hoReleasing, now.Add(ReleaseTimeout)
		}
	}
}

func (e *Election) onPrepared(p Prepared, now time.Time, out *Output) {
	in := e.ho.in[p.VIP]
	if in == nil || in.ready {
		return
	}
	if p.Err != "" {
		delete(e.ho.in, p.VIP)
		out.send(Message{Kind: MsgDeclined, From: e.cfg.Name, To: in.from, VIP: p.VIP, ID: in.id, Reason: "not ready: " + p.Err})
		return
	}
	in.ready, in.until = true, now.Add(TakeTimeout)
	out.send(Message{Kind: MsgReady, From: e.cfg.Name, To: in.from, VIP: p.VIP, ID: in.id})
}

func (e *Election) onSendFailed(f SendFailed, now time.Time, out *Output) {
	m := f.Msg
	switch m.Kind {
	case MsgOffer, MsgReleased:
		if o := e.ho.out[m.VIP]; o != nil && o.id == m.ID {
			e.abortHandover(m.VIP, fmt.Sprintf("cannot reach %s: %s", m.To, f.Err), true, now, out)
		}
	case MsgReady:
		if in := e.ho.in[m.VIP]; in != nil && in.id == m.ID {
			delete(e.ho.in, m.VIP)
		}
	}
}

// onReleased is the core's release of v during this node's handover: tell
// the successor to take it now.
func (e *Election) onReleased(v string, now time.Time, out *Output) bool {
	o := e.ho.out[v]
	if o == nil || o.phase != hoReleasing {
		return false
	}
	o.phase, o.deadline = hoReleased, now.Add(SettleTimeout)
	out.send(Message{Kind: MsgReleased, From: e.cfg.Name, To: o.to, VIP: v, ID: o.id})
	return true
}

// expire ends the handover steps whose deadline passed.
func (e *Election) expireHandovers(now time.Time, out *Output) {
	for _, v := range slices.Sorted(maps.Keys(e.ho.out)) {
		o := e.ho.out[v]
		if now.Before(o.deadline) {
			continue
		}
		switch o.phase {
		case hoOffered:
			e.abort(v, fmt.Sprintf("%s did not acknowledge within %v", o.to, AckTimeout), now, out)
		case hoReleasing:
			e.abort(v, fmt.Sprintf("the VIP was not released within %v", ReleaseTimeout), now, out)
		case hoReleased:
			e.abort(v, fmt.Sprintf("no claim from %s seen within %v of the release: left to the election", o.to, SettleTimeout), now, out)
		}
	}
	for _, v := range slices.Sorted(maps.Keys(e.ho.in)) {
		if in := e.ho.in[v]; !now.Before(in.until) {
			delete(e.ho.in, v)
		}
	}
}

// handoverDecision adjusts the decision for v while this node hands it
// over: it does not hold it from Ready on, but keeps its claim until the
// successor's claim is seen. It reports whether the normal claim rules
// must be skipped.
func (e *Election) handoverDecision(v string, d *Decision, now time.Time, out *Output) bool {
	o := e.ho.out[v]
	if o == nil {
		return false
	}
	if !d.Holder {
		// The successor's claim (a higher term) is seen, or this node lost
		// the VIP for another reason.
		if d.Leader == o.to && o.phase == hoReleased {
			e.finish(v, true, "handed over to "+o.to, now, out)
		} else {
			e.abort(v, "lost the VIP meanwhile: "+d.Reason, now, out)
		}
		return false
	}
	if o.phase >= hoReleasing {
		*d = Decision{Leader: o.to, Reason: "handing over to " + o.to}
		return true
	}
	return false
}

// trackMembers updates the preemption and failover bookkeeping from the view.
func (e *Election) trackMembers(now time.Time) {
	seen := map[string]bool{}
	for _, m := range e.view {
		if m.Name == e.cfg.Name {
			continue
		}
		seen[m.Name] = true
		if m.State == Alive {
			e.ho.lastAlive[m.Name] = now
		}
		ok := m.State == Alive && m.Meta.Eligible && m.Meta.Healthy && !m.Meta.Leaving && len(m.Meta.Broken) == 0
		if !ok {
			delete(e.ho.eligibleSince, m.Name)
		} else if _, ok := e.ho.eligibleSince[m.Name]; !ok {
			e.ho.eligibleSince[m.Name] = now
		}
	}
	for n := range e.ho.eligibleSince {
		if !seen[n] {
			delete(e.ho.eligibleSince, n)
		}
	}
	for n := range e.ho.lastAlive {
		if !seen[n] && now.Sub(e.ho.lastAlive[n]) > time.Hour {
			delete(e.ho.lastAlive, n)
		}
	}
}

// trackFault notes, for the failover timeline, when v lost a steady holder
// in this node's view.
func (e *Election) trackFault(v string, d Decision, now time.Time) {
	steady := false
	switch {
	case d.Leader == e.cfg.Name:
		steady = d.Holder && e.meta.Holds(v)
	case d.Leader != "":
		m, ok := e.member(d.Leader)
		steady = ok && m.State == Alive && m.Meta.Eligible && m.Meta.Holds(v)
	}
	if steady {
		e.ho.steady[v] = d.Leader
		delete(e.ho.faultAt, v)
		return
	}
	if _, ok := e.ho.faultAt[v]; !ok && e.ho.steady[v] != "" {
		e.ho.faultAt[v] = now
		e.ho.prevOf[v] = e.ho.steady[v]
	}
}

// timeline fills the failover timeline of a decision that makes this
// node the holder.
func (e *Election) timeline(v string, d *Decision, in incoming, handedIn bool) {
	if handedIn {
		d.Handover, d.PrevHolder, d.FaultAt, d.PrevHeardAt = true, in.from, in.at, in.at
		return
	}
	prev := e.ho.prevOf[v]
	fault, ok := e.ho.faultAt[v]
	if !ok || prev == "" || prev == e.cfg.Name {
		return
	}
	d.PrevHolder, d.FaultAt, d.PrevHeardAt = prev, fault, e.ho.lastAlive[prev]
}

// preempt starts a handover of v to a member with a higher priority that
// has been eligible for PreemptDelay without a break.
func (e *Election) preempt(v string, now time.Time, out *Output) {
	if e.cfg.PreemptDelay <= 0 || e.ho.stopping || e.ho.out[v] != nil || !e.holding(v) || now.Before(e.ho.preemptPause[v]) {
		return
	}
	var best *Member
	for i, m := range e.view {
		if m.Name == e.cfg.Name || m.Meta.Priority <= e.cfg.Priority || canTake(m, v) != "" {
			continue
		}
		since, ok := e.ho.eligibleSince[m.Name]
		if !ok || now.Sub(since) < e.cfg.PreemptDelay {
			continue
		}
		if best == nil || better(m, *best, v) {
			best = &e.view[i]
		}
	}
	if best != nil {
		e.startHandover(v, best.Name, now, false, true, out)
	}
}

// handoverNext adds the handover and preemption deadlines.
func (e *Election) handoverNext(add func(time.Time)) {
	for _, o := range e.ho.out {
		add(o.deadline)
	}
	for _, in := range e.ho.in {
		add(in.until)
	}
	for _, t := range e.ho.preemptPause {
		add(t)
	}
	if e.cfg.PreemptDelay > 0 {
		for n, t := range e.ho.eligibleSince {
			if m, ok := e.member(n); ok && m.Meta.Priority > e.cfg.Priority {
				add(t.Add(e.cfg.PreemptDelay))
			}
		}
	}
}

// HandoverStatus is the handover section of the election's status.
type HandoverStatus struct {
	// Last is the last handover of each VIP this node ran.
	Last map[string]HandoverResult `json:"last,omitempty"`
	// Running names the successor of each handover under way.
	Running map[string]string `json:"running,omitempty"`
}

func (e *Election) handoverStatus() HandoverStatus {
	s := HandoverStatus{}
	if len(e.ho.last) > 0 {
		s.Last = maps.Clone(e.ho.last)
	}
	for v, o := range e.ho.out {
		if s.Running == nil {
			s.Running = map[string]string{}
		}
		s.Running[v] = o.to
	}
	return s
}
