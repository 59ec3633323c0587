package cluster

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var (
	t0   = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	vip1 = "10.0.0.100/32"
)

// peer is a member as seen by the election under test.
func peer(name string, st State, meta Meta) Member { return Member{Name: name, State: st, Meta: meta} }

func counts(names ...string) Hashes {
	var h Hashes
	for _, n := range names {
		h = append(h, NameHash(n))
	}
	return h
}

func newEl(known ...string) *Election {
	k := Known{Members: map[string]KnownMember{}}
	for _, n := range known {
		k.Members[n] = KnownMember{}
	}
	return NewElection(ElectionConfig{Name: "n1", VIPs: []string{vip1}, Peers: true, MemberExpiry: time.Minute}, k, t0)
}

func decision(out Output, vip string) (Decision, bool) {
	for _, d := range out.Decisions {
		if d.VIP == vip {
			return d.Decision, true
		}
	}
	return Decision{}, false
}

func TestElectionBootstrap(t *testing.T) {
	tests := []struct {
		name   string
		events func(e *Election) Output
		holder bool
		lone   bool
		reason string
	}{
		{"waits for configured peers before holding alone", func(e *Election) Output {
			return e.Step(HealthChanged{Healthy: true}, t0.Add(time.Second))
		}, false, false, ""},
		{"holds alone after the grace, marked lone", func(e *Election) Output {
			e.Step(HealthChanged{Healthy: true}, t0.Add(time.Second))
			return e.Step(Tick{}, t0.Add(BootstrapGrace))
		}, true, true, "elected"},
		{"never alone after a key mismatch", func(e *Election) Output {
			e.Step(KeyMismatch{}, t0.Add(time.Second))
			e.Step(HealthChanged{Healthy: true}, t0.Add(time.Second))
			return e.Step(Tick{}, t0.Add(BootstrapGrace+time.Second))
		}, false, false, ""},
		{"alone again a minute after the last key mismatch", func(e *Election) Output {
			e.Step(KeyMismatch{}, t0.Add(time.Second))
			e.Step(HealthChanged{Healthy: true}, t0.Add(time.Second))
			return e.Step(Tick{}, t0.Add(time.Second+KeyVeto))
		}, true, true, ""},
		{"a name conflict makes the node ineligible", func(e *Election) Output {
			e.Step(HealthChanged{Healthy: true}, t0)
			e.Step(Tick{}, t0.Add(BootstrapGrace))
			return e.Step(NameConflict{Addr: "10.0.0.9:7950"}, t0.Add(3*time.Second))
		}, false, false, "not eligible"},
		{"eligible again after ConflictHold without conflicts", func(e *Election) Output {
			e.Step(HealthChanged{Healthy: true}, t0)
			e.Step(NameConflict{Addr: "10.0.0.9:7950"}, t0.Add(3*time.Second))
			return e.Step(Tick{}, t0.Add(3*time.Second+ConflictHold))
		}, true, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEl()
			tt.events(e)
			d := e.decisions[vip1]
			if d.Holder != tt.holder || d.Lone != tt.lone || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("decision %+v, want holder=%v lone=%v reason~%q", d, tt.holder, tt.lone, tt.reason)
			}
		})
	}
}

func TestElectionMembership(t *testing.T) {
	alive3 := func(e *Election, at time.Time) Output {
		return e.Step(ViewChanged{Members: []Member{
			peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")}),
			peer("n3", Alive, Meta{Counts: counts("n1", "n2", "n3")}),
		}}, at)
	}
	tests := []struct {
		name  string
		known []string
		steps func(e *Election)
		want  []string
		ok    bool
	}{
		{"a bootstrapping node admits whoever it sees", nil, func(e *Election) { alive3(e, t0) }, []string{"n1", "n2", "n3"}, true},
		{"a node with quorum admits a new member", []string{"n1", "n2", "n3"}, func(e *Election) {
			alive3(e, t0)
			e.Step(ViewChanged{Members: []Member{
				peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")}), peer("n3", Alive, Meta{Counts: counts("n1", "n2", "n3")}),
				peer("n4", Alive, Meta{Counts: counts("n4")}),
			}}, t0.Add(time.Second))
		}, []string{"n1", "n2", "n3", "n4"}, true},
		{"a node without quorum admits nobody (minority side)", []string{"n1", "n2", "n3"}, func(e *Election) {
			e.Step(ViewChanged{Members: []Member{peer("n4", Alive, Meta{Counts: counts("n4")})}}, t0)
		}, []string{"n1", "n2", "n3"}, false},
		{"a graceful leave is forgotten at once", []string{"n1", "n2", "n3"}, func(e *Election) {
			alive3(e, t0)
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}, Left: []string{"n3"}}, t0.Add(time.Second))
		}, []string{"n1", "n2"}, true},
		// sim seed 141: n3's machine is gone (dead, not yet expired), n2
		// restarts; n1, left with {n1, n3}, has no quorum and could never
		// admit n2 again: the VIP was lost for good although n1 and n2 are
		// a majority of the three.
		{"a member that left is counted again when back, even without quorum", []string{"n1", "n2", "n3"}, func(e *Election) {
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0)
			e.Step(ViewChanged{Left: []string{"n2"}}, t0.Add(time.Second))
			if e.Status(t0).Quorum.OK {
				panic("n1 alone of {n1, n3} has quorum")
			}
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0.Add(3*time.Second))
		}, []string{"n1", "n2", "n3"}, true},
		{"a restart whose leave arrives after the rejoin", []string{"n1", "n2", "n3"}, func(e *Election) {
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0)
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n2")})}, Left: []string{"n2"}}, t0.Add(time.Second))
		}, []string{"n1", "n2", "n3"}, true},
		{"a member forgotten by vipd forget after it left is not counted when back", []string{"n1", "n2", "n3"}, func(e *Election) {
			e.Step(ViewChanged{Left: []string{"n2"}}, t0.Add(time.Second))
			e.Forgotten(Known{Members: map[string]KnownMember{"n1": {}, "n3": {}}})
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n2")})}}, t0.Add(3*time.Second))
		}, []string{"n1", "n3"}, false},
		{"the tombstone goes MemberExpiry after the leave, with quorum", []string{"n1", "n2", "n3", "n4"}, func(e *Election) {
			v := []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")}), peer("n3", Alive, Meta{Counts: counts("n1", "n2", "n3")})}
			e.Step(ViewChanged{Members: v, Left: []string{"n4"}}, t0)
			e.Step(ViewChanged{Members: v}, t0.Add(time.Minute))
			// n2 and n3 die: n1 has no quorum; n4 is back after its tombstone went.
			e.Step(ViewChanged{Members: []Member{peer("n4", Alive, Meta{Counts: counts("n4")})}}, t0.Add(time.Minute+time.Second))
		}, []string{"n1", "n2", "n3"}, false},
		{"a dead member is forgotten after the expiry, with quorum", []string{"n1", "n2", "n3"}, func(e *Election) {
			alive3(e, t0)
			for at := time.Second; at <= 62*time.Second; at += time.Second {
				e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0.Add(at))
			}
		}, []string{"n1", "n2"}, true},
		{"not before the expiry", []string{"n1", "n2", "n3"}, func(e *Election) {
			alive3(e, t0)
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0.Add(59*time.Second))
		}, []string{"n1", "n2", "n3"}, true},
		{"never without quorum", []string{"n1", "n2", "n3"}, func(e *Election) {
			for at := time.Second; at <= 10*time.Minute; at += 10 * time.Second {
				e.Step(Tick{}, t0.Add(at))
			}
		}, []string{"n1", "n2", "n3"}, false},
		{"members that removed us do not count", []string{"n1", "n2", "n3"}, func(e *Election) {
			e.Step(ViewChanged{Members: []Member{
				peer("n2", Alive, Meta{Counts: counts("n2", "n3")}), peer("n3", Alive, Meta{Counts: counts("n2", "n3")}),
			}}, t0)
		}, []string{"n1", "n2", "n3"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEl(tt.known...)
			tt.steps(e)
			st := e.Status(t0)
			if !slices.Equal(st.Known, tt.want) || st.Quorum.OK != tt.ok {
				t.Fatalf("known %v quorum %+v, want %v ok=%v", st.Known, st.Quorum, tt.want, tt.ok)
			}
		})
	}
}

func TestElectionStepAside(t *testing.T) {
	e := newEl("n1", "n2", "n3")
	view := ViewChanged{Members: []Member{
		peer("n2", Alive, Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")}),
		peer("n3", Alive, Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")}),
	}}
	e.Step(view, t0)
	e.cfg.Priority, e.meta.Priority = 100, 100 // n1 ranks first
	e.Step(HealthChanged{Healthy: true}, t0)
	base := t0.Add(RestartSettle) // every known member in view: a restart's short settle
	out := e.Step(Tick{}, base)
	if d, _ := decision(out, vip1); !d.Holder {
		t.Fatalf("n1 should rank first: %+v", d)
	}
	out = e.Step(AcquireFailed{VIP: vip1, Reason: "eth1 down"}, base.Add(10*time.Millisecond))
	d, _ := decision(out, vip1)
	if d.Holder || out.Meta == nil || !out.Meta.CannotHold(vip1) || out.Meta.Holds(vip1) {
		t.Fatalf("after a failed acquire: %+v meta %+v", d, out.Meta)
	}
	// The others skip n1 while it says it cannot hold the VIP.
	other := Decide(View{Self: "n2", Members: []Member{
		{Name: "n1", State: Alive, Meta: *out.Meta},
		{Name: "n2", State: Alive, Meta: Meta{Eligible: true}},
		{Name: "n3", State: Alive, Meta: Meta{Eligible: true}},
	}}, vip1)
	if other.Leader == "n1" {
		t.Fatalf("n2 still waits for n1: %+v", other)
	}
	// Back-off doubles on repeated failures.
	e.Step(Tick{}, base.Add(StepAsideMin+20*time.Millisecond))
	out = e.Step(AcquireFailed{VIP: vip1, Reason: "again"}, base.Add(StepAsideMin+30*time.Millisecond))
	if b := e.broken[vip1]; b.until.Sub(base.Add(StepAsideMin+30*time.Millisecond)) != 2*StepAsideMin {
		t.Fatalf("second back-off %v", b.until.Sub(base.Add(StepAsideMin+30*time.Millisecond)))
	}
}

// TestElectionQuorumSettle: a node that regains quorum waits QuorumSettle
// for claims from members it has not heard yet, and only RestartSettle
// when every member it knows is in view (a restarted holder: the bench's
// kill case waited 1 s; without any settle a holder restarted before its
// crash was noticed claimed beside the node that saw it come back
// without its claim: cluster/sim TestScenarioHandover).
func TestElectionQuorumSettle(t *testing.T) {
	elig := func(n string) Member {
		return peer(n, Alive, Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")})
	}
	tests := []struct {
		name   string
		view   []Member
		at     time.Duration
		holder bool
		reason string
		beat   bool // member heartbeats (BeatQuorumSettle)
	}{
		{"all known in view (a restart): waits a little for claims made as it rejoined", []Member{elig("n2"), elig("n3")}, RestartSettle - time.Millisecond, false, "quorum regained moments ago", false},
		{"all known in view (a restart): claims after the restart settle", []Member{elig("n2"), elig("n3")}, RestartSettle, true, "", false},
		{"one known member missing: waits", []Member{elig("n2")}, 0, false, "quorum regained moments ago", false},
		{"one known member missing: claims after the settle", []Member{elig("n2")}, QuorumSettle, true, "", false},
		{"a known member suspect: waits", []Member{elig("n2"), peer("n3", Suspect, Meta{Counts: counts("n1", "n2", "n3")})}, 0, false, "quorum regained moments ago", false},
		{"a forming cluster (nobody known before): waits for members still joining", nil, 0, false, "quorum regained moments ago", false},
		{"member heartbeats, one known member missing: waits", []Member{elig("n2")}, BeatQuorumSettle - time.Millisecond, false, "quorum regained moments ago", true},
		{"member heartbeats, one known member missing: claims after the shorter settle", []Member{elig("n2")}, BeatQuorumSettle, true, "", true},
		{"member heartbeats, a restart: still the restart settle", []Member{elig("n2"), elig("n3")}, RestartSettle - time.Millisecond, false, "quorum regained moments ago", true},
		{"member heartbeats, a restart: claims after it", []Member{elig("n2"), elig("n3")}, RestartSettle, true, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEl("n1", "n2", "n3")
			view := tt.view
			if view == nil { // bootstrap: admits n2 and n3 as it sees them
				e = newEl()
				view = []Member{elig("n2"), elig("n3")}
			}
			e.cfg.Priority, e.meta.Priority = 100, 100 // n1 ranks first
			e.cfg.Beat = tt.beat
			e.Step(HealthChanged{Healthy: true}, t0)
			out := e.Step(ViewChanged{Members: view}, t0)
			if end := t0.Add(tt.at + time.Millisecond); !tt.holder && tt.at > 0 && out.Next.After(end) {
				t.Fatalf("next deadline %v, after the settle's end %v", out.Next.Sub(t0), end.Sub(t0))
			}
			e.Step(Tick{}, t0.Add(tt.at))
			d := e.decisions[vip1]
			if d.Holder != tt.holder || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("decision %+v, want holder=%v reason~%q", d, tt.holder, tt.reason)
			}
		})
	}
}

func TestTermsSaturate(t *testing.T) {
	if nextTerm(math.MaxUint64) != math.MaxUint64 || nextTerm(1) != 2 {
		t.Fatal("nextTerm wraps")
	}
	e := newEl()
	e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Term: math.MaxUint64, Counts: counts("n2")})}}, t0)
	e.claim(vip1, t0)
	if e.meta.Term != math.MaxUint64 {
		t.Fatalf("term %d", e.meta.Term)
	}
}

func TestMetaFits(t *testing.T) {
	var v4, v6 []string
	for i := 0; i < 40; i++ {
		v4 = append(v4, netip.AddrFrom4([4]byte{10, 200, byte(i), 100}).String()+"/32")
		v6 = append(v6, fmt.Sprintf("fd00:1234:5678:9abc::%x/128", 0x1000+i))
	}
	if err := MetaFits(v4[:12]); err != nil {
		t.Fatalf("12 IPv4 VIPs: %v", err)
	}
	err := MetaFits(v4)
	if err == nil || !strings.Contains(err.Error(), "VIPD_ADDRESS has 40 VIPs") {
		t.Fatalf("40 VIPs: %v", err)
	}
	if err := MetaFits(v6); err == nil {
		t.Fatal("40 IPv6 VIPs fit?")
	}
	// The limit named in the error really fits.
	var n int
	fmt.Sscanf(err.Error()[strings.Index(err.Error(), "holds ")+6:], "%d", &n)
	if n < 12 || MetaFits(v4[:n]) != nil || MetaFits(v4[:n+1]) == nil {
		t.Fatalf("limit %d is not the exact limit", n)
	}
	t.Logf("at most %d IPv4 VIPs per node", n)
}

func TestHashesJSON(t *testing.T) {
	m := Meta{Counts: counts("a", "b")}
	b, _ := json.Marshal(m)
	var back Meta
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Counts, m.Counts) {
		t.Fatalf("%s -> %+v %v", b, back, err)
	}
	if err := json.Unmarshal([]byte(`{"k":"!!"}`), &back); err == nil {
		t.Fatal("bad hashes accepted")
	}
}

func TestDropSelf(t *testing.T) {
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	tests := []struct {
		bind  string
		peers []string
		want  []string
	}{
		{"0.0.0.0:7950", []string{"10.0.0.1", "10.0.0.2", "10.0.0.3:7950"}, []string{"10.0.0.2", "10.0.0.3:7950"}},
		{"0.0.0.0:7950", []string{"10.0.0.1:7950", "[fd00::1]:7950", "fd00::1", "fd00::2"}, []string{"fd00::2"}},
		{"0.0.0.0:7950", []string{"10.0.0.1:7951"}, []string{"10.0.0.1:7951"}}, // another vipd on this host, another port
		{"10.0.0.1:7950", []string{"10.0.0.1", "127.0.0.1", "cp2.example"}, []string{"127.0.0.1", "cp2.example"}},
	}
	for _, tt := range tests {
		got, err := dropSelf(tt.peers, netip.MustParseAddrPort(tt.bind), local)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("dropSelf(%v, %s) = %v %v, want %v", tt.peers, tt.bind, got, err, tt.want)
		}
	}
}

// memberlist's own words for a key mismatch, on every path (join errors
// and log lines), whatever their case.
func TestIsKeyError(t *testing.T) {
	for _, s := range []string{
		"[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from: 10.0.0.2:7950",
		"1 error occurred:\n\t* Failed to join 10.0.0.2:7950: No installed keys could decrypt the message",
		"failed to join: Encryption is configured but remote state is not encrypted",
		"Remote state is encrypted and encryption is not configured",
	} {
		if !isKeyError(s) {
			t.Errorf("not recognised as a key mismatch: %q", s)
		}
	}
	if isKeyError("failed to join 10.0.0.2:7950: dial tcp: connection refused") {
		t.Error("connection refused taken for a key mismatch")
	}
}

// A node back from the minority side of a partition must not claim the VIP
// from a partial view: the holder on the other side may not be alive in
// its view yet (seen in the lab: a 2+1 heal dropped the VIP for 0.2-0.7 s).
func TestElectionWaitsForClaimsAfterQuorumRegained(t *testing.T) {
	e := newEl("n1", "n2", "n3")
	e.cfg.Priority, e.meta.Priority = 100, 100 // n1 would rank first
	e.Step(HealthChanged{Healthy: true}, t0)
	all := counts("n1", "n2", "n3")
	// Healed: n3 is back in the view first, n2 (the holder) not yet.
	out := e.Step(ViewChanged{Members: []Member{peer("n3", Alive, Meta{Eligible: true, Counts: all})}}, t0.Add(time.Second))
	if d, _ := decision(out, vip1); d.Holder {
		t.Fatalf("claimed from a partial view right after regaining quorum: %+v", d)
	}
	e.Step(ViewChanged{Members: []Member{
		peer("n2", Alive, Meta{Eligible: true, Counts: all, Holding: []string{vip1}, Term: 7}),
		peer("n3", Alive, Meta{Eligible: true, Counts: all}),
	}}, t0.Add(1500*time.Millisecond))
	if d := e.decisions[vip1]; d.Holder || d.Leader != "n2" {
		t.Fatalf("decision %+v, want n2 to keep it", d)
	}
	if e.meta.Holds(vip1) {
		t.Fatal("n1 claims the VIP")
	}
}

// Stepping aside leaves the VIP to the others; when none of them can take
// it (all stepping aside too, as after a segment-wide link failure), a node
// tries again StepAsideMin after its last failure instead of sitting out a
// back-off that outlives the fault.
func TestElectionStepAsideLastResort(t *testing.T) {
	for _, tc := range []struct {
		name      string
		othersOK  bool
		wantAfter bool // holder StepAsideMin after the second failure
	}{
		{"another member can hold it: keep stepping aside", true, false},
		{"nobody else can: try again", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEl("n1", "n2", "n3")
			e.cfg.Priority, e.meta.Priority = 100, 100
			other := Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")}
			if !tc.othersOK {
				other.Broken = []string{vip1}
			}
			e.Step(ViewChanged{Members: []Member{peer("n2", Alive, other), peer("n3", Alive, other)}}, t0)
			e.Step(HealthChanged{Healthy: true}, t0)
			base := t0.Add(QuorumSettle)
			e.Step(Tick{}, base)
			e.Step(AcquireFailed{VIP: vip1, Reason: "eth1 down"}, base)
			e.Step(Tick{}, base.Add(StepAsideMin))
			out := e.Step(AcquireFailed{VIP: vip1, Reason: "eth1 down"}, base.Add(StepAsideMin))
			if d := e.decisions[vip1]; d.Holder {
				t.Fatalf("holder right after a failure: %+v", d)
			}
			// Stepping aside for 2*StepAsideMin now; the timer must wake
			// the election when the last-resort rule may change its answer.
			if want := base.Add(2 * StepAsideMin); !out.Next.Equal(want) && tc.wantAfter {
				t.Fatalf("next deadline %v, want %v", out.Next.Sub(base), want.Sub(base))
			}
			e.Step(Tick{}, base.Add(2*StepAsideMin-time.Millisecond))
			if d := e.decisions[vip1]; d.Holder {
				t.Fatalf("holder before StepAsideMin passed: %+v", d)
			}
			e.Step(Tick{}, base.Add(2*StepAsideMin))
			if d := e.decisions[vip1]; d.Holder != tc.wantAfter {
				t.Fatalf("StepAsideMin after the failure: %+v, want holder=%v", d, tc.wantAfter)
			}
			if tc.wantAfter && e.meta.CannotHold(vip1) {
				t.Fatal("a last-resort holder still gossips that it cannot hold the VIP")
			}
		})
	}
}

// A name clash keeps the node out, and the others stop counting it, until
// it has seen no clash for ConflictHold while every known member is in
// view: two nodes with one name on the two sides of a partition must not
// give each side a majority, however short the clash before the partition.
func TestElectionNameConflict(t *testing.T) {
	all := Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")}
	partial := ViewChanged{Members: []Member{peer("n2", Alive, all)}} // n3 on the other side
	whole := ViewChanged{Members: []Member{peer("n2", Alive, all), peer("n3", Alive, all)}}
	for _, tc := range []struct {
		name   string
		after  ViewChanged // the view once the clash has stopped
		wait   time.Duration
		holder bool
	}{
		{"out during ConflictHold", whole, ConflictHold - QuorumSettle - time.Second, false},
		{"back after ConflictHold with every member in view", whole, ConflictHold, true},
		{"out while a member is out of view", partial, 50 * time.Second, false}, // (newEl's member expiry is a minute)
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEl("n1", "n2", "n3")
			e.cfg.Priority, e.meta.Priority = 100, 100
			e.Step(whole, t0)
			e.Step(HealthChanged{Healthy: true}, t0)
			at := t0.Add(3 * time.Second)
			e.Step(NameConflict{Addr: "10.0.0.9:7950"}, at)
			if e.meta.Eligible || e.decisions[vip1].Holder || !e.meta.Dup {
				t.Fatalf("during a name clash: eligible %v, holder %v, dup %v", e.meta.Eligible, e.decisions[vip1].Holder, e.meta.Dup)
			}
			e.Step(tc.after, at.Add(time.Second))
			later := at.Add(tc.wait)
			out := e.Step(Tick{}, later)
			if tc.holder && !out.Next.IsZero() && out.Next.Before(later) {
				t.Fatalf("next deadline %v in the past", out.Next)
			}
			e.Step(Tick{}, later.Add(QuorumSettle))
			if got := e.decisions[vip1].Holder; got != tc.holder {
				t.Fatalf("holder %v, want %v (%+v)", got, tc.holder, e.decisions[vip1])
			}
			if e.meta.Dup == tc.holder {
				t.Fatalf("meta.Dup %v", e.meta.Dup)
			}
			if st := e.Status(later); (st.NameConflict != "") == tc.holder {
				t.Fatalf("status name conflict %q", st.NameConflict)
			}
		})
	}
	// Others do not count a member that gossips Dup.
	view := View{Self: "n1", Members: []Member{
		{Name: "n1", State: Alive},
		{Name: "n2", State: Alive, Meta: Meta{Dup: true}},
		{Name: "n3", State: Alive},
	}}
	if q := Quorum(view, []string{"n1", "n2", "n3", "n4", "n5"}, QuorumRule{}); q.OK || q.Alive != 2 {
		t.Fatalf("quorum counts a duplicate-name member: %+v", q)
	}
}

// TestElectionSyncOnQuorumRegained: a node that regains quorum asks for a
// state exchange (Output.Sync) once, at the moment it does (also the
// first time after start): a claim made while it was cut off is not
// gossiped again, and without the exchange a node back from isolation
// claimed the VIP held by a member it still counted as dead (test/l2
// TestClusterPartitions, "2+1 holder isolated").
func TestElectionSyncOnQuorumRegained(t *testing.T) {
	elig := func(n string) Member {
		return peer(n, Alive, Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")})
	}
	e := newEl("n1", "n2", "n3")
	steps := []struct {
		name string
		ev   Event
		at   time.Duration
		sync bool
	}{
		{"healthy, alone", HealthChanged{Healthy: true}, 0, false},
		{"quorum reached after start (the start's own join may have missed a member)", ViewChanged{Members: []Member{elig("n2"), elig("n3")}}, time.Second, true},
		{"steady", Tick{}, 2 * time.Second, false},
		{"quorum lost", ViewChanged{Members: nil}, 3 * time.Second, false},
		{"still lost", Tick{}, 4 * time.Second, false},
		{"quorum regained (one member back)", ViewChanged{Members: []Member{elig("n2")}}, 5 * time.Second, true},
		{"steady again", Tick{}, 6 * time.Second, false},
		{"the last member back (quorum held all along)", ViewChanged{Members: []Member{elig("n2"), elig("n3")}}, 7 * time.Second, false},
	}
	for _, s := range steps {
		out := e.Step(s.ev, t0.Add(s.at))
		if out.Sync != s.sync {
			t.Errorf("%s: Sync=%v, want %v", s.name, out.Sync, s.sync)
		}
	}
}

// TestElectionAdoptsPeerKnown: a node that started without a member list
// counts the members a peer's state exchange brings (PeerKnown), within
// AdoptWindow of its first contact with another member, however late that
// is; a node with a list of its own, or after the window, keeps the usual
// admission rules. A rebuilt node that sees one other member of
// five then has no quorum.
func TestElectionAdoptsPeerKnown(t *testing.T) {
	five := Known{Members: map[string]KnownMember{}}
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		five.Members[n] = KnownMember{Addr: n + ":7950"}
	}
	elig := peer("n2", Alive, Meta{Eligible: true, Healthy: true})
	tests := []struct {
		name      string
		known     []string // the node's own list at start
		at        time.Duration
		wantKnown []string
		quorum    bool
	}{
		{"rebuilt node: counts the peer's members, no quorum with one of five", nil, time.Second, []string{"n1", "n2", "n3", "n4", "n5"}, false},
		{"a list of its own: kept", []string{"n1", "n2"}, time.Second, []string{"n1", "n2"}, true},
		{"late first contact: still adopted", nil, time.Minute, []string{"n1", "n2", "n3", "n4", "n5"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEl(tt.known...)
			e.Step(HealthChanged{Healthy: true}, t0)
			out := e.Step(PeerKnown{Known: five}, t0.Add(tt.at))
			e.Step(ViewChanged{Members: []Member{elig}}, t0.Add(tt.at))
			out2 := e.Step(Tick{}, t0.Add(tt.at+QuorumSettle+time.Second))
			if got := e.knownNames(); !slices.Equal(got, tt.wantKnown) {
				t.Errorf("known %v, want %v", got, tt.wantKnown)
			}
			if e.quorum.OK != tt.quorum {
				t.Errorf("quorum %+v, want OK=%v", e.quorum, tt.quorum)
			}
			if adopted := len(tt.wantKnown) == 5; adopted && (out.Known == nil || len(out.Known.Members) != 5) {
				t.Errorf("adopted list not persisted: %+v", out.Known)
			}
			if d := e.decisions[vip1]; !tt.quorum && d.Holder {
				t.Errorf("holds without quorum: %+v (%v)", d, out2.Logs)
			}
		})
	}
	// AdoptWindow after the first contact, the usual rules.
	e0 := newEl()
	e0.Step(ViewChanged{Members: []Member{elig}}, t0) // admits n2: first contact
	e0.Step(PeerKnown{Known: five}, t0.Add(AdoptWindow))
	if got := e0.knownNames(); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Errorf("known %v after the window, want n1, n2", got)
	}
	// A list larger than any control plane is cut at AdoptMax.
	big := Known{Members: map[string]KnownMember{}}
	for i := range 100 {
		big.Members[fmt.Sprintf("m%03d", i)] = KnownMember{}
	}
	e1 := newEl()
	e1.Step(PeerKnown{Known: big}, t0)
	if got := len(e1.knownNames()); got != AdoptMax {
		t.Errorf("adopted %d members of 100, want %d", got, AdoptMax)
	}
	// The node's own name and members it saw leave are not adopted.
	e := newEl()
	e.left["n4"] = KnownMember{}
	e.Step(PeerKnown{Known: five}, t0)
	if got := e.knownNames(); !slices.Equal(got, []string{"n1", "n2", "n3", "n5"}) {
		t.Errorf("known %v, want n1 (itself once), n2, n3, n5 (not n4, which left)", got)
	}
}
