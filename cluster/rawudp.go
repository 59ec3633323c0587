package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"github.com/vipd/vipd/internal/rawconn"
	"golang.org/x/sys/unix"
)

// rawUDP reads and sends the gossip socket's datagrams with raw system
// calls through the network poller. A regular system call (net.UDPConn's
// ReadFrom, WriteTo) wakes the Go runtime's sysmon thread when it sleeps,
// and sysmon then polls every 20 µs until the process is idle again: on
// a paravirtualised VM each of those wake-ups costs about as much as the
// packet itself. The lease's heartbeats and their acknowledgements are
// most of an idle node's packets (make bench idle: a third of the
// holder's CPU was sysmon). The calls never block (the socket is
// non-blocking), so sysmon need not know about them.
type rawUDP struct {
	rc syscall.RawConn
	v6 bool // the socket is AF_INET6 (IPv4 peers as mapped addresses)
}

func newRawUDP(c *net.UDPConn) (*rawUDP, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("gossip UDP socket: %w", err)
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil {
		return nil, fmt.Errorf("gossip UDP socket: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("gossip UDP socket: %w", serr)
	}
	_, v6 := sa.(*unix.SockaddrInet6)
	return &rawUDP{rc: rc, v6: v6}, nil
}

// errFamily: an IPv6 destination on an IPv4 socket.
var errFamily = errors.New("IPv6 destination on an IPv4 gossip socket")

// encodeSockaddr fills sa with to for a socket of family v6 (true:
// AF_INET6) and returns its length.
func encodeSockaddr(sa *unix.RawSockaddrAny, to netip.AddrPort, v6 bool) (uint32, error) {
	a := to.Addr()
	if v6 {
		s := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		*s = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&s.Port))[:], to.Port())
		if a.Is6() && !a.Is4In6() && a.Zone() != "" {
			ifi, err := net.InterfaceByName(a.Zone())
			if err != nil {
				return 0, err
			}
			s.Scope_id = uint32(ifi.Index)
		}
		return unix.SizeofSockaddrInet6, nil
	}
	a = a.Unmap()
	if !a.Is4() {
		return 0, errFamily
	}
	s := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
	*s = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&s.Port))[:], to.Port())
	return unix.SizeofSockaddrInet4, nil
}

// decodeSockaddr returns the address in sa (IPv4-mapped addresses as
// IPv4, as net.UDPConn returns them).
func decodeSockaddr(sa *unix.RawSockaddrAny) (netip.AddrPort, error) {
	switch sa.Addr.Family {
	case unix.AF_INET:
		s := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&s.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(s.Addr), port), nil
	case unix.AF_INET6:
		s := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&s.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), port), nil
	}
	return netip.AddrPort{}, fmt.Errorf("gossip packet from address family %d", sa.Addr.Family)
}

// readFrom reads one datagram into b, waiting in the poller.
func (r *rawUDP) readFrom(b []byte) (int, netip.AddrPort, error) {
	var (
		sa   unix.RawSockaddrAny
		n    uintptr
		rerr error
	)
	err := r.rc.Read(func(fd uintptr) bool {
		salen := uint32(unix.SizeofSockaddrAny)
		return rawconn.NonBlocking(func() (e syscall.Errno) {
			n, _, e = unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
				uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&salen)))
			return e
		}, &rerr)
	})
	if err != nil {
		return 0, netip.AddrPort{}, err
	}
	if rerr != nil {
		return 0, netip.AddrPort{}, rerr
	}
	from, err := decodeSockaddr(&sa)
	return int(n), from, err
}

// writeTo sends b to to, waiting in the poller while the socket's send
// buffer is full.
func (r *rawUDP) writeTo(b []byte, to netip.AddrPort) error {
	var sa unix.RawSockaddrAny
	salen, err := encodeSockaddr(&sa, to, r.v6)
	if err != nil {
		return err
	}
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	var werr error
	err = r.rc.Write(func(fd uintptr) bool {
		return rawconn.NonBlocking(func() syscall.Errno {
			_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(p), uintptr(len(b)), 0,
				uintptr(unsafe.Pointer(&sa)), uintptr(salen))
			return e
		}, &werr)
	})
	if err != nil {
		return err
	}
	return werr
}
