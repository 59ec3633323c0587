// Package cluster elects, for every VIP, the one node that holds it, over
// hashicorp/memberlist gossip: no Kubernetes API is needed, so the first
// control-plane node can hold the VIP before the cluster exists.
//
// Each node gossips its metadata: whether its apiserver is healthy, whether
// it has quorum (together: eligible), its priority, the VIPs it holds and a
// term that grows with every acquire. From the membership view every node
// computes the same decision with the pure function Decide:
//
//   - a node that is not eligible holds nothing;
//   - a VIP that an eligible member holds stays with it (no preemption); if
//     several claim it (a healed partition), the highest term wins, then the
//     lowest name;
//   - a VIP whose holder is suspect stays unassigned until that holder is
//     declared dead or left: break before make;
//   - otherwise the eligible alive member with the highest priority, then the
//     lowest sha256(name + "#" + vip), takes it.
//
// Quorum is a majority of the known members: every member ever seen
// (persisted in the state directory) plus the ones alive now. A node that has
// never seen another member is bootstrapping and needs no quorum.
package cluster

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strings"
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

// Meta is what each node gossips about itself (at most 512 bytes encoded).
type Meta struct {
	Healthy  bool     `json:"h,omitempty"`
	Eligible bool     `json:"e,omitempty"` // healthy and quorum (or bootstrap)
	Priority int      `json:"p,omitempty"`
	Term     uint64   `json:"t,omitempty"`
	Holding  []string `json:"v,omitempty"` // VIPs held, as prefixes
}

// Holds reports whether the member claims vip.
func (m Meta) Holds(vip string) bool { return slices.Contains(m.Holding, vip) }

// Member is one node in the view.
type Member struct {
	Name  string
	Addr  string
	State State
	Meta  Meta
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
	var cands []Member
	for _, m := range v.Members {
		if m.State == Alive && m.Meta.Eligible {
			cands = append(cands, m)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return better(cands[i], cands[j], vip) })
	w := cands[0] // self is eligible and alive in its own view
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

// QuorumRule is VIPD_QUORUM.
type QuorumRule struct {
	Off   bool
	Fixed int
}

// QuorumResult explains a quorum computation.
type QuorumResult struct {
	OK        bool   `json:"ok"`
	Alive     int    `json:"alive"` // members alive or suspect, self included
	Known     int    `json:"known"` // members known (ever seen plus alive now)
	Needed    int    `json:"needed"`
	Bootstrap bool   `json:"bootstrap"` // never seen another member
	Reason    string `json:"reason"`
}

// Quorum decides whether this node may hold VIPs given who is alive.
// known is the persisted set of members ever seen (self may be missing).
func Quorum(v View, known []string, rule QuorumRule) QuorumResult {
	set := map[string]bool{v.Self: true}
	for _, k := range known {
		set[k] = true
	}
	alive := 0
	for _, m := range v.Members {
		if m.State == Alive || m.State == Suspect {
			alive++
			set[m.Name] = true
		}
	}
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
		r.Reason = "bootstrap: no other member ever seen"
	default:
		r.Needed = len(set)/2 + 1
		r.OK = alive >= r.Needed
		r.Reason = fmt.Sprintf("%d of %d known members alive, %d needed", alive, len(set), r.Needed)
	}
	return r
}
