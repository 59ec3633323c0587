package cluster

// The socket of the member heartbeats (default profile; MemberBeats
// decides, docs/architecture.md "Member heartbeats"). Every member sends a
// small authenticated packet to every other member on a clock-aligned
// grid; the receiver does not wake per packet but reads the queued packets
// on its own tick. To need no second port, the packets go to the gossip
// port: the gossip UDP socket and this one share it with SO_REUSEPORT, and
// a classic BPF program attached to the group steers datagrams whose first
// byte is beatMagic to this socket (index 1) and everything else to
// memberlist's (index 0, bound first). The socket is not registered with
// Go's network poller, so a packet arriving wakes no thread.

import (
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// beatMagic is the first byte of a beat packet. memberlist's packets
// start with a message type (below 32), an encryption version (0, 1) or
// its label marker (244).
const beatMagic = 0xbe

// reusePort sets SO_REUSEPORT on a socket before bind (net.ListenConfig.Control).
func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// beatSocket is the lazily read UDP socket of the heartbeat.
type beatSocket struct {
	fd int
	v4 bool // an AF_INET socket (bound to an IPv4 address)
	io beatIO
}

// steerProgram returns index 1 (the beat socket) for a datagram whose
// first payload byte is beatMagic, else 0 (memberlist's socket). A
// reuseport program sees the payload at offset 0 (the kernel pulls the
// UDP header first); a load past the end (an empty datagram) returns 0.
func steerProgram() ([]unix.SockFilter, error) {
	ins, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: beatMagic, SkipTrue: 0, SkipFalse: 1},
		bpf.RetConstant{Val: 1},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		return nil, err
	}
	out := make([]unix.SockFilter, len(ins))
	for i, in := range ins {
		out[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return out, nil
}

// openBeatSocket joins the SO_REUSEPORT group of gossip, memberlist's UDP
// socket (opened with reusePort), and steers beats to itself. It takes
// gossip's own family, address and IPV6_V6ONLY: Go listens on a dual-stack
// IPv6 socket for "udp" on 0.0.0.0, and an IPv4 socket on 0.0.0.0 next to
// it would form a group of its own and, being the better match for IPv4,
// take every IPv4 datagram, memberlist's too (the lab found it: no UDP
// probe was ever answered).
func openBeatSocket(gossip syscall.Conn) (*beatSocket, error) {
	rc, err := gossip.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("heartbeat socket: %w", err)
	}
	var (
		sa     unix.Sockaddr
		v6only int
		serr   error
	)
	if err := rc.Control(func(fd uintptr) {
		if sa, serr = unix.Getsockname(int(fd)); serr != nil {
			return
		}
		if _, ok := sa.(*unix.SockaddrInet6); ok {
			v6only, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
		}
	}); err != nil {
		return nil, fmt.Errorf("heartbeat socket: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("heartbeat socket: the gossip socket: %w", serr)
	}
	domain := unix.AF_INET
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		domain = unix.AF_INET6
	}
	fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("heartbeat socket: %w", err)
	}
	s := &beatSocket{fd: fd, v4: domain == unix.AF_INET}
	s.initIO()
	if err := s.setup(sa, v6only); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}

func (s *beatSocket) setup(sa unix.Sockaddr, v6only int) error {
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fmt.Errorf("heartbeat socket: SO_REUSEPORT: %w", err)
	}
	if !s.v4 {
		if err := unix.SetsockoptInt(s.fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			return fmt.Errorf("heartbeat socket: IPV6_V6ONLY: %w", err)
		}
	}
	if err := unix.Bind(s.fd, sa); err != nil {
		return fmt.Errorf("heartbeat socket: bind %s: %w", addrPort(sa), err)
	}
	prog, err := steerProgram()
	if err != nil {
		return fmt.Errorf("heartbeat socket: %w", err)
	}
	if err := unix.SetsockoptSockFprog(s.fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		return fmt.Errorf("heartbeat socket: steering program on the gossip port: %w", err)
	}
	return nil
}

func toSockaddr(a netip.AddrPort) unix.Sockaddr {
	if a.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())}
	}
	return &unix.SockaddrInet6{Addr: a.Addr().As16(), Port: int(a.Port())}
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// The beat socket's I/O is batched (one sendmmsg to every member, one
// recvmmsg per 16 queued beats) and made with RawSyscall6: the socket is
// non-blocking and the calls never wait, so they need not tell the Go
// scheduler about a system call. On a VM a system call is dear, and one
// through syscall.Syscall also wakes the runtime's sysmon thread when it
// sleeps; an idle node's tick is then one wake-up, not seven. (x/net's
// ipv4/ipv6 batch I/O needs a net.PacketConn, i.e. the network poller,
// which would wake a thread per arriving beat.)

// mmsghdr is struct mmsghdr of sendmmsg(2) and recvmmsg(2) (64-bit Linux).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// beatBatch is the most beats one recvmmsg reads.
const beatBatch = 16

// beatIO holds the preallocated headers of the batched calls.
type beatIO struct {
	rbufs [beatBatch][beatMaxPacket]byte
	riov  [beatBatch]unix.Iovec
	rname [beatBatch]unix.RawSockaddrInet6
	rmsgs [beatBatch]mmsghdr

	targets []netip.AddrPort // what the send headers below are built for
	names   []unix.RawSockaddrInet6
	siov    unix.Iovec
	smsgs   []mmsghdr
	spkt    []byte
}

// beatMaxPacket bounds a beat (header, name, member list, tag).
const beatMaxPacket = 1024

func (s *beatSocket) initIO() {
	io := &s.io
	for i := range io.rmsgs {
		io.riov[i].Base = &io.rbufs[i][0]
		io.riov[i].SetLen(beatMaxPacket)
		io.rmsgs[i].hdr.Iov = &io.riov[i]
		io.rmsgs[i].hdr.Iovlen = 1
		io.rmsgs[i].hdr.Name = (*byte)(unsafe.Pointer(&io.rname[i]))
	}
}

// drain reads every queued datagram without blocking and hands each to fn
// (the slice is reused after fn returns).
func (s *beatSocket) drain(fn func(pkt []byte, from netip.AddrPort)) error {
	io := &s.io
	for {
		for i := range io.rmsgs {
			io.rmsgs[i].hdr.Namelen = unix.SizeofSockaddrInet6
			io.rmsgs[i].hdr.Flags = 0
			io.rmsgs[i].n = 0
		}
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&io.rmsgs[0])), beatBatch, unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EAGAIN || e == unix.EWOULDBLOCK:
			return nil
		case e == unix.EINTR:
			continue
		case e != 0:
			return fmt.Errorf("heartbeat socket: read: %w", e)
		}
		n := int(r)
		for i := 0; i < n; i++ {
			m := &io.rmsgs[i]
			if m.hdr.Flags&unix.MSG_TRUNC != 0 {
				continue // not a beat: longer than any
			}
			fn(io.rbufs[i][:m.n], rawAddrPort(&io.rname[i]))
		}
		if n < beatBatch {
			return nil
		}
	}
}

// rawAddrPort reads a sockaddr_in or sockaddr_in6 that recvmmsg filled in.
func rawAddrPort(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := uint16(sa.Port>>8) | uint16(sa.Port&0xff)<<8 // network order
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// rawSockaddr is a as the kernel takes it, in a sockaddr_in6-sized slot
// (the socket's family: an IPv4 socket takes sockaddr_in, an IPv6 one
// sockaddr_in6, with IPv4 targets mapped).
func (s *beatSocket) rawSockaddr(a netip.AddrPort) (unix.RawSockaddrInet6, uint32) {
	var raw unix.RawSockaddrInet6
	port := a.Port()
	nport := port>>8 | port<<8
	if s.v4 {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&raw))
		sa4.Family = unix.AF_INET
		sa4.Port = nport
		sa4.Addr = a.Addr().Unmap().As4()
		return raw, unix.SizeofSockaddrInet4
	}
	raw.Family = unix.AF_INET6
	raw.Port = nport
	raw.Addr = a.Addr().As16()
	return raw, unix.SizeofSockaddrInet6
}

// sendAll sends pkt to every target in one call without blocking (a full
// send queue drops a beat: they are best effort) and returns how many
// went out.
func (s *beatSocket) sendAll(pkt []byte, to []netip.AddrPort) (int, error) {
	if len(to) == 0 || len(pkt) == 0 {
		return 0, nil
	}
	io := &s.io
	if !slices.Equal(io.targets, to) {
		io.targets = slices.Clone(to)
		io.names = make([]unix.RawSockaddrInet6, len(to))
		io.smsgs = make([]mmsghdr, len(to))
		for i, a := range to {
			var nl uint32
			io.names[i], nl = s.rawSockaddr(a)
			io.smsgs[i].hdr.Name = (*byte)(unsafe.Pointer(&io.names[i]))
			io.smsgs[i].hdr.Namelen = nl
			io.smsgs[i].hdr.Iov = &io.siov
			io.smsgs[i].hdr.Iovlen = 1
		}
	}
	io.spkt = append(io.spkt[:0], pkt...)
	io.siov.Base = &io.spkt[0]
	io.siov.SetLen(len(io.spkt))
	next, sent := 0, 0
	var err error
	for next < len(io.smsgs) {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&io.smsgs[next])), uintptr(len(io.smsgs)-next), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
		case e != 0:
			// The message at next failed (e.g. no route to that member):
			// skip it, the others still get theirs.
			err = fmt.Errorf("heartbeat socket: send to %s: %w", io.targets[next], e)
			next++
		case r == 0:
			return sent, err // cannot happen: sendmmsg sends one or fails
		default:
			next += int(r)
			sent += int(r)
		}
	}
	return sent, err
}

// send sends one datagram without blocking (tests: a forged beat).
func (s *beatSocket) send(pkt []byte, to netip.AddrPort) error {
	return unix.Sendto(s.fd, pkt, unix.MSG_DONTWAIT, toSockaddr(to))
}

func (s *beatSocket) Close() error { return unix.Close(s.fd) }
