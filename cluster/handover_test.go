package cluster

import (
	"strings"
	"testing"
	"time"
)

var all3 = counts("n1", "n2", "n3")

func ok3(prio int) Meta { return Meta{Eligible: true, Healthy: true, Priority: prio, Counts: all3} }

// fixture is an Election under a fake clock, with the view it is fed.
type fixture struct {
	t    *testing.T
	e    *Election
	now  time.Time
	view map[string]Member
	outs []Output
}

func newFixture(t *testing.T, name string, cfg func(*ElectionConfig)) *fixture {
	c := ElectionConfig{Name: name, VIPs: []string{vip1}, Peers: true, MemberExpiry: time.Minute}
	if cfg != nil {
		cfg(&c)
	}
	k := Known{Members: map[string]KnownMember{"n1": {}, "n2": {}, "n3": {}}}
	f := &fixture{t: t, e: NewElection(c, k, t0), now: t0, view: map[string]Member{}}
	for _, n := range []string{"n1", "n2", "n3"} {
		if n != name {
			f.view[n] = peer(n, Alive, ok3(0))
		}
	}
	f.step(HealthChanged{Healthy: true})
	f.advance(QuorumSettle)
	return f
}

func (f *fixture) members() []Member {
	var ms []Member
	for _, n := range []string{"n1", "n2", "n3"} {
		if m, ok := f.view[n]; ok {
			ms = append(ms, m)
		}
	}
	return ms
}

// step feeds the view, then ev, as cluster.Node does, and merges both outputs.
func (f *fixture) step(ev Event) Output {
	o := f.e.Step(ViewChanged{Members: f.members()}, f.now)
	o2 := f.e.Step(ev, f.now)
	o.Decisions = mergeDecisions(o.Decisions, o2.Decisions)
	o.Send = append(o.Send, o2.Send...)
	o.Prepare = append(o.Prepare, o2.Prepare...)
	o.Handovers = append(o.Handovers, o2.Handovers...)
	if o2.Meta != nil {
		o.Meta = o2.Meta
	}
	o.Next = o2.Next
	f.outs = append(f.outs, o)
	return o
}

func (f *fixture) advance(d time.Duration) Output {
	f.now = f.now.Add(d)
	return f.step(Tick{})
}

func (f *fixture) set(name string, st State, m Meta) { f.view[name] = peer(name, st, m) }

// holdVIP makes the fixture's node (n1) hold vip1 with n2 and n3 around.
func holdVIP(t *testing.T, cfg func(*ElectionConfig)) *fixture {
	f := newFixture(t, "n1", func(c *ElectionConfig) {
		c.Priority = 100 // ranks first
		if cfg != nil {
			cfg(c)
		}
	})
	if !f.e.decisions[vip1].Holder {
		t.Fatalf("setup: n1 should hold: %+v", f.e.decisions[vip1])
	}
	f.step(HoldingChanged{VIP: vip1, Held: true})
	return f
}

func sent(o Output, k MsgKind) *Message {
	for i := range o.Send {
		if o.Send[i].Kind == k {
			return &o.Send[i]
		}
	}
	return nil
}

func result(o Output) *HandoverResult {
	if len(o.Handovers) == 0 {
		return nil
	}
	return &o.Handovers[len(o.Handovers)-1]
}

func TestHandoverRefusals(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fixture)
		req   HandoverRequested
		want  string
	}{
		{"no eligible successor", func(f *fixture) {
			f.set("n2", Alive, Meta{Eligible: false, Healthy: false, Counts: all3})
			f.set("n3", Suspect, ok3(0))
		}, HandoverRequested{}, "no eligible successor for 10.0.0.100/32"},
		{"unknown node", nil, HandoverRequested{To: "n9"}, "no member named n9 (members: n2, n3)"},
		{"unhealthy node", func(f *fixture) { f.set("n2", Alive, Meta{Counts: all3}) }, HandoverRequested{To: "n2"}, "n2 is not eligible: its apiserver is unhealthy"},
		{"broken node", func(f *fixture) {
			m := ok3(0)
			m.Broken = []string{vip1}
			f.set("n2", Alive, m)
		}, HandoverRequested{To: "n2"}, "n2 cannot hold 10.0.0.100/32 now"},
		{"suspect node", func(f *fixture) { f.set("n2", Suspect, ok3(0)) }, HandoverRequested{To: "n2"}, "n2 is suspect"},
		{"to itself", nil, HandoverRequested{To: "n1"}, "n1 is this node"},
		{"a VIP it does not have", nil, HandoverRequested{VIPs: []string{"10.9.9.9/32"}}, "10.9.9.9/32 is not one of this node's VIPs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := holdVIP(t, nil)
			if tt.setup != nil {
				tt.setup(f)
			}
			o := f.step(tt.req)
			r := result(o)
			if r == nil || r.OK || !strings.Contains(r.Reason, tt.want) {
				t.Fatalf("result %+v, want a refusal containing %q", r, tt.want)
			}
			if len(o.Send) != 0 {
				t.Fatalf("a refused handover sent %+v", o.Send)
			}
			if d := f.e.decisions[vip1]; !d.Holder {
				t.Fatalf("a refused handover gave up the VIP: %+v", d)
			}
		})
	}
	t.Run("not the holder", func(t *testing.T) {
		f := newFixture(t, "n1", nil)
		m := ok3(0)
		m.Holding, m.Term = []string{vip1}, 3
		f.set("n2", Alive, m)
		f.advance(10 * time.Millisecond)
		r := result(f.step(HandoverRequested{VIPs: []string{vip1}}))
		if r == nil || r.OK || !strings.Contains(r.Reason, "this node does not hold 10.0.0.100/32 (held by n2)") {
			t.Fatalf("result %+v", r)
		}
	})
	t.Run("already under way", func(t *testing.T) {
		f := holdVIP(t, nil)
		f.step(HandoverRequested{To: "n2"})
		r := result(f.step(HandoverRequested{To: "n3"}))
		if r == nil || !strings.Contains(r.Reason, "already under way") {
			t.Fatalf("result %+v", r)
		}
	})
}

func TestHandoverHolder(t *testing.T) {
	// A complete handover from the holder's side.
	f := holdVIP(t, nil)
	f.set("n3", Alive, ok3(5)) // n3 ranks first among the others
	o := f.step(HandoverRequested{})
	offer := sent(o, MsgOffer)
	if offer == nil || offer.To != "n3" || offer.VIP != vip1 {
		t.Fatalf("offer %+v", o.Send)
	}
	if d := f.e.decisions[vip1]; !d.Holder {
		t.Fatal("released before the successor was ready")
	}
	f.advance(20 * time.Millisecond)
	o = f.step(MessageReceived{Msg: Message{Kind: MsgReady, From: "n3", To: "n1", VIP: vip1, ID: offer.ID}})
	d, _ := decision(o, vip1)
	if d.Holder || d.Leader != "n3" || !strings.Contains(d.Reason, "handing over to n3") {
		t.Fatalf("after Ready: %+v", d)
	}
	if sent(o, MsgReleased) != nil {
		t.Fatal("Released sent before the core released")
	}
	f.advance(time.Millisecond)
	o = f.step(HoldingChanged{VIP: vip1, Held: false})
	rel := sent(o, MsgReleased)
	if rel == nil || rel.To != "n3" || rel.ID != offer.ID {
		t.Fatalf("released: %+v", o.Send)
	}
	if !f.e.Meta().Holds(vip1) {
		t.Fatal("dropped the claim before the successor's claim was seen: a third node could take the VIP")
	}
	// Nothing changes for a while: the claim stays, no re-acquire.
	o = f.advance(100 * time.Millisecond)
	if d, ok := decision(o, vip1); ok && d.Holder {
		t.Fatalf("took the VIP back: %+v", d)
	}
	m := ok3(5)
	m.Holding, m.Term = []string{vip1}, f.e.Meta().Term+1
	f.set("n3", Alive, m)
	o = f.advance(10 * time.Millisecond)
	r := result(o)
	if r == nil || !r.OK || r.To != "n3" {
		t.Fatalf("result %+v", o.Handovers)
	}
	if f.e.Meta().Holds(vip1) || f.e.decisions[vip1].Leader != "n3" {
		t.Fatalf("after the handover: meta %+v decision %+v", f.e.Meta(), f.e.decisions[vip1])
	}
	if st := f.e.Status(f.now); !st.Handover.Last[vip1].OK {
		t.Fatalf("status %+v", st.Handover)
	}
}

func TestHandoverHolderFailures(t *testing.T) {
	type check struct {
		holder bool // decision after the failure
		claim  bool // meta still claims
	}
	offerReady := func(f *fixture) Message {
		offer := sent(f.step(HandoverRequested{To: "n2"}), MsgOffer)
		f.step(MessageReceived{Msg: Message{Kind: MsgReady, From: "n2", To: "n1", VIP: vip1, ID: offer.ID}})
		return *offer
	}
	tests := []struct {
		name     string
		stopping bool
		run      func(f *fixture)
		want     check
		reason   string
	}{
		{"no ack: keeps the VIP", false, func(f *fixture) {
			f.step(HandoverRequested{To: "n2"})
			f.advance(AckTimeout)
		}, check{true, true}, "did not acknowledge"},
		{"no ack while stopping: today's release", true, func(f *fixture) {
			f.step(HandoverRequested{To: "n2", Stopping: true})
			f.advance(AckTimeout)
		}, check{false, false}, "did not acknowledge"},
		{"declined: keeps the VIP", false, func(f *fixture) {
			offer := sent(f.step(HandoverRequested{To: "n2"}), MsgOffer)
			f.step(MessageReceived{Msg: Message{Kind: MsgDeclined, From: "n2", To: "n1", VIP: vip1, ID: offer.ID, Reason: "busy"}})
		}, check{true, true}, "n2 declined: busy"},
		{"a stale ready is ignored", false, func(f *fixture) {
			offer := sent(f.step(HandoverRequested{To: "n2"}), MsgOffer)
			f.step(MessageReceived{Msg: Message{Kind: MsgReady, From: "n2", To: "n1", VIP: vip1, ID: offer.ID + 7}})
			f.advance(AckTimeout)
		}, check{true, true}, "did not acknowledge"},
		{"Released cannot be sent: takes the VIP back", false, func(f *fixture) {
			offer := offerReady(f)
			rel := sent(f.step(HoldingChanged{VIP: vip1, Held: false}), MsgReleased)
			if rel == nil {
				t.Fatal("no Released")
			}
			f.step(SendFailed{Msg: *rel, Err: "connection refused"})
			_ = offer
		}, check{true, true}, "cannot reach n2"},
		{"successor declines after the release: takes it back", false, func(f *fixture) {
			offer := offerReady(f)
			f.step(HoldingChanged{VIP: vip1, Held: false})
			f.step(MessageReceived{Msg: Message{Kind: MsgDeclined, From: "n2", To: "n1", VIP: vip1, ID: offer.ID, Reason: "unhealthy"}})
		}, check{true, true}, "declined"},
		{"no claim seen after the release: left to the election", false, func(f *fixture) {
			offerReady(f)
			f.step(HoldingChanged{VIP: vip1, Held: false})
			f.advance(SettleTimeout)
		}, check{false, false}, "no claim from n2"},
		{"the core does not release: keeps it", false, func(f *fixture) {
			offerReady(f)
			f.advance(ReleaseTimeout)
		}, check{true, true}, "not released"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := holdVIP(t, nil)
			f.outs = nil
			tt.run(f)
			var r *HandoverResult
			for _, o := range f.outs {
				if x := result(o); x != nil {
					r = x
				}
			}
			if r == nil || r.OK || !strings.Contains(r.Reason, tt.reason) {
				t.Fatalf("result %+v, want a failure containing %q", r, tt.reason)
			}
			d := f.e.decisions[vip1]
			if d.Holder != tt.want.holder || f.e.Meta().Holds(vip1) != tt.want.claim {
				t.Fatalf("decision %+v claim %v, want holder=%v claim=%v", d, f.e.Meta().Holds(vip1), tt.want.holder, tt.want.claim)
			}
			if tt.stopping && f.e.Meta().Eligible {
				t.Fatal("a stopping node is eligible after its handovers ended")
			}
		})
	}
	t.Run("left to the election: not reclaimed at once", func(t *testing.T) {
		f := holdVIP(t, nil)
		offerReady(f)
		f.step(HoldingChanged{VIP: vip1, Held: false})
		f.advance(SettleTimeout)
		if f.advance(ReclaimPause / 2); f.e.decisions[vip1].Holder {
			t.Fatal("reclaimed within ReclaimPause: the successor's late claim would lose to a newer term")
		}
	})
}

func TestHandoverSuccessor(t *testing.T) {
	holderMeta := func(term uint64) Meta {
		m := ok3(0)
		m.Holding, m.Term = []string{vip1}, term
		return m
	}
	offer := Message{Kind: MsgOffer, From: "n1", To: "n2", VIP: vip1, ID: 4}
	setup := func(t *testing.T, cfg func(*ElectionConfig)) *fixture {
		f := newFixture(t, "n2", cfg)
		f.set("n1", Alive, holderMeta(9))
		f.advance(10 * time.Millisecond)
		if d := f.e.decisions[vip1]; d.Holder || d.Leader != "n1" {
			t.Fatalf("setup: %+v", d)
		}
		return f
	}
	for _, settle := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run("takes it at once, claim settle "+settle.String(), func(t *testing.T) {
			f := setup(t, func(c *ElectionConfig) { c.ClaimSettle = settle })
			o := f.step(MessageReceived{Msg: offer})
			if len(o.Prepare) != 1 || o.Prepare[0] != vip1 || len(o.Send) != 0 {
				t.Fatalf("offer: prepare %v send %+v", o.Prepare, o.Send)
			}
			f.advance(5 * time.Millisecond)
			o = f.step(Prepared{VIP: vip1})
			if r := sent(o, MsgReady); r == nil || r.To != "n1" || r.ID != 4 {
				t.Fatalf("ready: %+v", o.Send)
			}
			if f.e.decisions[vip1].Holder {
				t.Fatal("took the VIP before the holder released it")
			}
			f.advance(5 * time.Millisecond)
			at := f.now
			o = f.step(MessageReceived{Msg: Message{Kind: MsgReleased, From: "n1", To: "n2", VIP: vip1, ID: 4}})
			d, _ := decision(o, vip1)
			if !d.Holder || !d.Handover || d.PrevHolder != "n1" || !d.FaultAt.Equal(at) {
				t.Fatalf("after Released: %+v", d)
			}
			if m := f.e.Meta(); !m.Holds(vip1) || m.Term <= 9 {
				t.Fatalf("claim %+v: must be above the holder's term 9", m)
			}
		})
	}
	tests := []struct {
		name string
		run  func(f *fixture) Output
		want string
	}{
		{"declines when unhealthy", func(f *fixture) Output {
			f.step(HealthChanged{Healthy: false})
			return f.step(MessageReceived{Msg: offer})
		}, "n2 is not eligible"},
		{"declines an offer from a node that does not hold it", func(f *fixture) Output {
			f.set("n1", Alive, ok3(0))
			return f.step(MessageReceived{Msg: offer})
		}, "n1 does not claim"},
		{"declines when not ready", func(f *fixture) Output {
			f.step(MessageReceived{Msg: offer})
			return f.step(Prepared{VIP: vip1, Err: "eth0 is down"})
		}, "not ready: eth0 is down"},
		{"declines a Released it did not expect", func(f *fixture) Output {
			return f.step(MessageReceived{Msg: Message{Kind: MsgReleased, From: "n1", To: "n2", VIP: vip1, ID: 4}})
		}, "no offer"},
		{"declines a Released after TakeTimeout", func(f *fixture) Output {
			f.step(MessageReceived{Msg: offer})
			f.step(Prepared{VIP: vip1})
			f.advance(TakeTimeout)
			return f.step(MessageReceived{Msg: Message{Kind: MsgReleased, From: "n1", To: "n2", VIP: vip1, ID: 4}})
		}, "no offer"},
		{"declines a Released when it lost its health meanwhile", func(f *fixture) Output {
			f.step(MessageReceived{Msg: offer})
			f.step(Prepared{VIP: vip1})
			f.step(HealthChanged{Healthy: false})
			return f.step(MessageReceived{Msg: Message{Kind: MsgReleased, From: "n1", To: "n2", VIP: vip1, ID: 4}})
		}, "can no longer take"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := setup(t, nil)
			o := tt.run(f)
			dm := sent(o, MsgDeclined)
			if dm == nil || !strings.Contains(dm.Reason, tt.want) || dm.To != "n1" {
				t.Fatalf("sent %+v, want Declined containing %q", o.Send, tt.want)
			}
			if f.e.Meta().Holds(vip1) || f.e.decisions[vip1].Holder {
				t.Fatal("claimed the VIP")
			}
		})
	}
}

func TestPreemptDelay(t *testing.T) {
	const delay = 10 * time.Second
	cfg := func(c *ElectionConfig) { c.Priority, c.PreemptDelay = 0, delay }
	high := ok3(50)
	t.Run("moves to a higher priority after the delay, not before", func(t *testing.T) {
		f := newFixture(t, "n1", func(c *ElectionConfig) { cfg(c) })
		// n1 holds (n2 and n3 have priority 0 too; rank by hash decides):
		// make n1 the holder by claiming it as the others are ineligible.
		f.set("n2", Alive, Meta{Counts: all3})
		f.set("n3", Alive, Meta{Counts: all3})
		f.advance(10 * time.Millisecond)
		if !f.e.decisions[vip1].Holder {
			t.Fatalf("setup: %+v", f.e.decisions[vip1])
		}
		f.step(HoldingChanged{VIP: vip1, Held: true})
		f.set("n2", Alive, high) // n2 becomes eligible with a higher priority
		start := f.now
		var offerAt time.Duration
		for i := 0; i < 1500 && offerAt == 0; i++ {
			o := f.advance(10 * time.Millisecond)
			if m := sent(o, MsgOffer); m != nil {
				if m.To != "n2" {
					t.Fatalf("offered to %s", m.To)
				}
				offerAt = f.now.Sub(start)
			}
		}
		if offerAt < delay || offerAt > delay+20*time.Millisecond {
			t.Fatalf("offer after %v, want %v", offerAt, delay)
		}
		if next := f.e.next(start.Add(time.Second)); next.IsZero() {
			t.Fatal("no deadline for the preemption")
		}
	})
	t.Run("a flapping node never gets it", func(t *testing.T) {
		f := newFixture(t, "n1", func(c *ElectionConfig) { cfg(c) })
		f.set("n2", Alive, Meta{Counts: all3})
		f.set("n3", Alive, Meta{Counts: all3})
		f.advance(10 * time.Millisecond)
		f.step(HoldingChanged{VIP: vip1, Held: true})
		// eligible 8 s, unhealthy 1 s, for 5 minutes
		for i := 0; i < 30000; i++ {
			if i%900 < 800 {
				f.set("n2", Alive, high)
			} else {
				f.set("n2", Alive, Meta{Priority: 50, Counts: all3})
			}
			if m := sent(f.advance(10*time.Millisecond), MsgOffer); m != nil {
				t.Fatalf("offered to a flapping node at %v", f.now.Sub(t0))
			}
		}
	})
	t.Run("off by default", func(t *testing.T) {
		f := newFixture(t, "n1", nil)
		f.set("n2", Alive, Meta{Counts: all3})
		f.set("n3", Alive, Meta{Counts: all3})
		f.advance(10 * time.Millisecond)
		f.step(HoldingChanged{VIP: vip1, Held: true})
		f.set("n2", Alive, high)
		for i := 0; i < 1000; i++ {
			if m := sent(f.advance(100*time.Millisecond), MsgOffer); m != nil {
				t.Fatal("preempted without VIPD_PREEMPT_DELAY")
			}
		}
	})
	t.Run("a failed preemption waits another delay", func(t *testing.T) {
		f := newFixture(t, "n1", func(c *ElectionConfig) { cfg(c) })
		f.set("n2", Alive, Meta{Counts: all3})
		f.set("n3", Alive, Meta{Counts: all3})
		f.advance(10 * time.Millisecond)
		f.step(HoldingChanged{VIP: vip1, Held: true})
		f.set("n2", Alive, high)
		var offers []time.Time
		for i := 0; i < 2500; i++ {
			if m := sent(f.advance(10*time.Millisecond), MsgOffer); m != nil {
				offers = append(offers, f.now)
			}
		}
		// n2 never answers: every AckTimeout a failure, then a pause of
		// one delay.
		if len(offers) < 2 || offers[1].Sub(offers[0]) < delay {
			t.Fatalf("offers at %v", offers)
		}
	})
}

func TestFailoverTimeline(t *testing.T) {
	f := newFixture(t, "n1", nil)
	m := ok3(0)
	m.Holding, m.Term = []string{vip1}, 3
	f.set("n2", Alive, m)
	f.advance(10 * time.Millisecond)
	f.advance(200 * time.Millisecond)
	lastAlive := f.now
	f.set("n2", Suspect, m) // fault seen
	f.advance(10 * time.Millisecond)
	fault := f.now
	f.advance(400 * time.Millisecond)
	delete(f.view, "n2") // declared dead
	f.set("n3", Alive, Meta{Counts: all3})
	o := f.advance(10 * time.Millisecond)
	d, _ := decision(o, vip1)
	if !d.Holder || d.Handover || d.PrevHolder != "n2" || !d.FaultAt.Equal(fault) || !d.PrevHeardAt.Equal(lastAlive) {
		t.Fatalf("decision %+v, want fault at %v, last heard %v", d, fault.Sub(t0), lastAlive.Sub(t0))
	}
}

func TestHandoverMessageCodec(t *testing.T) {
	m := Message{Kind: MsgReleased, From: "n1", To: "n2", VIP: vip1, ID: 7}
	got, ok := decodeMsg(encodeMsg(m))
	if !ok || got != m {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	for _, b := range [][]byte{nil, []byte("H"), []byte(`X{"k":"offer","f":"n1","v":"x"}`), []byte(`H{"k":"takeover","f":"n1","v":"x"}`),
		[]byte(`H{"k":"offer","v":"x"}`), []byte(`H{"k":"offer","f":"n1"}`), []byte("H{not json")} {
		if _, ok := decodeMsg(b); ok {
			t.Errorf("accepted %q", b)
		}
	}
	// A message for another node or another VIP changes nothing.
	f := holdVIP(t, nil)
	offer := sent(f.step(HandoverRequested{To: "n2"}), MsgOffer)
	for _, m := range []Message{
		{Kind: MsgReady, From: "n2", To: "n3", VIP: vip1, ID: offer.ID},
		{Kind: MsgReady, From: "n2", To: "n1", VIP: "10.9.9.9/32", ID: offer.ID},
		{Kind: MsgReady, From: "n3", To: "n1", VIP: vip1, ID: offer.ID},
	} {
		if o := f.step(MessageReceived{Msg: m}); len(o.Decisions) != 0 || len(o.Send) != 0 {
			t.Errorf("%+v changed something: %+v", m, o)
		}
	}
	if !f.e.decisions[vip1].Holder {
		t.Fatal("a stray message released the VIP")
	}
}
