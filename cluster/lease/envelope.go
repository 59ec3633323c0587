package lease

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// envelopeVersion is the first byte of every message between machines. A
// receiver drops versions it does not know (the Note names the version).
// Version 1 (never released) carried the header as JSON; version 2 in
// protobuf's wire format (headerwire.go).
const envelopeVersion = 2

// maxEnvelope bounds what a decoder accepts (a hostile or broken peer must
// not make a node allocate without bound).
const maxEnvelope = 8 << 20

// header is the part of an envelope that is not raft's: grants, acks,
// membership requests. It rides next to the raft messages for the same
// destination, one envelope per destination per Step.
type header struct {
	From    string `json:"f"`
	ID      uint64 `json:"i,omitempty"` // sender's raft id (0: no raft state yet)
	Cluster uint64 `json:"c,omitempty"` // sender's cluster id (0: none yet)
	Term    uint64 `json:"t,omitempty"` // sender's raft term

	// Leader -> node.
	Assign      *assign  `json:"a,omitempty"`
	Grant       *grant   `json:"g,omitempty"`
	Transfer    string   `json:"x,omitempty"` // the leader is handing leadership to this node
	Handoff     *handoff `json:"h,omitempty"`
	JoinRefused string   `json:"jr,omitempty"`
	Removed     uint64   `json:"rm,omitempty"` // this raft id (yours) is not in the configuration: wipe and rejoin
	Placed      *placed  `json:"pl,omitempty"`

	// Node -> leader (or any member, which forwards).
	Ack      *ack   `json:"k,omitempty"`
	Join     *join  `json:"j,omitempty"`
	Leave    string `json:"l,omitempty"`  // name of the node that leaves
	LeaveID  uint64 `json:"li,omitempty"` // its raft id: a late copy never removes a later incarnation of the name
	Forget   string `json:"fg,omitempty"`
	Handover string `json:"ho,omitempty"` // vipd handover at a follower: the holder it asks for ("*name": any but name)

	// Successor -> old holder: it bound and announced these keys of a
	// make-before-break overlap; the old holder lets go now.
	OvDone []string `json:"od,omitempty"`
}

// assign is the set of keys the leader wants a node to hold (generation
// Gen of term Term). Keys is sent only when the node has not acked Gen.
type assign struct {
	Term uint64   `json:"t"`
	Gen  uint64   `json:"g"`
	Full bool     `json:"f,omitempty"`
	Keys []string `json:"k,omitempty"`
	// Ov: planned transfers' make-before-break (transfer.go), with Full
	// only. For a key not in Keys: keep holding it at most O after
	// receipt, until Peer (the successor) confirms. For a key in Keys:
	// Peer (the old holder) may hold it for that while.
	Ov map[string]ovSpec `json:"o,omitempty"`
}

// placed tells a follower who holds the control-plane and egress addresses
// (term Term's leader's placement): information for status, egress routing
// and the l2 wire checks, never a permission to hold.
type placed struct {
	Term    uint64            `json:"t"`
	Holders map[string]string `json:"h,omitempty"`
	From    map[string]string `json:"f,omitempty"` // key -> the node that let it go for its holder (a planned move)
}

// grant lets a node hold its assigned keys until its own send time of ack
// Seq plus D nanoseconds.
type grant struct {
	Term uint64 `json:"t"`
	Seq  uint64 `json:"s"`
	Gen  uint64 `json:"g"`
	D    int64  `json:"d"`
}

// ack is a node's answer to an assign: it holds generation Gen, sent at its
// own time recorded under Seq, and reports its health and settings.
type ack struct {
	Term       uint64 `json:"t"`
	Seq        uint64 `json:"s"`
	Gen        uint64 `json:"g"`
	Healthy    bool   `json:"h,omitempty"`
	HealthyFor int64  `json:"hf,omitempty"`
	Priority   int    `json:"p,omitempty"`
	Role       Role   `json:"r,omitempty"`
	Leaving    bool   `json:"l,omitempty"`
	Boot       int64  `json:"b,omitempty"` // this process's start: Seq restarts with it
	// OvHeld: keys this node still holds in a make-before-break overlap
	// (not in its assignment any more): the leader counts them as held.
	OvHeld []string `json:"oh,omitempty"`
}

// join asks the leader to add a node as a learner.
type join struct {
	Name string `json:"n"`
	ID   uint64 `json:"i"`
	Role Role   `json:"r,omitempty"`
}

// handoff tells a transferee who holds what under the old leader's grants,
// and for how long those grants may still run (nanoseconds from the send).
type handoff struct {
	Holders map[string]string `json:"h,omitempty"`
	For     int64             `json:"d"`
}

type envelope struct {
	h    header
	msgs []*pb.Message
}

// encode frames an envelope: version byte, header length (uvarint), the
// header (headerwire.go), then for each raft message its length (uvarint)
// and protobuf bytes.
func encode(e *envelope) ([]byte, error) {
	out := make([]byte, 3, 160)
	out[0] = envelopeVersion
	// The header's length goes in front of it; most headers are shorter
	// than 128 bytes (one byte of length), longer ones are moved up.
	out = appendHeader(out, &e.h)
	hl := len(out) - 3
	var lb [binaryMaxVarint]byte
	l := binary.AppendUvarint(lb[:0], uint64(hl))
	switch {
	case len(l) < 2:
		copy(out[2:], out[3:])
		out = out[:len(out)-1]
	case len(l) > 2:
		out = append(out, l[2:]...)
		copy(out[1+len(l):], out[3:3+hl])
	}
	copy(out[1:], l)
	for _, m := range e.msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode raft message: %w", err)
		}
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out, nil
}

var errShort = errors.New("truncated envelope")

// decode parses an envelope; it never panics on any input.
func decode(b []byte) (*envelope, error) {
	if len(b) == 0 {
		return nil, errShort
	}
	if len(b) > maxEnvelope {
		return nil, fmt.Errorf("envelope of %d bytes exceeds %d", len(b), maxEnvelope)
	}
	if b[0] != envelopeVersion {
		return nil, fmt.Errorf("envelope version %d, this node speaks %d", b[0], envelopeVersion)
	}
	b = b[1:]
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errShort
		}
		p := b[k : k+int(n)]
		b = b[k+int(n):]
		return p, nil
	}
	hb, err := next()
	if err != nil {
		return nil, err
	}
	e := &envelope{}
	if err := parseHeader(hb, &e.h); err != nil {
		return nil, fmt.Errorf("decode header: %w", err)
	}
	for len(b) > 0 {
		mb, err := next()
		if err != nil {
			return nil, err
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(mb, m); err != nil {
			return nil, fmt.Errorf("decode raft message: %w", err)
		}
		e.msgs = append(e.msgs, m)
	}
	return e, nil
}

// Describe renders an envelope for traces and debugging.
func Describe(b []byte) string {
	e, err := decode(b)
	if err != nil {
		return "undecodable: " + err.Error()
	}
	hb, _ := json.Marshal(&e.h)
	s := string(hb)
	for _, m := range e.msgs {
		s += fmt.Sprintf(" %s(t%d i%d c%d n%d)", m.GetType(), m.GetTerm(), m.GetIndex(), m.GetCommit(), len(m.GetEntries()))
	}
	return s
}
