package cluster

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vipd/vipd/cluster/lease"
)

// echoMachine sends what the test queues and records what it receives and
// the views it is given; its first output publishes meta.
type echoMachine struct {
	mu     sync.Mutex
	meta   []byte
	out    []lease.Message
	got    []lease.Receive
	views  []lease.View
	notify chan struct{}
}

func newEcho(meta string) *echoMachine {
	return &echoMachine{meta: []byte(meta), notify: make(chan struct{}, 1)}
}

func (m *echoMachine) Step(now time.Time, ev lease.Event) lease.Output {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e := ev.(type) {
	case lease.Receive:
		m.got = append(m.got, e)
	case lease.View:
		m.views = append(m.views, e)
	}
	out := lease.Output{Send: m.out, Meta: m.meta, Next: now.Add(50 * time.Millisecond)}
	m.out, m.meta = nil, nil
	select {
	case m.notify <- struct{}{}:
	default:
	}
	return out
}

func (m *echoMachine) Status() lease.Status { return lease.Status{} }

func (m *echoMachine) queue(msgs ...lease.Message) {
	m.mu.Lock()
	m.out = append(m.out, msgs...)
	m.mu.Unlock()
}

// waitFor polls cond on every step of m, for up to 10 s.
func (m *echoMachine) waitFor(t *testing.T, what string, cond func(m *echoMachine) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		m.mu.Lock()
		ok := cond(m)
		m.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-m.notify:
		case <-deadline:
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

var (
	keyA = bytes.Repeat([]byte{1}, 32)
	keyB = bytes.Repeat([]byte{2}, 32)
)

type testNode struct {
	n    *LeaseNode
	m    *echoMachine
	stop func() error
	reg  *prometheus.Registry
}

func (tn testNode) addr() string { return tn.n.ml.LocalNode().Address() }

// startNode runs a LeaseNode on loopback with an echo machine.
func startNode(t *testing.T, name string, keys [][]byte, peers ...string) testNode {
	t.Helper()
	m := newEcho("meta-of-" + name)
	tn := startWith(t, name, m, keys, peers...)
	tn.m = m
	return tn
}

// startWith runs a LeaseNode on loopback with machine m.
func startWith(t *testing.T, name string, m leaseMachine, keys [][]byte, peers ...string) testNode {
	t.Helper()
	reg := prometheus.NewRegistry()
	n, err := newLeaseWith(LeaseConfig{
		Cluster: Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), Peers: peers, Keys: keys, Insecure: len(keys) == 0,
			StateDir: t.TempDir(), Timings: DefaultTimings(), LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }},
	}, discard(), reg, func(lease.Config, []byte, time.Time) (leaseMachine, error) { return m, nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- n.Run(ctx, func([]LeaseDecision) {}) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-errc
			_ = n.Close()
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return testNode{n: n, stop: stop, reg: reg}
}

// Messages go over memberlist's encrypted transport both ways (UDP when
// small, TCP when large), reach the other machine as Receive with the
// sender's name, and the published metadata reaches the other's View.
func TestLeaseNodeTransport(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	b := startNode(t, "b", [][]byte{keyA}, a.addr())
	b.m.waitFor(t, "b to see a with its metadata", func(m *echoMachine) bool {
		for _, v := range m.views {
			for _, mb := range v.Members {
				if mb.Name == "a" && mb.Alive && string(mb.Meta) == "meta-of-a" {
					return true
				}
			}
		}
		return false
	})
	a.m.waitFor(t, "a to see b", func(m *echoMachine) bool {
		for _, v := range m.views {
			for _, mb := range v.Members {
				if mb.Name == "b" && mb.Alive {
					return true
				}
			}
		}
		return false
	})
	big := bytes.Repeat([]byte("r"), 5000)
	a.m.queue(lease.Message{To: "b", Data: []byte("small")}, lease.Message{To: "b", Data: big})
	a.n.loop.post(lease.Tick{})
	b.m.waitFor(t, "both messages at b", func(m *echoMachine) bool { return len(m.got) >= 2 })
	b.m.mu.Lock()
	got := b.m.got
	b.m.mu.Unlock()
	var small, large bool
	for _, r := range got {
		if r.From != "a" {
			t.Fatalf("from %q", r.From)
		}
		small = small || string(r.Data) == "small"
		large = large || bytes.Equal(r.Data, big)
	}
	if !small || !large {
		t.Fatalf("received %d messages, small %v large %v", len(got), small, large)
	}
	b.m.queue(lease.Message{To: "a", Data: []byte("back")})
	b.n.loop.post(lease.Tick{})
	a.m.waitFor(t, "the answer at a", func(m *echoMachine) bool { return len(m.got) == 1 && m.got[0].From == "b" })

	// A message to a node that is not a member is a send error, counted.
	a.m.queue(lease.Message{To: "nobody", Data: []byte("x")})
	a.n.loop.post(lease.Tick{})
	a.m.waitFor(t, "a step", func(m *echoMachine) bool { return len(m.out) == 0 })
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(a.n.mSendErr) < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if v := testutil.ToFloat64(a.n.mSendErr); v < 1 {
		t.Fatalf("send errors %v", v)
	}

	// Stopping b: a sees it leave.
	if err := b.stop(); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("run: %v", err)
	}
	a.m.waitFor(t, "a to see b gone", func(m *echoMachine) bool {
		v := m.views[len(m.views)-1]
		for _, mb := range v.Members {
			if mb.Name == "b" {
				return !mb.Alive
			}
		}
		return false
	})
}

// Gossip is authenticated: a node with another key, or none, cannot join,
// and its messages never reach the machine, even sent straight to the port.
func TestLeaseNodeRejectsOtherKeys(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	for _, tc := range []struct {
		name string
		keys [][]byte
	}{{"other-key", [][]byte{keyB}}, {"no-key", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			x := startNode(t, tc.name, tc.keys, a.addr())
			host, port, _ := net.SplitHostPort(a.addr())
			var p int
			for _, c := range port {
				p = p*10 + int(c-'0')
			}
			target := &memberlist.Node{Name: "a", Addr: net.ParseIP(host), Port: uint16(p)}
			msg, _ := encodeLease(tc.name, []byte("forged"))
			if err := x.n.ml.SendBestEffort(target, msg); err != nil {
				t.Fatal(err)
			}
			if err := x.n.ml.SendReliable(target, append(msg, bytes.Repeat([]byte("z"), 2000)...)); err != nil {
				t.Logf("reliable send refused: %v", err)
			}
			// A keyed member's message sent after the forged ones arrives;
			// the forged ones must not have.
			good := startNode(t, tc.name+"-good", [][]byte{keyA}, a.addr())
			good.m.waitFor(t, "good to join a", func(m *echoMachine) bool { return good.n.ml.NumMembers() >= 2 })
			good.m.queue(lease.Message{To: "a", Data: []byte("real")})
			good.n.loop.post(lease.Tick{})
			a.m.waitFor(t, "the keyed member's message", func(m *echoMachine) bool {
				for _, r := range m.got {
					if r.From == tc.name+"-good" {
						return true
					}
				}
				return false
			})
			a.m.mu.Lock()
			defer a.m.mu.Unlock()
			for _, r := range a.m.got {
				if r.From == tc.name {
					t.Fatalf("a message from %s (%s) reached the machine", tc.name, r.Data[:6])
				}
			}
			if x.n.ml.NumMembers() != 1 {
				t.Fatalf("%s joined a cluster with another key: %d members", tc.name, x.n.ml.NumMembers())
			}
		})
	}
}

// Garbage and oversized user messages are dropped and counted, never
// handed to the machine.
func TestLeaseNodeDropsGarbage(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	d := (*leaseDelegate)(a.n)
	for _, msg := range [][]byte{nil, {leaseTag}, []byte("H{}"), append([]byte{leaseTag, 1, 1, 'a'}, make([]byte, maxLeaseMessage)...)} {
		d.NotifyMsg(msg)
	}
	self, _ := encodeLease("a", []byte("loop"))
	d.NotifyMsg(self) // this node's own name: a forgery or a loop
	if v := testutil.ToFloat64(a.n.mRecvBad); v != 5 {
		t.Fatalf("dropped %v, want 5", v)
	}
	a.n.loop.post(lease.Tick{})
	a.m.waitFor(t, "a step", func(m *echoMachine) bool { return true })
	a.m.mu.Lock()
	defer a.m.mu.Unlock()
	if len(a.m.got) != 0 {
		t.Fatalf("garbage reached the machine: %v", a.m.got)
	}
}

// transferMachine holds intVIP until it is asked to transfer or leave;
// then (unless stuck) it lets go and reports b as the holder.
type transferMachine struct {
	mu      sync.Mutex
	stuck   bool
	moved   bool
	removed bool
	asked   []string
}

func (m *transferMachine) Step(now time.Time, ev lease.Event) lease.Output {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e := ev.(type) {
	case lease.Transfer:
		m.asked = append(m.asked, "transfer to "+e.To)
		m.moved = !m.stuck
	case lease.Leave:
		m.asked = append(m.asked, "leave")
		m.moved, m.removed = !m.stuck, !m.stuck
	}
	out := lease.Output{Holds: map[string]time.Time{}, Next: now.Add(20 * time.Millisecond)}
	if !m.moved {
		out.Holds[intVIP] = now.Add(time.Second)
	}
	return out
}

func (m *transferMachine) Status() lease.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	holder := "a"
	if m.moved {
		holder = "b"
	}
	return lease.Status{Leader: holder, Holders: map[string]string{intVIP: holder}, Removed: m.removed, Voters: []string{"a", "b"}}
}

// vipd handover and SIGTERM: Transfer and Leave reach the machine; the
// call returns once another node holds the address, with the time taken;
// a successor that never takes it is reported at the deadline; the
// election stopping during a transfer ends the wait at once.
func TestLeaseNodeHandOver(t *testing.T) {
	m := &transferMachine{}
	a := startWith(t, "a", m, [][]byte{keyA})
	a.n.mu.Lock()
	a.n.want[lease.ControlPlane] = []lease.Address{{Key: intVIP, Kind: lease.ControlPlane}}
	a.n.members["b"] = lease.Member{Name: "b", Alive: true, Meta: []byte(`{"lv":1,"h":true}`)}
	a.n.mu.Unlock()
	waitHeld := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; {
			if _, h, _ := a.n.loop.snapshot(); len(h) == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("never held")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitHeld()
	rs, err := a.n.HandOver(context.Background(), nil, "b", false)
	if err != nil || len(rs) != 1 || !rs[0].OK || rs[0].To != "b" || rs[0].VIP != intVIP {
		t.Fatalf("handover: %+v %v", rs, err)
	}

	m.mu.Lock()
	m.moved, m.stuck = false, true
	m.mu.Unlock()
	a.n.loop.post(lease.Tick{})
	waitHeld()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	rs, err = a.n.HandOver(ctx, nil, "", true)
	cancel()
	if err == nil || len(rs) != 1 || rs[0].OK || !strings.Contains(rs[0].Reason, "still held here") {
		t.Fatalf("stuck leave: %+v %v", rs, err)
	}

	// Stop during a transfer: the wait ends with the election.
	done := make(chan error, 1)
	go func() {
		_, err := a.n.HandOver(context.Background(), nil, "", false)
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; { // the transfer is under way (the machine is stuck)
		m.mu.Lock()
		n := len(m.asked)
		m.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the transfer never reached the machine")
		}
		time.Sleep(time.Millisecond)
	}
	if err := a.stop(); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("run: %v", err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stopped during the handover") {
			t.Fatalf("handover after the stop: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handover still waits after the election stopped")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if strings.Join(m.asked, ", ") != "transfer to b, leave, transfer to " {
		t.Fatalf("machine asked %v", m.asked)
	}
}

// The metrics follow the machine's status and the holds.
func TestLeaseNodeMetrics(t *testing.T) {
	m := &transferMachine{}
	a := startWith(t, "a", m, [][]byte{keyA})
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, h, _ := a.n.loop.snapshot(); len(h) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never held")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n, err := testutil.GatherAndCount(a.reg, "vipd_lease_remaining_seconds")
	if err != nil || n != 1 {
		t.Fatalf("remaining series %d %v", n, err)
	}
	if v := testutil.ToFloat64(leaseRemaining{a.n}); v <= 0 || v > 1 {
		t.Fatalf("remaining %v s, want in (0, 1]", v)
	}
	if v := testutil.ToFloat64(a.n.mLeader); v != 1 {
		t.Fatalf("leader %v", v)
	}
	doc := a.n.Status().(LeaseStatusDoc)
	if doc.Election != "lease" || doc.Leader != "a" || doc.Holders[intVIP] != "a" || len(doc.Holds) != 1 {
		t.Fatalf("status %+v", doc)
	}
}

// vipd handover refuses, in one line and before anything moves, a VIP
// this node does not have, a successor that is not a member, this node,
// a witness, or a voter whose apiserver is unhealthy.
func TestLeaseNodeHandOverRefusals(t *testing.T) {
	m := &transferMachine{}
	a := startWith(t, "a", m, [][]byte{keyA})
	a.n.mu.Lock()
	a.n.want[lease.ControlPlane] = []lease.Address{{Key: intVIP, Kind: lease.ControlPlane}}
	a.n.members["b"] = lease.Member{Name: "b", Alive: true, Meta: []byte(`{"lv":1,"h":true}`)}
	a.n.members["u"] = lease.Member{Name: "u", Alive: true, Meta: []byte(`{"lv":1}`)}
	a.n.members["w"] = lease.Member{Name: "w", Alive: true}
	a.n.mu.Unlock()
	for _, tc := range []struct {
		vips []string
		to   string
		want string
	}{
		{[]string{"10.9.9.9/32"}, "", "10.9.9.9/32 is not one of this node's VIPs"},
		{nil, "n9", "no member named n9 (members: b, u, w)"},
		{nil, "a", "a is this node"},
	} {
		rs, err := a.n.HandOver(context.Background(), tc.vips, tc.to, false)
		if err != nil || len(rs) != 1 || !rs[0].Refused || !strings.Contains(rs[0].Reason, tc.want) {
			t.Errorf("handover %v to %q: %+v %v, want a refusal containing %q", tc.vips, tc.to, rs, err, tc.want)
		}
	}
	st := lease.Status{Witnesses: []string{"w"}, Voters: []string{"a", "b", "w"}}
	if rs := a.n.refuseHandover(st, nil, []string{intVIP}, "w", false, time.Now()); len(rs) != 1 || !strings.Contains(rs[0].Reason, "w is a witness") {
		t.Errorf("to a witness: %+v", rs)
	}
	st.Voters = append(st.Voters, "u")
	if rs := a.n.refuseHandover(st, nil, []string{intVIP}, "u", false, time.Now()); len(rs) != 1 || !strings.Contains(rs[0].Reason, "u is not eligible: its apiserver is unhealthy") {
		t.Errorf("to an unhealthy voter: %+v", rs)
	}
	if rs := a.n.refuseHandover(st, nil, []string{intVIP}, "b", false, time.Now()); len(rs) != 0 {
		t.Errorf("to a healthy voter: %+v", rs)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.asked) != 0 {
		t.Fatalf("a refused handover reached the machine: %v", m.asked)
	}
}

// Another node gossiping under this node's name (a cloned VM) shows as
// vipd_cluster_name_conflict 1 (alert VIPDDuplicateNodeName) for
// ConflictHold after the last clash, then 0 again; a clash between two
// other nodes does not count.
func TestLeaseNodeNameConflictMetric(t *testing.T) {
	a := startNode(t, "a", [][]byte{keyA})
	gauge := func() float64 {
		t.Helper()
		mfs, err := a.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "vipd_cluster_name_conflict" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("vipd_cluster_name_conflict not registered")
		return 0
	}
	if v := gauge(); v != 0 {
		t.Fatalf("before any clash: %v", v)
	}
	other := &memberlist.Node{Name: "b", Addr: net.ParseIP("127.0.0.9"), Port: 7950}
	(*leaseConflicts)(a.n).NotifyConflict(other, &memberlist.Node{Name: "b", Addr: net.ParseIP("127.0.0.10"), Port: 7950})
	if v := gauge(); v != 0 {
		t.Fatalf("a clash between two other nodes: %v", v)
	}
	clone := &memberlist.Node{Name: "a", Addr: net.ParseIP("127.0.0.9"), Port: 7950}
	(*leaseConflicts)(a.n).NotifyConflict(clone, clone)
	if v := gauge(); v != 1 {
		t.Fatalf("after a clash with this node's name: %v", v)
	}
	now := time.Now()
	if !a.n.nameConflict(now.Add(ConflictHold-time.Second)) || a.n.nameConflict(now.Add(ConflictHold+time.Second)) {
		t.Fatal("the clash must count for ConflictHold and no longer")
	}
}
