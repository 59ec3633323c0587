// Package cluster elects, for every VIP, the one node that holds it, over
// hashicorp/memberlist gossip: no Kubernetes API is needed, so the first
// control-plane node can hold the VIP before the cluster exists.
//
// The package has two halves. Election (this file and membership.go) is a
// deterministic state machine: events go in with the time they happened
// (membership view, health, holding, failed acquires, key errors, name
// conflicts, ticks) and out come the metadata to gossip, the decisions that
// changed, the member list to persist and the next deadline. It has no
// goroutines, sockets or clock, so every rule is a table test and the whole
// protocol runs in the simulator (package cluster/sim). Node (cluster.go) is
// the glue that feeds it from memberlist and carries its output out.
//
// Each node gossips its metadata: whether its apiserver is healthy, whether
// it may hold VIPs (eligible: healthy, quorum, unique name), its priority,
// the VIPs it claims with a term that grows with every claim, the VIPs it
// cannot hold now (a failed acquire, its VIP interface down) and the hashes
// of the members it counts. From that view every node computes the same
// decision with the pure function Decide:
//
//   - a node that is not eligible holds nothing;
//   - a VIP that an eligible member claims stays with it (no preemption); if
//     several claim it (a healed partition), the highest term wins, then the
//     lowest name;
//   - a VIP whose holder is suspect stays unassigned until that holder is
//     declared dead or left: break before make;
//   - otherwise the eligible alive member that can hold it, with the highest
//     priority, then the lowest sha256(name + "#" + vip), takes it.
package cluster

import (
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// State of a member as memberlist sees it.
type State int

// Member states.
const (
	Alive State = iota
	Suspect
	Dead
	Left
)

func (s State) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Meta is what each node gossips about itself (at most MetaLimit bytes
// encoded; MetaFits checks a configuration against it at start-up).
type Meta struct {
	Healthy  bool     `json:"h,omitempty"`
	Eligible bool     `json:"e,omitempty"` // healthy, quorum (or bootstrap), unique name
	Priority int      `json:"p,omitempty"`
	Term     uint64   `json:"t,omitempty"`
	Holding  []string `json:"v,omitempty"` // VIPs claimed, as prefixes
	Broken   []string `json:"b,omitempty"` // VIPs this node cannot hold now
	// Unverified lists the VIPs another node holds that this node cannot
	// reach on the wire (its ARP / neighbour probes go unanswered: the
	// holder's announcements do not arrive here). The holder gives a VIP
	// up when most of the other members report it (vip/l2verify.go).
	Unverified []string `json:"u,omitempty"`
	// Counts are the hashes of the members this node counts for quorum
	// (nil from a version that did not send them, or above MaxCounted).
	Counts Hashes `json:"k,omitempty"`
	// Leaving is set by a node that stops gracefully, just before it
	// leaves: the others forget it at once instead of after the expiry.
	Leaving bool `json:"l,omitempty"`
	// Dup is set by a node that has seen another node gossip under its
	// name: it stays out of the election, and the others do not count it
	// for quorum (two nodes with one name on both sides of a partition
	// would each make a majority), until it has seen no clash for
	// ConflictHold while every member it knows is in view.
	Dup bool `json:"d,omitempty"`
	// Pools is set by a node that announces pool addresses (VIPD_POOLS=on).
	Pools bool `json:"o,omitempty"`
	// Beat is set by a node that sends member heartbeats to the gossip
	// port and expects them (beatsock.go); others are not sent any.
	Beat bool `json:"hb,omitempty"`
}

// Holds reports whether the member claims vip.
func (m Meta) Holds(vip string) bool { return slices.Contains(m.Holding, vip) }

// CannotHold reports whether the member says it cannot hold vip now.
func (m Meta) CannotHold(vip string) bool { return slices.Contains(m.Broken, vip) }

// counts reports whether the member counts name for its quorum. A member
// that sends no list (an older version) counts everybody.
// A member that knows nobody else yet (it just started or joined) counts
// as agreeing: it is on no other side.
func (m Meta) counts(name string) bool {
	return len(m.Counts) <= 1 || slices.Contains(m.Counts, NameHash(name))
}

// Member is one node in the view.
type Member struct {
	Name  string
	Addr  string
	State State
	Meta  Meta
	// MetaHash is MetaHash of the metadata as gossiped (member beats
	// compare it with the hash each beat carries).
	MetaHash uint32
}

// View is one node's picture of the cluster.
type View struct {
	Self    string
	Members []Member // including self
}

func (v View) self() (Member, bool) {
	for _, m := range v.Members {
		if m.Name == v.Self {
			return m, true
		}
	}
	return Member{}, false
}

// Decision is the election's answer for one VIP.
type Decision struct {
	Holder bool   `json:"holder"` // this node should hold the VIP
	Leader string `json:"leader"` // who should hold it ("" when nobody may yet)
	Reason string `json:"reason"`
	// Lone is set while this node holds by bootstrapping alone: nobody
	// vouches for it, so the VIP is watched for another holder on the
	// segment and given up to it.
	Lone bool `json:"lone,omitempty"`
	// Handover is set when this node takes the VIP from a holder that
	// released it for this node (a planned handover): nobody else answers
	// for it, so it binds without the conflict probe.
	Handover bool `json:"handover,omitempty"`
	// The failover timeline, set when this node becomes the holder after
	// another: who held it, when this node saw it lose the VIP (handover:
	// when the release arrived) and when it was last heard alive.
	PrevHolder  string    `json:"-"`
	FaultAt     time.Time `json:"-"`
	PrevHeardAt time.Time `json:"-"`
}

// Decide computes who holds vip. It is a pure function of the view.
func Decide(v View, vip string) Decision {
	self, ok := v.self()
	if !ok {
		return Decision{Reason: "this node is not in its own view"}
	}
	// Claims by members that are not dead or left.
	var claims []Member
	for _, m := range v.Members {
		if (m.State == Alive || m.State == Suspect) && m.Meta.Holds(vip) {
			claims = append(claims, m)
		}
	}
	if len(claims) > 0 {
		sort.Slice(claims, func(i, j int) bool {
			if claims[i].Meta.Term != claims[j].Meta.Term {
				return claims[i].Meta.Term > claims[j].Meta.Term
			}
			return claims[i].Name < claims[j].Name
		})
		inc := claims[0]
		switch {
		case inc.Name == self.Name && self.Meta.Eligible:
			r := "incumbent"
			if len(claims) > 1 {
				r = fmt.Sprintf("incumbent (won over %s by term %d)", names(claims[1:]), inc.Meta.Term)
			}
			return Decision{Holder: true, Leader: self.Name, Reason: r}
		case inc.Name == self.Name:
			// We claim it but may not hold it: release, and let the
			// others wait for our release to be gossiped.
			return Decision{Leader: "", Reason: "holder but not eligible"}
		case inc.State == Suspect:
			return Decision{Leader: inc.Name, Reason: inc.Name + " holds it but is suspect: waiting until it is declared dead"}
		case inc.Meta.Eligible:
			return Decision{Leader: inc.Name, Reason: inc.Name + " holds it"}
		default:
			return Decision{Leader: "", Reason: inc.Name + " holds it but is not eligible: waiting for its release"}
		}
	}
	if !self.Meta.Eligible {
		return Decision{Reason: "not eligible"}
	}
	if self.Meta.CannotHold(vip) {
		return Decision{Reason: "cannot hold it now (acquire failed): stepping aside"}
	}
	var cands []Member
	for _, m := range v.Members {
		if m.State == Alive && m.Meta.Eligible && !m.Meta.CannotHold(vip) {
			cands = append(cands, m)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return better(cands[i], cands[j], vip) })
	w := cands[0] // self is eligible, able and alive in its own view
	if w.Name == self.Name {
		r := "elected: no holder"
		if len(cands) > 1 {
			r = fmt.Sprintf("elected: no holder; ranks first of %d eligible", len(cands))
		}
		return Decision{Holder: true, Leader: self.Name, Reason: r}
	}
	return Decision{Leader: w.Name, Reason: w.Name + " ranks first"}
}

// better orders candidates: higher priority first, then lower hash.
func better(a, b Member, vip string) bool {
	if a.Meta.Priority != b.Meta.Priority {
		return a.Meta.Priority > b.Meta.Priority
	}
	ha, hb := rank(a.Name, vip), rank(b.Name, vip)
	if ha != hb {
		return ha < hb
	}
	return a.Name < b.Name
}

func rank(name, vip string) string {
	h := sha256.Sum256([]byte(name + "#" + vip))
	return string(h[:])
}

func names(ms []Member) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = m.Name
	}
	return strings.Join(s, ",")
}

// nextTerm is the term of a new claim: above every term seen, saturating
// instead of wrapping to zero (a wrapped term would lose every tie).
func nextTerm(seen uint64) uint64 {
	if seen == math.MaxUint64 {
		return seen
	}
	return seen + 1
}

// QuorumRule is VIPD_QUORUM.
type QuorumRule struct {
	Off   bool
	Fixed int
}

// QuorumResult explains a quorum computation.
type QuorumResult struct {
	OK        bool   `json:"ok"`
	Alive     int    `json:"alive"` // known members alive or suspect that count this node, self included
	Known     int    `json:"known"` // members known
	Needed    int    `json:"needed"`
	Bootstrap bool   `json:"bootstrap"` // no other member known
	Reason    string `json:"reason"`
}

// Quorum decides whether this node may hold VIPs given who is alive. known
// is the set of members this node counts (self may be missing). A member
// counts towards the majority when it is known, alive or suspect, and counts
// this node in turn: two nodes whose member lists disagree (one was removed
// by the other side of a partition) cannot form a majority together.
func Quorum(v View, known []string, rule QuorumRule) QuorumResult {
	set := map[string]bool{v.Self: true}
	for _, k := range known {
		set[k] = true
	}
	alive := 0
	for _, m := range v.Members {
		if m.Name == v.Self {
			continue
		}
		if (m.State == Alive || m.State == Suspect) && set[m.Name] && m.Meta.counts(v.Self) && !m.Meta.Dup {
			alive++
		}
	}
	alive++ // self
	r := QuorumResult{Alive: alive, Known: len(set)}
	switch {
	case rule.Off:
		r.OK, r.Needed, r.Reason = true, 0, "quorum off"
	case rule.Fixed > 0:
		r.Needed = rule.Fixed
		r.OK = alive >= rule.Fixed
		r.Reason = fmt.Sprintf("%d of fixed %d alive", alive, rule.Fixed)
	case len(set) == 1:
		r.OK, r.Needed, r.Bootstrap = true, 1, true
		r.Reason = "bootstrap: no other member known"
	default:
		r.Needed = len(set)/2 + 1
		r.OK = alive >= r.Needed
		r.Reason = fmt.Sprintf("%d of %d known members alive, %d needed", alive, len(set), r.Needed)
	}
	return r
}
