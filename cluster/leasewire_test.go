package cluster

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestLeaseWireRoundTrip(t *testing.T) {
	for _, data := range [][]byte{nil, {0}, bytes.Repeat([]byte("x"), 5000)} {
		b, err := encodeLease("node-1", data)
		if err != nil {
			t.Fatal(err)
		}
		from, got, err := decodeLease(b)
		if err != nil || from != "node-1" || !bytes.Equal(got, data) {
			t.Fatalf("got %q %d bytes %v", from, len(got), err)
		}
		b[len(b)-1] ^= 0xff // the decoded bytes do not alias the buffer
		if len(data) > 0 && !bytes.Equal(got, data) {
			t.Fatal("decoded data aliases the message buffer")
		}
	}
	if _, err := encodeLease("", nil); err == nil {
		t.Fatal("encoded without a sender")
	}
	if _, err := encodeLease(strings.Repeat("n", 300), nil); err == nil {
		t.Fatal("encoded a 300-byte name")
	}
}

func TestLeaseWireRejects(t *testing.T) {
	tests := map[string][]byte{
		"empty":         nil,
		"handover":      []byte(`H{"from":"a"}`),
		"tag only":      {leaseTag},
		"no name":       {leaseTag, leaseWireVersion, 0, 'x'},
		"short name":    {leaseTag, leaseWireVersion, 9, 'a', 'b'},
		"other version": {leaseTag, 7, 1, 'a'},
		"oversized":     append([]byte{leaseTag, leaseWireVersion, 1, 'a'}, make([]byte, maxLeaseMessage)...),
	}
	for name, msg := range tests {
		t.Run(name, func(t *testing.T) {
			if from, data, err := decodeLease(msg); err == nil {
				t.Fatalf("accepted %q %q", from, data)
			}
		})
	}
	if _, _, err := decodeLease([]byte("H{}")); !errors.Is(err, errNotLease) {
		t.Fatalf("another message kind: %v", err)
	}
}

func FuzzDecodeLease(f *testing.F) {
	b, _ := encodeLease("n1", []byte("data"))
	f.Add(b)
	f.Add([]byte{leaseTag, leaseWireVersion, 255})
	f.Fuzz(func(t *testing.T, msg []byte) {
		from, data, err := decodeLease(msg)
		if err != nil {
			return
		}
		again, err := encodeLease(from, data)
		if err != nil || !bytes.Equal(again, msg) {
			t.Fatalf("decode/encode of %x gives %x (%v)", msg, again, err)
		}
	})
}
