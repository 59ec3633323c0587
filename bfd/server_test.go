package bfd

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/ipv4"
)

type change struct {
	peer     netip.Addr
	old, new State
	diag     Diag
}

// recorder collects state changes from a Server callback.
type recorder struct {
	mu sync.Mutex
	c  []change
	ch chan change
}

func newRecorder() *recorder { return &recorder{ch: make(chan change, 100)} }

func (r *recorder) fn(peer netip.Addr, old, new State, diag Diag) {
	r.mu.Lock()
	r.c = append(r.c, change{peer, old, new, diag})
	r.mu.Unlock()
	select {
	case r.ch <- change{peer, old, new, diag}:
	default: // nobody waiting that far back; the slice keeps the history
	}
}

// drain forgets changes not waited for yet, so the next waitFor sees only
// what happens after this call.
func (r *recorder) drain() {
	for {
		select {
		case <-r.ch:
		default:
			return
		}
	}
}

// waitFor returns the next change to want (of any peer).
func (r *recorder) waitFor(t *testing.T, want State, timeout time.Duration) change {
	t.Helper()
	return r.waitForPeer(t, netip.Addr{}, want, timeout)
}

// waitForPeer returns the next change of peer (any peer if zero) to want.
func (r *recorder) waitForPeer(t *testing.T, peer netip.Addr, want State, timeout time.Duration) change {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case c := <-r.ch:
			if c.new == want && (!peer.IsValid() || c.peer == peer) {
				return c
			}
		case <-deadline:
			t.Fatalf("no change to %v within %v", want, timeout)
		}
	}
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name, peer string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "peer" && l.GetValue() == peer {
					if m.Gauge != nil {
						return m.Gauge.GetValue(), true
					}
					return m.Counter.GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// loopbackPair runs two Servers on 127.0.0.1 and 127.0.0.2 (no root
// needed) on a random port, each with a session to the other.
func loopbackPair(t *testing.T, cfgA, cfgB SessionConfig) (a, b *Server, ra, rb *recorder, regA *prometheus.Registry, port int) {
	t.Helper()
	port = 20000 + rand.IntN(20000)
	ipA, ipB := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	ra, rb = newRecorder(), newRecorder()
	regA = prometheus.NewRegistry()
	var err error
	a, err = NewServer(ServerConfig{ListenAddrs: []netip.Addr{ipA}, Port: port, OnStateChange: ra.fn, Registerer: regA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err = NewServer(ServerConfig{ListenAddrs: []netip.Addr{ipB}, Port: port, OnStateChange: rb.fn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := a.Add(ipB, ipA, cfgA); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(ipA, ipB, cfgB); err != nil {
		t.Fatal(err)
	}
	return a, b, ra, rb, regA, port
}

func TestServerLoopback(t *testing.T) {
	ipA, ipB := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	fast := SessionConfig{DetectMult: 3, DesiredMinTx: 50 * ms, RequiredMinRx: 50 * ms}
	slow := SessionConfig{DetectMult: 4, DesiredMinTx: 80 * ms, RequiredMinRx: 120 * ms}
	a, b, ra, rb, regA, _ := loopbackPair(t, fast, slow)

	ra.waitFor(t, StateUp, 5*time.Second)
	rb.waitFor(t, StateUp, 5*time.Second)
	if v, ok := gaugeValue(t, regA, "vipd_bfd_session_up", "127.0.0.2"); !ok || v != 1 {
		t.Fatalf("vipd_bfd_session_up = %v (%v), want 1", v, ok)
	}

	// Negotiated: A sends every max(50, 120) = 120 ms; B waits 3 x 120.
	// A waits 4 x max(50 ms, 80 ms) = 320 ms.
	deadline := time.Now().Add(3 * time.Second)
	var st PeerStatus
	for time.Now().Before(deadline) {
		st, _ = a.Status(ipB)
		if !st.Session.PollInProgress && st.Session.TxInterval == 120*ms {
			break
		}
		time.Sleep(20 * ms)
	}
	if st.Session.State != StateUp || st.Session.TxInterval != 120*ms || st.Session.DetectionTime != 320*ms ||
		st.Session.RemoteDetectMult != 4 || st.Session.RemoteDetectionTime != 360*ms {
		t.Fatalf("A status %+v", st.Session)
	}
	if all := a.Statuses(); len(all) != 1 || all[0].Peer != ipB || all[0].Local != ipA {
		t.Fatalf("Statuses %+v", all)
	}

	// Interval change at A while Up: poll/final, B sees the new value.
	faster := fast
	faster.RequiredMinRx = 200 * ms
	if err := a.Update(ipB, faster); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 3*time.Second, "B to learn A's RX 200ms", func() bool {
		s, _ := b.Status(ipA)
		return s.Session.TxInterval == 200*ms && !s.Session.PollInProgress
	})
	if err := a.Update(ipB, SessionConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid update: %v", err)
	}

	// Remove at B sends AdminDown: A goes Down with diag 3 at once.
	ra.drain()
	start := time.Now()
	if err := b.Remove(ipA); err != nil {
		t.Fatal(err)
	}
	c := ra.waitFor(t, StateDown, 2*time.Second)
	if c.diag != DiagNeighborDown || c.old != StateUp || c.peer != ipB {
		t.Fatalf("A change %+v, want up -> down diag neighbor-down", c)
	}
	// The diag proves it was the AdminDown, not A's detection timer (800 ms).
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("AdminDown took %v to take A down", el)
	}
	if v, _ := gaugeValue(t, regA, "vipd_bfd_session_flaps_total", "127.0.0.2"); v != 1 {
		t.Fatalf("flaps = %v, want 1", v)
	}
	if _, ok := b.Status(ipA); ok {
		t.Fatal("removed session still has status")
	}
	if err := b.Remove(ipA); !errors.Is(err, ErrNoSession) {
		t.Fatalf("second Remove: %v", err)
	}
	// B's Remove must not call B's own callback for the AdminDown.
	rb.mu.Lock()
	for _, c := range rb.c {
		if c.new == StateAdminDown {
			t.Fatalf("callback for Remove: %+v", c)
		}
	}
	rb.mu.Unlock()

	// Re-adding at B with a new discriminator: A re-learns it and comes Up.
	if err := b.Add(ipA, ipB, slow); err != nil {
		t.Fatal(err)
	}
	ra.waitFor(t, StateUp, 5*time.Second)
}

func TestServerDetectionTimeout(t *testing.T) {
	ipA, ipB := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	cfg := SessionConfig{DetectMult: 3, DesiredMinTx: 30 * ms, RequiredMinRx: 30 * ms}
	a, b, ra, _, _, _ := loopbackPair(t, cfg, cfg)
	ra.waitFor(t, StateUp, 5*time.Second)
	waitUntil(t, 3*time.Second, "fast timers on both sides", func() bool {
		sa, _ := a.Status(ipB)
		sb, _ := b.Status(ipA)
		return sa.Session.DetectionTime == 90*ms && sb.Session.DetectionTime == 90*ms
	})
	// B goes silent without AdminDown: stop its session from sending by
	// closing its transmit socket under it.
	ra.drain()
	b.mu.RLock()
	b.byPeer[ipA].conn.Close()
	b.mu.RUnlock()
	start := time.Now()
	c := ra.waitFor(t, StateDown, 3*time.Second)
	el := time.Since(start)
	if c.diag != DiagControlDetectExpired {
		t.Fatalf("diag %v, want control-detection-time-expired", c.diag)
	}
	// Detection is 90 ms; allow generous scheduling slack on a loaded box.
	if el < 30*ms || el > 1500*ms {
		t.Fatalf("detected after %v, want about 90ms", el)
	}
	st, _ := a.Status(ipB)
	if st.Session.RemoteDiscriminator != 0 {
		t.Fatalf("remote discriminator kept after timeout: %+v", st.Session)
	}
}

func TestServerGTSM(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	ipA := netip.MustParseAddr("127.0.0.1")
	peer := netip.MustParseAddr("127.0.0.3")
	a, err := NewServer(ServerConfig{ListenAddrs: []netip.Addr{ipA}, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Add(peer, ipA, DefaultSessionConfig()); err != nil {
		t.Fatal(err)
	}
	send := func(ttl int, p ControlPacket) {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: peer.AsSlice()}, &net.UDPAddr{IP: ipA.AsSlice(), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := ipv4.NewConn(c).SetTTL(ttl); err != nil {
			t.Fatal(err)
		}
		b, _ := p.MarshalBinary()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	down := ControlPacket{State: StateDown, DetectMult: 3, MyDiscriminator: 77, DesiredMinTxInterval: 1e6, RequiredMinRxInterval: 1e6}
	send(64, down)
	waitUntil(t, 2*time.Second, "GTSM drop", func() bool { g, _, _ := a.Drops(); return g == 1 })
	if st, _ := a.Status(peer); st.Session.State != StateDown || st.RxPackets != 0 {
		t.Fatalf("TTL 64 packet reached the session: %+v", st)
	}
	send(255, ControlPacket{State: StateUp, DetectMult: 3, MyDiscriminator: 77}) // YourDisc 0 in Up: parse drop
	waitUntil(t, 2*time.Second, "parse drop", func() bool { _, p, _ := a.Drops(); return p == 1 })
	unknown := down
	unknown.YourDiscriminator = 12345
	send(255, unknown)
	waitUntil(t, 2*time.Second, "unknown drop", func() bool { _, _, u := a.Drops(); return u == 1 })
	send(255, down)
	waitUntil(t, 2*time.Second, "session to reach Init", func() bool {
		st, _ := a.Status(peer)
		return st.Session.State == StateInit && st.RxPackets == 1 && st.Session.RemoteDiscriminator == 77
	})
}

func TestServerAddErrors(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	s, err := NewServer(ServerConfig{ListenAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("127.0.0.9")
	if err := s.Add(netip.Addr{}, netip.Addr{}, DefaultSessionConfig()); err == nil {
		t.Error("invalid peer accepted")
	}
	if err := s.Add(peer, netip.MustParseAddr("::1"), DefaultSessionConfig()); err == nil {
		t.Error("mixed families accepted")
	}
	if err := s.Add(peer, netip.Addr{}, SessionConfig{DetectMult: 3}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad config: %v", err)
	}
	if err := s.Add(peer, netip.Addr{}, DefaultSessionConfig()); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(peer, netip.Addr{}, DefaultSessionConfig()); !errors.Is(err, ErrSessionExists) {
		t.Errorf("duplicate: %v", err)
	}
	if err := s.Update(netip.MustParseAddr("127.0.0.8"), DefaultSessionConfig()); !errors.Is(err, ErrNoSession) {
		t.Errorf("update unknown: %v", err)
	}
	// The source port is in the RFC 5881 range.
	s.mu.RLock()
	sport := s.byPeer[peer].conn.LocalAddr().(*net.UDPAddr).Port
	s.mu.RUnlock()
	if sport < SourcePortMin || sport > SourcePortMax {
		t.Errorf("source port %d outside 49152-65535", sport)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(netip.MustParseAddr("127.0.0.7"), netip.Addr{}, DefaultSessionConfig()); !errors.Is(err, ErrServerClosed) {
		t.Errorf("add after close: %v", err)
	}
	if _, err := NewServer(ServerConfig{ListenAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}}); err == nil {
		t.Error("two IPv4 listen addresses accepted")
	}
	reg := prometheus.NewRegistry()
	s1, err := NewServer(ServerConfig{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(ServerConfig{Registerer: reg}); err == nil {
		t.Error("second server on the same registry accepted")
	}
	s1.Close()
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * ms)
	}
}

// TestServerMultihop: two multihop sessions (RFC 5883) come Up over the
// multihop port; packets below the minimum TTL are dropped, packets at it
// are accepted, and a multihop peer's packet on the single-hop port does
// not reach its session.
func TestServerMultihop(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	mh := port + 1
	ipA, ipB, ipC := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	ra := newRecorder()
	a, err := NewServer(ServerConfig{ListenAddrs: []netip.Addr{ipA}, Port: port, MultihopPort: mh, OnStateChange: ra.fn})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewServer(ServerConfig{ListenAddrs: []netip.Addr{ipB}, Port: port, MultihopPort: mh})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := SessionConfig{DetectMult: 3, DesiredMinTx: 50 * ms, RequiredMinRx: 50 * ms}
	if err := a.AddMultihop(ipB, ipA, cfg, 254); err != nil {
		t.Fatal(err)
	}
	if err := b.AddMultihop(ipA, ipB, cfg, 254); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "multihop session Up", func() bool {
		st, _ := a.Status(ipB)
		return st.Session.State == StateUp && st.Multihop && st.MinTTL == 254
	})
	if err := a.AddMultihop(ipC, ipA, DefaultSessionConfig(), 0); err == nil || !strings.Contains(err.Error(), "VIPD_BFD_MULTIHOP_MIN_TTL") {
		t.Errorf("min TTL 0 accepted or error does not name the setting: %v", err)
	}
	if err := a.AddMultihop(ipC, ipA, DefaultSessionConfig(), 250); err != nil {
		t.Fatal(err)
	}
	// A single-hop session elsewhere opens the single-hop listener.
	if err := a.Add(netip.MustParseAddr("127.0.0.4"), ipA, DefaultSessionConfig()); err != nil {
		t.Fatal(err)
	}
	send := func(dport, ttl int, p ControlPacket) {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: ipC.AsSlice()}, &net.UDPAddr{IP: ipA.AsSlice(), Port: dport})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := ipv4.NewConn(c).SetTTL(ttl); err != nil {
			t.Fatal(err)
		}
		buf, _ := p.MarshalBinary()
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	down := ControlPacket{State: StateDown, DetectMult: 3, MyDiscriminator: 99, DesiredMinTxInterval: 1e6, RequiredMinRxInterval: 1e6}
	g0, _, u0 := a.Drops()
	send(mh, 249, down)
	waitUntil(t, 2*time.Second, "TTL 249 dropped", func() bool { g, _, _ := a.Drops(); return g == g0+1 })
	send(port, 255, down) // single-hop port: not the multihop session's
	waitUntil(t, 2*time.Second, "single-hop port packet not matched", func() bool { _, _, u := a.Drops(); return u == u0+1 })
	if st, _ := a.Status(ipC); st.RxPackets != 0 {
		t.Fatalf("a dropped packet reached the session: %+v", st)
	}
	send(mh, 250, down)
	waitUntil(t, 2*time.Second, "TTL 250 accepted", func() bool {
		st, _ := a.Status(ipC)
		return st.Session.State == StateInit && st.Session.RemoteDiscriminator == 99
	})
}
