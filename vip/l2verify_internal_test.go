package vip

import (
	"net/netip"
	"testing"
)

// SetHolder kicks the verifier when who holds a VIP changes, not when the
// election repeats the same decision (at every lease renewal).
func TestSetHolderKicksOnChangeOnly(t *testing.T) {
	l := &L2{}
	if err := l.EnableVerify(VerifyOptions{Every: 1e9}, nil); err != nil {
		t.Fatal(err)
	}
	vf := l.verify
	a := netip.MustParsePrefix("10.0.0.10/32")
	drain := func() bool {
		select {
		case <-vf.kick:
			return true
		default:
			return false
		}
	}
	for i, tc := range []struct {
		holder string
		self   bool
		kick   bool
	}{
		{"n1", true, true},   // first decision
		{"n1", true, false},  // a renewal
		{"n1", true, false},  // another
		{"n2", false, true},  // moved away
		{"n2", false, false}, // repeated
		{"", false, true},    // nobody
		{"n1", true, true},   // back
	} {
		clear(vf.queue)
		l.SetHolder(a, tc.holder, tc.self)
		if got := drain(); got != tc.kick {
			t.Errorf("step %d: SetHolder(%q, self=%v) kicked=%v, want %v", i, tc.holder, tc.self, got, tc.kick)
		}
		if _, queued := vf.queue[a.Addr()]; queued != tc.kick {
			t.Errorf("step %d: queued=%v, want %v", i, queued, tc.kick)
		}
	}
	if !vf.lost[a.Addr()] {
		t.Error("moving away from this node did not mark the VIP lost")
	}
}
