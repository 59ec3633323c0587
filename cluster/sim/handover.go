package sim

import (
	"time"

	"github.com/vipd/vipd/cluster"
)

// sendMsg carries a handover message from n like memberlist's reliable
// user messages: a member the sender does not see fails at once, one it
// cannot reach both ways (a TCP connection) fails after TCPTimeout, a
// running one gets it at the next tick, unless the message is lost.
func (s *Sim) sendMsg(n *node, m cluster.Message) {
	if c := s.crashOn; c != nil && c.send && c.node == n.name && c.kind == m.Kind {
		s.crashOn = nil
		s.logf("%s: vipd crashes as it sends %s", n.name, m.Kind)
		s.crashLater(n)
		return
	}
	var to *node
	for _, o := range s.nodes {
		if o != n && o.name == m.To && o.running && o.key == n.key && s.hears(n, o) {
			to = o
			break
		}
	}
	fail := func(after time.Duration, why string) {
		s.msgs = append(s.msgs, simMsg{at: s.now.Add(after), to: n, ev: cluster.SendFailed{Msg: m, Err: why}})
	}
	switch {
	case to == nil:
		fail(Tick, m.To+" is not a member")
	case !s.roundTrip(n, to):
		fail(TCPTimeout, "i/o timeout")
	case (s.lossKind == "" || s.lossKind == m.Kind) && s.hrnd.Float64() < s.msgLoss:
		s.logf("%s: %s to %s lost", n.name, m.Kind, m.To)
	default:
		s.msgs = append(s.msgs, simMsg{at: s.now.Add(Tick), to: to, ev: cluster.MessageReceived{Msg: m}})
	}
}

// crashLater crashes n's vipd at the next tick (not inside its own step).
func (s *Sim) crashLater(n *node) {
	s.msgs = append(s.msgs, simMsg{at: s.now, to: n, ev: nil})
}

// deliverMsgs delivers the messages due now.
func (s *Sim) deliverMsgs() {
	var later []simMsg
	due := s.msgs
	s.msgs = nil
	for _, m := range due {
		if m.at.After(s.now) {
			later = append(later, m)
			continue
		}
		if m.ev == nil { // a scheduled crash
			if m.to.running {
				s.stopVipd(m.to, false)
				m.to.restartAt = s.now.Add(RestartDelay)
			}
			continue
		}
		if !m.to.running {
			continue // a crashed or stopped vipd: the connection is gone
		}
		if mr, ok := m.ev.(cluster.MessageReceived); ok {
			if c := s.crashOn; c != nil && !c.send && c.node == m.to.name && c.kind == mr.Msg.Kind {
				s.crashOn = nil
				s.logf("%s: vipd crashes as %s arrives", m.to.name, mr.Msg.Kind)
				s.stopVipd(m.to, false)
				m.to.restartAt = s.now.Add(RestartDelay)
				continue
			}
		}
		s.elStep(m.to, m.ev)
	}
	s.msgs = append(later, s.msgs...)
}

// holderNode returns the running node whose core holds the VIP, if one.
func (s *Sim) holderNode() *node {
	for _, n := range s.nodes {
		if n.running && n.core != nil && n.core.State()[0].Held && answering(n) {
			return n
		}
	}
	return nil
}

// Handover runs `vipd handover [--to to]` on the named node.
func (s *Sim) Handover(name, to string) {
	n := s.Node(name)
	if n == nil || !n.running {
		return
	}
	s.logf("%s: vipd handover --to %q", name, to)
	s.elStep(n, cluster.HandoverRequested{To: to})
}

// PlannedStop sends SIGTERM to the named node's vipd: it hands its VIPs
// over (waiting up to 2 s, as the daemon does), then stops gracefully and
// is restarted RestartDelay later.
func (s *Sim) PlannedStop(name string) {
	n := s.Node(name)
	if n == nil || !n.running || n.stopping {
		return
	}
	s.logf("%s: SIGTERM (planned stop with handover)", name)
	n.stopping, n.stopAt, n.hoPending = true, s.now.Add(2*time.Second), map[string]bool{}
	if n.core != nil && n.core.State()[0].Held {
		n.hoPending[VIP.String()] = true
	}
	s.elStep(n, cluster.HandoverRequested{Stopping: true})
}

// SetMessageLoss loses handover messages (of one kind, or every kind when
// kind is "") with probability p.
func (s *Sim) SetMessageLoss(kind cluster.MsgKind, p float64) { s.lossKind, s.msgLoss = kind, p }

// CrashOn crashes the named node's vipd when it sends (send) or receives
// the next handover message of kind.
func (s *Sim) CrashOn(name string, kind cluster.MsgKind, send bool) {
	s.crashOn = &crashOn{node: name, kind: kind, send: send}
}

// SetHealthy changes a node's apiserver health.
func (s *Sim) SetHealthy(name string, healthy bool) {
	n := s.Node(name)
	n.healthy = healthy
	if n.running {
		s.coreStep(n, vipHealth(healthy))
		s.elStep(n, elHealth(healthy))
	}
}

// Handovers returns the handover results so far.
func (s *Sim) Handovers() []cluster.HandoverResult { return s.handovers }

// handoverFault injects one random planned handover, with a random
// complication (its own random source, so the other faults keep their
// schedule).
func (s *Sim) handoverFault() {
	h := s.holderNode()
	if h == nil {
		return
	}
	var others []*node
	for _, n := range s.members() {
		if n != h && n.running {
			others = append(others, n)
		}
	}
	to := ""
	if len(others) > 0 && s.hrnd.Intn(2) == 0 {
		to = others[s.hrnd.Intn(len(others))].name
	}
	s.msgLoss, s.lossKind, s.crashOn = 0, "", nil
	switch k := s.hrnd.Intn(10); {
	case k < 2: // lossy handover messages
		s.SetMessageLoss([]cluster.MsgKind{"", cluster.MsgOffer, cluster.MsgReady, cluster.MsgReleased}[s.hrnd.Intn(4)], []float64{0.3, 1}[s.hrnd.Intn(2)])
		s.logf("FAULT handover messages (%q) lost with p=%.1f", s.lossKind, s.msgLoss)
	case k < 4 && to != "": // the successor crashes mid-handover
		s.CrashOn(to, []cluster.MsgKind{cluster.MsgOffer, cluster.MsgReleased}[s.hrnd.Intn(2)], false)
		s.logf("FAULT %s will crash mid-handover", to)
	case k < 5: // the holder crashes mid-handover
		s.CrashOn(h.name, []cluster.MsgKind{cluster.MsgOffer, cluster.MsgReleased}[s.hrnd.Intn(2)], true)
		s.logf("FAULT %s will crash mid-handover", h.name)
	}
	if s.hrnd.Intn(3) == 0 {
		s.PlannedStop(h.name)
	} else {
		s.Handover(h.name, to)
	}
}
