package cluster

import (
	"strings"
	"testing"
)

const vipA = "10.0.0.100/32"

func m(name string, st State, meta Meta) Member { return Member{Name: name, State: st, Meta: meta} }

var (
	eligible = Meta{Healthy: true, Eligible: true}
	unwell   = Meta{}
)

func holding(term uint64) Meta {
	return Meta{Healthy: true, Eligible: true, Term: term, Holding: []string{vipA}}
}

// firstByHash returns which of the names ranks first for vipA.
func firstByHash(names ...string) string {
	best := names[0]
	for _, n := range names[1:] {
		if rank(n, vipA) < rank(best, vipA) {
			best = n
		}
	}
	return best
}

func TestDecide(t *testing.T) {
	h := firstByHash("n1", "n2", "n3")
	tests := []struct {
		name       string
		self       string
		members    []Member
		wantHolder bool
		wantLeader string
		reason     string
	}{
		{"lone eligible node holds", "n1", []Member{m("n1", Alive, eligible)}, true, "n1", "elected"},
		{"lone unhealthy node does not", "n1", []Member{m("n1", Alive, unwell)}, false, "", "not eligible"},
		{"self missing from view", "n9", []Member{m("n1", Alive, eligible)}, false, "", "not in its own view"},
		{"hash picks the same leader everywhere", "n1", []Member{m("n1", Alive, eligible), m("n2", Alive, eligible), m("n3", Alive, eligible)}, h == "n1", h, ""},
		{"priority beats hash", "n2", []Member{m("n1", Alive, eligible), m("n2", Alive, Meta{Healthy: true, Eligible: true, Priority: 10}), m("n3", Alive, eligible)}, true, "n2", "elected"},
		{"incumbent keeps it against higher priority", "n1", []Member{m("n1", Alive, holding(3)), m("n2", Alive, Meta{Healthy: true, Eligible: true, Priority: 100})}, true, "n1", "incumbent"},
		{"others defer to the incumbent", "n2", []Member{m("n1", Alive, holding(3)), m("n2", Alive, Meta{Healthy: true, Eligible: true, Priority: 100})}, false, "n1", "n1 holds it"},
		{"suspect holder: wait, no takeover", "n2", []Member{m("n1", Suspect, holding(3)), m("n2", Alive, eligible)}, false, "n1", "suspect"},
		{"dead holder: take over", "n2", []Member{m("n1", Dead, holding(3)), m("n2", Alive, eligible)}, true, "n2", "elected"},
		{"left holder: take over", "n2", []Member{m("n1", Left, holding(3)), m("n2", Alive, eligible)}, true, "n2", "elected"},
		{"holder not eligible yet still claiming: wait for its release", "n2", []Member{m("n1", Alive, Meta{Term: 3, Holding: []string{vipA}}), m("n2", Alive, eligible)}, false, "", "waiting for its release"},
		{"self holder not eligible: release", "n1", []Member{m("n1", Alive, Meta{Term: 3, Holding: []string{vipA}}), m("n2", Alive, eligible)}, false, "", "not eligible"},
		{"healed partition: higher term wins", "n1", []Member{m("n1", Alive, holding(3)), m("n2", Alive, holding(5))}, false, "n2", "n2 holds it"},
		{"healed partition: winner keeps it", "n2", []Member{m("n1", Alive, holding(3)), m("n2", Alive, holding(5))}, true, "n2", "won over n1"},
		{"equal terms: lower name wins", "n2", []Member{m("n1", Alive, holding(4)), m("n2", Alive, holding(4))}, false, "n1", "n1 holds it"},
		{"unhealthy members are not candidates", "n2", []Member{m("n1", Alive, unwell), m("n2", Alive, eligible), m("n3", Alive, unwell)}, true, "n2", "elected"},
		{"suspect members are not candidates", "n2", []Member{m("n1", Suspect, Meta{Healthy: true, Eligible: true, Priority: 9}), m("n2", Alive, eligible)}, true, "n2", "elected"},
		{"claims for other VIPs do not count", "n2", []Member{m("n1", Alive, Meta{Healthy: true, Eligible: true, Priority: 9, Holding: []string{"fd00::1/128"}}), m("n2", Alive, eligible)}, false, "n1", "ranks first"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(View{Self: tt.self, Members: tt.members}, vipA)
			if d.Holder != tt.wantHolder || d.Leader != tt.wantLeader || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("got %+v, want holder=%v leader=%q reason~%q", d, tt.wantHolder, tt.wantLeader, tt.reason)
			}
		})
	}
}

// Every node of a consistent view agrees on one holder.
func TestDecideAgreement(t *testing.T) {
	for _, prio := range [][3]int{{0, 0, 0}, {1, 0, 0}, {0, 5, 5}} {
		members := []Member{
			m("a", Alive, Meta{Healthy: true, Eligible: true, Priority: prio[0]}),
			m("b", Alive, Meta{Healthy: true, Eligible: true, Priority: prio[1]}),
			m("c", Alive, Meta{Healthy: true, Eligible: true, Priority: prio[2]}),
		}
		for _, vip := range []string{"10.0.0.1/32", "10.0.0.2/32", "fd00::1/128"} {
			holders := 0
			leaders := map[string]bool{}
			for _, self := range []string{"a", "b", "c"} {
				d := Decide(View{Self: self, Members: members}, vip)
				if d.Holder {
					holders++
				}
				leaders[d.Leader] = true
			}
			if holders != 1 || len(leaders) != 1 {
				t.Fatalf("prio %v vip %s: %d holders, leaders %v", prio, vip, holders, leaders)
			}
		}
	}
}

// counting sets the names a member says it counts.
func counting(mb Member, names ...string) Member {
	for _, n := range names {
		mb.Meta.Counts = append(mb.Meta.Counts, NameHash(n))
	}
	return mb
}

func TestQuorum(t *testing.T) {
	alive := func(names ...string) []Member {
		var ms []Member
		for _, n := range names {
			ms = append(ms, m(n, Alive, eligible))
		}
		return ms
	}
	tests := []struct {
		name      string
		members   []Member
		known     []string
		rule      QuorumRule
		ok        bool
		needed    int
		bootstrap bool
	}{
		{"first node bootstraps alone", alive("n1"), nil, QuorumRule{}, true, 1, true},
		{"first node with its own name persisted", alive("n1"), []string{"n1"}, QuorumRule{}, true, 1, true},
		{"three known, all alive", alive("n1", "n2", "n3"), []string{"n1", "n2", "n3"}, QuorumRule{}, true, 2, false},
		{"three known, two alive", alive("n1", "n2"), []string{"n1", "n2", "n3"}, QuorumRule{}, true, 2, false},
		{"three known, alone", alive("n1"), []string{"n1", "n2", "n3"}, QuorumRule{}, false, 2, false},
		{"two known, alone: no quorum (the two-node risk)", alive("n1"), []string{"n1", "n2"}, QuorumRule{}, false, 2, false},
		{"two known, quorum off", alive("n1"), []string{"n1", "n2"}, QuorumRule{Off: true}, true, 0, false},
		{"five known, three alive", alive("n1", "n2", "n3"), []string{"n1", "n2", "n3", "n4", "n5"}, QuorumRule{}, true, 3, false},
		{"five known, two alive", alive("n1", "n2"), []string{"n1", "n2", "n3", "n4", "n5"}, QuorumRule{}, false, 3, false},
		{"member not yet admitted is not counted", alive("n1", "n2", "n3", "n4"), []string{"n1", "n2", "n3"}, QuorumRule{}, true, 2, false},
		{"members that do not count us are not counted", []Member{m("n1", Alive, eligible), counting(m("n2", Alive, eligible), "n2", "n9"), counting(m("n3", Alive, eligible), "n3", "n9")}, []string{"n1", "n2", "n3"}, QuorumRule{}, false, 2, false},
		{"members that count us are counted", []Member{m("n1", Alive, eligible), counting(m("n2", Alive, eligible), "n1", "n2"), counting(m("n3", Alive, eligible), "n3", "n9")}, []string{"n1", "n2", "n3"}, QuorumRule{}, true, 2, false},
		{"a member that knows nobody yet counts", []Member{m("n1", Alive, eligible), counting(m("n2", Alive, eligible), "n2")}, []string{"n1", "n2"}, QuorumRule{}, true, 2, false},
		{"suspect counts as alive", []Member{m("n1", Alive, eligible), m("n2", Suspect, eligible), m("n3", Dead, eligible)}, []string{"n1", "n2", "n3"}, QuorumRule{}, true, 2, false},
		{"fixed N", alive("n1", "n2"), []string{"n1"}, QuorumRule{Fixed: 3}, false, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Quorum(View{Self: "n1", Members: tt.members}, tt.known, tt.rule)
			if r.OK != tt.ok || r.Needed != tt.needed || r.Bootstrap != tt.bootstrap || r.Reason == "" {
				t.Fatalf("got %+v, want ok=%v needed=%d bootstrap=%v", r, tt.ok, tt.needed, tt.bootstrap)
			}
		})
	}
}
