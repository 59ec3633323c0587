package cluster

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestBeatCodec(t *testing.T) {
	k1, k2, k3 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16), bytes.Repeat([]byte{3}, 32)
	msg := beatMsg{Name: "cp-1", Term: 7, Seq: 1234567, Meta: 0xdeadbeef, Heard: []BeatHeard{{Hash: BeatHash("cp-2"), Age: 0, Meta: 0x01020304}, {Hash: BeatHash("cp-3"), Age: 1}}}
	signed, err := encodeBeat(msg, beatKeys([][]byte{k1}))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := encodeBeat(msg, nil)
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), signed...)
	flipped[10] ^= 1 // the term
	relayed := append([]byte(nil), signed...)
	relayed[beatHeader+len(msg.Name)+1+8] ^= 1 // the first relay's age
	relayMeta := append([]byte(nil), signed...)
	relayMeta[beatHeader+len(msg.Name)+1+12] ^= 1 // the first relay's metadata hash
	for _, tc := range []struct {
		name string
		pkt  []byte
		keys [][]byte
		want error
	}{
		{"signed, same key", signed, [][]byte{k1}, nil},
		{"signed, key second in a rotated ring", signed, [][]byte{k2, k1}, nil},
		{"signed, other key", signed, [][]byte{k3}, errBeatAuth},
		{"tampered term", flipped, [][]byte{k1}, errBeatAuth},
		{"tampered relay", relayed, [][]byte{k1}, errBeatAuth},
		{"tampered relay metadata", relayMeta, [][]byte{k1}, errBeatAuth},
		{"unsigned to a keyed node", plain, [][]byte{k1}, errBeatShort},
		{"signed to an insecure node", signed, nil, errBeatShort},
		{"insecure both", plain, nil, nil},
		{"truncated", signed[:len(signed)-1], [][]byte{k1}, errBeatShort},
		{"header only", signed[:beatHeader], [][]byte{k1}, errBeatShort},
		{"not a beat", append([]byte{0x01}, signed[1:]...), [][]byte{k1}, errBeatShort},
		{"empty", nil, nil, errBeatShort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeBeat(tc.pkt, beatKeys(tc.keys))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if err == nil && !reflect.DeepEqual(got, msg) {
				t.Fatalf("decoded %+v, want %+v", got, msg)
			}
		})
	}
	if _, err := encodeBeat(beatMsg{Name: ""}, nil); err == nil {
		t.Error("empty name encoded")
	}
	// A relay list longer than beatMaxHeard is cut, never refused.
	long := beatMsg{Name: string(bytes.Repeat([]byte{'n'}, heartbeatMaxName)), Seq: 1, Heard: make([]BeatHeard, beatMaxHeard+5)}
	pkt, err := encodeBeat(long, beatKeys([][]byte{k1}))
	if err != nil || len(pkt) > beatMaxPacket {
		t.Fatalf("long relay list: %d bytes, %v", len(pkt), err)
	}
	if got, err := decodeBeat(pkt, beatKeys([][]byte{k1})); err != nil || len(got.Heard) != beatMaxHeard {
		t.Fatalf("long relay list decoded to %d relays, %v", len(got.Heard), err)
	}
	// A count larger than the packet holds is refused.
	bad := append([]byte(nil), plain...)
	bad[beatHeader+len(msg.Name)] = 200
	if _, err := decodeBeat(bad, nil); !errors.Is(err, errBeatShort) {
		t.Errorf("inflated relay count: %v", err)
	}
}

func TestBeatReplay(t *testing.T) {
	r := beatReplay{}
	steps := []struct {
		m    beatMsg
		want bool
	}{
		{beatMsg{Name: "a", Seq: 10}, true},
		{beatMsg{Name: "a", Seq: 10}, false}, // the same packet again
		{beatMsg{Name: "a", Seq: 9}, false},  // an older one
		{beatMsg{Name: "b", Seq: 1}, true},   // per sender
		{beatMsg{Name: "a", Seq: 11}, true},
	}
	for i, s := range steps {
		if got := r.fresh(s.m); got != s.want {
			t.Fatalf("step %d %+v: fresh %v, want %v", i, s.m, got, s.want)
		}
	}
	for _, tc := range []struct {
		last uint64
		now  int64
		want uint64
	}{{0, 100, 100}, {100, 200, 200}, {200, 150, 201}, {200, 200, 201}, {5, -1, 6}} {
		if got := nextSeq(tc.last, tc.now); got != tc.want {
			t.Errorf("nextSeq(%d, %d) = %d, want %d", tc.last, tc.now, got, tc.want)
		}
	}
}
