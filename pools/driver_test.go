package pools

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/clock"
)

// fakeL2 is the l2 announcer's batch side: a set of bound addresses,
// probes answered by the MACs in answers, and a count of every call.
type fakeL2 struct {
	mu        sync.Mutex
	bound     map[netip.Addr]bool
	answers   map[netip.Addr]string
	probes    map[netip.Addr]int
	announced map[netip.Addr]int
	released  map[netip.Addr]int
}

func newFakeL2() *fakeL2 {
	return &fakeL2{bound: map[netip.Addr]bool{}, answers: map[netip.Addr]string{},
		probes: map[netip.Addr]int{}, announced: map[netip.Addr]int{}, released: map[netip.Addr]int{}}
}

func (f *fakeL2) ProbeMany(_ context.Context, addrs []netip.Addr) (map[netip.Addr]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Addr]string{}
	for _, a := range addrs {
		f.probes[a]++
		if mac, ok := f.answers[a]; ok {
			out[a] = mac
		}
	}
	return out, nil
}

func (f *fakeL2) BindMany(_ context.Context, addrs []netip.Addr) map[netip.Addr]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range addrs {
		f.bound[a] = true
	}
	return nil
}

func (f *fakeL2) ReleaseMany(_ context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range addrs {
		delete(f.bound, a)
		f.released[a]++
	}
	return nil, nil
}

func (f *fakeL2) BoundMany(_ context.Context, addrs []netip.Addr) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Addr
	for _, a := range addrs {
		if f.bound[a] {
			out = append(out, a)
		}
	}
	return out, nil
}

func (f *fakeL2) AnnounceMany(_ context.Context, addrs []netip.Addr) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range addrs {
		f.announced[a]++
	}
	return len(addrs), nil
}

func (f *fakeL2) boundList() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Addr
	for a := range f.bound {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func (f *fakeL2) count(m map[netip.Addr]int, a netip.Addr) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[a]
}

// TestDriverOnAFakeClock runs the driver on a fake clock, one node that
// may hold every address: nothing is taken during StartupWait; then the
// addresses are probed, bound and announced in a burst; one removed by
// somebody else is bound again at the next reconcile; one whose probe is
// answered is in conflict and probed again every ConflictRetry; stopping
// releases everything. No step sleeps: the fake clock moves.
func TestDriverOnAFakeClock(t *testing.T) {
	a1, a2, a3 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	l2 := newFakeL2()
	clk := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	step := func(d time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := clk.Step(ctx, d); err != nil {
			t.Fatalf("the driver did not handle its timers: %v", err)
		}
	}
	d, err := NewDriver(DriverConfig{Name: "n1", L2: l2, Clock: clk, Healthy: func() bool { return true }},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 5 s; status %+v", what, d.Status())
			}
			time.Sleep(time.Millisecond)
		}
	}
	d.SetDesired([]Address{{Addr: a1, Pool: "a", Mode: ModeL2, All: true}, {Addr: a2, Pool: "a", Mode: ModeL2, All: true}})
	waitUntil("the feed's addresses reach the machine", func() bool { return d.Status().Desired == 2 })

	step(StartupWait - 100*time.Millisecond)
	if b := l2.boundList(); len(b) != 0 {
		t.Fatalf("bound %v during StartupWait", b)
	}
	step(200 * time.Millisecond)
	if b := l2.boundList(); !slices.Equal(b, []netip.Addr{a1, a2}) {
		t.Fatalf("bound %v after StartupWait, want %v", b, []netip.Addr{a1, a2})
	}
	if n := l2.count(l2.probes, a1); n != 1 {
		t.Fatalf("%s probed %d times before binding, want 1", a1, n)
	}
	step(Burst * BurstSpacing)
	for _, a := range []netip.Addr{a1, a2} {
		if n := l2.count(l2.announced, a); n != Burst {
			t.Fatalf("%s announced %d times in its burst, want %d", a, n, Burst)
		}
	}
	if st := d.Status(); st.Held != 2 || st.Desired != 2 {
		t.Fatalf("status %+v, want 2 held", st)
	}

	// Somebody removes a1: bound again at the next reconcile, not before.
	l2.mu.Lock()
	delete(l2.bound, a1)
	l2.mu.Unlock()
	step(ReconcileEvery)
	if b := l2.boundList(); !slices.Equal(b, []netip.Addr{a1, a2}) {
		t.Fatalf("bound %v one reconcile after a1 was removed", b)
	}

	// a3's probe is answered by another host: conflict, probed again
	// every ConflictRetry, never bound.
	l2.mu.Lock()
	l2.answers[a3] = "02:00:00:00:00:99"
	l2.mu.Unlock()
	d.SetDesired([]Address{{Addr: a1, Pool: "a", Mode: ModeL2, All: true}, {Addr: a2, Pool: "a", Mode: ModeL2, All: true},
		{Addr: a3, Pool: "a", Mode: ModeL2, All: true}})
	waitUntil("a3 in conflict", func() bool { return d.Status().Conflicts == 1 })
	p := l2.count(l2.probes, a3)
	step(ConflictRetry)
	if n := l2.count(l2.probes, a3); n != p+1 {
		t.Fatalf("a3 probed %d times in ConflictRetry after %d, want one more", n, p)
	}
	if slices.Contains(l2.boundList(), a3) {
		t.Fatal("a3 bound while another host answers for it")
	}
	st := d.Status()
	if i := slices.IndexFunc(st.Addresses, func(s AddressStatus) bool { return s.Address == a3.String() }); i < 0 || st.Addresses[i].Conflict != "02:00:00:00:00:99" {
		t.Fatalf("status of a3: %+v", st.Addresses)
	}

	// Stop: every address released before Run returns.
	cancel()
	<-done
	if b := l2.boundList(); len(b) != 0 {
		t.Fatalf("bound %v after Run returned", b)
	}
}
