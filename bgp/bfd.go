package bgp

import (
	"context"
	"net/netip"
	"sync"
)

// BFDState is a BFD session's state as the speaker needs it.
type BFDState int

// BFD states seen by the speaker. RemoteAdminDown is the peer saying it
// stopped BFD on purpose (RFC 5880 AdminDown): RFC 5882 section 3.2 says
// not to tear the client session down for that.
const (
	BFDDown BFDState = iota
	BFDUp
	BFDRemoteAdminDown
)

// BFDEvent is a state change of the BFD session protecting one BGP peer.
type BFDEvent struct {
	Peer   netip.Addr
	State  BFDState
	Reason string // diagnostic, logged and sent in the NOTIFICATION
}

// bfdAction is what a BFD state change asks of the BGP session.
type bfdAction int

const (
	bfdNothing bfdAction = iota
	bfdReset             // tear the session down now
	bfdEnable            // let the session (re)connect
)

// decideBFD is the pure rule. Only a detected failure (Up to Down) resets
// the session: a session that has never been Up says nothing about the
// path (FRR creates its BFD session for a dynamic neighbour only once BGP
// is Established), and a remote AdminDown is a deliberate stop.
func decideBFD(wasUp bool, st BFDState) bfdAction {
	switch st {
	case BFDUp:
		if !wasUp {
			return bfdEnable
		}
	case BFDDown:
		if wasUp {
			return bfdReset
		}
	}
	return bfdNothing
}

// peerControl is the part of the speaker BFD drives; Speaker implements it.
type peerControl interface {
	ResetPeer(ctx context.Context, peer netip.Addr, reason string) error
	EnablePeer(ctx context.Context, peer netip.Addr) error
}

// BFDLink applies BFD state changes to BGP sessions: a BFD Down (after Up)
// hard-resets the session to that peer at once, and BFD Up makes sure the
// session is enabled. A reset peer reconnects after the speaker's short
// idle hold (Config.IdleHoldAfterReset), so the link never holds a session
// down on its own: routers such as FRR run BFD for a dynamic neighbour
// only while its BGP session is up, and a peer kept disabled until BFD
// came back would never come back.
type BFDLink struct {
	ctl peerControl
	mu  sync.Mutex
	up  map[netip.Addr]bool
}

// NewBFDLink returns a link driving s.
func NewBFDLink(s *Speaker) *BFDLink { return newBFDLink(s) }

func newBFDLink(ctl peerControl) *BFDLink {
	return &BFDLink{ctl: ctl, up: map[netip.Addr]bool{}}
}

// Handle applies one event; it is safe to call from BFD's goroutines.
func (l *BFDLink) Handle(ctx context.Context, ev BFDEvent) error {
	l.mu.Lock()
	wasUp := l.up[ev.Peer]
	l.up[ev.Peer] = ev.State == BFDUp
	l.mu.Unlock()
	switch decideBFD(wasUp, ev.State) {
	case bfdReset:
		reason := "BFD down"
		if ev.Reason != "" {
			reason += ": " + ev.Reason
		}
		return l.ctl.ResetPeer(ctx, ev.Peer, reason)
	case bfdEnable:
		return l.ctl.EnablePeer(ctx, ev.Peer)
	}
	return nil
}
