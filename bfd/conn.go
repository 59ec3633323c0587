package bfd

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// RFC 5881 constants.
const (
	// ControlPort is the UDP port single-hop BFD Control packets go to.
	ControlPort = 3784
	// MultihopPort is the UDP port of multihop BFD (RFC 5883 section 5).
	MultihopPort = 4784
	// SourcePortMin and SourcePortMax bound the source port of our packets.
	SourcePortMin = 49152
	SourcePortMax = 65535
	// gtsmTTL is sent and required on receive (RFC 5881 section 5, GTSM).
	gtsmTTL = 255
	// tosCS6 marks BFD as network control traffic, as FRR does.
	tosCS6 = 0xc0
)

// rxPacket is one received datagram that passed parsing and GTSM.
type rxPacket struct {
	src netip.Addr
	dst netip.Addr // zero when the kernel gave no destination
	ttl int        // TTL / hop limit it arrived with
	pkt ControlPacket
}

// listener is the receive socket of one address family.
type listener struct {
	conn *net.UDPConn
	v4   *ipv4.PacketConn
	v6   *ipv6.PacketConn
	// multihop listeners (RFC 5883) leave the TTL check to the session,
	// which knows its minimum; single-hop ones require 255 (RFC 5881).
	multihop bool
}

// listen opens the UDP receive socket on addr:port with TTL / hop limit and
// destination reporting enabled.
func listen(addr netip.Addr, port int) (*listener, error) {
	network := "udp4"
	if addr.Is6() {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, uint16(port))))
	if err != nil {
		return nil, fmt.Errorf("listen for BFD on %s: %w", netip.AddrPortFrom(addr, uint16(port)), err)
	}
	l := &listener{conn: c}
	if addr.Is4() {
		l.v4 = ipv4.NewPacketConn(c)
		err = l.v4.SetControlMessage(ipv4.FlagTTL|ipv4.FlagDst, true)
	} else {
		l.v6 = ipv6.NewPacketConn(c)
		err = l.v6.SetControlMessage(ipv6.FlagHopLimit|ipv6.FlagDst, true)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("enable TTL reporting on BFD socket %s: %w", c.LocalAddr(), err)
	}
	return l, nil
}

// errGTSM marks a datagram dropped because its TTL / hop limit was not 255.
var errGTSM = errors.New("bfd: TTL/hop limit is not 255 (GTSM)")

// read returns the next datagram. A nil error with ok false means a
// datagram was dropped (reason in dropErr); a non-nil error ends the loop.
func (l *listener) read(buf []byte) (rx rxPacket, dropErr error, err error) {
	var (
		n   int
		src net.Addr
		ttl int
		dst net.IP
	)
	if l.v4 != nil {
		var cm *ipv4.ControlMessage
		n, cm, src, err = l.v4.ReadFrom(buf)
		if cm != nil {
			ttl, dst = cm.TTL, cm.Dst
		}
	} else {
		var cm *ipv6.ControlMessage
		n, cm, src, err = l.v6.ReadFrom(buf)
		if cm != nil {
			ttl, dst = cm.HopLimit, cm.Dst
		}
	}
	if err != nil {
		return rx, nil, err
	}
	ua, ok := src.(*net.UDPAddr)
	if !ok {
		return rx, fmt.Errorf("bfd: unexpected source address type %T", src), nil
	}
	rx.src = ua.AddrPort().Addr().Unmap().WithZone("")
	rx.ttl = ttl
	if !l.multihop && ttl != gtsmTTL {
		return rx, errGTSM, nil
	}
	if d, ok := netip.AddrFromSlice(dst); ok {
		rx.dst = d.Unmap()
	}
	if err := rx.pkt.UnmarshalBinary(buf[:n]); err != nil {
		return rx, err, nil
	}
	return rx, nil, nil
}

func (l *listener) close() error { return l.conn.Close() }

// dialSession opens the per-session transmit socket: connected to
// peer:port, bound to local (or any) and a free source port in
// 49152-65535, TTL / hop limit 255, DSCP CS6.
func dialSession(local, peer netip.Addr, port int, rnd func() float64) (*net.UDPConn, error) {
	network := "udp4"
	if peer.Is6() {
		network = "udp6"
	}
	raddr := net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, uint16(port)))
	var lastErr error
	const attempts = 64
	for range attempts {
		sport := SourcePortMin + int(rnd()*float64(SourcePortMax-SourcePortMin+1))
		if sport > SourcePortMax {
			sport = SourcePortMax
		}
		laddr := &net.UDPAddr{Port: sport}
		if local.IsValid() {
			laddr.IP = local.AsSlice()
			laddr.Zone = local.Zone()
		}
		c, err := net.DialUDP(network, laddr, raddr)
		if err != nil {
			lastErr = err
			if errors.Is(err, syscall.EADDRINUSE) {
				continue
			}
			return nil, fmt.Errorf("open BFD socket %s -> %s: %w", net.JoinHostPort(addrString(local), strconv.Itoa(sport)), raddr, err)
		}
		if err := setTTL(c, peer.Is6()); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	return nil, fmt.Errorf("no free BFD source port in %d-%d after %d attempts: %w", SourcePortMin, SourcePortMax, attempts, lastErr)
}

func setTTL(c *net.UDPConn, v6 bool) error {
	if v6 {
		p := ipv6.NewConn(c)
		if err := p.SetHopLimit(gtsmTTL); err != nil {
			return fmt.Errorf("set hop limit 255 on BFD socket: %w", err)
		}
		_ = p.SetTrafficClass(tosCS6) // best effort
		return nil
	}
	p := ipv4.NewConn(c)
	if err := p.SetTTL(gtsmTTL); err != nil {
		return fmt.Errorf("set TTL 255 on BFD socket: %w", err)
	}
	_ = p.SetTOS(tosCS6) // best effort
	return nil
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return "any"
	}
	return a.String()
}

// defaultRand is the jitter and port source when none is injected.
func defaultRand() float64 { return rand.Float64() }
