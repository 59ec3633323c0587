package cluster

// Beat packets (beatsock.go carries them, MemberBeats reads them): magic,
// version, the sender's sequence number (strictly increasing: its clock
// in nanoseconds, or one more than the last), its term while it claims a
// VIP (0: none), the hash of its metadata (MetaHash), its name, its relay
// list (a count, then per member the 8-byte BeatHash, the age in ticks
// and the MetaHash of the metadata the sender has of that member), and with a gossip key a 16-byte HMAC-SHA256 tag over all of it,
// under a key derived from each gossip key (any key of the ring verifies,
// so keys rotate as memberlist's do). A receiver takes a sender's packet
// only if its sequence number is above the last one taken (a replayed
// beat cannot keep a dead holder alive).

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
)

const (
	beatVersion = 3
	beatTagLen  = 16
	beatHeader  = 1 + 1 + 8 + 8 + 4 + 1
)

type beatMsg struct {
	Name  string
	Term  uint64
	Seq   uint64
	Meta  uint32 // MetaHash of the sender's metadata
	Heard []BeatHeard
}

// beatMaxHeard bounds the relay list (a beat with the longest name stays
// below beatMaxPacket; a larger cluster relays only part of its members,
// which is safe: a relay can only keep a member alive, or start a pull).
const (
	beatMaxHeard = 48
	beatRelayLen = 8 + 1 + 4
)

// beatKeys derives the beat MAC keys from the gossip keys.
func beatKeys(keys [][]byte) [][]byte {
	out := make([][]byte, 0, len(keys))
	for _, k := range keys {
		m := hmac.New(sha256.New, k)
		m.Write([]byte("vipd beat v1"))
		out = append(out, m.Sum(nil))
	}
	return out
}

var (
	errBeatShort = errors.New("beat: short or malformed packet")
	errBeatAuth  = errors.New("beat: not authenticated by any gossip key")
)

// beatCodec encodes and verifies beats with MAC states made once per key
// and reused buffers: a beat tick allocates next to nothing (garbage is
// what an idle node collects; 1.9 KB a tick before).
type beatCodec struct {
	macs []hash.Hash
	sum  []byte
	buf  []byte
}

func newBeatCodec(keys [][]byte) *beatCodec {
	c := &beatCodec{}
	for _, k := range keys {
		c.macs = append(c.macs, hmac.New(sha256.New, k))
	}
	return c
}

func (c *beatCodec) tag(i int, msg []byte) []byte {
	h := c.macs[i]
	h.Reset()
	h.Write(msg)
	c.sum = h.Sum(c.sum[:0])
	return c.sum[:beatTagLen]
}

// encodeBeat signs with the first key (none: insecure gossip, no tag).
func encodeBeat(m beatMsg, keys [][]byte) ([]byte, error) {
	b, err := newBeatCodec(keys).encode(m)
	return bytes.Clone(b), err
}

// encode returns m as a packet, valid until the next encode.
func (c *beatCodec) encode(m beatMsg) ([]byte, error) {
	if len(m.Name) == 0 || len(m.Name) > heartbeatMaxName {
		return nil, errBeatShort
	}
	heard := m.Heard[:min(len(m.Heard), beatMaxHeard)]
	b := append(c.buf[:0], beatMagic, beatVersion)
	b = binary.BigEndian.AppendUint64(b, m.Seq)
	b = binary.BigEndian.AppendUint64(b, m.Term)
	b = binary.BigEndian.AppendUint32(b, m.Meta)
	b = append(b, byte(len(m.Name)))
	b = append(b, m.Name...)
	b = append(b, byte(len(heard)))
	for _, h := range heard {
		b = binary.BigEndian.AppendUint64(b, h.Hash)
		b = append(b, h.Age)
		b = binary.BigEndian.AppendUint32(b, h.Meta)
	}
	if len(c.macs) > 0 {
		b = append(b, c.tag(0, b)...)
	}
	c.buf = b
	return b, nil
}

// decodeBeat parses and verifies a packet. With keys, a packet without a
// valid tag under one of them is refused; without keys, a tagged packet
// is refused too (the two sides disagree about authentication).
func decodeBeat(b []byte, keys [][]byte) (beatMsg, error) {
	var m beatMsg
	err := newBeatCodec(keys).decode(b, &m)
	return m, err
}

// decode parses and verifies b into m, reusing m.Heard's array.
func (c *beatCodec) decode(b []byte, m *beatMsg) error {
	if len(b) < beatHeader || b[0] != beatMagic || b[1] != beatVersion {
		return errBeatShort
	}
	nl := int(b[beatHeader-1])
	if nl == 0 || len(b) < beatHeader+nl+1 {
		return errBeatShort
	}
	hc := int(b[beatHeader+nl])
	body := beatHeader + nl + 1 + beatRelayLen*hc
	want := body
	if len(c.macs) > 0 {
		want += beatTagLen
	}
	if hc > beatMaxHeard || len(b) != want {
		return errBeatShort
	}
	if len(c.macs) > 0 {
		ok := false
		for i := range c.macs {
			if hmac.Equal(c.tag(i, b[:body]), b[body:]) {
				ok = true
				break
			}
		}
		if !ok {
			return errBeatAuth
		}
	}
	m.Seq = binary.BigEndian.Uint64(b[2:10])
	m.Term = binary.BigEndian.Uint64(b[10:18])
	m.Meta = binary.BigEndian.Uint32(b[18:22])
	m.Name = string(b[beatHeader : beatHeader+nl])
	m.Heard = m.Heard[:0]
	for i := 0; i < hc; i++ {
		o := beatHeader + nl + 1 + beatRelayLen*i
		m.Heard = append(m.Heard, BeatHeard{Hash: binary.BigEndian.Uint64(b[o : o+8]), Age: b[o+8], Meta: binary.BigEndian.Uint32(b[o+9 : o+13])})
	}
	if hc == 0 {
		m.Heard = nil
	}
	return nil
}

// beatReplay remembers each sender's last sequence number.
type beatReplay map[string]uint64

// fresh reports whether m is newer than the last beat taken from its
// sender, and if so remembers it.
func (r beatReplay) fresh(m beatMsg) bool {
	if m.Seq <= r[m.Name] {
		return false
	}
	r[m.Name] = m.Seq
	return true
}

// nextSeq is the sequence number of the next beat: the clock in
// nanoseconds, or one more than the last if the clock went back.
func nextSeq(last uint64, unixNano int64) uint64 {
	if unixNano > 0 && uint64(unixNano) > last {
		return uint64(unixNano)
	}
	return last + 1
}
