package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// transport is memberlist's network transport for vipd: what memberlist's
// own NetTransport does (one TCP and one UDP listener on the gossip
// address, TCP for joins, full syncs and handover messages, UDP for
// probes, gossip and heartbeats), except that a packet is read into one
// reused buffer and handed to memberlist as a copy of its own size.
// NetTransport hands over a fresh 64 KB buffer per packet read; an idle
// vipd reads several packets a second of a few hundred bytes each, and
// those buffers were most of its garbage and a fifth of its CPU (garbage
// collection), measured with `make bench`'s idle run (docs/l2.md).
type transport struct {
	tcp      *net.TCPListener
	udp      *net.UDPConn
	raw      *rawUDP // udp's reads and sends, without waking sysmon (rawudp.go)
	bindAny  bool    // bound to 0.0.0.0: advertise a private address instead
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	log      *slog.Logger

	wg       sync.WaitGroup
	stopOnce sync.Once
}

// maxPacket is the largest UDP datagram (memberlist's read buffer).
const maxPacket = 65536

// udpRecvBuffer is the socket receive buffer asked for (memberlist's
// value), halved until the kernel accepts it.
const udpRecvBuffer = 2 << 20

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// newTransport binds TCP and UDP on bind. Port 0 picks a free port (the
// same for both; tests use it).
func newTransport(bind netip.AddrPort, log *slog.Logger) (*transport, error) {
	var (
		tcp *net.TCPListener
		udp *net.UDPConn
		err error
	)
	tries := 1
	if bind.Port() == 0 {
		tries = 10 // the UDP port a TCP listener got may be taken
	}
	for range tries {
		tcp, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(bind))
		if err != nil {
			return nil, fmt.Errorf("gossip TCP listener: %w", err)
		}
		port := uint16(tcp.Addr().(*net.TCPAddr).Port)
		udp, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bind.Addr(), port)))
		if err == nil {
			break
		}
		tcp.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("gossip UDP listener: %w", err)
	}
	for size := udpRecvBuffer; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	raw, err := newRawUDP(udp)
	if err != nil {
		tcp.Close()
		udp.Close()
		return nil, err
	}
	t := &transport{
		tcp: tcp, udp: udp, raw: raw,
		bindAny:  bind.Addr() == netip.IPv4Unspecified(),
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
		log:      log,
	}
	t.wg.Add(2)
	go t.readPackets()
	go t.acceptStreams()
	return t, nil
}

// Port is the port both listeners are bound to.
func (t *transport) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr is the address memberlist tells others: the one
// given, else the bound one (for 0.0.0.0, a private address of this host,
// as memberlist's own transport chooses).
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("advertise address %q is not an IP address", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	if t.bindAny {
		s, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("listing this host's addresses: %w", err)
		}
		a := net.ParseIP(s)
		if a == nil {
			return nil, 0, errors.New("gossip bound to 0.0.0.0 and this host has no private IPv4 address to advertise: set VIPD_GOSSIP_BIND to this node's address")
		}
		return a, t.Port(), nil
	}
	return t.tcp.Addr().(*net.TCPAddr).IP, t.Port(), nil
}

// WriteTo sends one packet.
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		err = t.raw.writeTo(b, ap)
		return time.Now(), err
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

// WriteToAddress sends one packet (the node's name is not needed).
func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

// PacketCh delivers the packets read.
func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout opens a stream to another member.
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", addr)
}

// DialAddressTimeout opens a stream to another member.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// StreamCh delivers the streams accepted.
func (t *transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown closes both listeners and waits for their goroutines.
func (t *transport) Shutdown() error {
	t.stopOnce.Do(func() {
		close(t.done)
		t.tcp.Close()
		t.udp.Close()
	})
	t.wg.Wait()
	return nil
}

func (t *transport) stopping() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func (t *transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, ap, err := t.raw.readFrom(buf)
		now := time.Now()
		if err != nil {
			if t.stopping() {
				return
			}
			t.log.Warn("reading a gossip packet", "err", err)
			continue
		}
		if n < 1 {
			continue // memberlist needs a message type byte
		}
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: net.UDPAddrFromAddrPort(ap), Timestamp: now}
		select {
		case t.packetCh <- p:
		case <-t.done:
			return
		}
	}
}

func (t *transport) acceptStreams() {
	defer t.wg.Done()
	var backoff time.Duration
	for {
		c, err := t.tcp.Accept()
		if err != nil {
			if t.stopping() {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.log.Warn("accepting a gossip stream", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-t.done:
				return
			}
			continue
		}
		backoff = 0
		select {
		case t.streamCh <- c:
		case <-t.done:
			c.Close()
			return
		}
	}
}
