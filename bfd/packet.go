package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the only BFD protocol version this package speaks (RFC 5880).
const Version = 1

// ControlPacketLen is the length of the mandatory section of a BFD Control
// packet, the only length this package sends.
const ControlPacketLen = 24

// minAuthLen is the smallest Length a packet with the A bit may carry: the
// mandatory section plus the two-byte authentication header.
const minAuthLen = ControlPacketLen + 2

// State is a BFD session state (RFC 5880 section 4.1).
type State uint8

// Session states, in wire encoding.
const (
	StateAdminDown State = 0
	StateDown      State = 1
	StateInit      State = 2
	StateUp        State = 3
)

// String returns the state in lower case ("admin-down", "down", "init", "up").
func (s State) String() string {
	switch s {
	case StateAdminDown:
		return "admin-down"
	case StateDown:
		return "down"
	case StateInit:
		return "init"
	case StateUp:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// MarshalText makes State render as its name in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Diag is a BFD diagnostic code (RFC 5880 section 4.1).
type Diag uint8

// Diagnostic codes.
const (
	DiagNone                  Diag = 0 // No Diagnostic
	DiagControlDetectExpired  Diag = 1 // Control Detection Time Expired
	DiagEchoFailed            Diag = 2 // Echo Function Failed
	DiagNeighborDown          Diag = 3 // Neighbor Signaled Session Down
	DiagForwardingPlaneReset  Diag = 4 // Forwarding Plane Reset
	DiagPathDown              Diag = 5 // Path Down
	DiagConcatenatedPathDown  Diag = 6 // Concatenated Path Down
	DiagAdminDown             Diag = 7 // Administratively Down
	DiagReverseConcatPathDown Diag = 8 // Reverse Concatenated Path Down
)

var diagNames = [...]string{
	"none", "control-detection-time-expired", "echo-function-failed",
	"neighbor-signaled-down", "forwarding-plane-reset", "path-down",
	"concatenated-path-down", "administratively-down", "reverse-concatenated-path-down",
}

// String returns a short lower-case name for the code.
func (d Diag) String() string {
	if int(d) < len(diagNames) {
		return diagNames[d]
	}
	return fmt.Sprintf("diag(%d)", uint8(d))
}

// MarshalText makes Diag render as its name in JSON.
func (d Diag) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// ControlPacket is the mandatory section of a BFD Control packet (RFC 5880
// section 4.1). Intervals are in microseconds, as on the wire. The
// Authentication section is not supported: Unmarshal rejects packets with
// the A bit set and Marshal never sets it.
type ControlPacket struct {
	Diag  Diag
	State State

	Poll                    bool // P
	Final                   bool // F
	ControlPlaneIndependent bool // C
	Demand                  bool // D

	DetectMult        uint8
	MyDiscriminator   uint32
	YourDiscriminator uint32

	DesiredMinTxInterval      uint32 // µs
	RequiredMinRxInterval     uint32 // µs
	RequiredMinEchoRxInterval uint32 // µs
}

// Errors returned by UnmarshalBinary. Each describes one receive check of
// RFC 5880 section 6.8.6 that belongs to parsing; test with errors.Is.
var (
	ErrTooShort          = errors.New("bfd: packet shorter than 24 bytes")
	ErrVersion           = errors.New("bfd: unsupported version (want 1)")
	ErrLength            = errors.New("bfd: bad length field")
	ErrDetectMultZero    = errors.New("bfd: detect multiplier is zero")
	ErrMultipoint        = errors.New("bfd: multipoint (M) bit set")
	ErrMyDiscZero        = errors.New("bfd: my discriminator is zero")
	ErrYourDiscZero      = errors.New("bfd: your discriminator is zero in state other than down/admin-down")
	ErrAuthNotSupported  = errors.New("bfd: authentication (A bit) is not supported by this implementation")
	ErrInvalidFieldValue = errors.New("bfd: field value out of range")
)

// Flag bits in byte 1.
const (
	bitPoll   = 0x20
	bitFinal  = 0x10
	bitCPI    = 0x08
	bitAuth   = 0x04
	bitDemand = 0x02
	bitMulti  = 0x01
)

// AppendBinary appends the 24-byte wire form of p to b. It fails only when
// Diag or State does not fit its field.
func (p *ControlPacket) AppendBinary(b []byte) ([]byte, error) {
	if p.Diag > 31 {
		return b, fmt.Errorf("%w: diag %d does not fit 5 bits", ErrInvalidFieldValue, p.Diag)
	}
	if p.State > StateUp {
		return b, fmt.Errorf("%w: state %d does not fit 2 bits", ErrInvalidFieldValue, p.State)
	}
	flags := byte(p.State) << 6
	if p.Poll {
		flags |= bitPoll
	}
	if p.Final {
		flags |= bitFinal
	}
	if p.ControlPlaneIndependent {
		flags |= bitCPI
	}
	if p.Demand {
		flags |= bitDemand
	}
	b = append(b, Version<<5|byte(p.Diag), flags, p.DetectMult, ControlPacketLen)
	b = binary.BigEndian.AppendUint32(b, p.MyDiscriminator)
	b = binary.BigEndian.AppendUint32(b, p.YourDiscriminator)
	b = binary.BigEndian.AppendUint32(b, p.DesiredMinTxInterval)
	b = binary.BigEndian.AppendUint32(b, p.RequiredMinRxInterval)
	b = binary.BigEndian.AppendUint32(b, p.RequiredMinEchoRxInterval)
	return b, nil
}

// MarshalBinary returns the 24-byte wire form of p.
func (p *ControlPacket) MarshalBinary() ([]byte, error) {
	return p.AppendBinary(make([]byte, 0, ControlPacketLen))
}

// UnmarshalBinary parses a received BFD Control packet (the UDP payload)
// and applies the receive checks of RFC 5880 section 6.8.6 that need no
// session: version 1, Length >= 24 and <= len(b), detect multiplier not
// zero, M bit clear, My Discriminator not zero, Your Discriminator zero only
// in Down or AdminDown. A packet with the A bit set is rejected with
// ErrAuthNotSupported (after the length checks that apply to it). Bytes
// after the mandatory 24 are ignored. On error p is left unchanged.
func (p *ControlPacket) UnmarshalBinary(b []byte) error {
	if len(b) < ControlPacketLen {
		return ErrTooShort
	}
	if v := b[0] >> 5; v != Version {
		return ErrVersion
	}
	flags := b[1]
	length := int(b[3])
	minLen := ControlPacketLen
	if flags&bitAuth != 0 {
		minLen = minAuthLen
	}
	if length < minLen || length > len(b) {
		return ErrLength
	}
	if flags&bitAuth != 0 {
		return ErrAuthNotSupported
	}
	if b[2] == 0 {
		return ErrDetectMultZero
	}
	if flags&bitMulti != 0 {
		return ErrMultipoint
	}
	my := binary.BigEndian.Uint32(b[4:8])
	if my == 0 {
		return ErrMyDiscZero
	}
	your := binary.BigEndian.Uint32(b[8:12])
	state := State(flags >> 6)
	if your == 0 && state != StateDown && state != StateAdminDown {
		return ErrYourDiscZero
	}
	*p = ControlPacket{
		Diag:                      Diag(b[0] & 0x1f),
		State:                     state,
		Poll:                      flags&bitPoll != 0,
		Final:                     flags&bitFinal != 0,
		ControlPlaneIndependent:   flags&bitCPI != 0,
		Demand:                    flags&bitDemand != 0,
		DetectMult:                b[2],
		MyDiscriminator:           my,
		YourDiscriminator:         your,
		DesiredMinTxInterval:      binary.BigEndian.Uint32(b[12:16]),
		RequiredMinRxInterval:     binary.BigEndian.Uint32(b[16:20]),
		RequiredMinEchoRxInterval: binary.BigEndian.Uint32(b[20:24]),
	}
	return nil
}
