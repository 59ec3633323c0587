package bfd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StateChangeFunc is called after a session changed state. It runs on the
// Server's single notification goroutine, in order; it must not block for
// long (it delays later notifications, not the sessions).
type StateChangeFunc func(peer netip.Addr, old, new State, diag Diag)

// ServerConfig configures a Server. Every field is optional.
type ServerConfig struct {
	// ListenAddrs are the local addresses the receive sockets (UDP 3784)
	// bind to, at most one per address family. A family without an entry
	// binds to the wildcard address (0.0.0.0 or ::).
	ListenAddrs []netip.Addr
	// Port is the receive and destination UDP port; 0 means 3784. Other
	// values are for tests only.
	Port int
	// MultihopPort is the same for multihop sessions; 0 means 4784.
	MultihopPort int
	// OnStateChange is called on every state change of every session,
	// except for the AdminDown that Remove and Close cause.
	OnStateChange StateChangeFunc
	// Registerer receives vipd_bfd_session_up and
	// vipd_bfd_session_flaps_total; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Rand returns values in [0, 1) for the TX jitter and source ports; it
	// is called from several goroutines, so it must be safe for concurrent
	// use. nil uses math/rand/v2.
	Rand func() float64
}

// PeerStatus is the status of one session, ready for /status JSON.
type PeerStatus struct {
	Peer       netip.Addr `json:"peer"`
	Local      netip.Addr `json:"local,omitzero"`
	Multihop   bool       `json:"multihop,omitempty"` // RFC 5883 session
	MinTTL     int        `json:"min_ttl,omitempty"`  // multihop: lowest TTL accepted
	Session    Status     `json:"session"`
	LastChange time.Time  `json:"last_change,omitzero"`
	Flaps      uint64     `json:"flaps"` // times the session left Up
	// Counters of received datagrams by outcome.
	RxPackets uint64 `json:"rx_packets"`
	TxPackets uint64 `json:"tx_packets"`
	TxErrors  uint64 `json:"tx_errors"`
}

// ShutdownPackets is how many AdminDown packets Remove and Close send, 10 ms
// apart, so one lost datagram does not leave the remote to time out.
const ShutdownPackets = 3

const shutdownSpacing = 10 * time.Millisecond

// Errors of Server methods.
var (
	ErrSessionExists = errors.New("bfd: a session for this peer already exists")
	ErrNoSession     = errors.New("bfd: no session for this peer")
	ErrServerClosed  = errors.New("bfd: server closed")
)

// Server runs single-hop BFD sessions, one per peer address, sharing one
// receive socket per address family.
//
// Sockets are opened synchronously inside NewServer and Add, on the calling
// goroutine's OS thread; a caller that wants them in a network namespace
// calls these from a thread in that namespace (see the package example in
// frr_test.go). No socket is opened later from another goroutine.
type Server struct {
	cfg    ServerConfig
	log    *slog.Logger
	rand   func() float64
	port   int
	mhPort int

	up    *prometheus.GaugeVec
	flaps *prometheus.CounterVec

	mu        sync.RWMutex
	closed    bool
	byPeer    map[netip.Addr]*peerSession
	byDisc    map[uint32]*peerSession
	listeners map[listenerKey]*listener
	wg        sync.WaitGroup // read loops and sessions

	notes *notifier

	gtsmDrops, parseDrops, unknownDrops uint64 // guarded by mu (write lock)
}

// NewServer returns a running Server without sessions.
func NewServer(cfg ServerConfig) (*Server, error) {
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		rand:      cfg.Rand,
		port:      cfg.Port,
		byPeer:    map[netip.Addr]*peerSession{},
		byDisc:    map[uint32]*peerSession{},
		listeners: map[listenerKey]*listener{},
		mhPort:    cfg.MultihopPort,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "bfd")
	if s.rand == nil {
		s.rand = defaultRand
	}
	if s.port == 0 {
		s.port = ControlPort
	}
	if s.port < 1 || s.port > 65535 {
		return nil, fmt.Errorf("bfd: port %d out of range 1-65535", cfg.Port)
	}
	if s.mhPort == 0 {
		s.mhPort = MultihopPort
	}
	if s.mhPort < 1 || s.mhPort > 65535 || s.mhPort == s.port {
		return nil, fmt.Errorf("bfd: multihop port %d out of range 1-65535 or equal to the single-hop port", cfg.MultihopPort)
	}
	seen := map[bool]bool{}
	for _, a := range cfg.ListenAddrs {
		if !a.IsValid() {
			return nil, errors.New("bfd: invalid listen address")
		}
		if seen[a.Is6()] {
			return nil, fmt.Errorf("bfd: more than one listen address for IPv%d", map[bool]int{false: 4, true: 6}[a.Is6()])
		}
		seen[a.Is6()] = true
	}
	s.up = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vipd_bfd_session_up", Help: "1 when the BFD session to the peer is Up, else 0.",
	}, []string{"peer"})
	s.flaps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vipd_bfd_session_flaps_total", Help: "Times the BFD session to the peer left the Up state.",
	}, []string{"peer"})
	if r := cfg.Registerer; r != nil {
		if err := r.Register(s.up); err != nil {
			return nil, fmt.Errorf("bfd: register metrics: %w", err)
		}
		if err := r.Register(s.flaps); err != nil {
			r.Unregister(s.up)
			return nil, fmt.Errorf("bfd: register metrics: %w", err)
		}
	}
	s.notes = newNotifier(cfg.OnStateChange)
	return s, nil
}

// Add starts a session to peer, sending from local (the zero Addr lets the
// kernel choose). It opens the receive socket for the peer's address
// family if needed and the session's own transmit socket.
func (s *Server) Add(peer, local netip.Addr, cfg SessionConfig) error {
	return s.add(peer, local, cfg, 0)
}

// AddMultihop starts a multihop session (RFC 5883) to peer: packets go to
// UDP 4784 with TTL 255, and arrive through a listener on 4784 that
// accepts them only with a TTL / hop limit of at least minTTL (1-255;
// 255 - minTTL is the number of routers allowed in between). Demultiplexing
// is by discriminator, or by source address (and local address when set)
// while the peer does not know ours yet.
func (s *Server) AddMultihop(peer, local netip.Addr, cfg SessionConfig, minTTL int) error {
	if minTTL < 1 || minTTL > 255 {
		return fmt.Errorf("bfd: multihop minimum TTL (VIPD_BFD_MULTIHOP_MIN_TTL) is %d, want 1-255", minTTL)
	}
	return s.add(peer, local, cfg, minTTL)
}

// add starts a session; minTTL > 0 makes it multihop.
func (s *Server) add(peer, local netip.Addr, cfg SessionConfig, minTTL int) error {
	multihop := minTTL > 0
	if !peer.IsValid() || peer.IsUnspecified() || peer.IsMulticast() {
		return fmt.Errorf("bfd: peer address %q is not a unicast address", peer)
	}
	peer = peer.Unmap()
	if local.IsValid() {
		local = local.Unmap()
		if local.Is6() != peer.Is6() {
			return fmt.Errorf("bfd: local address %s and peer %s are of different families", local, peer)
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bfd session to %s: %w", peer, err)
	}
	key := peer.WithZone("")

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	if _, ok := s.byPeer[key]; ok {
		return fmt.Errorf("%w: %s", ErrSessionExists, peer)
	}
	if err := s.ensureListener(listenerKey{v6: peer.Is6(), multihop: multihop}); err != nil {
		return err
	}
	port := s.port
	if multihop {
		port = s.mhPort
	}
	conn, err := dialSession(local, peer, port, s.rand)
	if err != nil {
		return err
	}
	var disc uint32
	for disc == 0 || s.byDisc[disc] != nil {
		disc = rand.Uint32()
	}
	now := time.Now()
	sess, err := NewSession(now, disc, cfg, s.rand)
	if err != nil {
		conn.Close()
		return err
	}
	ps := &peerSession{
		srv: s, peer: peer, local: local, disc: disc, conn: conn, sess: sess, multihop: multihop, minTTL: minTTL,
		rx:   make(chan rxPacket, 16),
		ctl:  make(chan func(*Session, time.Time) Actions),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		log:  s.log.With("peer", peer.String()),
	}
	ps.status = PeerStatus{Peer: peer, Local: local, Session: sess.Status(), Multihop: multihop, MinTTL: minTTL}
	s.byPeer[key] = ps
	s.byDisc[disc] = ps
	s.up.WithLabelValues(peer.String()).Set(0)
	s.flaps.WithLabelValues(peer.String())
	s.wg.Add(1)
	go ps.run()
	ps.log.Info("BFD session added", "local", addrString(local), "source_port", conn.LocalAddr().(*net.UDPAddr).Port,
		"discriminator", disc, "detect_mult", cfg.DetectMult, "tx", cfg.DesiredMinTx, "rx", cfg.RequiredMinRx,
		"multihop", multihop, "min_ttl", minTTL)
	return nil
}

// listenerKey names a receive socket: one per family and hop mode.
type listenerKey struct{ v6, multihop bool }

// ensureListener opens the receive socket of a family; s.mu is held.
func (s *Server) ensureListener(k listenerKey) error {
	v6 := k.v6
	if s.listeners[k] != nil {
		return nil
	}
	addr := netip.IPv4Unspecified()
	if v6 {
		addr = netip.IPv6Unspecified()
	}
	for _, a := range s.cfg.ListenAddrs {
		if a.Is6() == v6 {
			addr = a
		}
	}
	port := s.port
	if k.multihop {
		port = s.mhPort
	}
	l, err := listen(addr, port)
	if err != nil {
		return err
	}
	l.multihop = k.multihop
	s.listeners[k] = l
	s.wg.Add(1)
	go s.readLoop(l)
	return nil
}

func (s *Server) readLoop(l *listener) {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		rx, drop, err := l.read(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("BFD receive socket failed", "local", l.conn.LocalAddr(), "err", err)
			}
			return
		}
		if drop != nil {
			s.mu.Lock()
			if errors.Is(drop, errGTSM) {
				s.gtsmDrops++
			} else {
				s.parseDrops++
			}
			s.mu.Unlock()
			s.log.Debug("BFD packet dropped", "src", rx.src, "reason", drop)
			continue
		}
		s.mu.RLock()
		var ps *peerSession
		if d := rx.pkt.YourDiscriminator; d != 0 {
			ps = s.byDisc[d]
			if ps != nil && ps.peer.WithZone("") != rx.src {
				ps = nil // discriminator of another peer: spoofed or stale
			}
		} else {
			ps = s.byPeer[rx.src]
		}
		if ps != nil && ps.local.IsValid() && rx.dst.IsValid() && rx.dst != ps.local.WithZone("") {
			ps = nil
		}
		// A packet on the other hop mode's port is not this session's.
		if ps != nil && ps.multihop != l.multihop {
			ps = nil
		}
		lowTTL := ps != nil && ps.multihop && rx.ttl < ps.minTTL
		s.mu.RUnlock()
		if lowTTL {
			s.mu.Lock()
			s.gtsmDrops++
			s.mu.Unlock()
			s.log.Debug("BFD packet dropped", "src", rx.src, "reason", "multihop TTL below the minimum", "ttl", rx.ttl, "min_ttl", ps.minTTL)
			continue
		}
		if ps == nil {
			s.mu.Lock()
			s.unknownDrops++
			s.mu.Unlock()
			s.log.Debug("BFD packet for no session", "src", rx.src, "your_discriminator", rx.pkt.YourDiscriminator)
			continue
		}
		select {
		case ps.rx <- rx:
		default:
			ps.log.Warn("BFD session receive queue full, packet dropped")
		}
	}
}

// Update changes the intervals and multiplier of a running session; while
// Up this runs a Poll sequence with the peer.
func (s *Server) Update(peer netip.Addr, cfg SessionConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bfd session to %s: %w", peer, err)
	}
	var cfgErr error
	err := s.do(peer, func(sess *Session, now time.Time) Actions {
		a, err := sess.SetConfig(now, cfg)
		cfgErr = err
		return a
	})
	if err != nil {
		return err
	}
	return cfgErr // written before do returned
}

// SetAdminDown takes a session administratively down (true, diag 7) or
// back up (false) without removing it.
func (s *Server) SetAdminDown(peer netip.Addr, down bool) error {
	return s.do(peer, func(sess *Session, now time.Time) Actions {
		if down {
			return sess.SetAdminDown(now, DiagAdminDown)
		}
		return sess.SetAdminUp(now)
	})
}

// do runs op on the session's goroutine and waits until it ran.
func (s *Server) do(peer netip.Addr, op func(*Session, time.Time) Actions) error {
	s.mu.RLock()
	ps := s.byPeer[peer.Unmap().WithZone("")]
	s.mu.RUnlock()
	if ps == nil {
		return fmt.Errorf("%w: %s", ErrNoSession, peer)
	}
	ran := make(chan struct{})
	wrapped := func(sess *Session, now time.Time) Actions {
		defer close(ran)
		return op(sess, now)
	}
	select {
	case ps.ctl <- wrapped:
		<-ran
		return nil
	case <-ps.done:
		return fmt.Errorf("%w: %s", ErrNoSession, peer)
	}
}

// Remove sends AdminDown to the peer (ShutdownPackets times), then stops
// and forgets the session. The state-change callback is not called.
func (s *Server) Remove(peer netip.Addr) error {
	key := peer.Unmap().WithZone("")
	s.mu.Lock()
	ps := s.byPeer[key]
	if ps != nil {
		delete(s.byPeer, key)
		delete(s.byDisc, ps.disc)
	}
	s.mu.Unlock()
	if ps == nil {
		return fmt.Errorf("%w: %s", ErrNoSession, peer)
	}
	ps.shutdown()
	s.up.DeleteLabelValues(ps.peer.String())
	s.flaps.DeleteLabelValues(ps.peer.String())
	return nil
}

// Status returns the status of the session to peer.
func (s *Server) Status(peer netip.Addr) (PeerStatus, bool) {
	s.mu.RLock()
	ps := s.byPeer[peer.Unmap().WithZone("")]
	s.mu.RUnlock()
	if ps == nil {
		return PeerStatus{}, false
	}
	return ps.snapshot(), true
}

// Statuses returns the status of every session, sorted by peer address.
func (s *Server) Statuses() []PeerStatus {
	s.mu.RLock()
	out := make([]PeerStatus, 0, len(s.byPeer))
	for _, ps := range s.byPeer {
		out = append(out, ps.snapshot())
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b PeerStatus) int { return a.Peer.Compare(b.Peer) })
	return out
}

// Drops returns the counts of received datagrams dropped before reaching a
// session: TTL/hop limit not 255, failed parsing, and no matching session.
func (s *Server) Drops() (gtsm, parse, unknown uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.gtsmDrops, s.parseDrops, s.unknownDrops
}

// Close sends AdminDown on every session (in parallel), stops them, closes
// the sockets and unregisters the metrics. The callback is not called for
// this AdminDown. Close waits for a running callback to return.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	sessions := make([]*peerSession, 0, len(s.byPeer))
	for _, ps := range s.byPeer {
		sessions = append(sessions, ps)
	}
	clear(s.byPeer)
	clear(s.byDisc)
	s.mu.Unlock()

	var wg sync.WaitGroup
	for _, ps := range sessions {
		wg.Go(ps.shutdown)
	}
	wg.Wait()
	var errs []error
	s.mu.Lock()
	for _, l := range s.listeners {
		if err := l.close(); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.notes.close()
	if r := s.cfg.Registerer; r != nil {
		r.Unregister(s.up)
		r.Unregister(s.flaps)
	}
	return errors.Join(errs...)
}

// peerSession runs one Session on its own goroutine.
type peerSession struct {
	srv         *Server
	peer, local netip.Addr
	disc        uint32
	conn        *net.UDPConn
	sess        *Session // owned by run after Add returns
	rx          chan rxPacket
	ctl         chan func(*Session, time.Time) Actions
	stop        chan struct{}
	done        chan struct{}
	log         *slog.Logger
	stopOnce    sync.Once
	multihop    bool
	minTTL      int

	mu     sync.Mutex
	status PeerStatus
}

func (ps *peerSession) snapshot() PeerStatus {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.status
}

// shutdown asks run to send AdminDown and exit, and waits for it.
func (ps *peerSession) shutdown() {
	ps.stopOnce.Do(func() { close(ps.stop) })
	<-ps.done
}

func (ps *peerSession) run() {
	defer ps.srv.wg.Done()
	defer close(ps.done)
	defer ps.conn.Close()
	buf := make([]byte, 0, ControlPacketLen)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if next := ps.sess.NextDeadline(); next.IsZero() {
			timer.Reset(time.Hour) // nothing scheduled; an input will come first
		} else {
			timer.Reset(time.Until(next))
		}
		var a Actions
		select {
		case rx := <-ps.rx:
			var err error
			a, err = ps.sess.Receive(time.Now(), &rx.pkt)
			ps.mu.Lock()
			ps.status.RxPackets++
			ps.mu.Unlock()
			if err != nil {
				ps.log.Debug("BFD packet discarded", "err", err)
			}
		case <-timer.C:
			a = ps.sess.Tick(time.Now())
		case op := <-ps.ctl:
			a = op(ps.sess, time.Now())
		case <-ps.stop:
			a = ps.sess.SetAdminDown(time.Now(), DiagAdminDown)
			if !a.Send { // already AdminDown (SetAdminDown): say it again anyway
				a.Packet = ps.sess.packet(false)
			}
			for i := range ShutdownPackets {
				if i > 0 {
					time.Sleep(shutdownSpacing)
				}
				buf = ps.send(buf, &a.Packet)
			}
			ps.log.Info("BFD session stopped, AdminDown sent")
			return
		}
		if a.Send {
			buf = ps.send(buf, &a.Packet)
		}
		ps.publish(a)
	}
}

func (ps *peerSession) send(buf []byte, p *ControlPacket) []byte {
	buf, err := p.AppendBinary(buf[:0])
	if err == nil {
		_, err = ps.conn.Write(buf)
	}
	ps.mu.Lock()
	if err != nil {
		ps.status.TxErrors++
	} else {
		ps.status.TxPackets++
	}
	ps.mu.Unlock()
	if err != nil {
		// ECONNREFUSED (ICMP port unreachable) and no-route are expected
		// while the peer is away; the state machine handles the silence.
		ps.log.Debug("BFD send failed", "err", err)
	}
	return buf
}

func (ps *peerSession) publish(a Actions) {
	st := ps.sess.Status()
	now := time.Now()
	ps.mu.Lock()
	ps.status.Session = st
	if a.StateChanged {
		ps.status.LastChange = now
		if a.OldState == StateUp {
			ps.status.Flaps++
		}
	}
	ps.mu.Unlock()
	if !a.StateChanged {
		return
	}
	label := ps.peer.String()
	if a.NewState == StateUp {
		ps.srv.up.WithLabelValues(label).Set(1)
	} else {
		ps.srv.up.WithLabelValues(label).Set(0)
	}
	if a.OldState == StateUp {
		ps.srv.flaps.WithLabelValues(label).Inc()
	}
	lvl := slog.LevelInfo
	if a.OldState == StateUp {
		lvl = slog.LevelWarn
	}
	ps.log.Log(context.Background(), lvl, "BFD session state changed", "from", a.OldState, "to", a.NewState,
		"diag", a.Diag, "remote_discriminator", st.RemoteDiscriminator,
		"tx_interval", st.TxInterval, "detection_time", st.DetectionTime)
	ps.srv.notes.push(stateChange{peer: ps.peer, old: a.OldState, new: a.NewState, diag: a.Diag})
}

type stateChange struct {
	peer     netip.Addr
	old, new State
	diag     Diag
}

// notifier delivers state changes in order on one goroutine, so a slow
// callback never stalls a session's timers.
type notifier struct {
	fn   StateChangeFunc
	mu   sync.Mutex
	q    []stateChange
	wake chan struct{}
	quit chan struct{}
	done chan struct{}
}

func newNotifier(fn StateChangeFunc) *notifier {
	n := &notifier{fn: fn, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go n.loop()
	return n
}

func (n *notifier) push(c stateChange) {
	if n.fn == nil {
		return
	}
	n.mu.Lock()
	n.q = append(n.q, c)
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *notifier) loop() {
	defer close(n.done)
	for {
		select {
		case <-n.wake:
		case <-n.quit:
			return
		}
		for {
			n.mu.Lock()
			if len(n.q) == 0 {
				n.mu.Unlock()
				break
			}
			c := n.q[0]
			n.q = n.q[1:]
			n.mu.Unlock()
			n.fn(c.peer, c.old, c.new, c.diag)
		}
	}
}

// close stops delivery; queued notifications that were not delivered yet
// are dropped. It waits for a running callback.
func (n *notifier) close() {
	close(n.quit)
	<-n.done
}
