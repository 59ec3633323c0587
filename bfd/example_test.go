package bfd_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/bfd"
)

// A BGP speaker keeps one BFD session per peer and resets the BGP session
// when BFD leaves Up. (Compiled, not run: it would send packets.)
func ExampleServer() {
	resetBGP := func(peer netip.Addr) { /* e.g. GoBGP ResetPeer / disable the neighbour */ }
	enableBGP := func(peer netip.Addr) {}

	srv, err := bfd.NewServer(bfd.ServerConfig{
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, nil)),
		OnStateChange: func(peer netip.Addr, old, new bfd.State, diag bfd.Diag) {
			switch {
			case old == bfd.StateUp && new != bfd.StateUp:
				resetBGP(peer)
			case new == bfd.StateUp:
				enableBGP(peer)
			}
		},
	})
	if err != nil {
		panic(err)
	}
	defer srv.Close() // AdminDown to every peer

	peer, local := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.11")
	cfg := bfd.SessionConfig{DetectMult: 3, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond}
	if err := srv.Add(peer, local, cfg); err != nil {
		panic(err)
	}
	st, _ := srv.Status(peer)
	_ = json.NewEncoder(os.Stdout).Encode(st) // {"peer":"192.0.2.1","local":"192.0.2.11","session":{"state":"down",...
	_ = srv.Remove(peer)
}

// Driving the pure state machine by hand, as the Server does.
func ExampleSession() {
	now := time.Now()
	s, err := bfd.NewSession(now, 0x1234, bfd.DefaultSessionConfig(), nil)
	if err != nil {
		panic(err)
	}
	send := func(p bfd.ControlPacket) { b, _ := p.MarshalBinary(); _ = b /* write to the socket */ }
	for range 3 {
		now = s.NextDeadline() // a real driver sleeps until then, or until a packet arrives
		if a := s.Tick(now); a.Send {
			send(a.Packet)
		}
	}
	var in bfd.ControlPacket
	wire := []byte{0x20, 0x40, 3, 24, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0x0f, 0x42, 0x40, 0, 0x0f, 0x42, 0x40, 0, 0, 0, 0}
	if err := in.UnmarshalBinary(wire); err == nil {
		if a, err := s.Receive(now, &in); err == nil && a.StateChanged {
			send(a.Packet) // Down -> Init, announced at once
			fmt.Println(a.OldState, "->", a.NewState, "your discriminator", a.Packet.YourDiscriminator)
		}
	}
	// Output: down -> init your discriminator 9
}
