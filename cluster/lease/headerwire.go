package lease

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The envelope header on the wire (envelope version 2): protobuf's wire
// format, written and read field by field with protowire. Every field is
// optional; a zero value, an empty list and an empty map are left out, a
// nested message is written whenever its pointer is set (even when empty),
// and a reader skips the fields it does not know, so a later version can
// add fields that this one ignores. Signed integers are zigzag varints.
//
// The numbers below are the contract; never reuse one.

// header
const (
	hFrom        protowire.Number = 1
	hID          protowire.Number = 2
	hCluster     protowire.Number = 3
	hTerm        protowire.Number = 4
	hAssign      protowire.Number = 5
	hGrant       protowire.Number = 6
	hTransfer    protowire.Number = 7
	hHandoff     protowire.Number = 8
	hJoinRefused protowire.Number = 9
	hRemoved     protowire.Number = 10
	hPlaced      protowire.Number = 11
	hAck         protowire.Number = 12
	hJoin        protowire.Number = 13
	hLeave       protowire.Number = 14
	hLeaveID     protowire.Number = 15
	hForget      protowire.Number = 16
	hHandover    protowire.Number = 17
	hOvDone      protowire.Number = 18
)

// assign, placed, grant, ack, join, handoff, and a map entry
const (
	aTerm, aGen, aFull, aKeys, aOv                                              protowire.Number = 1, 2, 3, 4, 5
	pTerm, pHolders, pFrom                                                      protowire.Number = 1, 2, 3
	gTerm, gSeq, gGen, gD                                                       protowire.Number = 1, 2, 3, 4
	kTerm, kSeq, kGen, kHealthy, kHealthyFor, kPriority, kRole, kLeaving, kBoot protowire.Number = 1, 2, 3, 4, 5, 6, 7, 8, 9
	kOvHeld                                                                     protowire.Number = 10
	jName, jID, jRole                                                           protowire.Number = 1, 2, 3
	hoHolders, hoFor                                                            protowire.Number = 1, 2
	eKey, eValue, eOvPeer, eOvO                                                 protowire.Number = 1, 2, 2, 3
)

func putU(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func putI(b []byte, n protowire.Number, v int64) []byte {
	return putU(b, n, protowire.EncodeZigZag(v))
}

func putB(b []byte, n protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return putU(b, n, 1)
}

func putS(b []byte, n protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// putM writes a nested message: a length, then what body appends.
func putM(b []byte, n protowire.Number, body func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	at := len(b)
	b = body(b)
	// The length goes in front of the body: move it up by the
	// varint's size (the bodies are small, one copy is cheap).
	size := len(b) - at
	var lb [binaryMaxVarint]byte
	l := protowire.AppendVarint(lb[:0], uint64(size))
	b = append(b, l...)
	copy(b[at+len(l):], b[at:at+size])
	copy(b[at:], l)
	return b
}

const binaryMaxVarint = 10

func putMap(b []byte, n protowire.Number, m map[string]string) []byte {
	for _, k := range sortedKeys(m) {
		b = putM(b, n, func(b []byte) []byte {
			b = putS(b, eKey, k)
			return putS(b, eValue, m[k])
		})
	}
	return b
}

func appendHeader(b []byte, h *header) []byte {
	b = putS(b, hFrom, h.From)
	b = putU(b, hID, h.ID)
	b = putU(b, hCluster, h.Cluster)
	b = putU(b, hTerm, h.Term)
	if a := h.Assign; a != nil {
		b = putM(b, hAssign, func(b []byte) []byte {
			b = putU(b, aTerm, a.Term)
			b = putU(b, aGen, a.Gen)
			b = putB(b, aFull, a.Full)
			for _, k := range a.Keys {
				b = protowire.AppendTag(b, aKeys, protowire.BytesType)
				b = protowire.AppendString(b, k)
			}
			for _, k := range sortedKeys(a.Ov) {
				o := a.Ov[k]
				b = putM(b, aOv, func(b []byte) []byte {
					b = putS(b, eKey, k)
					b = putS(b, eOvPeer, o.Peer)
					return putI(b, eOvO, o.O)
				})
			}
			return b
		})
	}
	if g := h.Grant; g != nil {
		b = putM(b, hGrant, func(b []byte) []byte {
			b = putU(b, gTerm, g.Term)
			b = putU(b, gSeq, g.Seq)
			b = putU(b, gGen, g.Gen)
			return putI(b, gD, g.D)
		})
	}
	b = putS(b, hTransfer, h.Transfer)
	if ho := h.Handoff; ho != nil {
		b = putM(b, hHandoff, func(b []byte) []byte {
			b = putMap(b, hoHolders, ho.Holders)
			return putI(b, hoFor, ho.For)
		})
	}
	b = putS(b, hJoinRefused, h.JoinRefused)
	b = putU(b, hRemoved, h.Removed)
	if p := h.Placed; p != nil {
		b = putM(b, hPlaced, func(b []byte) []byte {
			b = putU(b, pTerm, p.Term)
			b = putMap(b, pHolders, p.Holders)
			return putMap(b, pFrom, p.From)
		})
	}
	if k := h.Ack; k != nil {
		b = putM(b, hAck, func(b []byte) []byte {
			b = putU(b, kTerm, k.Term)
			b = putU(b, kSeq, k.Seq)
			b = putU(b, kGen, k.Gen)
			b = putB(b, kHealthy, k.Healthy)
			b = putI(b, kHealthyFor, k.HealthyFor)
			b = putI(b, kPriority, int64(k.Priority))
			b = putI(b, kRole, int64(k.Role))
			b = putB(b, kLeaving, k.Leaving)
			b = putI(b, kBoot, k.Boot)
			for _, s := range k.OvHeld {
				b = protowire.AppendTag(b, kOvHeld, protowire.BytesType)
				b = protowire.AppendString(b, s)
			}
			return b
		})
	}
	if j := h.Join; j != nil {
		b = putM(b, hJoin, func(b []byte) []byte {
			b = putS(b, jName, j.Name)
			b = putU(b, jID, j.ID)
			return putI(b, jRole, int64(j.Role))
		})
	}
	b = putS(b, hLeave, h.Leave)
	b = putU(b, hLeaveID, h.LeaveID)
	b = putS(b, hForget, h.Forget)
	b = putS(b, hHandover, h.Handover)
	for _, s := range h.OvDone {
		b = protowire.AppendTag(b, hOvDone, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

var errHeaderField = errors.New("malformed header field")

// fields calls f for each field of a message body. f gets the field's
// number, its wire type, and its value: v for a varint, s for a
// length-delimited field (aliasing b). Fields of other wire types are
// skipped; f's error or a malformed field ends the walk.
func fields(b []byte, f func(n protowire.Number, t protowire.Type, v uint64, s []byte) error) error {
	for len(b) > 0 {
		n, t, k := protowire.ConsumeTag(b)
		if k < 0 {
			return errHeaderField
		}
		b = b[k:]
		var v uint64
		var s []byte
		switch t {
		case protowire.VarintType:
			v, k = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			s, k = protowire.ConsumeBytes(b)
		default:
			k = protowire.ConsumeFieldValue(n, t, b)
		}
		if k < 0 {
			return errHeaderField
		}
		b = b[k:]
		if t != protowire.VarintType && t != protowire.BytesType {
			continue
		}
		if err := f(n, t, v, s); err != nil {
			return err
		}
	}
	return nil
}

// want checks a known field's wire type.
func want(n protowire.Number, t, w protowire.Type) error {
	if t != w {
		return fmt.Errorf("header field %d: wire type %d, want %d", n, t, w)
	}
	return nil
}

func varintField(n protowire.Number, t protowire.Type, v uint64, dst *uint64) error {
	if err := want(n, t, protowire.VarintType); err != nil {
		return err
	}
	*dst = v
	return nil
}

func zigzagField(n protowire.Number, t protowire.Type, v uint64, dst *int64) error {
	if err := want(n, t, protowire.VarintType); err != nil {
		return err
	}
	*dst = protowire.DecodeZigZag(v)
	return nil
}

func boolField(n protowire.Number, t protowire.Type, v uint64, dst *bool) error {
	if err := want(n, t, protowire.VarintType); err != nil {
		return err
	}
	*dst = v != 0
	return nil
}

func stringField(n protowire.Number, t protowire.Type, s []byte, dst *string) error {
	if err := want(n, t, protowire.BytesType); err != nil {
		return err
	}
	*dst = string(s)
	return nil
}

// entry decodes a map entry (key, value; for overlaps also the O field).
func entry(s []byte) (key, value string, o int64, err error) {
	err = fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
		switch n {
		case eKey:
			return stringField(n, t, s, &key)
		case eValue:
			return stringField(n, t, s, &value)
		case eOvO:
			return zigzagField(n, t, v, &o)
		}
		return nil
	})
	return key, value, o, err
}

func mapField(n protowire.Number, t protowire.Type, s []byte, dst *map[string]string) error {
	if err := want(n, t, protowire.BytesType); err != nil {
		return err
	}
	k, v, _, err := entry(s)
	if err != nil {
		return err
	}
	if *dst == nil {
		*dst = map[string]string{}
	}
	(*dst)[k] = v
	return nil
}

func parseHeader(b []byte, h *header) error {
	return fields(b, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
		switch n {
		case hFrom:
			return stringField(n, t, s, &h.From)
		case hID:
			return varintField(n, t, v, &h.ID)
		case hCluster:
			return varintField(n, t, v, &h.Cluster)
		case hTerm:
			return varintField(n, t, v, &h.Term)
		case hAssign:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			a := &assign{}
			h.Assign = a
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
				switch n {
				case aTerm:
					return varintField(n, t, v, &a.Term)
				case aGen:
					return varintField(n, t, v, &a.Gen)
				case aFull:
					return boolField(n, t, v, &a.Full)
				case aKeys:
					var k string
					err := stringField(n, t, s, &k)
					a.Keys = append(a.Keys, k)
					return err
				case aOv:
					if err := want(n, t, protowire.BytesType); err != nil {
						return err
					}
					k, peer, o, err := entry(s)
					if a.Ov == nil {
						a.Ov = map[string]ovSpec{}
					}
					a.Ov[k] = ovSpec{Peer: peer, O: o}
					return err
				}
				return nil
			})
		case hGrant:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			g := &grant{}
			h.Grant = g
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, _ []byte) error {
				switch n {
				case gTerm:
					return varintField(n, t, v, &g.Term)
				case gSeq:
					return varintField(n, t, v, &g.Seq)
				case gGen:
					return varintField(n, t, v, &g.Gen)
				case gD:
					return zigzagField(n, t, v, &g.D)
				}
				return nil
			})
		case hTransfer:
			return stringField(n, t, s, &h.Transfer)
		case hHandoff:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			ho := &handoff{}
			h.Handoff = ho
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
				switch n {
				case hoHolders:
					return mapField(n, t, s, &ho.Holders)
				case hoFor:
					return zigzagField(n, t, v, &ho.For)
				}
				return nil
			})
		case hJoinRefused:
			return stringField(n, t, s, &h.JoinRefused)
		case hRemoved:
			return varintField(n, t, v, &h.Removed)
		case hPlaced:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			p := &placed{}
			h.Placed = p
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
				switch n {
				case pTerm:
					return varintField(n, t, v, &p.Term)
				case pHolders:
					return mapField(n, t, s, &p.Holders)
				case pFrom:
					return mapField(n, t, s, &p.From)
				}
				return nil
			})
		case hAck:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			k := &ack{}
			h.Ack = k
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
				var i int64
				switch n {
				case kTerm:
					return varintField(n, t, v, &k.Term)
				case kSeq:
					return varintField(n, t, v, &k.Seq)
				case kGen:
					return varintField(n, t, v, &k.Gen)
				case kHealthy:
					return boolField(n, t, v, &k.Healthy)
				case kHealthyFor:
					return zigzagField(n, t, v, &k.HealthyFor)
				case kPriority:
					err := zigzagField(n, t, v, &i)
					k.Priority = int(i)
					return err
				case kRole:
					err := zigzagField(n, t, v, &i)
					k.Role = Role(i)
					return err
				case kLeaving:
					return boolField(n, t, v, &k.Leaving)
				case kBoot:
					return zigzagField(n, t, v, &k.Boot)
				case kOvHeld:
					var o string
					err := stringField(n, t, s, &o)
					k.OvHeld = append(k.OvHeld, o)
					return err
				}
				return nil
			})
		case hJoin:
			if err := want(n, t, protowire.BytesType); err != nil {
				return err
			}
			j := &join{}
			h.Join = j
			return fields(s, func(n protowire.Number, t protowire.Type, v uint64, s []byte) error {
				var i int64
				switch n {
				case jName:
					return stringField(n, t, s, &j.Name)
				case jID:
					return varintField(n, t, v, &j.ID)
				case jRole:
					err := zigzagField(n, t, v, &i)
					j.Role = Role(i)
					return err
				}
				return nil
			})
		case hLeave:
			return stringField(n, t, s, &h.Leave)
		case hLeaveID:
			return varintField(n, t, v, &h.LeaveID)
		case hForget:
			return stringField(n, t, s, &h.Forget)
		case hHandover:
			return stringField(n, t, s, &h.Handover)
		case hOvDone:
			var o string
			err := stringField(n, t, s, &o)
			h.OvDone = append(h.OvDone, o)
			return err
		}
		return nil
	})
}
