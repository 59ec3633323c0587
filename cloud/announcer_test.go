package cloud

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/vip"
)

var (
	_ vip.Announcer    = (*Announcer)(nil)
	_ vip.LoneAcquirer = (*Announcer)(nil)
)

// memProvider is an in-memory Provider that counts calls.
type memProvider struct {
	mu          sync.Mutex
	holder      string // "" unassigned
	holderErr   error
	assignErr   error
	local       *bool // nil: no metadata (HeldLocally errors)
	holderCalls int
	assignCalls int
	localCalls  int
	block       chan struct{} // when set, Holder waits for it (after reading the answer)
}

func (m *memProvider) Name() string     { return "mem" }
func (m *memProvider) Instance() string { return "me" }

func (m *memProvider) Holder(context.Context, netip.Addr) (Holding, error) {
	m.mu.Lock()
	m.holderCalls++
	h, err, block := Holding{Holder: m.holder, Self: m.holder == "me"}, m.holderErr, m.block
	m.mu.Unlock()
	if block != nil {
		<-block
	}
	if err != nil {
		return Holding{}, err
	}
	return h, nil
}

func (m *memProvider) Assign(context.Context, netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.assignCalls++
	if m.assignErr != nil {
		return m.assignErr
	}
	m.holder = "me"
	return nil
}

func (m *memProvider) HeldLocally(context.Context, netip.Addr) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.localCalls++
	if m.local == nil {
		return false, errors.New("no metadata")
	}
	return *m.local, nil
}

func (m *memProvider) set(f func(*memProvider)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func (m *memProvider) counts() (holder, assign, local int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.holderCalls, m.assignCalls, m.localCalls
}

type lockedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *lockedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *lockedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var vip10 = netip.MustParsePrefix(testIP + "/32")

func newAnn(t *testing.T, p Provider) (*Announcer, *lockedClock) {
	t.Helper()
	clk := &lockedClock{t: time.Unix(1_700_000_000, 0)}
	a := NewAnnouncer(p, AnnouncerOptions{Refresh: 10 * time.Second, Now: clk.Now})
	t.Cleanup(func() { _ = a.Close() })
	return a, clk
}

// settle waits for background refreshes to finish.
func settle(t *testing.T, a *Announcer) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		busy := false
		for _, s := range a.state {
			busy = busy || s.refreshing
		}
		a.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("refresh did not finish")
}

func boolp(b bool) *bool { return &b }

func TestAcquireDecisions(t *testing.T) {
	tests := []struct {
		name       string
		holder     string
		local      *bool
		prime      bool
		wantHolder int
		wantAssign int
		wantLocal  int
	}{
		{"metadata says held: no API call", "me", boolp(true), false, 0, 0, 1},
		{"metadata says not held: assign without a GET", "other", boolp(false), false, 0, 1, 1},
		{"no metadata, API says held: no assign", "me", nil, false, 1, 0, 1},
		{"no metadata, API says other: assign", "other", nil, false, 1, 1, 1},
		{"primed held: nothing at all", "me", boolp(true), true, 1, 0, 0},
		{"primed other: assign straight away", "other", boolp(false), true, 1, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &memProvider{holder: tc.holder, local: tc.local}
			a, _ := newAnn(t, p)
			ctx := context.Background()
			if tc.prime {
				if err := a.Prime(ctx, []netip.Prefix{vip10}); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Acquire(ctx, vip10); err != nil {
				t.Fatal(err)
			}
			h, as, l := p.counts()
			if h != tc.wantHolder || as != tc.wantAssign || l != tc.wantLocal {
				t.Fatalf("calls holder=%d assign=%d local=%d, want %d %d %d", h, as, l, tc.wantHolder, tc.wantAssign, tc.wantLocal)
			}
			if ok, err := a.Present(ctx, vip10); err != nil || !ok {
				t.Fatalf("Present after Acquire = %v, %v", ok, err)
			}
		})
	}
}

func TestPresentIsCachedAndRefreshedInTheBackground(t *testing.T) {
	p := &memProvider{holder: "other", local: boolp(false)}
	a, clk := newAnn(t, p)
	ctx := context.Background()

	// Not wanted: false without any call.
	if ok, _ := a.Present(ctx, vip10); ok {
		t.Fatal("Present before Acquire")
	}
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	h0, _, _ := p.counts()
	for i := 0; i < 50; i++ {
		clk.Advance(100 * time.Millisecond) // 5s of driver ticks
		if ok, err := a.Present(ctx, vip10); err != nil || !ok {
			t.Fatalf("Present = %v, %v", ok, err)
		}
	}
	if h, _, _ := p.counts(); h != h0 {
		t.Fatalf("%d holder calls within the refresh interval", h-h0)
	}

	// Someone moves the IP away; after Refresh one background call notices.
	p.set(func(m *memProvider) { m.holder = "other" })
	clk.Advance(6 * time.Second)
	if ok, _ := a.Present(ctx, vip10); !ok {
		t.Fatal("the stale answer is returned while the refresh runs")
	}
	settle(t, a)
	if ok, _ := a.Present(ctx, vip10); ok {
		t.Fatal("Present still true after the refresh saw another holder")
	}
	if h, _, _ := p.counts(); h != h0+1 {
		t.Fatalf("%d holder calls, want exactly one refresh", h-h0)
	}
	// The driver re-acquires: the fresh answer says "other", so it
	// assigns at once.
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	if _, as, _ := p.counts(); as != 2 {
		t.Fatalf("%d assigns, want 2", as)
	}
}

func TestRefreshFailureKeepsTheHolder(t *testing.T) {
	p := &memProvider{holder: "me", local: boolp(true)}
	a, clk := newAnn(t, p)
	ctx := context.Background()
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	p.set(func(m *memProvider) { m.holderErr = ErrUnavailable })
	for i := 0; i < 5; i++ {
		clk.Advance(11 * time.Second)
		if ok, _ := a.Present(ctx, vip10); !ok {
			t.Fatalf("round %d: Present false while the API is down", i)
		}
		settle(t, a)
	}
	if ok, _ := a.Present(ctx, vip10); !ok {
		t.Fatal("Present false after failed refreshes")
	}
	if h, _, _ := p.counts(); h != 5 {
		t.Fatalf("%d refreshes in 55s with a 10s interval, want 5", h)
	}
}

func TestReleaseMakesNoCallAndForgets(t *testing.T) {
	p := &memProvider{holder: "me", local: boolp(true)}
	a, _ := newAnn(t, p)
	ctx := context.Background()
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	h0, as0, l0 := p.counts()
	if err := a.Release(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	if h, as, l := p.counts(); h != h0 || as != as0 || l != l0 {
		t.Fatal("Release called the provider")
	}
	if ok, _ := a.Present(ctx, vip10); ok {
		t.Fatal("Present true after Release")
	}
	// Another node takes it meanwhile; a new Acquire must check again
	// rather than trust the cache from before the release.
	p.set(func(m *memProvider) { m.holder, m.local = "other", boolp(false) })
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	if _, as, _ := p.counts(); as != as0+1 {
		t.Fatalf("assigns = %d, want %d", as, as0+1)
	}
}

func TestAcquireFailure(t *testing.T) {
	p := &memProvider{holder: "other", local: boolp(false), assignErr: ErrUnavailable}
	a, _ := newAnn(t, p)
	ctx := context.Background()
	err := a.Acquire(ctx, vip10)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if ok, _ := a.Present(ctx, vip10); ok {
		t.Fatal("Present true after a failed Acquire")
	}
	if err := a.Acquire(ctx, netip.MustParsePrefix("192.0.2.0/24")); err == nil {
		t.Fatal("a /24 was accepted")
	}
	if err := a.Acquire(ctx, netip.MustParsePrefix("fd00::1/128")); err == nil {
		t.Fatal("IPv6 was accepted")
	}
	if err := a.Announce(ctx, vip10); err != nil {
		t.Fatal(err)
	}
}

func TestPrimeErrors(t *testing.T) {
	p := &memProvider{holderErr: ErrUnavailable}
	a, _ := newAnn(t, p)
	if err := a.Prime(context.Background(), []netip.Prefix{vip10}); err != nil {
		t.Fatalf("API down at start-up must not stop the daemon: %v", err)
	}
	p.set(func(m *memProvider) { m.holderErr = ErrNotFound })
	if err := a.Prime(context.Background(), []netip.Prefix{vip10}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("not found: %v", err)
	}
}

// TestRestartMakesNoAssign runs the real backend against the fake: a
// holder that restarts (new backend and announcer) finds the IP on its
// droplet and sends no assign.
func TestRestartMakesNoAssign(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{ActionDuration: 100 * time.Millisecond}, nil)
	ctx := ctxT(t, 10*time.Second)
	a1 := NewAnnouncer(e.do, AnnouncerOptions{})
	if err := a1.Prime(ctx, []netip.Prefix{vip10}); err != nil {
		t.Fatal(err)
	}
	if err := a1.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	_ = a1.Close()
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 1 {
		t.Fatalf("first start: %d assigns", n)
	}

	do2, err := NewDigitalOcean(ctx, e.do.cfg)
	if err != nil {
		t.Fatal(err)
	}
	a2 := NewAnnouncer(do2, AnnouncerOptions{})
	defer a2.Close()
	e.fake.ResetLog()
	if err := a2.Prime(ctx, []netip.Prefix{vip10}); err != nil {
		t.Fatal(err)
	}
	if err := a2.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a2.Present(ctx, vip10); !ok {
		t.Fatal("not present after restart")
	}
	if n := e.fake.Count(http.MethodPost, ""); n != 0 {
		t.Fatalf("restart sent %d POSTs", n)
	}
	if n := len(e.fake.Requests()); n != 1 {
		t.Fatalf("restart made %d API calls, want 1 (the start-up check)", n)
	}
}

// A flapping election makes nodes acquire and release in turn; each node
// assigns at most once per CoolOff, and the refusal costs no API call.
func TestCoolOffBoundsPingPong(t *testing.T) {
	p := &memProvider{holder: "other", local: boolp(false)}
	a, clk := newAnn(t, p)
	ctx := context.Background()
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	flip := func() error {
		if err := a.Release(ctx, vip10); err != nil {
			t.Fatal(err)
		}
		p.set(func(m *memProvider) { m.holder = "other" }) // another node took it
		clk.Advance(time.Second)
		return a.Acquire(ctx, vip10)
	}
	for i := 0; i < 4; i++ { // 1s, 2s, 3s, 4s after the assign
		if err := flip(); !errors.Is(err, ErrCoolOff) {
			t.Fatalf("flip %d: %v, want ErrCoolOff", i, err)
		}
		if ok, _ := a.Present(ctx, vip10); ok {
			t.Fatal("Present true after a refused Acquire")
		}
	}
	if _, as, _ := p.counts(); as != 1 {
		t.Fatalf("%d assigns during the cool-off, want 1", as)
	}
	if err := flip(); err != nil { // 5s after: allowed again
		t.Fatal(err)
	}
	if _, as, _ := p.counts(); as != 2 {
		t.Fatalf("%d assigns, want 2", as)
	}

	// A planned handover back to this node 1 s after its assign is not
	// held back: the previous holder let the IP go for this node.
	if err := a.Release(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	p.set(func(m *memProvider) { m.holder = "other" })
	clk.Advance(time.Second)
	if err := a.AcquireHandover(ctx, vip10); err != nil {
		t.Fatalf("a planned handover inside the cool-off: %v", err)
	}
	if _, as, _ := p.counts(); as != 3 {
		t.Fatalf("%d assigns after the planned handover, want 3", as)
	}
	if ok, _ := a.Present(ctx, vip10); !ok {
		t.Fatal("Present false after the planned handover")
	}
	// It counts as an assign: an ordinary Acquire right after is held
	// back again.
	if err := flip(); !errors.Is(err, ErrCoolOff) {
		t.Fatalf("an ordinary acquire 1 s after the planned handover: %v, want ErrCoolOff", err)
	}

	// Disabled with a negative CoolOff.
	p2 := &memProvider{holder: "other", local: boolp(false)}
	a2 := NewAnnouncer(p2, AnnouncerOptions{CoolOff: -1})
	defer a2.Close()
	for i := 0; i < 3; i++ {
		p2.set(func(m *memProvider) { m.holder = "other" })
		_ = a2.Release(ctx, vip10)
		if err := a2.Acquire(ctx, vip10); err != nil {
			t.Fatal(err)
		}
	}
	if _, as, _ := p2.counts(); as != 3 {
		t.Fatalf("%d assigns without cool-off, want 3", as)
	}
}

// A refresh that was in flight across a Release and a new Acquire must not
// overwrite what the Acquire learned.
func TestStaleRefreshIsDropped(t *testing.T) {
	p := &memProvider{holder: "me", local: boolp(true)}
	a, clk := newAnn(t, p)
	ctx := context.Background()
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	p.set(func(m *memProvider) { m.holder, m.block = "other", block })
	clk.Advance(11 * time.Second)
	if ok, _ := a.Present(ctx, vip10); !ok { // starts a refresh that will answer "other"
		t.Fatal("Present false before the refresh")
	}
	for {
		if h, _, _ := p.counts(); h == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Meanwhile: released, the IP comes back here, acquired again.
	if err := a.Release(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	p.set(func(m *memProvider) { m.holder, m.block = "me", nil })
	if err := a.Acquire(ctx, vip10); err != nil {
		t.Fatal(err)
	}
	close(block)
	settle(t, a)
	if ok, _ := a.Present(ctx, vip10); !ok {
		t.Fatal("a stale refresh answer overwrote the fresh Acquire")
	}
}

// Issue 10, Found 6 (cloud): a node that bootstraps alone never takes the
// reserved IP from another instance; it takes an unassigned one.
func TestAcquireLone(t *testing.T) {
	tests := []struct {
		name      string
		holder    string
		holderErr error
		assigns   int
		wantErr   bool
	}{
		{"held by another instance: refused, no assign", "other", nil, 0, true},
		{"holder unknown (API down): refused", "", errors.New("503"), 0, true},
		{"unassigned: taken", "", nil, 1, false},
		{"already ours: nothing to do", "me", nil, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &memProvider{holder: tc.holder, holderErr: tc.holderErr}
			a, _ := newAnn(t, p)
			err := a.AcquireLone(context.Background(), vip10)
			if (err != nil) != tc.wantErr || (tc.holder == "other" && !errors.Is(err, ErrHeldElsewhere)) {
				t.Fatalf("err %v", err)
			}
			if _, as, _ := p.counts(); as != tc.assigns {
				t.Fatalf("%d assigns, want %d", as, tc.assigns)
			}
		})
	}
}
