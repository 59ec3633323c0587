package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v3/api"
)

// maxQuickRecoveries bounds back-to-back re-creations of a session that
// reaches OPEN but never Established (wrong AS, router rejecting us): after
// that many, GoBGP's own idle hold (5 s) paces the attempts.
const maxQuickRecoveries = 3

// decideRecovery is the pure rule for a session that dropped without vipd
// asking: it returns true when the peer should be re-created at once.
//
// Why: GoBGP v3 (pkg/server/fsm.go) keeps a dropped session Idle for a
// hard-coded 5 s (holdtimeIdle) and then waits another 1-2 s before its
// first dial, so a router restart or link flap cost about 7 s. A freshly
// added peer starts with no idle hold and dials after 1-2 s, then every
// 1-2 x ConnectRetry (1 s): the session is back within about 2 s of the
// router accepting connections.
//
// prev/next are the session states, disabled says vipd disabled the peer
// on purpose, streak counts re-creations since the session was last
// Established.
func decideRecovery(prev, next api.PeerState_SessionState, disabled bool, streak int) bool {
	if disabled || next != api.PeerState_IDLE {
		return false
	}
	switch prev {
	case api.PeerState_ESTABLISHED:
		return true
	case api.PeerState_OPENSENT, api.PeerState_OPENCONFIRM:
		return streak < maxQuickRecoveries
	}
	return false
}

// recoverLoop re-creates the peers sent on s.recover until ctx ends. It is
// the only goroutine that deletes and adds peers after Start.
func (s *Speaker) recoverLoop(ctx context.Context) {
	defer close(s.recoverDone)
	for {
		select {
		case <-ctx.Done():
			return
		case addr := <-s.recover:
			if err := s.recreatePeer(ctx, addr); err != nil && ctx.Err() == nil {
				s.log.Warn("bgp: could not re-create the session; GoBGP retries on its own", "peer", addr.String(), "err", err)
			}
		}
	}
}

func (s *Speaker) recreatePeer(ctx context.Context, addr netip.Addr) error {
	s.mu.Lock()
	pi, ok := s.peers[addr]
	if !ok || pi.disabled || s.closed {
		s.mu.Unlock()
		return nil
	}
	p := pi.peer
	pi.recoveries++
	s.mu.Unlock()
	opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The session is Idle: deleting it sends nothing to the router.
	if err := s.srv.DeletePeer(opCtx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
		return fmt.Errorf("delete peer: %w", err)
	}
	if err := s.srv.AddPeer(opCtx, &api.AddPeerRequest{Peer: s.apiPeer(p)}); err != nil {
		return fmt.Errorf("add peer: %w", err)
	}
	s.log.Info("bgp session dropped; reconnecting at once", "peer", p.String())
	return nil
}
