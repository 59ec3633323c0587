package cluster

import (
	"errors"
	"fmt"
)

// leaseTag starts every lease election message on the wire (a memberlist
// user message), so other payloads (handover messages 'H', heartbeats)
// are never mistaken for one.
const leaseTag = 'L'

// leaseWireVersion is the envelope's version byte.
const leaseWireVersion = 1

// maxLeaseMessage bounds a received message: the machine's messages are
// a few hundred bytes (appends carry a configuration at most), and
// memberlist's reliable path allows far more than anybody should send.
const maxLeaseMessage = 1 << 20

// maxNameLen bounds a node name on the wire (VIPD_NODE_NAME is checked
// at start; memberlist itself limits names to far less).
const maxNameLen = 253

// encodeLease wraps a machine's message from this node for the wire:
// tag, version, the sender's name (memberlist does not tell the receiver
// who sent a user message; the gossip key authenticates the packet, so the
// name is as trustworthy as the key), and the machine's bytes.
func encodeLease(from string, data []byte) ([]byte, error) {
	if from == "" || len(from) > maxNameLen {
		return nil, fmt.Errorf("node name of %d bytes: want 1-%d", len(from), maxNameLen)
	}
	b := make([]byte, 0, 3+len(from)+len(data))
	b = append(b, leaseTag, leaseWireVersion, byte(len(from)))
	b = append(b, from...)
	return append(b, data...), nil
}

var errNotLease = errors.New("not a lease election message")

// decodeLease unwraps a lease message. It never panics on any input and
// never returns a slice aliasing msg (memberlist reuses its buffers).
func decodeLease(msg []byte) (from string, data []byte, err error) {
	if len(msg) < 1 || msg[0] != leaseTag {
		return "", nil, errNotLease
	}
	if len(msg) > maxLeaseMessage {
		return "", nil, fmt.Errorf("lease message of %d bytes exceeds %d", len(msg), maxLeaseMessage)
	}
	if len(msg) < 3 {
		return "", nil, errors.New("lease message too short")
	}
	if msg[1] != leaseWireVersion {
		return "", nil, fmt.Errorf("lease message version %d (this vipd speaks %d)", msg[1], leaseWireVersion)
	}
	n := int(msg[2])
	if n == 0 || len(msg) < 3+n {
		return "", nil, errors.New("lease message with a bad sender name")
	}
	from = string(msg[3 : 3+n])
	data = append([]byte(nil), msg[3+n:]...)
	return from, data, nil
}
