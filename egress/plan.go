// Package egress programs a static egress IP through the node that holds
// it (the gateway): selected pods' traffic to selected destinations leaves
// the cluster with the egress IP as its source.
//
// On the gateway, matching flows are SNATed to the egress IP (before the
// CNI's masquerade) and their forwarding is accepted. On every other node
// (a director) they are marked in prerouting, policy-routed (an ip rule on
// the mark, one routing table per egress IP) to the gateway's node address
// and exempted from the CNI's masquerade with an identity SNAT that runs
// before it.
//
// The package is split like the rest of vipd: Plan and Diff are pure (the
// desired kernel state from the inputs, and what to change to get there
// from what the kernel has), Kernel does the netlink and nftables I/O, and
// Controller runs them every tick.
package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"
)

// TableName is the nftables table vipd owns (family inet).
const TableName = "vipd-egress"

// Chain priorities (docs/egress.md).
const (
	// PriorityMark runs after dstnat (-100), so a service's DNAT is seen,
	// and before the routing decision that the mark steers.
	PriorityMark = -90
	// PrioritySNAT runs before srcnat (100), where iptables' and most CNIs'
	// masquerade rules live: a NAT binding made here skips them.
	PrioritySNAT = 90
	// PriorityForward runs before the filter chains (0).
	PriorityForward = -10
)

// MaxEgressIPs is the number of egress IPs (routing tables) at most.
const MaxEgressIPs = 15

// Rule is one egress rule: traffic from From to To leaves with source IP.
type Rule struct {
	IP   netip.Addr
	From []netip.Prefix
	To   []netip.Prefix
}

// Settings are the node's egress settings.
type Settings struct {
	Table        int            // first routing table (VIPD_EGRESS_TABLE)
	RulePriority int            // ip rule priority (VIPD_EGRESS_RULE_PRIORITY)
	MarkMask     uint32         // VIPD_EGRESS_MARK_MASK
	Link         int            // index of the interface routes leave by
	ClusterCIDRs []netip.Prefix // never steered (VIPD_EGRESS_CLUSTER_CIDRS)
}

// Gateway is what this node knows about the gateway of one egress IP.
type Gateway struct {
	Self bool       // this node is the gateway (holds, or is elected to hold, the IP)
	Node string     // the gateway's node name ("" unknown)
	Addr netip.Addr // its node address; invalid: unknown
}

// Input is everything Plan needs.
type Input struct {
	Rules    []Rule
	Gateways map[netip.Addr]Gateway
	Settings Settings
	// Order fixes the slot (mark value and routing table) of each egress
	// IP, so that rules coming and going (EgressPolicy objects) do not
	// renumber the others. Empty: the order of first mention in Rules.
	// Rules whose IP is not in Order are ignored.
	Order []netip.Addr
}

// slots returns the egress IPs in use with their slot numbers.
func (in Input) slots() (ips []netip.Addr, slot map[netip.Addr]int) {
	slot = map[netip.Addr]int{}
	used := IPs(in.Rules)
	if len(in.Order) == 0 {
		for i, ip := range used {
			slot[ip] = i
		}
		return used, slot
	}
	for i, ip := range in.Order {
		if slices.Contains(used, ip) && i < MaxEgressIPs {
			ips = append(ips, ip)
			slot[ip] = i
		}
	}
	return ips, slot
}

// Role of this node for one egress IP.
type Role string

// Roles.
const (
	RoleGateway  Role = "gateway"
	RoleDirector Role = "director"
)

// State is the desired (or observed) kernel state.
type State struct {
	Chains  []Chain // the nftables table's chains; none: no table
	IPRules []IPRule
	Routes  []Route
	// Roles is this node's role per egress IP (not kernel state).
	Roles map[netip.Addr]Role
}

// Chain is one base chain of the vipd table.
type Chain struct {
	Name     string
	Hook     string // prerouting, postrouting, forward
	Type     string // filter, nat
	Priority int
	Rules    []NftRule
}

// NftRule is one rule: every set field of the match must hold.
type NftRule struct {
	Family   int          // 4 or 6
	Src, Dst netip.Prefix // invalid: any
	// Iif != 0: the packet came in on this interface (prerouting only).
	Iif int
	// MarkMask != 0: the packet mark masked by MarkMask equals Mark.
	Mark, MarkMask uint32
	DNATed         bool // the connection was DNATed (ct status dnat)
	DstLocal       bool // the destination is an address of this node
	Reply          bool // ct state established or related
	Action         Action
	Label          string // readable part of the rule's comment
}

// Action is what a rule does.
type Action struct {
	Kind ActionKind
	// SetMark's mark and the bits it may change; SNAT's address.
	Mark, Mask uint32
	To         netip.Addr
}

// ActionKind names an action.
type ActionKind string

// Actions.
const (
	Return   ActionKind = "return"
	Accept   ActionKind = "accept"
	SetMark  ActionKind = "mark"     // mark = (mark & ^Mask) | Mark
	SNAT     ActionKind = "snat"     // snat to Action.To
	SNATSelf ActionKind = "snatself" // snat to the packet's own source: a binding that skips later NAT chains
	Drop     ActionKind = "drop"
	Count    ActionKind = "count" // only the rule's counter: no verdict
)

// Key is the canonical text of the rule: equal keys, equal rules.
func (r NftRule) Key() string {
	k := fmt.Sprintf("f=%d src=%s dst=%s mark=%#x/%#x dnat=%v local=%v reply=%v act=%s/%#x/%#x/%s",
		r.Family, r.Src, r.Dst, r.Mark, r.MarkMask, r.DNATed, r.DstLocal, r.Reply, r.Action.Kind, r.Action.Mark, r.Action.Mask, r.Action.To)
	// Fields added later only when set: the digests of the older rules
	// stay the same across an upgrade.
	if r.Iif != 0 {
		k += fmt.Sprintf(" iif=%d", r.Iif)
	}
	return k
}

// Comment is the rule's nftables comment: a readable label and a digest
// of its key, which is how the kernel's rules are compared with the plan.
func (r NftRule) Comment() string {
	h := sha256.Sum256([]byte(r.Key()))
	return "vipd " + r.Label + " #" + hex.EncodeToString(h[:5])
}

// ChainKey is the canonical text of a chain's declaration.
func (c Chain) ChainKey() string {
	return fmt.Sprintf("%s %s %s %d", c.Name, c.Type, c.Hook, c.Priority)
}

// IPRule is a policy routing rule: packets whose mark masked by Mask is
// Mark look up Table.
type IPRule struct {
	Family   int
	Priority int
	Mark     uint32
	Mask     uint32
	Table    int
}

// Route is a default route in one of vipd's tables: through Via on the
// link, or unreachable when Via is invalid.
type Route struct {
	Family int
	Table  int
	Via    netip.Addr
	Link   int
	// raw is the kernel's own route when it is not one vipd makes (Observe
	// only): what Apply deletes.
	raw any
}

// Unreachable reports whether the route rejects (no gateway known).
func (r Route) Unreachable() bool { return !r.Via.IsValid() }

func (r Route) String() string {
	if r.Unreachable() {
		return fmt.Sprintf("unreachable default (IPv%d) table %d", r.Family, r.Table)
	}
	return fmt.Sprintf("default via %s (IPv%d) table %d", r.Via, r.Family, r.Table)
}

func (r IPRule) String() string {
	return fmt.Sprintf("IPv%d priority %d fwmark %#x/%#x lookup %d", r.Family, r.Priority, r.Mark, r.Mask, r.Table)
}

// IPs returns the distinct egress IPs of rules in order of first mention:
// the i-th (from 0) uses mark i+1 and routing table Table+i.
func IPs(rules []Rule) []netip.Addr {
	var out []netip.Addr
	for _, r := range rules {
		if !slices.Contains(out, r.IP) {
			out = append(out, r.IP)
		}
	}
	return out
}

// MarkValue is the mark of the i-th egress IP (from 0) under mask.
func MarkValue(i int, mask uint32) uint32 {
	return uint32(i+1) << bits.TrailingZeros32(mask)
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// Plan computes the desired kernel state. It is a pure function.
//
// The snat chain of every plan ends with a guard: a new selected flow
// (the first packet of a connection, which is all a NAT chain sees) that
// no rule before SNATed to an egress IP or bypassed to the gateway is
// dropped there, before the CNI's masquerade would give it this node's
// address. Whatever the window between two states of the cluster (a
// gateway stepping down, a director routing to a node that is no longer
// the gateway, a stopping node), the selected pods' connections are then
// never set up with a node's address: their packets are dropped instead.
func Plan(in Input) State { return plan(in, false) }

// PlanStopping is the state a stopping node holds while other nodes may
// still route their pods' traffic through it (a gateway that just stepped
// down): the snat chain's guard alone, which drops every new selected flow
// (nothing SNATs or marks any more), and a count of the selected packets
// arriving from other nodes (chain arrivals, read by Kernel.Arrivals),
// by which the stop sees when the directors have moved away. No marks,
// SNAT, ip rules or routes.
func PlanStopping(in Input) State { return plan(in, true) }

// ChainArrivals is the stopping state's counting chain (read back by name).
const ChainArrivals = "arrivals"

func plan(in Input, stopping bool) State {
	st := State{Roles: map[netip.Addr]Role{}}
	ips, slot := in.slots()
	if len(ips) == 0 {
		return st
	}
	s := in.Settings
	// Destinations never steered, per family: the cluster CIDRs and the
	// from CIDRs of every rule (pod to pod stays inside).
	excluded := map[int][]netip.Prefix{}
	addExcl := func(p netip.Prefix) {
		f := family(p.Addr())
		if !slices.Contains(excluded[f], p) {
			excluded[f] = append(excluded[f], p)
		}
	}
	for _, p := range s.ClusterCIDRs {
		addExcl(p)
	}
	for _, r := range in.Rules {
		if _, ok := slot[r.IP]; !ok {
			continue
		}
		for _, p := range r.From {
			addExcl(p)
		}
	}
	for f := range excluded {
		sort.Slice(excluded[f], func(i, j int) bool { return excluded[f][i].String() < excluded[f][j].String() })
	}
	families := map[int]bool{}
	for _, ip := range ips {
		families[family(ip)] = true
	}
	exclusions := func(local bool) []NftRule {
		var out []NftRule
		for _, f := range []int{4, 6} {
			if !families[f] {
				continue
			}
			out = append(out, NftRule{Family: f, DNATed: true, Action: Action{Kind: Return}, Label: "skip DNATed (services)"})
			if local {
				out = append(out, NftRule{Family: f, DstLocal: true, Action: Action{Kind: Return}, Label: "skip local destinations"})
			}
			for _, p := range excluded[f] {
				out = append(out, NftRule{Family: f, Dst: p, Action: Action{Kind: Return}, Label: "skip cluster " + p.String()})
			}
		}
		return out
	}

	if stopping {
		arrivals := flowRules(in, ips, func(ip netip.Addr, from, to netip.Prefix) NftRule {
			return NftRule{Family: family(ip), Iif: s.Link, Src: from, Dst: to,
				Action: Action{Kind: Count}, Label: "stopping: from another node " + ip.String()}
		})
		st.Chains = append(st.Chains,
			Chain{Name: ChainArrivals, Hook: "prerouting", Type: "filter", Priority: PriorityMark, Rules: append(exclusions(true), arrivals...)},
			Chain{Name: "snat", Hook: "postrouting", Type: "nat", Priority: PrioritySNAT, Rules: append(exclusions(false), guardRules(in, ips)...)})
		return st
	}

	var mark, snat, fwd []NftRule
	for _, ip := range ips {
		i := slot[ip]
		f := family(ip)
		gw := in.Gateways[ip]
		value := MarkValue(i, s.MarkMask)
		table := s.Table + i
		// The rule is there whatever the role: a role change then only
		// touches the table's route and the nftables table.
		st.IPRules = append(st.IPRules, IPRule{Family: f, Priority: s.RulePriority, Mark: value, Mask: s.MarkMask, Table: table})
		if gw.Self {
			st.Roles[ip] = RoleGateway
			for _, r := range in.Rules {
				if r.IP != ip {
					continue
				}
				for _, from := range r.From {
					for _, to := range r.To {
						snat = append(snat, NftRule{Family: f, Src: from, Dst: to, Action: Action{Kind: SNAT, To: ip}, Label: "gateway " + ip.String() + " snat"})
						fwd = append(fwd,
							NftRule{Family: f, Src: from, Dst: to, Action: Action{Kind: Accept}, Label: "gateway " + ip.String() + " forward"},
							NftRule{Family: f, Src: to, Dst: from, Reply: true, Action: Action{Kind: Accept}, Label: "gateway " + ip.String() + " replies"})
					}
				}
			}
			continue
		}
		st.Roles[ip] = RoleDirector
		// Without a known gateway the traffic is rejected rather than let
		// out with another source address (fail closed).
		rt := Route{Family: f, Table: table, Via: gw.Addr, Link: s.Link}
		switch {
		case !gw.Addr.IsValid():
			rt.Link = 0
		case family(gw.Addr) != f:
			// The gateway's node (gossip) address is of the other family
			// (IPv6 has no IPv4 next hops): route via the egress IP itself,
			// on link; the holder answers for it and announces it to the
			// segment when it takes it over.
			rt.Via = ip
		}
		st.Routes = append(st.Routes, rt)
		for _, r := range in.Rules {
			if r.IP != ip {
				continue
			}
			for _, from := range r.From {
				for _, to := range r.To {
					mark = append(mark, NftRule{Family: f, Src: from, Dst: to, Action: Action{Kind: SetMark, Mark: value, Mask: s.MarkMask}, Label: "director " + ip.String() + " mark"})
				}
			}
		}
		snat = append(snat, NftRule{Family: f, Mark: value, MarkMask: s.MarkMask, Action: Action{Kind: SNATSelf}, Label: "director " + ip.String() + " skip masquerade"})
	}
	if len(mark) > 0 {
		st.Chains = append(st.Chains, Chain{Name: "mark", Hook: "prerouting", Type: "filter", Priority: PriorityMark,
			Rules: append(exclusions(true), mark...)})
	}
	st.Chains = append(st.Chains, Chain{Name: "snat", Hook: "postrouting", Type: "nat", Priority: PrioritySNAT,
		Rules: append(append(exclusions(false), snat...), guardRules(in, ips)...)})
	if len(fwd) > 0 {
		st.Chains = append(st.Chains, Chain{Name: "forward", Hook: "forward", Type: "filter", Priority: PriorityForward, Rules: fwd})
	}
	return st
}

// guardRules end the snat chain: a selected flow that reaches them was
// neither SNATed to its egress IP (gateway) nor marked for a gateway
// (director), so the CNI's masquerade would send it out with this node's
// address: it is dropped. A NAT chain sees a connection's first packet
// only: a flow it dropped has no conntrack entry and its next packet is
// seen again.
func guardRules(in Input, ips []netip.Addr) []NftRule {
	return flowRules(in, ips, func(ip netip.Addr, from, to netip.Prefix) NftRule {
		return NftRule{Family: family(ip), Src: from, Dst: to, Action: Action{Kind: Drop},
			Label: "guard " + ip.String() + " drop unless snat"}
	})
}

// flowRules makes one rule per flow (source, destination) that the rules
// of ips select, without duplicates.
func flowRules(in Input, ips []netip.Addr, rule func(ip netip.Addr, from, to netip.Prefix) NftRule) []NftRule {
	var out []NftRule
	for _, ip := range ips {
		for _, r := range in.Rules {
			if r.IP != ip {
				continue
			}
			for _, from := range r.From {
				for _, to := range r.To {
					out = appendUnique(out, rule(ip, from, to))
				}
			}
		}
	}
	return out
}

// appendUnique appends r unless a rule with the same key is there (two
// egress IPs' rules may select the same flows).
func appendUnique(rs []NftRule, r NftRule) []NftRule {
	for _, x := range rs {
		if x.Key() == r.Key() {
			return rs
		}
	}
	return append(rs, r)
}

// Observed is what the kernel has that vipd owns: the table's chains (each
// with its rules' comments), the ip rules at vipd's priority that look up
// one of its tables, and the routes in its tables.
type Observed struct {
	Table   bool
	Chains  []ObservedChain
	IPRules []IPRule
	Routes  []Route
}

// ObservedChain is a chain as read back from the kernel.
type ObservedChain struct {
	Key      string   // ChainKey form
	Comments []string // the rules' comments, in order
}

// Changes is what Diff found to do.
type Changes struct {
	// ReplaceTable rewrites the whole nftables table in one batch (or
	// deletes it when the plan has no chains).
	ReplaceTable bool
	DeleteTable  bool
	AddRules     []IPRule
	DelRules     []IPRule
	AddRoutes    []Route
	DelRoutes    []Route
}

// Empty reports whether nothing is to be done.
func (c Changes) Empty() bool {
	return !c.ReplaceTable && !c.DeleteTable && len(c.AddRules)+len(c.DelRules)+len(c.AddRoutes)+len(c.DelRoutes) == 0
}

// Summary lists the changes, for logs.
func (c Changes) Summary() string {
	var p []string
	if c.ReplaceTable {
		p = append(p, "replace nftables table")
	}
	if c.DeleteTable {
		p = append(p, "delete nftables table")
	}
	for _, r := range c.DelRules {
		p = append(p, "del rule "+r.String())
	}
	for _, r := range c.AddRules {
		p = append(p, "add rule "+r.String())
	}
	for _, r := range c.DelRoutes {
		p = append(p, "del route "+r.String())
	}
	for _, r := range c.AddRoutes {
		p = append(p, "add route "+r.String())
	}
	return strings.Join(p, "; ")
}

// Diff returns the changes that turn obs into want. It is pure.
func Diff(want State, obs Observed) Changes {
	var c Changes
	if len(want.Chains) == 0 {
		c.DeleteTable = obs.Table
	} else if !chainsEqual(want.Chains, obs) {
		c.ReplaceTable = true
	}
	for _, r := range obs.IPRules {
		if !slices.Contains(want.IPRules, r) {
			c.DelRules = append(c.DelRules, r)
		}
	}
	for _, r := range want.IPRules {
		if !slices.Contains(obs.IPRules, r) {
			c.AddRules = append(c.AddRules, r)
		}
	}
	for _, r := range obs.Routes {
		if !slices.Contains(want.Routes, r) {
			c.DelRoutes = append(c.DelRoutes, r)
		}
	}
	for _, r := range want.Routes {
		if !slices.Contains(obs.Routes, r) {
			c.AddRoutes = append(c.AddRoutes, r)
		}
	}
	return c
}

func chainsEqual(want []Chain, obs Observed) bool {
	if !obs.Table || len(want) != len(obs.Chains) {
		return false
	}
	byKey := map[string][]string{}
	for _, oc := range obs.Chains {
		byKey[oc.Key] = oc.Comments
	}
	for _, w := range want {
		got, ok := byKey[w.ChainKey()]
		if !ok || len(got) != len(w.Rules) {
			return false
		}
		for i, r := range w.Rules {
			if got[i] != r.Comment() {
				return false
			}
		}
	}
	return true
}

// Observe returns what obs would be if the kernel held exactly st: what a
// perfect Apply leaves behind (used by tests and to check an apply).
func (st State) Observe() Observed {
	o := Observed{Table: len(st.Chains) > 0, IPRules: slices.Clone(st.IPRules), Routes: slices.Clone(st.Routes)}
	for _, c := range st.Chains {
		oc := ObservedChain{Key: c.ChainKey()}
		for _, r := range c.Rules {
			oc.Comments = append(oc.Comments, r.Comment())
		}
		o.Chains = append(o.Chains, oc)
	}
	return o
}

// Bounds of a stopping node's drain (see Drain).
const (
	// DrainMax bounds the whole drain, from the stop on.
	DrainMax = 2 * time.Second
	// DrainMemory: a node that was a gateway this recently drains; the
	// directors move to a new gateway within a gossip round (well under a
	// second), so a node that stepped down longer ago carries nothing.
	DrainMemory = 10 * time.Second
	// DrainQuiet: the guard stays until no packet of a selected flow came
	// from another node for this long (the directors' poll is 50 ms).
	DrainQuiet = 200 * time.Millisecond
	// DrainPoll is how often a draining node looks again.
	DrainPoll = 20 * time.Millisecond
)

// DrainInput is what a stopping node knows at one moment of its drain.
type DrainInput struct {
	Now   time.Time
	Start time.Time // the stop began (the controller's context was done)
	// LastGateway is the last time this node was the gateway of an egress
	// IP (zero: never in this run).
	LastGateway time.Time
	Held        bool // still holds an egress IP
	Left        bool // has left the cluster (true without a cluster)
	// Guarded is when the stopping state (PlanStopping) went in; zero:
	// not yet.
	Guarded time.Time
	// LastArrival is when the count of selected packets from other nodes
	// last grew while guarded (zero: it never did).
	LastArrival time.Time
}

// DrainStep is what a stopping node does next.
type DrainStep string

// Drain steps.
const (
	DrainWait   DrainStep = "wait"   // look again by the returned time
	DrainGuard  DrainStep = "guard"  // install PlanStopping, then look again
	DrainRemove DrainStep = "remove" // remove everything: nobody routes here any more (or DrainMax is up)
)

// Drain decides the next step of a stopping node's egress state. It is
// pure.
//
// The directors route the selected pods' traffic to whichever node they
// last saw holding the egress IP, and learn of a new holder only through
// gossip: for a while after a gateway stepped down (a hand-over at stop, or
// just before) their packets still arrive. A node that removed its table
// then would forward them by its main table, and the CNI's masquerade
// would send them out with this node's address. So a node that was a
// gateway within DrainMemory waits until it released the egress IPs and
// left the cluster (the directors' view moves on), then holds the stopping
// state, which drops such packets and counts them, until none arrived for
// DrainQuiet; then it removes everything. DrainMax bounds it all.
func Drain(in DrainInput) (DrainStep, time.Time) {
	deadline := in.Start.Add(DrainMax)
	if in.LastGateway.IsZero() || in.Start.Sub(in.LastGateway) > DrainMemory || !in.Now.Before(deadline) {
		return DrainRemove, time.Time{}
	}
	next := func(t time.Time) time.Time {
		if p := in.Now.Add(DrainPoll); p.Before(t) {
			t = p
		}
		if deadline.Before(t) {
			t = deadline
		}
		return t
	}
	if in.Held || !in.Left {
		return DrainWait, next(deadline)
	}
	if in.Guarded.IsZero() {
		return DrainGuard, time.Time{}
	}
	quiet := in.Guarded
	if in.LastArrival.After(quiet) {
		quiet = in.LastArrival
	}
	if end := quiet.Add(DrainQuiet); in.Now.Before(end) {
		return DrainWait, next(end)
	}
	return DrainRemove, time.Time{}
}
