package cluster

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

// MetaLimit is memberlist's limit on a node's metadata.
const MetaLimit = 512

// MaxCounted is how many member hashes the metadata carries. A cluster
// with more known members than this gossips none, and its peers then count
// it without checking that it counts them (control planes have 3 to 7).
const MaxCounted = 16

// NameHash is the 32-bit hash of a member name gossiped in Meta.Counts.
func NameHash(name string) uint32 {
	h := sha256.Sum256([]byte(name))
	return binary.BigEndian.Uint32(h[:4])
}

// Hashes is a list of member-name hashes, gossiped as one base64 string
// (4 bytes a member) to stay well inside the metadata limit.
type Hashes []uint32

// MarshalJSON implements json.Marshaler.
func (h Hashes) MarshalJSON() ([]byte, error) {
	if h == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 4*len(h))
	for i, v := range h {
		binary.BigEndian.PutUint32(b[4*i:], v)
	}
	return json.Marshal(base64.RawStdEncoding.EncodeToString(b))
}

// UnmarshalJSON implements json.Unmarshaler.
func (h *Hashes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*h = nil
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	b, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		return fmt.Errorf("member hashes: not a base64 list of 4-byte hashes")
	}
	out := make(Hashes, len(b)/4)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	*h = out
	return nil
}

// encodeMeta encodes m for gossip.
func encodeMeta(m Meta) ([]byte, error) { return json.Marshal(m) }

func decodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, nil
	}
	err := json.Unmarshal(b, &m)
	return m, err
}

// MetaFits reports whether the metadata of a node with these VIPs fits in
// MetaLimit in the worst case (every VIP claimed, the largest term and
// priority, MaxCounted members), and if not, how many of them would.
func MetaFits(vips []string) error {
	worst := func(vs []string) int {
		m := Meta{Healthy: true, Eligible: true, Leaving: true, Dup: true, Pools: true, Priority: math.MinInt32, Term: math.MaxUint64,
			Holding: vs, Broken: []string{longest(vs)}, Counts: make(Hashes, MaxCounted),
			// Unverified never lists a VIP this node holds: the key
			// alone on top of every VIP held bounds it.
			Unverified: []string{""}}
		b, _ := encodeMeta(m)
		return len(b)
	}
	if worst(vips) <= MetaLimit {
		return nil
	}
	fit := 0
	for fit < len(vips) && worst(vips[:fit+1]) <= MetaLimit {
		fit++
	}
	return fmt.Errorf("VIPD_ADDRESS has %d VIPs: the gossip metadata (%d bytes at most) holds %d of these; use fewer VIPs per node, or bgp mode", len(vips), MetaLimit, fit)
}

func longest(vs []string) string {
	l := ""
	for _, v := range vs {
		if len(v) > len(l) {
			l = v
		}
	}
	return l
}
