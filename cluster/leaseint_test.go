package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/cluster/lease"
)

const intVIP = "10.0.0.100/32"

// holdLog records every node's hold intervals of intVIP as the executors
// would see them: from the decision to the earlier of its lease end and
// the release decision.
type holdLog struct {
	mu    sync.Mutex
	open  map[string][2]time.Time // node -> [start, until]
	with  map[string]string       // node -> the old holder of an open span's planned transfer
	spans []span
	ch    chan struct{}
	log   lockedLog // every node's log (logger)
	// yielded counts, per node, decisions that hold intVIP as a planned
	// transfer's old holder (Yielding: bound, no more announcements)
	yielded map[string]int
}

type span struct {
	node       string
	start, end time.Time
	with       string // a planned transfer's old holder, beside which this span began
}

func newHoldLog() *holdLog {
	return &holdLog{open: map[string][2]time.Time{}, with: map[string]string{}, ch: make(chan struct{}, 1), yielded: map[string]int{}}
}

func (h *holdLog) decide(node string) func([]LeaseDecision) {
	return func(ds []LeaseDecision) {
		now := time.Now()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range ds {
			if d.Address.Key != intVIP {
				continue
			}
			if d.Yielding {
				h.yielded[node]++
			}
			o, held := h.open[node]
			switch {
			case d.Holder && held && !now.After(o[1]):
				h.open[node] = [2]time.Time{o[0], d.Until} // renewed in time
			case d.Holder:
				if held {
					h.spans = append(h.spans, span{node, o[0], o[1], h.with[node]})
				}
				if d.Until.After(now) {
					h.open[node] = [2]time.Time{now, d.Until}
					h.with[node] = d.OverlapWith
				}
			case held:
				h.spans = append(h.spans, span{node, o[0], minTime(now, o[1]), h.with[node]})
				delete(h.open, node)
			}
		}
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// holder returns the node holding intVIP now ("" none) and how many do.
func (h *holdLog) holders() []string {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n, o := range h.open {
		if now.Before(o[1]) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// overlaps returns every pair of spans of different nodes that overlap.
func (h *holdLog) overlaps() []string {
	h.mu.Lock()
	all := append([]span(nil), h.spans...)
	for n, o := range h.open {
		all = append(all, span{n, o[0], minTime(time.Now(), o[1]), h.with[n]})
	}
	h.mu.Unlock()
	var bad []string
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			a, b := all[i], all[j]
			if a.node != b.node && a.start.Before(b.end) && b.start.Before(a.end) && !agreedOverlap(a, b) {
				bad = append(bad, fmt.Sprintf("%s %v..%v and %s %v..%v", a.node, a.start.Format("15:04:05.000"), a.end.Format("15:04:05.000"),
					b.node, b.start.Format("15:04:05.000"), b.end.Format("15:04:05.000")))
			}
		}
	}
	return bad
}

// agreedOverlap: b began as a planned transfer's successor beside a (or
// a beside b), and they overlapped no longer than the profile's bound plus
// the time the decisions took to reach this log.
func agreedOverlap(a, b span) bool {
	if a.start.After(b.start) {
		a, b = b, a
	}
	cfg := lease.ProfileConfig("default")
	bound := time.Duration(float64(cfg.Overlap)/(1-cfg.Drift)) + 20*time.Millisecond
	return b.with == a.node && minTime(a.end, b.end).Sub(b.start) <= bound
}

// waitHolder waits until exactly one node other than not holds intVIP.
func (h *holdLog) waitHolder(t *testing.T, within time.Duration, not ...string) string {
	t.Helper()
	deadline := time.After(within)
	for {
		if hs := h.holders(); len(hs) == 1 && !contains(not, hs[0]) {
			return hs[0]
		}
		select {
		case <-h.ch:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no single holder other than %v within %v: holders %v", not, within, h.holders())
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

type realNode struct {
	n      *LeaseNode
	cancel context.CancelFunc
	done   chan error
}

// startReal runs a LeaseNode with the real lease machine on loopback.
func startReal(t *testing.T, name, dir string, h *holdLog, peers ...string) *realNode {
	t.Helper()
	mc := lease.ProfileConfig("default")
	n, err := NewLease(LeaseConfig{
		Cluster: Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), Peers: peers, Keys: [][]byte{keyA},
			StateDir: dir, Timings: DefaultTimings(), LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }},
		Machine:   mc,
		Addresses: []lease.Address{{Key: intVIP, Kind: lease.ControlPlane}},
	}, h.logger(t, name), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &realNode{n: n, cancel: cancel, done: make(chan error, 1)}
	dec := h.decide(name)
	go func() {
		rn.done <- n.Run(ctx, func(ds []LeaseDecision) {
			dec(ds)
			for _, d := range ds {
				if d.Holder && d.Reason != "lease renewed by a majority" {
					n.SetHolding(d.Address.Key, true) // as the core does once bound and announced
				}
			}
		})
	}()
	n.SetHealthy(true)
	t.Cleanup(rn.stop)
	return rn
}

func (r *realNode) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
	_ = r.n.Close()
	r.cancel = nil
}

func (r *realNode) addr() string { return r.n.ml.LocalNode().Address() }

// LeaseNodes with the real machine over memberlist on loopback: one holder
// at a time, always; a graceful stop of the holder (Leave) moves the
// address and shrinks the configuration; a replacement joins; a hard stop
// of the holder moves the address; every node persisted its state.
func TestLeaseIntegrationThreeNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	h := newHoldLog()
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir(), "c": t.TempDir()}
	nodes := map[string]*realNode{}
	nodes["a"] = startReal(t, "a", dirs["a"], h)
	first := h.waitHolder(t, 5*time.Second)
	if first != "a" {
		t.Fatalf("the bootstrapping node is not the holder: %s", first)
	}
	waitVoters := func(on string, want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			st, _, _ := nodes[on].n.loop.snapshot()
			if len(st.Voters) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: voters after 15 s: %v (learners %v), want %d", on, st.Voters, st.Learners, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	nodes["b"] = startReal(t, "b", dirs["b"], h, nodes["a"].addr())
	nodes["c"] = startReal(t, "c", dirs["c"], h, nodes["a"].addr())
	waitVoters("a", 3)
	holder := h.waitHolder(t, 5*time.Second)
	// Every node knows the holder and its address (egress directors
	// route to it; the l2 wire checks compare answers with it).
	for name, rn := range nodes {
		deadline := time.Now().Add(3 * time.Second)
		for {
			got, addr := rn.n.Holder(intVIP)
			if got == holder && addr == netip.MustParseAddr("127.0.0.1") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Holder(%s) = %q %v, want %s 127.0.0.1", name, intVIP, got, addr, holder)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Graceful stop of the holder (SIGTERM: Leave): another node holds.
	// Three voters do not shrink (the floor): the stopped node stays a
	// voter and, started again from its state, is the same member.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	rs, err := nodes[holder].n.HandOver(ctx, nil, "", true)
	cancel()
	if err != nil {
		t.Fatalf("leave: %v %+v", err, rs)
	}
	next := h.waitHolder(t, 5*time.Second, holder)
	t.Logf("graceful stop of %s: %s holds after %v (%+v)", holder, next, time.Since(start).Round(time.Millisecond), rs)
	nodes[holder].stop()
	waitVoters(next, 3)
	nodes[holder] = startReal(t, holder, dirs[holder], h, nodes[next].addr())
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, _, _ := nodes[holder].n.loop.snapshot()
		if st.Leader != "" && contains(st.Voters, holder) && len(st.Voters) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s restarted after its graceful stop: leader %q voters %v learners %v", holder, st.Leader, st.Voters, st.Learners)
		}
	}

	// A replacement joins (through the holder's address); the node it
	// replaces stops gracefully and leaves (four voters may shrink to
	// three); then the holder dies without a stop: another node holds
	// within a lease and an election.
	nodes["d"] = startReal(t, "d", t.TempDir(), h, nodes[next].addr())
	waitVoters(next, 4)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	if rs, err := nodes[holder].n.HandOver(ctx, nil, "", true); err != nil {
		t.Fatalf("leave of %s: %v %+v", holder, err, rs)
	}
	cancel()
	nodes[holder].stop()
	delete(nodes, holder)
	waitVoters(next, 3)
	start = time.Now()
	nodes[next].stop()
	third := h.waitHolder(t, 10*time.Second, holder, next)
	t.Logf("hard stop of %s: %s holds after %v", next, third, time.Since(start).Round(time.Millisecond))

	// The dead node restarts from its state: it is the same member again
	// (no second cluster, no new incarnation), and the holder stays.
	nodes[next] = startReal(t, next, dirs[next], h, nodes[third].addr())
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, _, _ := nodes[next].n.loop.snapshot()
		lt, _, _ := nodes[third].n.loop.snapshot()
		if st.Leader != "" && st.Leader == lt.Leader && len(lt.Voters) == 3 && contains(lt.Voters, next) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted %s: leader %q (third says %q), voters %v", next, st.Leader, lt.Leader, lt.Voters)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if hs := h.holders(); len(hs) != 1 || hs[0] != third {
		t.Fatalf("after %s restarted: holders %v, want [%s]", next, hs, third)
	}

	if bad := h.overlaps(); len(bad) > 0 {
		t.Fatalf("two holders at once:\n%s", strings.Join(bad, "\n"))
	}
	// The state was persisted on every node.
	for name, dir := range dirs {
		if b, err := newStateFile(dir).Load(); err != nil || len(b) == 0 {
			t.Fatalf("%s: state %d bytes, %v", name, len(b), err)
		}
	}
}

// logger logs a node of the test at info level into the buffer shared by
// all its nodes, which the test prints when it fails (LEASE_DEBUG=1: at
// debug level to stderr as it goes). The machine's notes (a wipe, a
// refused join, an election) are what a failure in CI needs to be read.
func (h *holdLog) logger(t *testing.T, node string) *slog.Logger {
	if os.Getenv("LEASE_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", node)
	}
	l := &h.log
	l.once.Do(func() {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the nodes' log (info and above):\n%s", l.tail(300))
			}
		})
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", node)
}

// lockedLog is an io.Writer the loggers of several nodes share.
type lockedLog struct {
	once  sync.Once
	mu    sync.Mutex
	lines []string
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// tail returns the last n lines.
func (l *lockedLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-n):], "\n")
}

// The lab's TestClusterStopAndRejoin in process: three times, the holder
// stops gracefully and starts again from its state; a holder is back each
// time and the restarted node becomes a voter again.
func TestLeaseIntegrationStopAndRejoin(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	h := newHoldLog()
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir(), "c": t.TempDir()}
	nodes := map[string]*realNode{}
	nodes["a"] = startReal(t, "a", dirs["a"], h)
	h.waitHolder(t, 5*time.Second)
	nodes["b"] = startReal(t, "b", dirs["b"], h, nodes["a"].addr())
	nodes["c"] = startReal(t, "c", dirs["c"], h, nodes["a"].addr())
	voters := func(on string) []string {
		st, _, _ := nodes[on].n.loop.snapshot()
		return st.Voters
	}
	waitVoters := func(on string, want int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for len(voters(on)) != want {
			if time.Now().After(deadline) {
				st, _, _ := nodes[on].n.loop.snapshot()
				t.Fatalf("%s: voters %v learners %v, want %d", on, st.Voters, st.Learners, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitVoters("a", 3)
	for i := 0; i < 3; i++ {
		holder := h.waitHolder(t, 10*time.Second)
		h.mu.Lock()
		yielded := h.yielded[holder]
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rs, err := nodes[holder].n.HandOver(ctx, nil, "", true)
		cancel()
		nodes[holder].stop()
		next := h.waitHolder(t, 10*time.Second, holder)
		t.Logf("round %d: %s left (%v %+v), %s holds", i, holder, err, rs, next)
		// The old holder kept the VIP through the make-before-break
		// overlap as yielding: bound, announcing nothing more.
		h.mu.Lock()
		if h.yielded[holder] == yielded {
			t.Errorf("round %d: %s handed the VIP over without a decision that it yields it", i, holder)
		}
		h.mu.Unlock()
		var peer string
		for n := range nodes {
			if n != holder {
				peer = n
			}
		}
		nodes[holder] = startReal(t, holder, dirs[holder], h, nodes[peer].addr())
		waitVoters(next, 3)
	}
	if bad := h.overlaps(); len(bad) > 0 {
		t.Fatalf("two holders at once:\n%s", strings.Join(bad, "\n"))
	}
}
