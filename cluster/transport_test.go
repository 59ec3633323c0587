package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func testTransport(t *testing.T) *transport {
	t.Helper()
	tr, err := newTransport(netip.MustParseAddrPort("127.0.0.1:0"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown() })
	return tr
}

// A packet reaches memberlist in a buffer of its own size: memberlist's
// own transport handed over 64 KB per packet, most of an idle vipd's
// garbage.
func TestTransportPacketsAtTheirSize(t *testing.T) {
	tr := testTransport(t)
	c, err := net.Dial("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port())))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, msg := range [][]byte{[]byte("ping"), bytes.Repeat([]byte{7}, 1400)} {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-tr.PacketCh():
			if !bytes.Equal(p.Buf, msg) {
				t.Fatalf("packet %q, want %q", p.Buf, msg)
			}
			if cap(p.Buf) > len(msg)+64 {
				t.Errorf("a %d-byte packet came in a %d-byte buffer", len(msg), cap(p.Buf))
			}
			if p.From.String() != c.LocalAddr().String() {
				t.Errorf("from %v, want %v", p.From, c.LocalAddr())
			}
			if time.Since(p.Timestamp) > 10*time.Second || p.Timestamp.IsZero() {
				t.Errorf("timestamp %v", p.Timestamp)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no packet")
		}
	}
}

// TCP and UDP share the port; a stream accepted is handed over; the
// advertised address is the bound one unless one is given.
func TestTransportStreamsAndAddress(t *testing.T) {
	tr := testTransport(t)
	ip, port, err := tr.FinalAdvertiseAddr("", 0)
	if err != nil || !ip.Equal(net.ParseIP("127.0.0.1")) || port != tr.Port() {
		t.Fatalf("advertise %v %d %v, want 127.0.0.1 %d", ip, port, err, tr.Port())
	}
	if ip, port, err := tr.FinalAdvertiseAddr("10.1.2.3", 7950); err != nil || ip.String() != "10.1.2.3" || len(ip) != net.IPv4len || port != 7950 {
		t.Errorf("advertise given: %v %d %v", ip, port, err)
	}
	if _, _, err := tr.FinalAdvertiseAddr("node1", 7950); err == nil {
		t.Error("a name was accepted as advertise address")
	}
	c, err := tr.DialTimeout(net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port())), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-tr.StreamCh():
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no stream")
	}
	if _, err := tr.WriteTo([]byte("x"), "not an address"); err == nil {
		t.Error("WriteTo to a bad address did not fail")
	}
}

// The gossip port taken: one clear error, nothing left bound.
func TestTransportBindConflict(t *testing.T) {
	tr := testTransport(t)
	bind := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(tr.Port()))
	_, err := newTransport(bind, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err %v, want address already in use", err)
	}
	u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	_, err = newTransport(u.LocalAddr().(*net.UDPAddr).AddrPort(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "UDP") {
		t.Fatalf("err %v, want the UDP listener's error", err)
	}
	// The TCP listener of the failed attempt was closed: the port is free.
	l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(u.LocalAddr().(*net.UDPAddr).AddrPort()))
	if err != nil {
		t.Fatalf("TCP port left bound: %v", err)
	}
	l.Close()
}

// Shutdown returns although nobody reads the packets and streams that
// arrived, and the listeners are gone.
func TestTransportShutdownUnread(t *testing.T) {
	tr := testTransport(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port()))
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("unread"))
	s, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { tr.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown blocked")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("TCP listener still accepts after Shutdown")
	}
	tr.Shutdown() // twice is fine
}

// Two memberlists over it: a join (TCP push-pull), then a user message
// (UDP) both ways.
func TestTransportMemberlist(t *testing.T) {
	mk := func(name string) (*memberlist.Memberlist, chan []byte) {
		tr := testTransport(t)
		got := make(chan []byte, 8)
		c := memberlist.DefaultLocalConfig()
		c.Name = name
		c.Transport = tr
		c.BindAddr, c.BindPort, c.AdvertisePort = "127.0.0.1", tr.Port(), tr.Port()
		c.Delegate = msgDelegate(got)
		c.LogOutput = io.Discard
		ml, err := memberlist.Create(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ml.Shutdown() })
		return ml, got
	}
	a, gotA := mk("a")
	b, gotB := mk("b")
	if _, err := b.Join([]string{a.LocalNode().Address()}); err != nil {
		t.Fatal(err)
	}
	// The joined side merges b's state after answering it: b's Join may
	// return first.
	waitFor(t, 5*time.Second, "both memberlists see 2 members", func() bool { return a.NumMembers() == 2 && b.NumMembers() == 2 })
	if err := a.SendBestEffort(b.LocalNode(), []byte("to b")); err != nil {
		t.Fatal(err)
	}
	if err := b.SendBestEffort(a.LocalNode(), []byte("to a")); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		ch   chan []byte
		want string
	}{{gotB, "to b"}, {gotA, "to a"}} {
		select {
		case m := <-w.ch:
			if string(m) != w.want {
				t.Errorf("got %q, want %q", m, w.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q not delivered", w.want)
		}
	}
}

type msgDelegate chan []byte

func (d msgDelegate) NodeMeta(int) []byte               { return nil }
func (d msgDelegate) NotifyMsg(b []byte)                { d <- append([]byte(nil), b...) }
func (d msgDelegate) GetBroadcasts(int, int) [][]byte   { return nil }
func (d msgDelegate) LocalState(bool) []byte            { return nil }
func (d msgDelegate) MergeRemoteState(b []byte, _ bool) {}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
