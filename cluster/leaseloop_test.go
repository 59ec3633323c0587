package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/internal/clock"
	"go.uber.org/goleak"
)

// fakeClock is the drivers' fake clock: timers fire when Advance passes
// them.
type fakeClock = clock.Fake

func newFakeClock() *fakeClock {
	return clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
}

// toyMachine is a small deterministic machine for the runtime's tests:
// it records what it was fed and answers with what script returns.
type toyMachine struct {
	mu     sync.Mutex
	fed    []string
	script func(now time.Time, ev lease.Event) lease.Output
	status lease.Status
}

func (m *toyMachine) Step(now time.Time, ev lease.Event) lease.Output {
	m.mu.Lock()
	m.fed = append(m.fed, fmt.Sprintf("%T%+v", ev, ev))
	script := m.script
	m.mu.Unlock()
	if script == nil {
		return lease.Output{}
	}
	return script(now, ev)
}

func (m *toyMachine) Status() lease.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status
}

func (m *toyMachine) events() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.fed)
}

// journal records saves, sends and decisions in order.
type journal struct {
	mu      sync.Mutex
	lines   []string
	saveErr error
	sendErr error
}

func (j *journal) add(s string) {
	j.mu.Lock()
	j.lines = append(j.lines, s)
	j.mu.Unlock()
}
func (j *journal) Save(b []byte) error {
	j.add("save " + string(b))
	return j.saveErr
}
func (j *journal) Send(to string, b []byte) error {
	j.add("send " + to + " " + string(b))
	return j.sendErr
}
func (j *journal) decide(ds []LeaseDecision) {
	for _, d := range ds {
		if d.Holder {
			j.add(fmt.Sprintf("hold %s until +%v", d.Address.Key, d.Until.Sub(testT0)))
		} else {
			j.add("release " + d.Address.Key)
		}
	}
}
func (j *journal) take() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	l := j.lines
	j.lines = nil
	return l
}

var testT0 = newFakeClock().Now()

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startLoop runs a loop over m until the test ends and returns it with its
// journal and a func that stops it and returns run's error.
func startLoop(t *testing.T, m leaseMachine, clk Clock) (*leaseLoop, *journal, func() error) {
	t.Helper()
	j := &journal{}
	l := newLeaseLoop(m, clk, j, j, discard())
	l.decide = j.decide
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	_, _, stepped := l.snapshot()
	go func() { errc <- l.run(ctx) }()
	select { // the first step is done
	case <-stepped:
	case err := <-errc:
		t.Fatalf("loop stopped at once: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the loop never stepped")
	}
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				err = errors.New("the loop did not stop within 5 s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return l, j, stop
}

// postWait posts ev and waits until the loop has stepped with it.
func postWait(t *testing.T, l *leaseLoop, ev lease.Event) {
	t.Helper()
	_, _, stepped := l.snapshot()
	if !l.post(ev) {
		t.Fatal("queue full")
	}
	waitStep(t, stepped)
}

func waitStep(t *testing.T, stepped <-chan struct{}) {
	t.Helper()
	select {
	case <-stepped:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not step within 5 s")
	}
}

// advance moves the fake clock and waits for the step the timer causes.
func advance(t *testing.T, l *leaseLoop, clk *fakeClock, d time.Duration) {
	t.Helper()
	_, _, stepped := l.snapshot()
	due := clk.Deadline()
	clk.Advance(d)
	if !due.IsZero() && !due.After(clk.Now()) {
		waitStep(t, stepped)
	}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The state is saved before anything of the same output is sent (raft's
// Ready rule), and holds become decisions: new, renewed, released.
func TestLeaseLoopPersistBeforeSendAndHolds(t *testing.T) {
	clk := newFakeClock()
	var mu sync.Mutex
	holds := map[string]time.Time{}
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		mu.Lock()
		defer mu.Unlock()
		out := lease.Output{Holds: cloneHolds(holds), Next: now.Add(100 * time.Millisecond)}
		if _, ok := ev.(lease.Receive); ok {
			out.Persist = []byte("vote")
			out.Send = []lease.Message{{To: "b", Data: []byte("ack")}, {To: "c", Data: []byte("ack")}}
		}
		return out
	}}
	l, j, _ := startLoop(t, m, clk)
	j.take()
	postWait(t, l, lease.Receive{From: "b", Data: []byte("req")})
	if got, want := strings.Join(j.take(), "; "), "save vote; send b ack; send c ack"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}

	mu.Lock()
	holds["10.0.0.100/32"] = testT0.Add(time.Second)
	mu.Unlock()
	advance(t, l, clk, 100*time.Millisecond)
	advance(t, l, clk, 100*time.Millisecond) // unchanged: nothing
	mu.Lock()
	holds["10.0.0.100/32"] = testT0.Add(2 * time.Second)
	holds["10.0.0.101/32"] = testT0.Add(2 * time.Second)
	mu.Unlock()
	advance(t, l, clk, 100*time.Millisecond)
	mu.Lock()
	delete(holds, "10.0.0.100/32")
	mu.Unlock()
	advance(t, l, clk, 100*time.Millisecond)
	want := []string{"hold 10.0.0.100/32 until +1s", "hold 10.0.0.100/32 until +2s", "hold 10.0.0.101/32 until +2s", "release 10.0.0.100/32"}
	if got := j.take(); !slices.Equal(got, want) {
		t.Fatalf("decisions\n got %q\nwant %q", got, want)
	}
	if _, h, _ := l.snapshot(); len(h) != 1 {
		t.Fatalf("holds %v", h)
	}
}

func cloneHolds(m map[string]time.Time) map[string]time.Time {
	out := make(map[string]time.Time, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// A state that cannot be saved stops the loop with an error, sends
// nothing of that output and releases everything held.
func TestLeaseLoopSaveFailureStops(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		out := lease.Output{Holds: map[string]time.Time{"10.0.0.100/32": now.Add(time.Second)}, Next: now.Add(time.Second)}
		if _, ok := ev.(lease.Receive); ok {
			out.Persist = []byte("term 7")
			out.Send = []lease.Message{{To: "b", Data: []byte("vote")}}
		}
		return out
	}}
	l, j, stop := startLoop(t, m, clk)
	j.mu.Lock()
	j.saveErr = errors.New("disk full")
	j.mu.Unlock()
	l.post(lease.Receive{From: "b", Data: []byte("req")})
	err := func() error {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			j.mu.Lock()
			n := len(j.lines)
			j.mu.Unlock()
			if n >= 3 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return stop()
	}()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("run returned %v, want the save error", err)
	}
	got := strings.Join(j.take(), "; ")
	if strings.Contains(got, "send") || !strings.HasSuffix(got, "save term 7; release 10.0.0.100/32") {
		t.Fatalf("journal %q", got)
	}
}

// The loop ticks the machine at Output.Next on its (fake) clock, and at
// idleWake when the machine asks for nothing.
func TestLeaseLoopTicksAtNext(t *testing.T) {
	clk := newFakeClock()
	next := 250 * time.Millisecond
	var mu sync.Mutex
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		mu.Lock()
		defer mu.Unlock()
		if next == 0 {
			return lease.Output{}
		}
		return lease.Output{Next: now.Add(next)}
	}}
	l, _, _ := startLoop(t, m, clk)
	if d := clk.Deadline().Sub(testT0); d != 250*time.Millisecond {
		t.Fatalf("timer armed for +%v, want +250ms", d)
	}
	n := len(m.events())
	advance(t, l, clk, 249*time.Millisecond)
	if len(m.events()) != n {
		t.Fatalf("ticked early: %v", m.events()[n:])
	}
	advance(t, l, clk, time.Millisecond)
	if ev := m.events(); len(ev) != n+1 || ev[n] != "lease.Tick{}" {
		t.Fatalf("after the deadline: %v", ev[n:])
	}
	mu.Lock()
	next = 0
	mu.Unlock()
	advance(t, l, clk, 250*time.Millisecond)
	if d := clk.Deadline().Sub(clk.Now()); d != idleWake {
		t.Fatalf("no Next: timer in %v, want %v", d, idleWake)
	}
}

// Health goes to the machine once per change; a witness never sends it;
// a failure to hold pauses health for failedPause, then restores it.
func TestLeaseLoopHealth(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{}
	l, _, _ := startLoop(t, m, clk)
	postWait(t, l, lease.Health{Healthy: true})
	postWait(t, l, lease.Health{Healthy: true})
	postWait(t, l, failedEvent{})
	advance(t, l, clk, failedPause-time.Millisecond)
	advance(t, l, clk, time.Millisecond)
	var hs []string
	for _, e := range m.events() {
		if strings.HasPrefix(e, "lease.Health") {
			hs = append(hs, e)
		}
	}
	want := []string{"lease.Health{Healthy:false}", "lease.Health{Healthy:true}", "lease.Health{Healthy:false}", "lease.Health{Healthy:true}"}
	if !slices.Equal(hs, want) {
		t.Fatalf("health fed\n got %v\nwant %v", hs, want)
	}

	w := &toyMachine{}
	j := &journal{}
	wl := newLeaseLoop(w, clk, j, j, discard())
	wl.witness, wl.decide = true, j.decide
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = wl.run(ctx) }()
	postWait(t, wl, lease.Health{Healthy: true})
	cancel()
	<-done
	for _, e := range w.events() {
		if strings.HasPrefix(e, "lease.Health") {
			t.Fatalf("a witness sent %s", e)
		}
	}
}

// Send errors are counted and do not stop the loop.
func TestLeaseLoopSendErrors(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		return lease.Output{Send: []lease.Message{{To: "gone", Data: []byte("x")}}, Holds: map[string]time.Time{"a/32": now.Add(time.Second)}}
	}}
	l, j, stop := startLoop(t, m, clk)
	j.mu.Lock()
	j.sendErr = errors.New("gone is not a gossip member")
	j.mu.Unlock()
	postWait(t, l, lease.Tick{})
	postWait(t, l, lease.Tick{})
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	l.mu.Lock()
	n := l.sendErrs
	l.mu.Unlock()
	if n < 2 {
		t.Fatalf("%d send errors counted", n)
	}
}

// Stopping the loop releases what it holds, and its goroutine is gone
// (TestMain checks for leaks after every test).
func TestLeaseLoopStopReleases(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{script: func(now time.Time, ev lease.Event) lease.Output {
		return lease.Output{Holds: map[string]time.Time{"10.0.0.100/32": now.Add(time.Second)}, Next: now.Add(time.Second)}
	}}
	_, j, stop := startLoop(t, m, clk)
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	if got := j.take(); !slices.Equal(got, []string{"hold 10.0.0.100/32 until +1s", "release 10.0.0.100/32"}) {
		t.Fatalf("journal %q", got)
	}
}

// The real clock is monotonic: a wall-clock step moves no lease end.
func TestRealClockIsMonotonic(t *testing.T) {
	now := RealClock{}.Now()
	if !strings.Contains(now.String(), "m=") {
		t.Fatalf("RealClock.Now() %v carries no monotonic reading", now)
	}
	// A time with the monotonic reading stripped compares by wall clock;
	// the runtime never strips it (no Round(0), no serialised times).
	if later := now.Add(time.Second); !later.After(now) || later.Sub(now) != time.Second {
		t.Fatal("monotonic arithmetic")
	}
}

// A gossip key error keeps a node that is alone in its configuration from
// holding (it may be the one with the wrong key, in a cluster of its own)
// for KeyVeto; a node in a real cluster is not affected.
func TestLeaseLoopKeyVeto(t *testing.T) {
	for _, tc := range []struct {
		name   string
		voters []string
		want   []string
	}{
		{"alone", []string{"a"}, []string{"lease.Health{Healthy:false}", "lease.Health{Healthy:true}", "lease.Health{Healthy:false}", "lease.Health{Healthy:true}"}},
		{"in a cluster", []string{"a", "b", "c"}, []string{"lease.Health{Healthy:false}", "lease.Health{Healthy:true}"}},
		{"a learner of a one-voter cluster", []string{"b"}, []string{"lease.Health{Healthy:false}", "lease.Health{Healthy:true}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			m := &toyMachine{status: lease.Status{Name: "a", Voters: tc.voters}}
			l, _, _ := startLoop(t, m, clk)
			postWait(t, l, lease.Health{Healthy: true})
			postWait(t, l, keyEvent{})
			advance(t, l, clk, KeyVeto-time.Millisecond)
			advance(t, l, clk, time.Millisecond)
			var hs []string
			for _, e := range m.events() {
				if strings.HasPrefix(e, "lease.Health") {
					hs = append(hs, e)
				}
			}
			if !slices.Equal(hs, tc.want) {
				t.Fatalf("health fed\n got %v\nwant %v", hs, tc.want)
			}
		})
	}
}

// An address held elsewhere is reported once per change of its holder
// (vipd status: "n1 holds it", and Node for the l2 wire checks); pool
// addresses are left to their status.
func TestLeaseLoopReportsHolderElsewhere(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{status: lease.Status{Name: "a", Leader: "b", Holders: map[string]string{"10.0.0.100/32": "b"}},
		script: func(now time.Time, ev lease.Event) lease.Output { return lease.Output{Holds: map[string]time.Time{}} }}
	var mu sync.Mutex
	var got []string
	l := newLeaseLoop(m, clk, &journal{}, &journal{}, discard())
	l.decide = func(ds []LeaseDecision) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			got = append(got, fmt.Sprintf("%s holder=%v node=%q %s", d.Address.Key, d.Holder, d.Node, d.Reason))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.run(ctx) }()
	defer func() { cancel(); <-done }()
	postWait(t, l, lease.Want{Addresses: []lease.Address{{Key: "10.0.0.100/32"}, {Key: "10.1.0.1/32", Kind: lease.Pool}}})
	postWait(t, l, lease.Tick{})
	m.mu.Lock()
	m.status.Holders = map[string]string{}
	m.status.Leader = ""
	m.mu.Unlock()
	postWait(t, l, lease.Tick{})
	mu.Lock()
	defer mu.Unlock()
	want := []string{`10.0.0.100/32 holder=false node="b" b holds it`, `10.0.0.100/32 holder=false node="" no holder yet: no leader`}
	if !slices.Equal(got, want) {
		t.Fatalf("decisions\n got %q\nwant %q", got, want)
	}
}

// A step that feeds the machine nothing (a key error on a node in a
// cluster) keeps the machine's deadline: the lease is still renewed on
// time (the lab's wrong-key test lost the VIP when the timer moved to the
// end of the veto).
func TestLeaseLoopVetoKeepsTheMachineDeadline(t *testing.T) {
	clk := newFakeClock()
	m := &toyMachine{status: lease.Status{Name: "a", Voters: []string{"a", "b"}},
		script: func(now time.Time, ev lease.Event) lease.Output {
			return lease.Output{Next: now.Add(50 * time.Millisecond)}
		}}
	l, _, _ := startLoop(t, m, clk)
	advance(t, l, clk, 10*time.Millisecond)
	postWait(t, l, keyEvent{})
	if d := clk.Deadline().Sub(clk.Now()); d != 40*time.Millisecond {
		t.Fatalf("timer in %v after the key error, want the machine's 40ms", d)
	}
}

// A new hold names the node this one last knew as the holder (the status
// timeline's previous holder), and is a handover only when the leader says
// that node let it go for this one; otherwise a failover.
func TestLeaseLoopNamesThePreviousHolder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from     string
		handover bool
	}{
		{"handed over", "b", true},
		{"failover", "", false},
		{"handed over by another node than the last known holder", "c", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			var mu sync.Mutex
			holds := map[string]time.Time{}
			m := &toyMachine{status: lease.Status{Name: "a", Leader: "b", Holders: map[string]string{"10.0.0.100/32": "b"}},
				script: func(now time.Time, ev lease.Event) lease.Output {
					mu.Lock()
					defer mu.Unlock()
					return lease.Output{Holds: cloneHolds(holds)}
				}}
			var got []LeaseDecision
			l := newLeaseLoop(m, clk, &journal{}, &journal{}, discard())
			l.decide = func(ds []LeaseDecision) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, ds...)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = l.run(ctx) }()
			defer func() { cancel(); <-done }()
			postWait(t, l, lease.Want{Addresses: []lease.Address{{Key: "10.0.0.100/32"}}})
			postWait(t, l, lease.Tick{})
			m.mu.Lock()
			m.status.Holders = map[string]string{"10.0.0.100/32": "a"}
			m.status.From = map[string]string{}
			if tc.from != "" {
				m.status.From["10.0.0.100/32"] = tc.from
			}
			m.mu.Unlock()
			mu.Lock()
			holds["10.0.0.100/32"] = testT0.Add(time.Second)
			mu.Unlock()
			postWait(t, l, lease.Tick{})
			mu.Lock()
			defer mu.Unlock()
			last := got[len(got)-1]
			if !last.Holder || last.Prev != "b" || last.Handover != tc.handover {
				t.Fatalf("new hold: %+v, want Prev b, Handover %v", last, tc.handover)
			}
		})
	}
}

// A hold while this node is the only voter and VIPD_PEERS is set is Lone
// (the core keeps probing for another holder; cloud mode does not take an
// address another instance holds); with other voters, or without peers
// (a single-node setup), it is not.
func TestLeaseLoopLoneHold(t *testing.T) {
	for _, tc := range []struct {
		voters []string
		peers  bool
		lone   bool
	}{
		{[]string{"a"}, true, true},
		{[]string{"a"}, false, false},
		{[]string{"a", "b", "c"}, true, false},
	} {
		clk := newFakeClock()
		var mu sync.Mutex
		m := &toyMachine{status: lease.Status{Name: "a", Leader: "a", Voters: tc.voters},
			script: func(now time.Time, ev lease.Event) lease.Output {
				return lease.Output{Holds: map[string]time.Time{"10.0.0.100/32": testT0.Add(time.Second)}}
			}}
		var got []LeaseDecision
		l := newLeaseLoop(m, clk, &journal{}, &journal{}, discard())
		l.expectPeers = tc.peers
		l.decide = func(ds []LeaseDecision) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ds...)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = l.run(ctx) }()
		postWait(t, l, lease.Tick{})
		cancel()
		<-done
		mu.Lock()
		if len(got) == 0 || !got[0].Holder || got[0].Lone != tc.lone {
			t.Errorf("voters %v peers %v: %+v, want Lone %v", tc.voters, tc.peers, got, tc.lone)
		}
		mu.Unlock()
	}
}
