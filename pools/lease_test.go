package pools

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// With Config.Leased the lease election places l2 addresses: this node
// holds exactly what its leases say, until each lease's end, whatever the
// rendezvous ranking would say; bgp addresses are unchanged.
func TestMachineLeased(t *testing.T) {
	lost := firstAddrWonBy(t, "b", "a", "b", "c") // rendezvous would give it to b
	won := firstAddrWonBy(t, "a", "a", "b", "c")
	A, W := netip.MustParseAddr(lost), netip.MustParseAddr(won)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ok := func(as ...netip.Addr) Event {
		var rs []Result
		for _, a := range as {
			rs = append(rs, Result{Addr: a})
		}
		return Acquired{Results: rs}
	}
	type step struct {
		at      time.Duration
		ev      Event
		acquire []string
		release []string
	}
	start := StartupWait
	cases := []struct {
		name  string
		steps []step
	}{
		{"holds what is leased, not what it would win", []step{
			{at: 0, ev: members("a", "b", "c")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost), l2(won)}}},
			{at: 0, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + time.Second)}}},
			{at: start, ev: Tick{}, acquire: []string{lost}},
			{at: start, ev: ok(A)},
		}},
		{"released at the lease end without another event", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: start, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + 500*time.Millisecond)}}, acquire: []string{lost}},
			{at: start, ev: ok(A)},
			{at: start + 499*time.Millisecond, ev: Tick{}},
			{at: start + 500*time.Millisecond, ev: Tick{}, release: []string{lost}},
		}},
		{"a renewal keeps it; a lease that is gone releases at once", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost), l2(won)}}},
			{at: start, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + time.Second), W: at(start + time.Second)}}, acquire: []string{won, lost}},
			{at: start, ev: ok(A, W)},
			{at: start + 800*time.Millisecond, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + 2*time.Second)}}, release: []string{won}},
			{at: start + time.Second, ev: Tick{}},
			{at: start + 2*time.Second, ev: Tick{}, release: []string{lost}},
		}},
		{"a lease whose end has passed is not acted on", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: start, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start)}}},
		}},
		{"not eligible for the address: not held although leased", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost, "b")}}},
			{at: start, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + time.Second)}}},
		}},
		{"an acquire under way when the lease ends is undone", []step{
			{at: 0, ev: members("a")},
			{at: 0, ev: Desired{Addresses: []Address{l2(lost)}}},
			{at: start, ev: Leases{Until: map[netip.Addr]time.Time{A: at(start + 100*time.Millisecond)}}, acquire: []string{lost}},
			{at: start + 100*time.Millisecond, ev: Tick{}, release: []string{lost}},
			{at: start + 150*time.Millisecond, ev: ok(A), release: []string{lost}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMachine(Config{Name: "a", Probe: true, Leased: true}, t0)
			for i, s := range tc.steps {
				out := m.Step(s.ev, t0.Add(s.at))
				if got := addrs(out.Acquire); !slices.Equal(got, s.acquire) {
					t.Fatalf("step %d (%T at %v): acquire %v, want %v", i, s.ev, s.at, got, s.acquire)
				}
				if got := addrs(out.Release); !slices.Equal(got, s.release) {
					t.Fatalf("step %d (%T at %v): release %v, want %v", i, s.ev, s.at, got, s.release)
				}
			}
		})
	}
}

// Next wakes the driver at the earliest lease end of what it holds.
func TestMachineLeasedNext(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.7")
	m := NewMachine(Config{Name: "a", Leased: true}, t0)
	m.Step(members("a"), t0)
	m.Step(Desired{Addresses: []Address{l2("10.0.0.7")}}, t0)
	end := t0.Add(StartupWait + 300*time.Millisecond)
	m.Step(Leases{Until: map[netip.Addr]time.Time{a: end}}, t0.Add(StartupWait))
	out := m.Step(Acquired{Results: []Result{{Addr: a}}}, t0.Add(StartupWait))
	if !out.Next.Equal(end) {
		t.Fatalf("Next %v, want the lease end %v", out.Next.Sub(t0), end.Sub(t0))
	}
}
