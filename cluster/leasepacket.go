package cluster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The lease election's small messages (heartbeats, their answers, grants:
// most of an idle node's packets) go straight between the gossip socket
// and the lease loop, in memberlist's own packet format: a user message,
// sealed as memberlist seals it (encryption version 1: AES-GCM with the
// primary gossip key, a random 12-byte nonce, no label). Every memberlist
// reads them as the user messages they are, and vipd's transport hands
// the ones memberlist's nodes send to the lease loop the same way.
//
// What it saves per packet: memberlist builds a new AES cipher and GCM
// for every packet it seals or opens, copies it through a bytes.Buffer,
// and passes a received one through its packet goroutine before the
// delegate; here the ciphers are made once per key and a received message
// goes from the socket's reader to the lease loop's queue.

// memberlist's message types (net.go) that the lease packets use.
const (
	mlUserMsg   = 8
	mlHasCrcMsg = 12
)

const (
	mlEncryptVersion = 1 // memberlist's encryption version 1: no padding
	gcmNonceSize     = 12
	gcmTagSize       = 16
)

// packetSealer seals and opens packets as memberlist does with its keyring:
// seal with the primary key (the first), open with any.
type packetSealer struct {
	aeads []cipher.AEAD
}

// newPacketSealer makes the ciphers of keys (the primary first). No keys:
// nil (gossip not encrypted).
func newPacketSealer(keys [][]byte) (*packetSealer, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	s := &packetSealer{}
	for i, k := range keys {
		b, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("gossip key %d: %w", i+1, err)
		}
		g, err := cipher.NewGCM(b)
		if err != nil {
			return nil, fmt.Errorf("gossip key %d: %w", i+1, err)
		}
		s.aeads = append(s.aeads, g)
	}
	return s, nil
}

// seal appends to dst the packet carrying plain: version, nonce, sealed
// plain.
func (s *packetSealer) seal(dst, plain []byte) ([]byte, error) {
	dst = append(dst, mlEncryptVersion)
	n := len(dst)
	dst = append(dst, make([]byte, gcmNonceSize)...)
	if _, err := rand.Read(dst[n:]); err != nil {
		return nil, fmt.Errorf("gossip packet nonce: %w", err)
	}
	return s.aeads[0].Seal(dst, dst[n:n+gcmNonceSize], plain, nil), nil
}

var errNotSealed = errors.New("not a packet sealed with a gossip key of this node")

// open appends the plaintext of pkt to dst; pkt is not modified (a packet
// that is not the lease's goes on to memberlist as it came).
func (s *packetSealer) open(dst, pkt []byte) ([]byte, error) {
	if len(pkt) < 1+gcmNonceSize+gcmTagSize || pkt[0] != mlEncryptVersion {
		return nil, errNotSealed
	}
	nonce, ct := pkt[1:1+gcmNonceSize], pkt[1+gcmNonceSize:]
	for _, g := range s.aeads {
		if p, err := g.Open(dst, nonce, ct, nil); err == nil {
			return p, nil
		}
	}
	return nil, errNotSealed
}

// leasePacket returns the packet for a lease message b (from encodeLease):
// a memberlist user message, sealed when s is set. No CRC: memberlist
// checks one only when the packet carries it, and the GCM tag already
// covers the message.
func leasePacket(s *packetSealer, b []byte) ([]byte, error) {
	plain := make([]byte, 0, 1+len(b))
	plain = append(plain, mlUserMsg)
	plain = append(plain, b...)
	if s == nil {
		return plain, nil
	}
	return s.seal(make([]byte, 0, 1+gcmNonceSize+len(plain)+gcmTagSize), plain)
}

// leaseMessage returns the lease message a packet carries, opened into
// scratch: ok false when it is anything else (memberlist's own messages,
// other user messages, a compound or labelled packet, one sealed with a
// key this node does not have, one without a seal while the gossip is
// sealed), which then goes to memberlist unchanged and is handled, or
// refused and logged, there.
func leaseMessage(s *packetSealer, scratch, pkt []byte) (msg []byte, ok bool) {
	plain := pkt
	if s != nil {
		p, err := s.open(scratch, pkt)
		if err != nil {
			return nil, false
		}
		plain = p
	}
	if len(plain) >= 5 && plain[0] == mlHasCrcMsg {
		if crc32.ChecksumIEEE(plain[5:]) != binary.BigEndian.Uint32(plain[1:5]) {
			return nil, false // memberlist logs the bad checksum
		}
		plain = plain[5:]
	}
	if len(plain) < 2 || plain[0] != mlUserMsg || plain[1] != leaseTag {
		return nil, false
	}
	return plain[1:], true
}
