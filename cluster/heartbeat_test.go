package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestHeartbeatsTracker(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 40 * time.Millisecond, Misses: 4}
	dl := cfg.Deadline()
	ms := time.Millisecond
	type step struct {
		at    time.Duration
		watch []string // nil: no Watch call
		heard string
		want  []HolderSilent
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a silent claimant is reported once, at the deadline", []step{
			{at: 0, watch: []string{"a"}},
			{at: dl - ms},
			{at: dl, want: []HolderSilent{{Name: "a", Silent: true}}},
			{at: dl + 100*ms},
		}},
		{"each heartbeat pushes the deadline", []step{
			{at: 0, watch: []string{"a"}},
			{at: 40 * ms, heard: "a"},
			{at: 80 * ms, heard: "a"},
			{at: 80*ms + dl - ms},
			{at: 80*ms + dl, want: []HolderSilent{{Name: "a", Silent: true}}},
		}},
		{"a heartbeat after silence withdraws the verdict; the next deadline is twice that gap", []step{
			{at: 0, watch: []string{"a"}},
			{at: dl, want: []HolderSilent{{Name: "a", Silent: true}}},
			{at: dl + 5*ms, heard: "a", want: []HolderSilent{{Name: "a", Silent: false}}},
			{at: 3*(dl+5*ms) - ms},
			{at: 3 * (dl + 5*ms), want: []HolderSilent{{Name: "a", Silent: true}}},
		}},
		{"heartbeats from a member that claims nothing here are ignored", []step{
			{at: 0, heard: "x"},
			{at: 10 * ms, watch: []string{"x"}}, // its claim arrives: armed now, not at the heartbeat
			{at: 10*ms + dl - ms},
			{at: 10*ms + dl, want: []HolderSilent{{Name: "x", Silent: true}}},
		}},
		{"a claimant that stops claiming is dropped; a silent one is withdrawn", []step{
			{at: 0, watch: []string{"a", "b"}},
			{at: dl, want: []HolderSilent{{Name: "a", Silent: true}, {Name: "b", Silent: true}}},
			{at: dl + ms, watch: []string{"b"}, want: []HolderSilent{{Name: "a", Silent: false}}},
			{at: dl + 2*ms, heard: "a"},
		}},
		{"a new claimant gets a full deadline from when it is seen", []step{
			{at: 0, watch: []string{"a"}},
			{at: dl / 2, watch: []string{"a", "b"}},
			{at: dl, want: []HolderSilent{{Name: "a", Silent: true}}},
			{at: dl/2 + dl, want: []HolderSilent{{Name: "b", Silent: true}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHeartbeats(cfg)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				var got []HolderSilent
				if s.watch != nil {
					got = append(got, h.Watch(s.watch, now)...)
				}
				if s.heard != "" {
					got = append(got, h.Heard(s.heard, now)...)
				}
				got = append(got, h.Expire(now)...)
				if !slices.Equal(got, s.want) {
					t.Fatalf("step %d at %v: got %v, want %v", i, s.at, got, s.want)
				}
				if n := h.Next(); !n.IsZero() && !n.After(now) {
					t.Fatalf("step %d: next deadline %v is not after now", i, n.Sub(t0))
				}
			}
		})
	}
}

// TestHeartbeatsStalled: when this node itself did not run for a while,
// the heartbeats queued meanwhile get one interval to be read before a
// claimant is found silent.
func TestHeartbeatsStalled(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 40 * time.Millisecond, Misses: 5}
	h := NewHeartbeats(cfg)
	h.Watch([]string{"a"}, t0)
	late := t0.Add(400 * time.Millisecond) // the timer due at t0+200ms fires 200ms late
	h.Stalled(t0.Add(200*time.Millisecond), late)
	if ev := h.Expire(late); ev != nil {
		t.Fatalf("silent right after our own stall: %v", ev)
	}
	if ev := h.Expire(late.Add(cfg.Interval)); len(ev) != 1 || !ev[0].Silent {
		t.Fatalf("still silent one interval after the stall: %v", ev)
	}
	// A timer on time changes nothing.
	h = NewHeartbeats(cfg)
	h.Watch([]string{"a"}, t0)
	h.Stalled(t0.Add(200*time.Millisecond), t0.Add(210*time.Millisecond))
	if ev := h.Expire(t0.Add(210 * time.Millisecond)); len(ev) != 1 {
		t.Fatalf("a timer 10ms late must not delay the verdict: %v", ev)
	}
}

// TestHeartbeatsAdaptive: after a long gap the claimant's deadline
// stretches to twice that gap (at most MaxDeadlineFactor times the
// configured one), then shrinks back with regular heartbeats.
func TestHeartbeatsAdaptive(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 40 * time.Millisecond, Misses: 5}
	h := NewHeartbeats(cfg)
	h.Watch([]string{"a"}, t0)
	now := t0
	beat := func(d time.Duration) []HolderSilent {
		now = now.Add(d)
		return append(h.Expire(now), h.Heard("a", now)...)
	}
	for i := 0; i < 10; i++ {
		if ev := beat(cfg.Interval); ev != nil {
			t.Fatal(ev)
		}
	}
	if d := h.Deadline("a"); d != cfg.Deadline() {
		t.Fatalf("regular heartbeats: deadline %v, want the configured %v", d, cfg.Deadline())
	}
	// A 250 ms stall: found silent at 200 ms, heard again at 250 ms.
	if ev := beat(250 * time.Millisecond); len(ev) != 2 || !ev[0].Silent || ev[1].Silent {
		t.Fatalf("stall: %v", ev)
	}
	if d := h.Deadline("a"); d != 500*time.Millisecond {
		t.Fatalf("after a 250 ms gap: deadline %v, want 500ms", d)
	}
	// The next, similar stall is absorbed.
	if ev := beat(250 * time.Millisecond); ev != nil {
		t.Fatalf("second stall: %v", ev)
	}
	// A real silence is still found, at the stretched deadline.
	if ev := h.Expire(now.Add(499 * time.Millisecond)); ev != nil {
		t.Fatal(ev)
	}
	if ev := h.Expire(now.Add(500 * time.Millisecond)); len(ev) != 1 {
		t.Fatalf("silence past the stretched deadline: %v", ev)
	}
	h.Heard("a", now.Add(501*time.Millisecond))
	now = now.Add(501 * time.Millisecond)
	if d := h.Deadline("a"); d != MaxDeadlineFactor*cfg.Deadline() {
		t.Fatalf("after a 501 ms gap: deadline %v, want the cap %v", d, MaxDeadlineFactor*cfg.Deadline())
	}
	// Regular heartbeats bring it back within about 30 s.
	for i := 0; i < 750; i++ {
		beat(cfg.Interval)
	}
	if d := h.Deadline("a"); d != cfg.Deadline() {
		t.Fatalf("after 30 s of regular heartbeats: deadline %v", d)
	}
}

func TestHeartbeatsOff(t *testing.T) {
	h := NewHeartbeats(HeartbeatConfig{})
	if ev := h.Watch([]string{"a"}, t0); ev != nil {
		t.Fatal(ev)
	}
	if ev := h.Expire(t0.Add(time.Hour)); ev != nil || !h.Next().IsZero() {
		t.Fatalf("a tracker without heartbeats reported %v, next %v", ev, h.Next())
	}
}

func TestHeartbeatCodec(t *testing.T) {
	b := encodeHeartbeat("cp-1", 42)
	name, term, err := decodeHeartbeat(b)
	if err != nil || name != "cp-1" || term != 42 {
		t.Fatalf("%q %d %v", name, term, err)
	}
	for _, bad := range [][]byte{nil, {heartbeatMagic}, b[:10], append([]byte{0x01}, b[1:]...), append([]byte{heartbeatMagic, 9}, b[2:]...),
		append(b[:10:10], bytes.Repeat([]byte("x"), 256)...)} {
		if _, _, err := decodeHeartbeat(bad); err == nil {
			t.Errorf("decoded %x", bad)
		}
	}
}

// TestElectionHolderSilent: a silent holder is replaced at once, without
// waiting for memberlist to declare it dead; a suspect one is not.
func TestElectionHolderSilent(t *testing.T) {
	all := counts("n1", "n2", "n3")
	view := func(n2 State) ViewChanged {
		return ViewChanged{Members: []Member{
			peer("n1", Alive, Meta{}),
			peer("n2", n2, Meta{Healthy: true, Eligible: true, Term: 5, Holding: []string{vip1}, Counts: all}),
			peer("n3", Alive, Meta{Healthy: true, Eligible: true, Counts: all}),
		}}
	}
	start := func() *Election {
		e := newEl("n1", "n2", "n3")
		e.Step(HealthChanged{Healthy: true}, t0)
		e.Step(view(Alive), t0)
		out := e.Step(Tick{}, t0.Add(3*time.Second))
		if d := e.decisions[vip1]; d.Leader != "n2" || d.Holder {
			t.Fatalf("before: %+v %+v", d, out)
		}
		return e
	}
	at := t0.Add(4 * time.Second)

	e := start()
	e.Step(view(Suspect), at)
	if d := e.decisions[vip1]; d.Leader != "n2" || d.Holder {
		t.Fatalf("suspect holder without a heartbeat verdict: %+v (must wait for the failure detector)", d)
	}
	out := e.Step(HolderSilent{Name: "n2", Silent: true}, at)
	d, changed := decision(out, vip1)
	if !changed || d.Leader == "n2" || d.Leader == "" {
		t.Fatalf("silent holder: decision %+v changed=%v, want a new leader at once", d, changed)
	}
	if !slices.ContainsFunc(out.Logs, func(l LogLine) bool {
		return l.Warn && l.Msg[:len("holder heartbeats stopped")] == "holder heartbeats stopped"
	}) {
		t.Fatalf("no log line for the verdict: %+v", out.Logs)
	}
	if q := e.Status(at).Quorum; !q.OK || q.Alive != 2 {
		t.Fatalf("quorum without the silent holder: %+v", q)
	}
	leader := d.Leader
	// Heard again: the verdict is withdrawn; a claim made meanwhile (a
	// higher term) stands, else n2 keeps the VIP.
	out = e.Step(HolderSilent{Name: "n2", Silent: false}, at.Add(time.Millisecond))
	if d := e.decisions[vip1]; leader == "n1" && d.Leader != "n1" || leader == "n3" && d.Leader != "n2" {
		t.Fatalf("after the heartbeat resumed: %+v (leader during silence %s) %+v", d, leader, out)
	}

	// A verdict about this node itself is ignored.
	e = start()
	e.Step(HolderSilent{Name: "n1", Silent: true}, at)
	if q := e.Status(at).Quorum; q.Alive != 3 {
		t.Fatalf("self silenced: %+v", q)
	}
}

// TestHeartbeatOtherKeyIgnored sends heartbeats over memberlist's real
// transport on loopback: one under the cluster's key is heard; one under
// another key is dropped by memberlist and never keeps a silent holder
// alive.
func TestHeartbeatOtherKeyIgnored(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	other := bytes.Repeat([]byte{2}, 32)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rx, err := New(Config{Name: "rx", Bind: netip.MustParseAddrPort("127.0.0.1:0"), Keys: [][]byte{key}, StateDir: t.TempDir(),
		VIPs: []string{vip1}, Heartbeat: FastHeartbeat(), LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rx.ml.Shutdown()
	to := &memberlist.Node{Name: "rx", Addr: net.ParseIP("127.0.0.1"), Port: rx.ml.LocalNode().Port}

	sender := func(name string, k []byte) *memberlist.Memberlist {
		mc := memberlist.DefaultLANConfig()
		mc.Name, mc.BindAddr, mc.BindPort = name, "127.0.0.1", 0
		mc.LogOutput = io.Discard
		ring, err := memberlist.NewKeyring([][]byte{k}, k)
		if err != nil {
			t.Fatal(err)
		}
		mc.Keyring, mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = ring, true, true
		ml, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ml.Shutdown() })
		return ml
	}
	armed := time.Now()
	rx.hb.mu.Lock()
	rx.hb.hb.Watch([]string{"good", "forged"}, armed)
	rx.hb.mu.Unlock()
	good, forged := sender("good", key), sender("forged", other)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := good.SendBestEffort(to, encodeHeartbeat("good", 1)); err != nil {
			t.Fatal(err)
		}
		if err := forged.SendBestEffort(to, encodeHeartbeat("forged", 1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		rx.hb.mu.Lock()
		heardGood := rx.hb.hb.last["good"].After(armed)
		rx.hb.mu.Unlock()
		if heardGood || time.Now().After(deadline) {
			break
		}
	}
	// Keep sending both for a while longer: the forged one never counts.
	for i := 0; i < 10; i++ {
		_ = forged.SendBestEffort(to, encodeHeartbeat("forged", 1))
		time.Sleep(10 * time.Millisecond)
	}
	rx.hb.mu.Lock()
	defer rx.hb.mu.Unlock()
	if !rx.hb.hb.last["good"].After(armed) {
		t.Fatal("a heartbeat under the cluster's key was not heard")
	}
	if !rx.hb.hb.last["forged"].Equal(armed) {
		t.Fatal("a heartbeat under another key was heard")
	}
	lost := rx.hb.hb.Expire(armed.Add(FastHeartbeat().Deadline()))
	if !slices.Contains(lost, HolderSilent{Name: "forged", Silent: true}) {
		t.Fatalf("the member heard only under another key is not silent: %v", lost)
	}
}

// TestHeartbeatsTermGaps: only gaps between heartbeats of one claim (one
// term) stretch the deadline; the wait for a claim's first heartbeat and
// the pause of a claimant that released and claimed again do not.
func TestHeartbeatsTermGaps(t *testing.T) {
	cfg := HeartbeatConfig{Interval: 40 * time.Millisecond, Misses: 4}
	dl := cfg.Deadline()
	ms := time.Millisecond
	type hb struct {
		at   time.Duration
		term uint64
	}
	for _, tc := range []struct {
		name  string
		beats []hb
		want  time.Duration // the deadline after the last heartbeat
	}{
		{"regular heartbeats of one claim: the configured deadline", []hb{{40 * ms, 7}, {80 * ms, 7}, {120 * ms, 7}}, dl},
		{"a stall within one claim stretches it to twice the gap", []hb{{40 * ms, 7}, {140 * ms, 7}, {180 * ms, 7}}, 2 * (100*ms - (100*ms-40*ms)/gapDecay)},
		{"a long wait for the first heartbeat is not a stall", []hb{{150 * ms, 7}, {190 * ms, 7}}, dl},
		{"release and claim again (a new term) is not a stall", []hb{{40 * ms, 7}, {80 * ms, 7}, {580 * ms, 8}, {620 * ms, 8}}, dl},
		{"after a new term, stalls count again", []hb{{40 * ms, 7}, {580 * ms, 8}, {700 * ms, 8}}, 2 * 120 * ms},
		{"an old sender without terms (Heard): every gap counts", []hb{{150 * ms, 0}}, 2 * 150 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHeartbeats(cfg)
			h.Watch([]string{"a"}, t0)
			for _, b := range tc.beats {
				now := t0.Add(b.at)
				if got := h.HeardTerm("a", b.term, now); len(got) != 0 {
					t.Fatalf("at %v: verdicts %v", b.at, got)
				}
			}
			if got := h.Deadline("a"); got != tc.want {
				t.Fatalf("deadline %v, want %v", got, tc.want)
			}
			last := t0.Add(tc.beats[len(tc.beats)-1].at)
			if evs := h.Expire(last.Add(tc.want - ms)); len(evs) != 0 {
				t.Fatalf("silent before the deadline: %v", evs)
			}
			if evs := h.Expire(last.Add(tc.want)); !slices.Equal(evs, []HolderSilent{{Name: "a", Silent: true}}) {
				t.Fatalf("at the deadline: %v", evs)
			}
		})
	}
}
