package vip

import (
	"net/netip"
	"testing"
	"time"
)

func TestOverlapWindows(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("10.0.0.101")
	var w overlapWindows
	if w.in(a, t0) {
		t.Fatal("zero value: in a window")
	}
	w.set(a, t0.Add(300*time.Millisecond))
	for _, tc := range []struct {
		addr netip.Addr
		at   time.Duration
		want bool
	}{
		{a, 0, true}, {b, 0, false}, {a, 299 * time.Millisecond, true}, {a, 300 * time.Millisecond, false}, {a, 0, false},
	} {
		if got := w.in(tc.addr, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%v at %v: %v, want %v", tc.addr, tc.at, got, tc.want)
		}
	}
	w.set(b, t0.Add(time.Second))
	w.set(b, time.Time{})
	if w.in(b, t0) {
		t.Error("a window ended by a zero until still runs")
	}
}
