package cluster

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestBeatSocketSteering binds a gossip-like UDP socket and the beat
// socket to one loopback port and checks, with real datagrams, that beats
// (and only beats) queue on the beat socket, unread until drained, and
// that everything else (empty datagrams too) still reaches the gossip
// socket.
func TestBeatSocketSteering(t *testing.T) {
	// The gossip socket as the transport opens it: "udp" on a specific
	// address is an IPv4 socket, on 0.0.0.0 a dual-stack IPv6 one (the
	// default VIPD_GOSSIP_BIND), which the beat socket must join.
	for _, bind := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		t.Run(bind, func(t *testing.T) { testBeatSteering(t, bind) })
	}
}

func testBeatSteering(t *testing.T, bind string) {
	lc := net.ListenConfig{Control: reusePort}
	pc, err := lc.ListenPacket(context.Background(), "udp", bind)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	gossip := pc.(*net.UDPConn)
	port := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort(gossip.LocalAddr().String()).Port())
	bs, err := openBeatSocket(gossip)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()

	client, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(port))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	send := func(b []byte) {
		t.Helper()
		if _, err := client.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		send([]byte{beatMagic, byte(i)})
	}
	send([]byte{0x01, 0x02}) // memberlist: encryption version 1
	send([]byte{beatMagic + 1})
	send(nil)

	readGossip := func() []byte {
		t.Helper()
		gossip.SetReadDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 64)
		n, err := gossip.Read(b)
		if err != nil {
			t.Fatalf("gossip socket: %v", err)
		}
		return b[:n]
	}
	for _, want := range [][]byte{{0x01, 0x02}, {beatMagic + 1}, {}} {
		if got := readGossip(); string(got) != string(want) {
			t.Fatalf("gossip socket read %x, want %x", got, want)
		}
	}
	var beats [][]byte
	if err := bs.drain(func(p []byte, from netip.AddrPort) {
		if from != netip.MustParseAddrPort(client.LocalAddr().String()) && from != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort(client.LocalAddr().String()).Port()) {
			t.Errorf("beat from %s, want %s", from, client.LocalAddr())
		}
		beats = append(beats, append([]byte(nil), p...))
	}); err != nil {
		t.Fatal(err)
	}
	if len(beats) != 3 {
		t.Fatalf("drained %d beats, want 3: %x", len(beats), beats)
	}
	for i, b := range beats {
		if len(b) != 2 || b[0] != beatMagic || b[1] != byte(i) {
			t.Errorf("beat %d = %x", i, b)
		}
	}
	// Nothing queued: drain returns at once.
	n := 0
	if err := bs.drain(func([]byte, netip.AddrPort) { n++ }); err != nil || n != 0 {
		t.Fatalf("second drain: %d packets, err %v", n, err)
	}
	// Beats sent from the beat socket itself reach the peer's beat socket.
	if err := bs.send([]byte{beatMagic, 9}, port); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for n == 0 && time.Now().Before(deadline) {
		bs.drain(func(p []byte, _ netip.AddrPort) {
			if p[1] == 9 {
				n++
			}
		})
		time.Sleep(5 * time.Millisecond)
	}
	if n != 1 {
		t.Fatalf("beat sent by the beat socket not received")
	}
}
