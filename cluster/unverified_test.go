package cluster

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// TestElectionUnverified: a node that cannot reach a VIP through its
// holder gossips it in Meta.Unverified (a changed meta is gossiped), never
// for a VIP it holds itself, and clears it when it can again. The election
// itself does not act on it: the holder's l2 announcer reads the reports.
func TestElectionUnverified(t *testing.T) {
	e := newEl("n1", "n2", "n3")
	view := ViewChanged{Members: []Member{
		peer("n2", Alive, Meta{Eligible: true, Healthy: true, Holding: []string{vip1}, Counts: counts("n1", "n2", "n3")}),
		peer("n3", Alive, Meta{Eligible: true, Healthy: true, Counts: counts("n1", "n2", "n3")}),
	}}
	e.Step(view, t0)
	e.Step(HealthChanged{Healthy: true}, t0)
	base := t0.Add(RestartSettle)
	e.Step(Tick{}, base)
	before := e.decisions[vip1]
	out := e.Step(Unverified{VIP: vip1, Unreachable: true}, base.Add(time.Millisecond))
	if out.Meta == nil || !slices.Equal(out.Meta.Unverified, []string{vip1}) {
		t.Fatalf("meta after an unverified report: %+v", out.Meta)
	}
	if d := e.decisions[vip1]; d != before {
		t.Fatalf("the report changed the election: %+v, was %+v", d, before)
	}
	b, _ := encodeMeta(*out.Meta)
	var back Meta
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Unverified, []string{vip1}) {
		t.Fatalf("round trip %s: %+v %v", b, back, err)
	}
	out = e.Step(Unverified{VIP: vip1, Unreachable: false}, base.Add(2*time.Millisecond))
	if out.Meta == nil || len(out.Meta.Unverified) != 0 {
		t.Fatalf("meta after the VIP is reachable again: %+v", out.Meta)
	}
	// Never reported for a VIP this node holds (claims it).
	e.Step(Unverified{VIP: vip1, Unreachable: true}, base.Add(3*time.Millisecond))
	e.meta.Holding = []string{vip1}
	e.Step(Tick{}, base.Add(4*time.Millisecond))
	if slices.Contains(e.meta.Unverified, vip1) {
		t.Fatalf("a held VIP reported unverified: %+v", e.meta)
	}
}
