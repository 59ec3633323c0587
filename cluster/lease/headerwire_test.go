package lease

import (
	"reflect"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// fullHeader sets every field of the header and of every message it
// carries, negative values where a field is signed.
func fullHeader() header {
	return header{
		From: "n1", ID: 1 << 40, Cluster: 7, Term: 3,
		Assign: &assign{Term: 3, Gen: 9, Full: true, Keys: []string{"10.0.0.1/32", "", "p/10.0.1.5"},
			Ov: map[string]ovSpec{"10.0.0.1/32": {Peer: "n2", O: 300e6}, "k": {Peer: "n3", O: -1}}},
		Grant:       &grant{Term: 3, Seq: 1 << 33, Gen: 9, D: -5},
		Transfer:    "n2",
		Handoff:     &handoff{Holders: map[string]string{"a": "n1", "b": ""}, For: 685e6},
		JoinRefused: "duplicate name",
		Removed:     12,
		Placed:      &placed{Term: 3, Holders: map[string]string{"a": "n1"}, From: map[string]string{"a": "n2"}},
		Ack: &ack{Term: 3, Seq: 44, Gen: 9, Healthy: true, HealthyFor: 5e9, Priority: -2, Role: Witness,
			Leaving: true, Boot: -1 << 62, OvHeld: []string{"a", "b"}},
		Join:     &join{Name: "n4", ID: 99, Role: Witness},
		Leave:    "n5",
		LeaveID:  5,
		Forget:   "n6",
		Handover: "*n1",
		OvDone:   []string{"c", ""},
	}
}

// zeroFields lists the fields of v (a struct, pointers followed) that hold
// their zero value or an empty list or map.
func zeroFields(v reflect.Value, path string) []string {
	var out []string
	for i := 0; i < v.NumField(); i++ {
		f, p := v.Field(i), path+"."+v.Type().Field(i).Name
		switch {
		case f.Kind() == reflect.Pointer && !f.IsNil():
			out = append(out, zeroFields(f.Elem(), p)...)
		case (f.Kind() == reflect.Map || f.Kind() == reflect.Slice) && f.Len() == 0, f.IsZero():
			out = append(out, p)
		case f.Kind() == reflect.Map && f.Type().Elem().Kind() == reflect.Struct:
			for _, k := range f.MapKeys() {
				out = append(out, zeroFields(f.MapIndex(k), p+"["+k.String()+"]")...)
			}
		}
	}
	return out
}

// TestHeaderWireEveryField: every field of the header and of the messages
// it carries survives the wire (a field added to the structs without a
// number in headerwire.go fails here first), and the encoding is the
// same bytes every time (maps in key order).
func TestHeaderWireEveryField(t *testing.T) {
	h := fullHeader()
	if z := zeroFields(reflect.ValueOf(h), "header"); len(z) > 0 {
		t.Fatalf("fullHeader leaves fields unset (set them, and give new ones a number): %v", z)
	}
	e := &envelope{h: h, msgs: []*pb.Message{{Type: pb.MsgHeartbeat.Enum(), To: new(uint64(2)), Context: []byte("3/44")}}}
	b, err := encode(e)
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.h, h) {
		t.Fatalf("header changed on the wire:\n got %+v\nwant %+v", d.h, h)
	}
	if len(d.msgs) != 1 || string(d.msgs[0].GetContext()) != "3/44" || d.msgs[0].GetTo() != 2 {
		t.Fatalf("raft message changed on the wire: %v", d.msgs)
	}
	for range 20 {
		if b2, _ := encode(e); string(b2) != string(b) {
			t.Fatal("two encodings of one header differ")
		}
	}
}

// TestHeaderWirePresence: a message that is set but empty stays set, one
// that is nil stays nil, and empty strings, lists and maps cost nothing.
func TestHeaderWirePresence(t *testing.T) {
	for _, h := range []header{
		{},
		{From: "a"},
		{From: "a", Ack: &ack{}},
		{From: "a", Assign: &assign{}, Grant: &grant{}, Handoff: &handoff{}, Placed: &placed{}, Join: &join{}},
		{From: "a", Assign: &assign{Keys: []string{""}}, OvDone: []string{""}},
	} {
		b, err := encode(&envelope{h: h})
		if err != nil {
			t.Fatal(err)
		}
		d, err := decode(b)
		if err != nil {
			t.Fatalf("%+v: %v", h, err)
		}
		if !reflect.DeepEqual(d.h, h) {
			t.Errorf("got %+v, want %+v", d.h, h)
		}
	}
	b, _ := encode(&envelope{h: header{From: "a", Ack: &ack{}}})
	// version, length, From (tag, length, "a"), Ack (tag, length 0)
	if len(b) != 1+1+3+2 {
		t.Errorf("an empty ack costs %d bytes: % x", len(b), b)
	}
}

// TestHeaderWireLongHeaders: a header longer than a one-byte length
// (127 bytes) and than a two-byte one (16,383) keeps its raft messages
// after it.
func TestHeaderWireLongHeaders(t *testing.T) {
	for _, n := range []int{0, 1, 20, 1000, 5000} {
		h := header{From: "leader", Assign: &assign{Term: 1, Gen: 2, Full: true}}
		for i := range n {
			h.Assign.Keys = append(h.Assign.Keys, "10.0."+strings.Repeat("9", i%7)+"/32")
		}
		e := &envelope{h: h, msgs: []*pb.Message{{Type: pb.MsgApp.Enum(), Index: new(uint64(77))}, {Type: pb.MsgHeartbeat.Enum()}}}
		b, err := encode(e)
		if err != nil {
			t.Fatal(err)
		}
		d, err := decode(b)
		if err != nil {
			t.Fatalf("%d keys: %v", n, err)
		}
		if !reflect.DeepEqual(d.h, h) || len(d.msgs) != 2 || d.msgs[0].GetIndex() != 77 || d.msgs[1].GetType() != pb.MsgHeartbeat {
			t.Fatalf("%d keys: header or messages changed (%d messages)", n, len(d.msgs))
		}
	}
}

// TestHeaderWireForward: fields this version does not know (a later
// version's) are skipped, in the header and in the messages it carries;
// a known field of the wrong wire type, a truncated field and a group are
// refused.
func TestHeaderWireForward(t *testing.T) {
	var hb []byte
	hb = protowire.AppendTag(hb, 99, protowire.VarintType)
	hb = protowire.AppendVarint(hb, 5)
	hb = protowire.AppendTag(hb, hFrom, protowire.BytesType)
	hb = protowire.AppendString(hb, "a")
	hb = protowire.AppendTag(hb, 100, protowire.Fixed64Type)
	hb = protowire.AppendFixed64(hb, 1)
	var ab []byte
	ab = protowire.AppendTag(ab, kSeq, protowire.VarintType)
	ab = protowire.AppendVarint(ab, 7)
	ab = protowire.AppendTag(ab, 50, protowire.BytesType)
	ab = protowire.AppendString(ab, "later")
	hb = protowire.AppendTag(hb, hAck, protowire.BytesType)
	hb = protowire.AppendBytes(hb, ab)
	var h header
	if err := parseHeader(hb, &h); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, header{From: "a", Ack: &ack{Seq: 7}}) {
		t.Fatalf("got %+v", h)
	}
	for name, bad := range map[string][]byte{
		"string as varint": protowire.AppendVarint(protowire.AppendTag(nil, hFrom, protowire.VarintType), 1),
		"varint as bytes":  protowire.AppendString(protowire.AppendTag(nil, hTerm, protowire.BytesType), "x"),
		"truncated":        protowire.AppendTag(nil, hFrom, protowire.BytesType),
		"long length":      append(protowire.AppendTag(nil, hFrom, protowire.BytesType), 9, 'a'),
		"group":            protowire.AppendTag(nil, 3, protowire.StartGroupType),
		"bad ack inside":   protowire.AppendBytes(protowire.AppendTag(nil, hAck, protowire.BytesType), []byte{0x08}),
	} {
		if err := parseHeader(bad, &header{}); err == nil {
			t.Errorf("%s: accepted % x", name, bad)
		}
	}
}

// TestEnvelopeVersionOne: a version 1 envelope (JSON header, never
// released) is refused naming both versions.
func TestEnvelopeVersionOne(t *testing.T) {
	_, err := decode(append([]byte{1, 9}, `{"f":"a"}`...))
	if err == nil || !strings.Contains(err.Error(), "version 1, this node speaks 2") {
		t.Fatalf("decode of a version 1 envelope: %v", err)
	}
}

// TestEnvelopeGarbage: encoding an ack envelope, the one a voter sends at
// every renewal, and decoding it stay within a small allocation budget
// (with the JSON header of version 1: 4 and 16, and 128 bytes
// instead of 60).
func TestEnvelopeGarbage(t *testing.T) {
	e := &envelope{h: header{From: "node-2", ID: 2, Cluster: 77, Term: 4,
		Ack: &ack{Term: 4, Seq: 1234, Gen: 3, Healthy: true, HealthyFor: 5e9, Boot: 1764000000000000000}},
		msgs: []*pb.Message{{Type: pb.MsgHeartbeatResp.Enum(), To: new(uint64(1)), From: new(uint64(2)), Term: new(uint64(4)), Context: []byte("4/1234")}}}
	b, _ := encode(e)
	enc := testing.AllocsPerRun(100, func() { _, _ = encode(e) })
	dec := testing.AllocsPerRun(100, func() { _, _ = decode(b) })
	t.Logf("ack envelope of %d bytes: %.0f allocations to encode, %.0f to decode", len(b), enc, dec)
	if enc > 2 || dec > 10 || len(b) > 64 {
		t.Errorf("%.0f allocations to encode (want <= 2), %.0f to decode (want <= 10), %d bytes (want <= 64)", enc, dec, len(b))
	}
}
