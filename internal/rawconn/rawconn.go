// Package rawconn reads and writes sockets with raw system calls through
// Go's network poller.
//
// Go's regular socket calls (net.Conn's Read and Write) enter the runtime's
// system-call path, and the first one after the process went idle wakes
// the runtime's monitor thread (sysmon), which then polls every 20 µs
// until the process is idle again. On a paravirtualised VM each of those
// wake-ups costs about as much as the call itself, and an idle vipd's
// periodic work (lease heartbeats, the apiserver health probe) was a
// third monitor thread. The sockets here are non-blocking, so the calls
// never block and the runtime need not know about them: when one would
// block, the poller waits for the socket as it does for net.Conn.
package rawconn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NonBlocking runs call, a non-blocking system call, again while it is
// interrupted. It returns false when the call would block (EAGAIN: the
// poller waits for the socket, then the caller's callback runs again) and
// true when it is done, its error in *err (nil on success): the callback
// shape of syscall.RawConn's Read and Write.
func NonBlocking(call func() syscall.Errno, err *error) bool {
	for {
		switch e := call(); e {
		case 0:
			*err = nil
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			*err = e
			return true
		}
	}
}

// Conn is a stream connection (TCP, Unix) whose Read and Write are raw
// system calls through the poller. Deadlines, Close and the addresses are
// the wrapped connection's: a deadline or a Close ends a waiting Read or
// Write with the error net.Conn gives.
type Conn struct {
	net.Conn
	rc syscall.RawConn
}

// syscallConner is what *net.TCPConn and *net.UnixConn offer.
type syscallConner interface {
	SyscallConn() (syscall.RawConn, error)
}

// Wrap returns c reading and writing with raw calls, or an error when c
// has no socket of its own (a TLS or an in-memory connection).
func Wrap(c net.Conn) (*Conn, error) {
	sc, ok := c.(syscallConner)
	if !ok {
		return nil, fmt.Errorf("rawconn: a %T has no socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("rawconn: %w", err)
	}
	return &Conn{Conn: c, rc: rc}, nil
}

// Read reads into b: io.EOF when the peer closed the stream.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var (
		n    uintptr
		rerr error
	)
	err := c.rc.Read(func(fd uintptr) bool {
		return NonBlocking(func() (e syscall.Errno) {
			n, _, e = unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			return e
		}, &rerr)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, c.opError("read", err)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return int(n), nil
}

// Write writes all of b, waiting in the poller while the send buffer is
// full.
func (c *Conn) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		var (
			n    uintptr
			werr error
		)
		rest := b[done:]
		err := c.rc.Write(func(fd uintptr) bool {
			return NonBlocking(func() (e syscall.Errno) {
				n, _, e = unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
				return e
			}, &werr)
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			return done, c.opError("write", err)
		}
		done += int(n)
	}
	return done, nil
}

// opError wraps a system call's error as net.Conn does (a deadline's and
// a closed connection's errors are passed as they are: callers compare
// them with errors.Is).
func (c *Conn) opError(op string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		err = &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: fmt.Errorf("%s: %w", op, errno)}
	}
	return err
}
