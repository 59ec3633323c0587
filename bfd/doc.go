// Package bfd is an asynchronous BFD (RFC 5880) for single-hop (RFC 5881)
// and multihop (RFC 5883) sessions,
// interoperable with FRR's bfdd. It has three layers:
//
//   - ControlPacket: the 24-byte Control packet codec with the receive
//     checks of RFC 5880 section 6.8.6 that need no session.
//     Authentication, Echo and Demand mode are not supported.
//   - Session: the pure state machine (AdminDown/Down/Init/Up), timers,
//     interval negotiation, jitter and Poll/Final. No goroutines, sockets or
//     clock: time is an argument, packets and state changes come out as
//     Actions, NextDeadline says when to call Tick.
//   - Server: the UDP transport. It receives on port 3784 (one socket per
//     address family), drops datagrams whose TTL / hop limit is not 255
//     (GTSM), demultiplexes by Your Discriminator or, when that is zero, by
//     source address, and sends from one socket per session with a source
//     port in 49152-65535 and TTL 255. Each session runs on its own
//     goroutine. AddMultihop starts a multihop session instead: port 4784,
//     a listener of its own, and a per-session minimum TTL in place of
//     GTSM.
//
// # Using it from BGP
//
// One Server per process; one session per BGP peer address:
//
//	srv, err := bfd.NewServer(bfd.ServerConfig{
//		Registerer: reg, // vipd_bfd_session_up{peer}, vipd_bfd_session_flaps_total{peer}
//		Logger:     log,
//		OnStateChange: func(peer netip.Addr, old, new bfd.State, diag bfd.Diag) {
//			// old == bfd.StateUp && new != bfd.StateUp: reset the BGP session now.
//			// new == bfd.StateUp: allow it again.
//		},
//	})
//	defer srv.Close() // sends AdminDown (diag 7) on every session
//	err = srv.Add(peerAddr, localAddr, bfd.SessionConfig{ // localAddr may be the zero netip.Addr
//		DetectMult: 3, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond,
//	})
//	st, ok := srv.Status(peerAddr) // PeerStatus: JSON-ready for /status
//	err = srv.Remove(peerAddr)     // sends AdminDown, forgets the session
//
// A consumer that wants no import of this package in its own code defines
// a small interface with these methods and lets cmd/vipd pass a *Server
// (or an adapter) in.
//
// OnStateChange runs on one notification goroutine, in order, and does not
// fire for the AdminDown that Remove and Close cause. A new session starts
// Down and stays Down until the peer answers; as with FRR, only a change
// away from Up is a failure. Update changes a session's intervals (a Poll
// sequence while Up); SetAdminDown takes one down without removing it.
//
// SessionConfig.Validate names the VIPD_BFD_* setting that is out of range:
// detect multiplier 1-255, intervals 10ms-60s (FRR's limits).
//
// # Network namespaces
//
// NewServer opens nothing; Add opens the receive socket of the peer's
// family (once) and the session's transmit socket, synchronously, on the
// calling goroutine's OS thread. To run a Server inside a network
// namespace, call Add from a thread locked into it (see inNetns in
// frr_test.go). No socket is opened later from another goroutine.
//
// # Deviations and choices
//
//   - A Poll sequence is started only while Up (also on reaching Up, when
//     the advertised TX drops from the 1 s slow rate). While not Up a new
//     interval is carried in every packet and applies at once.
//   - With detect multiplier 1 the TX interval is 75-90 % of the negotiated
//     one, as RFC 5880 section 6.8.7 requires; otherwise 75-100 %.
//   - After a Detection Time of silence the remote's discriminator is
//     forgotten and its Required Min RX reset to 1 µs (6.8.1, 6.8.18).
//   - An AdminDown session keeps sending AdminDown at the slow rate
//     (6.8.16 allows either); Remove and Close send ShutdownPackets of them
//     10 ms apart and then stop.
package bfd
