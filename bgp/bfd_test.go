package bgp

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
)

type fakeCtl struct{ calls []string }

func (f *fakeCtl) ResetPeer(_ context.Context, p netip.Addr, reason string) error {
	f.calls = append(f.calls, "reset "+p.String()+" "+reason)
	return nil
}

func (f *fakeCtl) EnablePeer(_ context.Context, p netip.Addr) error {
	f.calls = append(f.calls, "enable "+p.String())
	return nil
}

func TestBFDLink(t *testing.T) {
	r1, r2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	tests := []struct {
		name   string
		events []BFDEvent
		want   []string
	}{
		{"down before ever up does nothing", []BFDEvent{{Peer: r1, State: BFDDown}}, nil},
		{"up enables", []BFDEvent{{Peer: r1, State: BFDUp}}, []string{"enable 192.0.2.1"}},
		{"up then down resets once", []BFDEvent{
			{Peer: r1, State: BFDUp}, {Peer: r1, State: BFDDown, Reason: "control detection time expired"}, {Peer: r1, State: BFDDown},
		}, []string{"enable 192.0.2.1", "reset 192.0.2.1 BFD down: control detection time expired"}},
		{"repeated up enables once", []BFDEvent{{Peer: r1, State: BFDUp}, {Peer: r1, State: BFDUp}}, []string{"enable 192.0.2.1"}},
		{"remote admin down keeps the session", []BFDEvent{{Peer: r1, State: BFDUp}, {Peer: r1, State: BFDRemoteAdminDown}, {Peer: r1, State: BFDDown}},
			[]string{"enable 192.0.2.1"}},
		{"peers are independent", []BFDEvent{{Peer: r1, State: BFDUp}, {Peer: r2, State: BFDDown}, {Peer: r1, State: BFDDown}},
			[]string{"enable 192.0.2.1", "reset 192.0.2.1 BFD down"}},
		{"flap recovers", []BFDEvent{{Peer: r2, State: BFDUp}, {Peer: r2, State: BFDDown}, {Peer: r2, State: BFDUp}},
			[]string{"enable 2001:db8::1", "reset 2001:db8::1 BFD down", "enable 2001:db8::1"}},
	}
	for _, tt := range tests {
		f := &fakeCtl{}
		l := newBFDLink(f)
		for _, ev := range tt.events {
			if err := l.Handle(context.Background(), ev); err != nil {
				t.Fatal(err)
			}
		}
		if !reflect.DeepEqual(f.calls, tt.want) {
			t.Errorf("%s: calls %q, want %q", tt.name, f.calls, tt.want)
		}
	}
}
