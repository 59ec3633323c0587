package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// msgTag starts every handover message on the wire (memberlist user
// messages), so other payloads are never mistaken for one.
const msgTag = 'H'

func encodeMsg(m Message) []byte {
	b, _ := json.Marshal(m)
	return append([]byte{msgTag}, b...)
}

func decodeMsg(b []byte) (Message, bool) {
	var m Message
	if len(b) < 2 || b[0] != msgTag || json.Unmarshal(b[1:], &m) != nil || m.From == "" || m.VIP == "" {
		return Message{}, false
	}
	switch m.Kind {
	case MsgOffer, MsgReady, MsgDeclined, MsgReleased:
		return m, true
	}
	return Message{}, false
}

// sendMsg delivers a handover message directly to its node over
// memberlist's reliable (TCP, encrypted with the gossip key) user-message
// path, without blocking the election; a failure goes back to it.
func (n *Node) sendMsg(m Message) {
	var to *memberlist.Node
	for _, mb := range n.ml.Members() {
		if mb.Name == m.To {
			to = mb
		}
	}
	if to == nil {
		n.send(SendFailed{Msg: m, Err: m.To + " is not a member"})
		return
	}
	go func() {
		if err := n.ml.SendReliable(to, encodeMsg(m)); err != nil {
			n.send(SendFailed{Msg: m, Err: err.Error()})
		}
	}()
}

// OnPrepare sets how the election asks the core to get ready for a VIP
// offered in a handover (answered with SetPrepared). Call before Run.
func (n *Node) OnPrepare(fn func(vip string)) { n.prepare = fn }

// SetPrepared answers OnPrepare: err is nil when the core is ready.
func (n *Node) SetPrepared(vip string, err error) {
	p := Prepared{VIP: vip}
	if err != nil {
		p.Err = err.Error()
	}
	n.send(p)
}

// handoverRequest carries a HandoverRequested with the channel its
// results go to.
type handoverRequest struct {
	HandoverRequested
	reply chan []HandoverResult
}

type waiter struct {
	pending map[string]bool
	results []HandoverResult
	reply   chan []HandoverResult
}

// HandOver asks this node to hand VIPs it holds over (see
// HandoverRequested) and waits until each handover ended, was refused, or
// ctx is done. It returns a result for every VIP it tried.
func (n *Node) HandOver(ctx context.Context, req HandoverRequested) ([]HandoverResult, error) {
	r := handoverRequest{HandoverRequested: req, reply: make(chan []HandoverResult, 1)}
	select {
	case n.inbox <- r:
		n.poke()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case res := <-r.reply:
		return res, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("handover still under way: %w", ctx.Err())
	}
}

func (handoverRequest) isElectionEvent() {}

// startWaiter registers the VIPs the request started handovers for, and
// answers at once when there are none.
func (n *Node) startWaiter(r handoverRequest, out Output) {
	w := &waiter{pending: map[string]bool{}, reply: r.reply}
	for _, m := range out.Send {
		if m.Kind == MsgOffer && m.From == n.cfg.Name {
			w.pending[m.VIP] = true
		}
	}
	for _, h := range out.Handovers {
		if !w.pending[h.VIP] {
			w.results = append(w.results, h)
		}
	}
	if len(w.pending) == 0 {
		w.reply <- w.results
		return
	}
	n.waiters = append(n.waiters, w)
}

// deliver hands finished handovers to the requests waiting for them.
func (n *Node) deliver(rs []HandoverResult) {
	for _, r := range rs {
		if r.Refused {
			continue // answers the request that asked (startWaiter)
		}
		for _, w := range n.waiters {
			if w.pending[r.VIP] {
				delete(w.pending, r.VIP)
				w.results = append(w.results, r)
			}
		}
	}
	n.waiters = slices.DeleteFunc(n.waiters, func(w *waiter) bool {
		if len(w.pending) > 0 {
			return false
		}
		w.reply <- w.results
		return true
	})
}

// handoverWait is the longest a planned handover may take: each step's
// deadline, one after the other.
const handoverWait = AckTimeout + ReleaseTimeout + SettleTimeout + 500*time.Millisecond

// HandoverWait bounds HandOver for callers without a deadline of their own.
func HandoverWait() time.Duration { return handoverWait }
