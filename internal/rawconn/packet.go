package rawconn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Packet is a datagram socket (an AF_PACKET socket: the l2 conflict
// guard's readers and the verification's probes) read and written with
// raw calls through the poller. Its deadlines and Close are its owner's:
// a read deadline or a Close ends a waiting Recv with the error the owner's
// connection gives (a timeout; a closed file's error).
type Packet struct {
	rc syscall.RawConn
}

// WrapPacket returns c read and written with raw calls.
func WrapPacket(c syscall.Conn) (*Packet, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("rawconn: %w", err)
	}
	return &Packet{rc: rc}, nil
}

// Recv reads one datagram into b, cut to len(b), without its source
// address, waiting in the poller until one arrives.
func (p *Packet) Recv(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, errors.New("rawconn: Recv into an empty buffer")
	}
	var (
		n    uintptr
		rerr error
	)
	err := p.rc.Read(func(fd uintptr) bool {
		return NonBlocking(func() (e syscall.Errno) {
			n, _, e = unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
			return e
		}, &rerr)
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, os.NewSyscallError("recvfrom", rerr)
	}
	return int(n), nil
}

// SendLinkLayer sends the frame b out of interface ifindex to the
// hardware address dst, with EtherType proto in the socket address (as a
// packet socket's sendto).
func (p *Packet) SendLinkLayer(b []byte, ifindex int, proto uint16, dst net.HardwareAddr) error {
	var sa unix.RawSockaddrLinklayer
	if len(b) == 0 || len(dst) > len(sa.Addr) {
		return fmt.Errorf("rawconn: cannot send %d bytes to hardware address %v", len(b), dst)
	}
	sa.Family = unix.AF_PACKET
	sa.Protocol = proto<<8 | proto>>8 // network byte order
	sa.Ifindex = int32(ifindex)
	sa.Halen = uint8(len(dst))
	copy(sa.Addr[:], dst)
	var werr error
	err := p.rc.Write(func(fd uintptr) bool {
		return NonBlocking(func() (e syscall.Errno) {
			_, _, e = unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0,
				uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
			return e
		}, &werr)
	})
	if err != nil {
		return err
	}
	if werr != nil {
		return os.NewSyscallError("sendto", werr)
	}
	return nil
}
