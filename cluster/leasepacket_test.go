package cluster

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/vipd/vipd/cluster/lease"
)

// plainMemberlist is a memberlist with its own transport (memberlist's
// NetTransport, as any memberlist peer would run) and keys, its user
// messages delivered to got.
func plainMemberlist(t *testing.T, name string, keys [][]byte) (*memberlist.Memberlist, chan []byte) {
	t.Helper()
	got := make(chan []byte, 8)
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.BindAddr, c.BindPort, c.AdvertisePort = "127.0.0.1", 0, 0
	c.Delegate = msgDelegate(got)
	c.LogOutput = io.Discard
	if len(keys) > 0 {
		ring, err := memberlist.NewKeyring(keys, keys[0])
		if err != nil {
			t.Fatal(err)
		}
		c.Keyring = ring
		c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Shutdown() })
	return ml, got
}

func udpSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readPacket(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	buf := make([]byte, 65536)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := c.ReadFromUDP(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// What memberlist itself sends as a user message, sealed with its keyring,
// is a lease message to leaseMessage when it is one and the keys match:
// the transport hands it to the lease loop instead of memberlist.
func TestLeaseMessageFromMemberlist(t *testing.T) {
	msg, err := encodeLease("m", []byte("renewal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		sent      [][]byte // memberlist's keyring, primary first
		ours      [][]byte // this node's keys (nil: gossip not encrypted)
		user      []byte
		wantLease bool
	}{
		{"same key", [][]byte{keyA}, [][]byte{keyA}, msg, true},
		{"sealed with this node's second key (a key rotation)", [][]byte{keyB}, [][]byte{keyA, keyB}, msg, true},
		{"another key", [][]byte{keyB}, [][]byte{keyA}, msg, false},
		{"sealed, this node without keys", [][]byte{keyA}, nil, msg, false},
		{"neither side encrypts", nil, nil, msg, true},
		{"not sealed, this node with keys", nil, [][]byte{keyA}, msg, false},
		{"another user message (a handover's 'H')", [][]byte{keyA}, [][]byte{keyA}, []byte("H{}"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ml, _ := plainMemberlist(t, "m", tc.sent)
			sock := udpSocket(t)
			to := memberlist.Address{Addr: sock.LocalAddr().String(), Name: "x"}
			if err := ml.SendToAddress(to, tc.user); err != nil {
				t.Fatal(err)
			}
			pkt := readPacket(t, sock)
			orig := append([]byte(nil), pkt...)
			s, err := newPacketSealer(tc.ours)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := leaseMessage(s, nil, pkt)
			if ok != tc.wantLease || (ok && !bytes.Equal(got, tc.user)) {
				t.Fatalf("leaseMessage: %q, %v; want %v", got, ok, tc.wantLease)
			}
			if !bytes.Equal(pkt, orig) {
				t.Fatal("the packet was changed: memberlist would get another one")
			}
		})
	}
}

// A lease packet is the user message memberlist's own SendBestEffort
// would send: a memberlist with the same key (or this node's primary key
// among its keys) delivers it to its delegate; one with another key drops
// it.
func TestLeasePacketToMemberlist(t *testing.T) {
	msg, err := encodeLease("a", []byte("answer"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		theirs  [][]byte
		ours    [][]byte
		deliver bool
	}{
		{"same key", [][]byte{keyA}, [][]byte{keyA}, true},
		{"our primary is their second key", [][]byte{keyB, keyA}, [][]byte{keyA}, true},
		{"another key", [][]byte{keyB}, [][]byte{keyA}, false},
		{"neither side encrypts", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ml, got := plainMemberlist(t, "m", tc.theirs)
			s, err := newPacketSealer(tc.ours)
			if err != nil {
				t.Fatal(err)
			}
			pkt, err := leasePacket(s, msg)
			if err != nil {
				t.Fatal(err)
			}
			c := udpSocket(t)
			ln := ml.LocalNode()
			if _, err := c.WriteToUDP(pkt, &net.UDPAddr{IP: ln.Addr, Port: int(ln.Port)}); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-got:
				if !tc.deliver || !bytes.Equal(m, msg) {
					t.Fatalf("delivered %q (want delivery: %v)", m, tc.deliver)
				}
			case <-time.After(500 * time.Millisecond):
				if tc.deliver {
					t.Fatal("not delivered")
				}
			}
		})
	}
}

// Only a well-formed, authentic lease message is taken; everything else
// goes to memberlist unchanged.
func TestLeaseMessageRefuses(t *testing.T) {
	s, err := newPacketSealer([][]byte{keyA})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := encodeLease("b", []byte("x"))
	crc := func(body []byte, sum uint32) []byte {
		h := []byte{mlHasCrcMsg, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(h[1:], sum)
		return append(h, body...)
	}
	user := append([]byte{mlUserMsg}, msg...)
	sealed := func(plain []byte) []byte {
		p, err := s.seal(nil, plain)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := sealed(user)
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-1] ^= 1
	for _, tc := range []struct {
		name string
		pkt  []byte
		ok   bool
	}{
		{"a lease message", good, true},
		{"with memberlist's checksum", sealed(crc(user, crc32.ChecksumIEEE(user))), true},
		{"a wrong checksum", sealed(crc(user, crc32.ChecksumIEEE(user)+1)), false},
		{"tampered", tampered, false},
		{"truncated", good[:20], false},
		{"empty", nil, false},
		{"a labelled packet", append([]byte{244, 1, 'x'}, good...), false},
		{"a compound message", sealed(append([]byte{7, 1, 0, byte(len(user))}, user...)), false},
		{"a ping", sealed([]byte{0, 0x80}), false},
		{"a user message of one byte", sealed([]byte{mlUserMsg}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := leaseMessage(s, make([]byte, 0, 16), tc.pkt)
			if ok != tc.ok || (ok && !bytes.Equal(got, msg)) {
				t.Fatalf("got %q, %v; want %v", got, ok, tc.ok)
			}
		})
	}
}

// A lease message between two nodes reaches the other machine through the
// transport's tap: with memberlist given no user message at all, it still
// arrives.
func TestLeaseNodePacketsBypassMemberlist(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	b := startNode(t, "b", [][]byte{keyA}, a.addr())
	waitFor(t, 5*time.Second, "a and b see each other", func() bool { return a.n.ml.NumMembers() == 2 && b.n.ml.NumMembers() == 2 })
	// From now on b's transport hands memberlist no user message at all.
	inner := b.n.tr.tap.Load()
	b.n.tr.setTap(func(pkt []byte) bool {
		if (*inner)(pkt) {
			return true
		}
		if _, ok := leaseMessage(nil, nil, pkt); ok {
			return true
		}
		p, err := b.n.sealer.open(nil, pkt)
		return err == nil && len(p) > 0 && (p[0] == mlUserMsg || p[0] == mlHasCrcMsg)
	})
	a.m.queue(lease.Message{To: "b", Data: []byte("via the tap")})
	a.n.loop.post(lease.Tick{})
	b.m.waitFor(t, "the message at b", func(m *echoMachine) bool {
		for _, r := range m.got {
			if r.From == "a" && string(r.Data) == "via the tap" {
				return true
			}
		}
		return false
	})
}
