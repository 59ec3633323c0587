package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
)

// Binder puts a VIP on (and takes it off) the local interface the VIP
// traffic is delivered to. The speaker's default binds on lo with netlink.
type Binder interface {
	Bind(vip netip.Prefix) error
	Unbind(vip netip.Prefix) error
	Bound(vip netip.Prefix) (bool, error)
}

// Options are the speaker's collaborators; all are optional.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: no metrics
	Binder     Binder                // nil: netlink on Config.Interface
}

// Speaker is the bgp-mode vip.Announcer: an embedded GoBGP speaker that
// advertises each acquired VIP as a /32 or /128 to every peer of the same
// address family, with the VIP bound on lo so the node accepts its traffic.
type Speaker struct {
	cfg    Config
	log    *slog.Logger
	srv    *server.BgpServer
	binder Binder
	cancel context.CancelFunc
	reg    prometheus.Registerer
	coll   *collector

	// recover carries peers whose session dropped to recoverLoop.
	recover       chan netip.Addr
	recoverCancel context.CancelFunc
	recoverDone   chan struct{}

	mu       sync.Mutex
	peers    map[netip.Addr]*peerInfo
	held     map[netip.Prefix]bool // true: acquired; false: released since (kept so metrics show 0)
	closed   bool
	closeErr error
}

type peerInfo struct {
	peer  Peer
	state api.PeerState_SessionState
	since time.Time
	flaps int // transitions out of Established
	// disabled: vipd disabled the session on purpose (no recovery).
	disabled bool
	// recoveries since the session was last Established.
	recoveries int
}

// Start validates cfg, starts GoBGP and adds every peer (active sessions).
// The returned speaker holds no VIP until Acquire.
func Start(ctx context.Context, cfg Config, opts Options) (*Speaker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "bgp")
	binder := opts.Binder
	if binder == nil {
		binder = newNetlinkBinder(cfg.Interface)
	}
	srv := server.NewBgpServer(server.LoggerOption(slogBridge{l: logger}))
	go srv.Serve()
	s := &Speaker{
		cfg: cfg, log: logger, srv: srv, binder: binder, reg: opts.Registerer,
		peers: map[netip.Addr]*peerInfo{}, held: map[netip.Prefix]bool{},
		recover: make(chan netip.Addr, len(cfg.Peers)*4+1), recoverDone: make(chan struct{}),
	}
	for _, p := range cfg.Peers {
		s.peers[p.Address] = &peerInfo{peer: p, state: api.PeerState_UNKNOWN, since: time.Now()}
	}
	wctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	rctx, rcancel := context.WithCancel(context.Background())
	s.recoverCancel = rcancel
	go s.recoverLoop(rctx)
	if err := s.start(ctx, wctx); err != nil {
		cancel()
		rcancel()
		<-s.recoverDone
		stopCtx, stop := context.WithTimeout(context.Background(), 2*time.Second)
		defer stop()
		_ = srv.StopBgp(stopCtx, &api.StopBgpRequest{})
		srv.Stop()
		return nil, err
	}
	if s.reg != nil {
		s.coll = newCollector(s)
		if err := s.reg.Register(s.coll); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("bgp: register metrics: %w", err)
		}
	}
	return s, nil
}

func (s *Speaker) start(ctx, watchCtx context.Context) error {
	listen := int32(-1) // do not listen: sessions are dialled by us
	if s.cfg.ListenPort != 0 {
		listen = int32(s.cfg.ListenPort)
	}
	global := &api.Global{Asn: s.cfg.LocalAS, RouterId: s.cfg.RouterID.String(), ListenPort: listen}
	if s.cfg.ListenPort != 0 {
		global.ListenAddresses = []string{"0.0.0.0", "::"}
	}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		return fmt.Errorf("bgp: start speaker (AS %d, router id %s): %w", s.cfg.LocalAS, s.cfg.RouterID, err)
	}
	if err := s.rejectLearnedRoutes(ctx); err != nil {
		return err
	}
	if err := s.srv.WatchEvent(watchCtx, &api.WatchEventRequest{Peer: &api.WatchEventRequest_Peer{}}, s.onEvent); err != nil {
		return fmt.Errorf("bgp: watch peer events: %w", err)
	}
	for _, p := range s.cfg.Peers {
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.apiPeer(p)}); err != nil {
			return fmt.Errorf("bgp: add peer %s (AS %d): %w", p, p.AS, err)
		}
		s.log.Info("bgp peer configured", "peer", p.String(), "peer_as", p.AS, "hold", p.Hold, "keepalive", p.Keepalive,
			"md5", p.Password != "", "multihop", p.Multihop, "graceful_restart", s.cfg.GracefulRestart)
	}
	return nil
}

// rejectLearnedRoutes installs a global import policy that drops every
// route received from any neighbour. The router echoes the other nodes'
// VIP paths back to us; vipd has no use for them and must never act on
// them. Locally originated paths have no neighbour and are not matched.
func (s *Speaker) rejectLearnedRoutes(ctx context.Context) error {
	const setName, polName = "vipd-any-neighbor", "vipd-reject-learned"
	if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_NEIGHBOR, Name: setName, List: []string{"0.0.0.0/0", "::/0"},
	}}); err != nil {
		return fmt.Errorf("bgp: import policy neighbour set: %w", err)
	}
	pol := &api.Policy{Name: polName, Statements: []*api.Statement{{
		Name:       polName + "-all",
		Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: setName}},
		Actions:    &api.Actions{RouteAction: api.RouteAction_REJECT},
	}}}
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: pol, ReferExistingStatements: false}); err != nil {
		return fmt.Errorf("bgp: import policy: %w", err)
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_IMPORT,
		Policies: []*api.Policy{{Name: polName}}, DefaultAction: api.RouteAction_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("bgp: assign import policy: %w", err)
	}
	return nil
}

func family(a netip.Addr) *api.Family {
	if a.Is4() {
		return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
}

func secs(d time.Duration) uint64 { return uint64(d / time.Second) }

func (s *Speaker) apiPeer(p Peer) *api.Peer {
	gr := s.cfg.GracefulRestart
	afi := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: family(p.Address), Enabled: true}}
	if gr {
		afi.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	ap := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.AS, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           secs(s.cfg.ConnectRetry),
			HoldTime:               secs(p.Hold),
			KeepaliveInterval:      secs(p.Keepalive),
			IdleHoldTimeAfterReset: secs(s.cfg.IdleHoldAfterReset),
		}},
		Transport: &api.Transport{RemotePort: uint32(p.Port), PassiveMode: false},
		AfiSafis:  []*api.AfiSafi{afi},
	}
	if p.Multihop > 0 {
		ap.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.Multihop)}
	}
	if gr {
		ap.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(secs(s.cfg.RestartTime))}
	}
	return ap
}

func (s *Speaker) onEvent(r *api.WatchEventResponse) {
	ev := r.GetPeer()
	if ev == nil || ev.Type != api.WatchEventResponse_PeerEvent_STATE || ev.Peer == nil || ev.Peer.State == nil {
		return
	}
	addr, err := netip.ParseAddr(ev.Peer.State.NeighborAddress)
	if err != nil {
		return
	}
	addr = addr.Unmap()
	st := ev.Peer.State.SessionState
	s.mu.Lock()
	pi, ok := s.peers[addr]
	if !ok || pi.state == st {
		s.mu.Unlock()
		return
	}
	prev := pi.state
	pi.state, pi.since = st, time.Now()
	if prev == api.PeerState_ESTABLISHED {
		pi.flaps++
	}
	if st == api.PeerState_ESTABLISHED {
		pi.recoveries = 0
	}
	recover := !s.closed && decideRecovery(prev, st, pi.disabled, pi.recoveries)
	s.mu.Unlock()
	if recover {
		select {
		case s.recover <- addr:
		default: // already queued
		}
	}
	if st == api.PeerState_ESTABLISHED || prev == api.PeerState_ESTABLISHED {
		s.log.Info("bgp peer state", "peer", pi.peer.String(), "from", stateName(prev), "to", stateName(st))
	} else {
		s.log.Debug("bgp peer state", "peer", pi.peer.String(), "from", stateName(prev), "to", stateName(st))
	}
}

func stateName(st api.PeerState_SessionState) string {
	switch st {
	case api.PeerState_UNKNOWN:
		return "unknown"
	case api.PeerState_IDLE:
		return "idle"
	case api.PeerState_CONNECT:
		return "connect"
	case api.PeerState_ACTIVE:
		return "active"
	case api.PeerState_OPENSENT:
		return "opensent"
	case api.PeerState_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_ESTABLISHED:
		return "established"
	}
	return st.String()
}

// vipPath builds the advertisement of vip with an unspecified next hop, so
// GoBGP fills in the local address of each session (IPv4 0.0.0.0 in the
// NEXT_HOP attribute, IPv6 :: in MP_REACH_NLRI).
func vipPath(vip netip.Prefix, attrs Attributes, localAS uint32) (*api.Path, error) {
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0}) // IGP
	if err != nil {
		return nil, err
	}
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: vip.Addr().String(), PrefixLen: uint32(vip.Bits())})
	if err != nil {
		return nil, err
	}
	fam := family(vip.Addr())
	var nh *anypb.Any
	if vip.Addr().Is4() {
		nh, err = anypb.New(&api.NextHopAttribute{NextHop: "0.0.0.0"})
	} else {
		nh, err = anypb.New(&api.MpReachNLRIAttribute{Family: fam, NextHops: []string{"::"}, Nlris: []*anypb.Any{nlri}})
	}
	if err != nil {
		return nil, err
	}
	extra, err := attrs.pattrs(localAS)
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: fam, Nlri: nlri, Pattrs: append([]*anypb.Any{origin, nh}, extra...)}, nil
}

// checkVIP accepts host prefixes only: a VIP is one address.
func checkVIP(vip netip.Prefix) (netip.Prefix, error) {
	if !vip.IsValid() {
		return vip, errors.New("bgp: invalid VIP prefix")
	}
	a := vip.Addr().Unmap()
	if vip.Bits() != a.BitLen() {
		return vip, fmt.Errorf("bgp: VIP %s: want a single address (/32 or /128)", vip)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Acquire binds vip on lo and advertises it to every peer of its family.
// It is idempotent: a VIP already bound and in the RIB is left alone, so
// the router sees no extra UPDATE on each reconcile pass.
func (s *Speaker) Acquire(ctx context.Context, vip netip.Prefix) error {
	vip, err := checkVIP(vip)
	if err != nil {
		return err
	}
	if err := s.binder.Bind(vip); err != nil {
		return fmt.Errorf("bgp: bind %s on %s: %w", vip, s.cfg.Interface, err)
	}
	inRIB, err := s.inRIB(ctx, vip)
	if err != nil {
		return err
	}
	if !inRIB {
		attrs := s.cfg.attributesFor(vip)
		p, err := vipPath(vip, attrs, s.cfg.LocalAS)
		if err != nil {
			return fmt.Errorf("bgp: build path for %s: %w", vip, err)
		}
		if _, err := s.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: p}); err != nil {
			return fmt.Errorf("bgp: advertise %s: %w", vip, err)
		}
		if !s.hasPeerFor(vip.Addr()) {
			s.log.Warn("bgp: VIP has no peer of its address family; it is bound but reaches no router", "vip", vip.String())
		}
		s.log.Info("bgp advertise", "vip", vip.String(), "attributes", attrs.String())
	}
	s.mu.Lock()
	s.held[vip] = true
	s.mu.Unlock()
	return nil
}

func (s *Speaker) hasPeerFor(a netip.Addr) bool {
	for _, p := range s.cfg.Peers {
		if p.Address.Is4() == a.Is4() {
			return true
		}
	}
	return false
}

// Release withdraws vip from every peer, then removes it from lo. Releasing
// a VIP that is not held is not an error.
func (s *Speaker) Release(ctx context.Context, vip netip.Prefix) error {
	vip, err := checkVIP(vip)
	if err != nil {
		return err
	}
	var errs []error
	inRIB, err := s.inRIB(ctx, vip)
	if err != nil {
		errs = append(errs, err)
	}
	if inRIB || err != nil {
		if werr := s.withdraw(ctx, vip); werr != nil {
			errs = append(errs, werr)
		} else {
			s.log.Info("bgp withdraw", "vip", vip.String())
		}
	}
	if err := s.binder.Unbind(vip); err != nil {
		errs = append(errs, fmt.Errorf("bgp: unbind %s from %s: %w", vip, s.cfg.Interface, err))
	}
	s.mu.Lock()
	s.held[vip] = false
	s.mu.Unlock()
	return errors.Join(errs...)
}

// withdraw deletes exactly vip's locally originated path. It never sends a
// DeletePath request without a path: GoBGP reads that as "delete all".
func (s *Speaker) withdraw(ctx context.Context, vip netip.Prefix) error {
	p, err := vipPath(vip, s.cfg.attributesFor(vip), s.cfg.LocalAS)
	if err != nil {
		return fmt.Errorf("bgp: build path for %s: %w", vip, err)
	}
	if p == nil || p.Nlri == nil {
		return fmt.Errorf("bgp: refusing to withdraw %s with an empty path", vip)
	}
	if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Family: p.Family, Path: p}); err != nil {
		return fmt.Errorf("bgp: withdraw %s: %w", vip, err)
	}
	return nil
}

// inRIB reports whether a locally originated path for vip is in the
// global RIB (learned routes never are: the import policy rejects them).
func (s *Speaker) inRIB(ctx context.Context, vip netip.Prefix) (bool, error) {
	found := false
	err := s.srv.ListPath(ctx, &api.ListPathRequest{
		TableType: api.TableType_GLOBAL, Family: family(vip.Addr()),
		Prefixes: []*api.TableLookupPrefix{{Prefix: vip.String(), Type: api.TableLookupPrefix_EXACT}},
	}, func(d *api.Destination) {
		for _, p := range d.Paths {
			if !p.IsWithdraw && isLocal(p) {
				found = true
			}
		}
	})
	if err != nil {
		return false, fmt.Errorf("bgp: look up %s in the RIB: %w", vip, err)
	}
	return found, nil
}

func isLocal(p *api.Path) bool {
	return p.NeighborIp == "" || p.NeighborIp == "<nil>" || p.NeighborIp == "0.0.0.0" || p.NeighborIp == "::"
}

// Announce has nothing to repeat in bgp mode: the sessions carry the state.
func (s *Speaker) Announce(context.Context, netip.Prefix) error { return nil }

// Present reports whether vip is both bound on lo and advertised (acquired
// and not released since, so in the RIB and sent to every established
// peer of its family).
func (s *Speaker) Present(ctx context.Context, vip netip.Prefix) (bool, error) {
	vip, err := checkVIP(vip)
	if err != nil {
		return false, err
	}
	bound, err := s.binder.Bound(vip)
	if err != nil {
		return false, fmt.Errorf("bgp: check %s on %s: %w", vip, s.cfg.Interface, err)
	}
	if !bound {
		return false, nil
	}
	// The RIB changes only through Acquire and Release (GoBGP has no API
	// open to anyone else), so the speaker's own record answers: asking
	// GoBGP for every VIP on every reconcile pass cost a quarter of a core
	// with 2,000 VIPs.
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[vip], nil
}

// ResetPeer tears the session to peer down at once (a BGP NOTIFICATION
// Cease/Administrative Reset) and lets it reconnect after the short idle
// hold. BFD Down calls this: the router must not keep a path whose next
// hop stopped answering.
func (s *Speaker) ResetPeer(ctx context.Context, peer netip.Addr, reason string) error {
	// Only an Established session has anything to tear down. GoBGP queues
	// the NOTIFICATION on the peer's FSM even when the session is not up,
	// and a peer re-created after a drop would then send it on its next
	// session and drop that too (a BFD Down often arrives after the router
	// already closed the session).
	s.mu.Lock()
	pi, ok := s.peers[peer.Unmap()]
	established := ok && pi.state == api.PeerState_ESTABLISHED
	s.mu.Unlock()
	if !established {
		s.log.Info("bgp peer reset not needed: session not established", "peer", peer.String(), "reason", reason)
		return nil
	}
	if err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: peer.String(), Communication: reason}); err != nil {
		return fmt.Errorf("bgp: reset peer %s: %w", peer, err)
	}
	s.log.Info("bgp peer reset", "peer", peer.String(), "reason", reason)
	return nil
}

// DisablePeer shuts the session down and keeps it down (administratively)
// until EnablePeer.
func (s *Speaker) DisablePeer(ctx context.Context, peer netip.Addr, reason string) error {
	s.setDisabled(peer, true)
	if err := s.srv.DisablePeer(ctx, &api.DisablePeerRequest{Address: peer.String(), Communication: reason}); err != nil {
		return fmt.Errorf("bgp: disable peer %s: %w", peer, err)
	}
	s.log.Info("bgp peer disabled", "peer", peer.String(), "reason", reason)
	return nil
}

// EnablePeer lets a disabled peer connect again. Enabling an enabled peer
// is harmless.
func (s *Speaker) EnablePeer(ctx context.Context, peer netip.Addr) error {
	s.setDisabled(peer, false)
	if err := s.srv.EnablePeer(ctx, &api.EnablePeerRequest{Address: peer.String()}); err != nil {
		return fmt.Errorf("bgp: enable peer %s: %w", peer, err)
	}
	return nil
}

func (s *Speaker) setDisabled(peer netip.Addr, v bool) {
	s.mu.Lock()
	if pi, ok := s.peers[peer.Unmap()]; ok {
		pi.disabled = v
	}
	s.mu.Unlock()
}

// Peers returns the configured peers (with defaults applied).
func (s *Speaker) Peers() []Peer {
	return append([]Peer(nil), s.cfg.Peers...)
}

// PeerStatus is one peer's state for /status.
type PeerStatus struct {
	Peer        string    `json:"peer"`
	AS          uint32    `json:"as"`
	State       string    `json:"state"`
	Established bool      `json:"established"`
	Since       time.Time `json:"since"`
	Flaps       int       `json:"flaps"`
	// Advertised lists the VIPs in the peer's Adj-RIB-Out (sent to it).
	Advertised []string `json:"advertised"`
}

// Status is the speaker's state for /status.
type Status struct {
	LocalAS  uint32       `json:"local_as"`
	RouterID string       `json:"router_id"`
	VIPs     []string     `json:"vips"` // acquired (bound and in the RIB)
	Peers    []PeerStatus `json:"peers"`
}

// Status reports peer sessions and, per peer, which VIPs were sent to it.
func (s *Speaker) Status(ctx context.Context) Status {
	s.mu.Lock()
	st := Status{LocalAS: s.cfg.LocalAS, RouterID: s.cfg.RouterID.String()}
	held := make([]netip.Prefix, 0, len(s.held))
	for v, ok := range s.held {
		if ok {
			held = append(held, v)
		}
	}
	type snap struct {
		addr netip.Addr
		ps   PeerStatus
	}
	var peers []snap
	for _, p := range s.cfg.Peers {
		pi := s.peers[p.Address]
		peers = append(peers, snap{p.Address, PeerStatus{
			Peer: p.String(), AS: p.AS, State: stateName(pi.state), Established: pi.state == api.PeerState_ESTABLISHED,
			Since: pi.since, Flaps: pi.flaps, Advertised: []string{},
		}})
	}
	s.mu.Unlock()
	sort.Slice(held, func(i, j int) bool { return held[i].Addr().Less(held[j].Addr()) })
	st.VIPs = []string{}
	for _, v := range held {
		st.VIPs = append(st.VIPs, v.String())
	}
	for _, p := range peers {
		if p.ps.Established {
			for _, v := range held {
				if v.Addr().Is4() == p.addr.Is4() && s.inAdjOut(ctx, p.addr, v) {
					p.ps.Advertised = append(p.ps.Advertised, v.String())
				}
			}
		}
		st.Peers = append(st.Peers, p.ps)
	}
	return st
}

// knownVIPs lists every VIP acquired at least once, sorted.
func (s *Speaker) knownVIPs() []string {
	s.mu.Lock()
	vs := make([]netip.Prefix, 0, len(s.held))
	for v := range s.held {
		vs = append(vs, v)
	}
	s.mu.Unlock()
	sort.Slice(vs, func(i, j int) bool { return vs[i].Addr().Less(vs[j].Addr()) })
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

func (s *Speaker) inAdjOut(ctx context.Context, peer netip.Addr, vip netip.Prefix) bool {
	found := false
	err := s.srv.ListPath(ctx, &api.ListPathRequest{
		TableType: api.TableType_ADJ_OUT, Name: peer.String(), Family: family(vip.Addr()),
		Prefixes: []*api.TableLookupPrefix{{Prefix: vip.String(), Type: api.TableLookupPrefix_EXACT}},
	}, func(d *api.Destination) {
		for _, p := range d.Paths {
			if !p.IsWithdraw {
				found = true
			}
		}
	})
	return err == nil && found
}

// Close stops every session (the router drops this node's paths as the
// sessions close) and the speaker. It does not unbind VIPs from lo: call
// Release first for a clean stop.
func (s *Speaker) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closeErr
	}
	s.closed = true
	s.mu.Unlock()
	if s.coll != nil && s.reg != nil {
		s.reg.Unregister(s.coll)
	}
	// No peer is re-created from here on: GoBGP's management calls block
	// for ever once the server has stopped.
	s.recoverCancel()
	<-s.recoverDone
	// StopBgp sends a Cease to every peer and waits for the sessions to
	// close; it takes no deadline of its own, so bound it here.
	done := make(chan struct{})
	go func() {
		s.srv.Stop()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		err = errors.New("bgp: stop: sessions did not close within 3s")
	}
	s.cancel()
	s.mu.Lock()
	s.closeErr = err
	s.mu.Unlock()
	return err
}
