package bfd

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Golden packets, written by hand from the RFC 5880 section 4.1 layout.
var goldenPackets = []struct {
	name string
	hex  string
	pkt  ControlPacket
}{
	{
		// What an active system sends first: Down, YourDisc 0, 1 s slow TX.
		name: "down-initial",
		hex:  "20 40 03 18  00000001 00000000  000f4240 000493e0 00000000",
		pkt: ControlPacket{State: StateDown, DetectMult: 3, MyDiscriminator: 1,
			DesiredMinTxInterval: 1000000, RequiredMinRxInterval: 300000},
	},
	{
		name: "up-poll",
		hex:  "20 e0 03 18  deadbeef 01020304  000186a0 000186a0 0000c350",
		pkt: ControlPacket{State: StateUp, Poll: true, DetectMult: 3,
			MyDiscriminator: 0xdeadbeef, YourDiscriminator: 0x01020304,
			DesiredMinTxInterval: 100000, RequiredMinRxInterval: 100000, RequiredMinEchoRxInterval: 50000},
	},
	{
		name: "up-final-cpi-demand",
		hex:  "20 da 05 18  00000002 00000003  0003d090 0003d090 00000000",
		pkt: ControlPacket{State: StateUp, Final: true, ControlPlaneIndependent: true, Demand: true, DetectMult: 5,
			MyDiscriminator: 2, YourDiscriminator: 3,
			DesiredMinTxInterval: 250000, RequiredMinRxInterval: 250000},
	},
	{
		// Shutdown: AdminDown with diag 7 (administratively down).
		name: "admin-down-diag7",
		hex:  "27 00 03 18  00000009 0000000a  000f4240 000493e0 00000000",
		pkt: ControlPacket{Diag: DiagAdminDown, State: StateAdminDown, DetectMult: 3,
			MyDiscriminator: 9, YourDiscriminator: 10,
			DesiredMinTxInterval: 1000000, RequiredMinRxInterval: 300000},
	},
	{
		name: "init-diag3",
		hex:  "23 80 01 18  ffffffff 00000001  00000001 00000000 00000000",
		pkt: ControlPacket{Diag: DiagNeighborDown, State: StateInit, DetectMult: 1,
			MyDiscriminator: 0xffffffff, YourDiscriminator: 1, DesiredMinTxInterval: 1},
	},
}

func TestMarshalGolden(t *testing.T) {
	for _, tc := range goldenPackets {
		t.Run(tc.name, func(t *testing.T) {
			want := mustHex(t, tc.hex)
			got, err := tc.pkt.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("marshal:\n got %x\nwant %x", got, want)
			}
			var p ControlPacket
			if err := p.UnmarshalBinary(want); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if p != tc.pkt {
				t.Fatalf("unmarshal:\n got %+v\nwant %+v", p, tc.pkt)
			}
		})
	}
}

func TestAppendBinaryAppends(t *testing.T) {
	p := goldenPackets[0].pkt
	b, err := p.AppendBinary([]byte{0xaa})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 25 || b[0] != 0xaa || !bytes.Equal(b[1:], mustHex(t, goldenPackets[0].hex)) {
		t.Fatalf("got %x", b)
	}
}

func TestMarshalRejectsOutOfRange(t *testing.T) {
	for _, p := range []ControlPacket{{Diag: 32, DetectMult: 1}, {State: 4, DetectMult: 1}} {
		if _, err := p.MarshalBinary(); !errors.Is(err, ErrInvalidFieldValue) {
			t.Errorf("%+v: err = %v, want ErrInvalidFieldValue", p, err)
		}
	}
}

func TestUnmarshalChecks(t *testing.T) {
	base := mustHex(t, "20 c0 03 18  00000001 00000002  000493e0 000493e0 00000000") // Up
	mod := func(f func(b []byte) []byte) []byte {
		b := append([]byte(nil), base...)
		return f(b)
	}
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"ok", base, nil},
		{"trailing bytes ignored", mod(func(b []byte) []byte { b[3] = 28; return append(b, 1, 2, 3, 4) }), nil},
		{"empty", nil, ErrTooShort},
		{"23 bytes", base[:23], ErrTooShort},
		{"version 0", mod(func(b []byte) []byte { b[0] = 0x00; return b }), ErrVersion},
		{"version 2", mod(func(b []byte) []byte { b[0] = 0x40; return b }), ErrVersion},
		{"length 23", mod(func(b []byte) []byte { b[3] = 23; return b }), ErrLength},
		{"length > payload", mod(func(b []byte) []byte { b[3] = 25; return b }), ErrLength},
		{"auth with length 24", mod(func(b []byte) []byte { b[1] |= bitAuth; return b }), ErrLength},
		{"auth", mod(func(b []byte) []byte { b[1] |= bitAuth; b[3] = 26; return append(b, 1, 2) }), ErrAuthNotSupported},
		{"detect mult 0", mod(func(b []byte) []byte { b[2] = 0; return b }), ErrDetectMultZero},
		{"multipoint", mod(func(b []byte) []byte { b[1] |= bitMulti; return b }), ErrMultipoint},
		{"my disc 0", mod(func(b []byte) []byte { copy(b[4:8], []byte{0, 0, 0, 0}); return b }), ErrMyDiscZero},
		{"your disc 0 in up", mod(func(b []byte) []byte { copy(b[8:12], []byte{0, 0, 0, 0}); return b }), ErrYourDiscZero},
		{"your disc 0 in init", mod(func(b []byte) []byte { b[1] = 0x80; copy(b[8:12], []byte{0, 0, 0, 0}); return b }), ErrYourDiscZero},
		{"your disc 0 in down", mod(func(b []byte) []byte { b[1] = 0x40; copy(b[8:12], []byte{0, 0, 0, 0}); return b }), nil},
		{"your disc 0 in admin-down", mod(func(b []byte) []byte { b[1] = 0x00; copy(b[8:12], []byte{0, 0, 0, 0}); return b }), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := ControlPacket{DetectMult: 99}
			before := p
			err := p.UnmarshalBinary(tc.b)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err != nil && p != before {
				t.Fatalf("packet modified on error: %+v", p)
			}
		})
	}
}

func TestAuthErrorIsClear(t *testing.T) {
	if !strings.Contains(ErrAuthNotSupported.Error(), "authentication") {
		t.Fatalf("error should name authentication: %v", ErrAuthNotSupported)
	}
}

func TestStateDiagStrings(t *testing.T) {
	if StateAdminDown.String() != "admin-down" || StateUp.String() != "up" || State(9).String() != "state(9)" {
		t.Fatal("state names")
	}
	if DiagControlDetectExpired.String() != "control-detection-time-expired" || Diag(30).String() != "diag(30)" {
		t.Fatal("diag names")
	}
	if b, _ := StateInit.MarshalText(); string(b) != "init" {
		t.Fatalf("MarshalText = %s", b)
	}
}

// FuzzUnmarshal checks that the parser never panics and that anything it
// accepts re-marshals to the same mandatory section (with the Length field
// normalised to 24, since trailing bytes are not kept) and parses back to an
// equal value.
func FuzzUnmarshal(f *testing.F) {
	for _, tc := range goldenPackets {
		f.Add(mustHex(f, tc.hex))
	}
	f.Add(mustHex(f, "20 c4 03 1a  00000001 00000002  000493e0 000493e0 00000000 0102"))
	f.Add(mustHex(f, "20 c1 03 18  00000001 00000002  000493e0 000493e0 00000000"))
	f.Add(mustHex(f, "20 c0 03 1c  00000001 00000002  000493e0 000493e0 00000000 00000000"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p ControlPacket
		if err := p.UnmarshalBinary(b); err != nil {
			return
		}
		out, err := p.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted packet does not marshal: %v (%+v)", err, p)
		}
		want := append([]byte(nil), b[:ControlPacketLen]...)
		if want[3] < ControlPacketLen {
			t.Fatalf("accepted length %d < 24", want[3])
		}
		want[3] = ControlPacketLen
		if !bytes.Equal(out, want) {
			t.Fatalf("round trip:\n in  %x\n out %x", b[:ControlPacketLen], out)
		}
		var q ControlPacket
		if err := q.UnmarshalBinary(out); err != nil || q != p {
			t.Fatalf("re-parse: %v, %+v != %+v", err, q, p)
		}
	})
}
