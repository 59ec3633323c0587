package rawconn

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/internal/testenv"
)

// etherType is IEEE's local experimental EtherType: nothing else on the
// throwaway namespace's loopback sends it.
const etherType = 0x88b5

// inThrowawayNS runs the test on a locked thread in a new network
// namespace with lo up; sockets opened there stay in it.
func inThrowawayNS(t *testing.T) *net.Interface {
	t.Helper()
	testenv.RequireRoot(t)
	runtime.LockOSThread() // the thread never returns to the host namespace unless Set succeeds
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
		ns.Close()
	})
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	ifi, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	return ifi
}

func listenPacket(t *testing.T, ifi *net.Interface) (*packet.Conn, *Packet) {
	t.Helper()
	c, err := packet.Listen(ifi, packet.Raw, etherType, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p, err := WrapPacket(c)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

func frame(ifi *net.Interface, payload string) []byte {
	hw := make([]byte, 6) // lo's hardware address is all zeros
	copy(hw, ifi.HardwareAddr)
	f := append(append(append([]byte{}, hw...), hw...), etherType>>8, etherType&0xff)
	return append(f, payload...)
}

// Frames sent with SendLinkLayer arrive whole, with their EtherType, at
// another packet socket, read with Recv; a short buffer cuts a frame.
func TestPacketCarriesFrames(t *testing.T) {
	ifi := inThrowawayNS(t)
	_, tx := listenPacket(t, ifi)
	rxc, rx := listenPacket(t, ifi)
	want := map[string]bool{}
	for i := range 3 {
		payload := fmt.Sprintf("vipd frame %d", i)
		want[payload] = true
		if err := tx.SendLinkLayer(frame(ifi, payload), ifi.Index, etherType, make(net.HardwareAddr, 6)); err != nil {
			t.Fatalf("SendLinkLayer: %v", err)
		}
	}
	if err := rxc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1514)
	for len(want) > 0 {
		n, err := rx.Recv(buf)
		if err != nil {
			t.Fatalf("Recv with %d frames still to come: %v", len(want), err)
		}
		got := buf[:n]
		if n < 14 || got[12] != etherType>>8 || got[13] != etherType&0xff {
			t.Fatalf("frame % x: not ours", got)
		}
		delete(want, string(got[14:])) // lo delivers each frame twice: as sent and as received
	}
	// A buffer shorter than the frame gets its start.
	if err := tx.SendLinkLayer(frame(ifi, "a frame longer than the buffer"), ifi.Index, etherType, make(net.HardwareAddr, 6)); err != nil {
		t.Fatal(err)
	}
	short := make([]byte, 16)
	for {
		n, err := rx.Recv(short)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(short) {
			t.Fatalf("Recv into %d bytes returned %d", len(short), n)
		}
		if bytes.Equal(short[14:], []byte("a ")) {
			break
		}
	}
}

// The owner's deadline and Close end a waiting Recv; bad arguments are
// refused without a system call.
func TestPacketEdges(t *testing.T) {
	ifi := inThrowawayNS(t)
	c, p := listenPacket(t, ifi)
	if _, err := p.Recv(nil); err == nil {
		t.Error("Recv into an empty buffer: no error")
	}
	if err := p.SendLinkLayer(nil, ifi.Index, etherType, make(net.HardwareAddr, 6)); err == nil {
		t.Error("SendLinkLayer of an empty frame: no error")
	}
	if err := p.SendLinkLayer(frame(ifi, "x"), ifi.Index, etherType, make(net.HardwareAddr, 9)); err == nil {
		t.Error("SendLinkLayer to a 9-byte hardware address: no error")
	}
	if err := p.SendLinkLayer(frame(ifi, "x"), 999999, etherType, make(net.HardwareAddr, 6)); err == nil {
		t.Error("SendLinkLayer on a missing interface: no error")
	}
	buf := make([]byte, 1514)
	start := time.Now()
	if err := c.SetReadDeadline(start.Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := p.Recv(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Recv past the deadline: %v, want a timeout", err)
	}
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("Recv returned after %v, before its deadline", waited)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Recv(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = c.Close()
	select {
	case err := <-done:
		// A packet socket is an *os.File underneath, whose poller says
		// "use of closed file" (an unexported error).
		if err == nil || errors.As(err, &ne) && ne.Timeout() || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("Recv after Close: %v, want the closed file's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting Recv")
	}
}
