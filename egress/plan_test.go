package egress

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

var (
	eip4 = netip.MustParseAddr("10.0.0.200")
	eip6 = netip.MustParseAddr("fd00::200")
	pods = netip.MustParsePrefix("10.244.0.0/16")
	any4 = netip.MustParsePrefix("0.0.0.0/0")
)

func settings() Settings {
	return Settings{Table: 7950, RulePriority: 7950, MarkMask: 0x00f00000, Link: 2,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
}

func rules() []Rule {
	return []Rule{
		{IP: eip4, From: []netip.Prefix{pods}, To: []netip.Prefix{any4}},
		{IP: eip6, From: []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/56")}, To: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}},
	}
}

func chain(st State, name string) *Chain {
	for i := range st.Chains {
		if st.Chains[i].Name == name {
			return &st.Chains[i]
		}
	}
	return nil
}

func kinds(c *Chain) []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, r := range c.Rules {
		s := string(r.Action.Kind)
		if r.Dst.IsValid() && r.Action.Kind == Return {
			s += " " + r.Dst.String()
		}
		out = append(out, s)
	}
	return out
}

func TestPlanRoles(t *testing.T) {
	gw2 := netip.MustParseAddr("10.0.0.12")
	tests := []struct {
		name      string
		gws       map[netip.Addr]Gateway
		roles     map[netip.Addr]Role
		routes    []Route
		markRules []string // action kinds of the mark chain
		snatRules []string
		forward   int
	}{
		{
			name:  "director for both, gateway of IPv4 known, IPv6 unknown",
			gws:   map[netip.Addr]Gateway{eip4: {Node: "n2", Addr: gw2}},
			roles: map[netip.Addr]Role{eip4: RoleDirector, eip6: RoleDirector},
			routes: []Route{
				{Family: 4, Table: 7950, Via: gw2, Link: 2},
				{Family: 6, Table: 7951}, // unreachable: fail closed
			},
			markRules: []string{"return", "return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return", "return fd00:10:244::/56", "mark", "mark"},
			snatRules: []string{"return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return fd00:10:244::/56", "snatself", "snatself", "drop", "drop"},
		},
		{
			name:      "gateway of IPv4, director of IPv6 (its gateway known by an IPv4 address)",
			gws:       map[netip.Addr]Gateway{eip4: {Self: true, Node: "n1"}, eip6: {Node: "n2", Addr: gw2}},
			roles:     map[netip.Addr]Role{eip4: RoleGateway, eip6: RoleDirector},
			routes:    []Route{{Family: 6, Table: 7951, Via: eip6, Link: 2}}, // via the egress IP: no IPv4 next hop for IPv6
			markRules: []string{"return", "return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return", "return fd00:10:244::/56", "mark"},
			snatRules: []string{"return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return fd00:10:244::/56", "snat", "snatself", "drop", "drop"},
			forward:   2,
		},
		{
			name:      "gateway of both: no marks, no routes",
			gws:       map[netip.Addr]Gateway{eip4: {Self: true}, eip6: {Self: true}},
			roles:     map[netip.Addr]Role{eip4: RoleGateway, eip6: RoleGateway},
			snatRules: []string{"return", "return 10.244.0.0/16", "return 10.96.0.0/12", "return", "return fd00:10:244::/56", "snat", "snat", "drop", "drop"},
			forward:   4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := Plan(Input{Rules: rules(), Gateways: tt.gws, Settings: settings()})
			for ip, r := range tt.roles {
				if st.Roles[ip] != r {
					t.Errorf("role of %s: %s, want %s", ip, st.Roles[ip], r)
				}
			}
			// The ip rules are there whatever the role.
			wantRules := []IPRule{{Family: 4, Priority: 7950, Mark: 0x100000, Mask: 0xf00000, Table: 7950}, {Family: 6, Priority: 7950, Mark: 0x200000, Mask: 0xf00000, Table: 7951}}
			if !slices.Equal(st.IPRules, wantRules) {
				t.Errorf("ip rules %v, want %v", st.IPRules, wantRules)
			}
			if !slices.Equal(st.Routes, tt.routes) {
				t.Errorf("routes %v, want %v", st.Routes, tt.routes)
			}
			if got := kinds(chain(st, "mark")); !slices.Equal(got, tt.markRules) {
				t.Errorf("mark chain %q, want %q", got, tt.markRules)
			}
			if got := kinds(chain(st, "snat")); !slices.Equal(got, tt.snatRules) {
				t.Errorf("snat chain %q, want %q", got, tt.snatRules)
			}
			if n := len(kinds(chain(st, "forward"))); n != tt.forward {
				t.Errorf("forward chain has %d rules, want %d", n, tt.forward)
			}
		})
	}
}

func TestPlanDetails(t *testing.T) {
	st := Plan(Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Addr: netip.MustParseAddr("10.0.0.12")}}, Settings: settings()})
	m := chain(st, "mark")
	if m.Hook != "prerouting" || m.Type != "filter" || m.Priority != PriorityMark {
		t.Fatalf("mark chain %+v", m)
	}
	last := m.Rules[len(m.Rules)-2]
	if last.Src != pods || last.Dst != any4 || last.Action.Mark != 0x100000 || last.Action.Mask != 0xf00000 || last.Family != 4 {
		t.Fatalf("IPv4 mark rule %+v", last)
	}
	// The local-destination and DNAT exclusions come first.
	if !m.Rules[0].DNATed || !m.Rules[1].DstLocal {
		t.Fatalf("exclusions first: %+v", m.Rules[:2])
	}
	s := chain(st, "snat")
	if s.Hook != "postrouting" || s.Type != "nat" || s.Priority >= 100 {
		t.Fatalf("snat chain must run before srcnat (100): %+v", s)
	}
	self := s.Rules[len(s.Rules)-4] // then the IPv6 bypass and the two guards
	if self.Action.Kind != SNATSelf || self.Mark != 0x100000 || self.MarkMask != 0xf00000 {
		t.Fatalf("masquerade bypass matches the mark: %+v", self)
	}
	// Comments identify rules: every rule's differs within its chain.
	for _, c := range st.Chains {
		seen := map[string]bool{}
		for _, r := range c.Rules {
			cm := r.Comment()
			if seen[cm] || !strings.HasPrefix(cm, "vipd ") || len(cm) > 120 {
				t.Fatalf("comment %q duplicated or malformed", cm)
			}
			seen[cm] = true
		}
	}
	// Nothing to do without rules.
	if e := Plan(Input{Settings: settings()}); len(e.Chains)+len(e.IPRules)+len(e.Routes) != 0 {
		t.Fatalf("empty plan: %+v", e)
	}
	// Several from/to CIDRs: one rule per pair; a gateway's own pod CIDR
	// destinations are excluded.
	r := []Rule{{IP: eip4, From: []netip.Prefix{pods, netip.MustParsePrefix("10.245.0.0/16")}, To: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/24")}}}
	g := Plan(Input{Rules: r, Gateways: map[netip.Addr]Gateway{eip4: {Self: true}}, Settings: settings()})
	if n := len(kinds(chain(g, "snat"))); n != 4+4+4 { // dnat, 2 from CIDRs, the service CIDR; 4 pairs; their 4 guards
		t.Fatalf("snat rules: %q", kinds(chain(g, "snat")))
	}
}

func TestDiff(t *testing.T) {
	gw2, gw3 := netip.MustParseAddr("10.0.0.12"), netip.MustParseAddr("10.0.0.13")
	dir := Plan(Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Addr: gw2}, eip6: {Addr: gw2}}, Settings: settings()})
	dir3 := Plan(Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Addr: gw3}, eip6: {Addr: gw2}}, Settings: settings()})
	gw := Plan(Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Self: true}, eip6: {Addr: gw2}}, Settings: settings()})

	tamper := func(f func(o *Observed)) Observed {
		o := dir.Observe()
		f(&o)
		return o
	}
	tests := []struct {
		name  string
		want  State
		obs   Observed
		check func(c Changes) bool
	}{
		{"in sync", dir, dir.Observe(), Changes.Empty},
		{"nothing there yet (start)", dir, Observed{}, func(c Changes) bool {
			return c.ReplaceTable && len(c.AddRules) == 2 && len(c.AddRoutes) == 2 && len(c.DelRules)+len(c.DelRoutes) == 0
		}},
		{"gateway moved: one route replaced, table kept", dir3, dir.Observe(), func(c Changes) bool {
			return !c.ReplaceTable && len(c.AddRoutes) == 1 && c.AddRoutes[0].Via == gw3 && len(c.DelRoutes) == 1 && c.DelRoutes[0].Via == gw2
		}},
		{"became the gateway: table replaced, route removed, rules kept", gw, dir.Observe(), func(c Changes) bool {
			return c.ReplaceTable && len(c.DelRoutes) == 1 && c.DelRoutes[0].Family == 4 && len(c.AddRules)+len(c.DelRules)+len(c.AddRoutes) == 0
		}},
		{"rule deleted by hand", dir, tamper(func(o *Observed) { o.IPRules = o.IPRules[1:] }), func(c Changes) bool {
			return len(c.AddRules) == 1 && c.AddRules[0].Family == 4 && !c.ReplaceTable
		}},
		{"route changed by hand", dir, tamper(func(o *Observed) { o.Routes[0].Via = gw3 }), func(c Changes) bool {
			return len(c.AddRoutes) == 1 && len(c.DelRoutes) == 1 && c.DelRoutes[0].Via == gw3
		}},
		{"rule added to a vipd chain by hand", dir, tamper(func(o *Observed) { o.Chains[0].Comments = append(o.Chains[0].Comments, "") }), func(c Changes) bool {
			return c.ReplaceTable
		}},
		{"rule replaced in place", dir, tamper(func(o *Observed) { o.Chains[1].Comments[0] = "vipd x #0000000000" }), func(c Changes) bool {
			return c.ReplaceTable
		}},
		{"a chain added to the table", dir, tamper(func(o *Observed) { o.Chains = append(o.Chains, ObservedChain{Key: "extra"}) }), func(c Changes) bool {
			return c.ReplaceTable
		}},
		{"table deleted by hand", dir, tamper(func(o *Observed) { o.Table, o.Chains = false, nil }), func(c Changes) bool {
			return c.ReplaceTable && len(c.AddRoutes)+len(c.AddRules) == 0
		}},
		{"stale state of a crash with more egress IPs", dir, tamper(func(o *Observed) {
			o.IPRules = append(o.IPRules, IPRule{Family: 4, Priority: 7950, Mark: 0x300000, Mask: 0xf00000, Table: 7952})
			o.Routes = append(o.Routes, Route{Family: 4, Table: 7952, Via: gw3, Link: 2}, Route{Family: 4, Table: 7950, Link: -1})
		}), func(c Changes) bool {
			return len(c.DelRules) == 1 && c.DelRules[0].Table == 7952 && len(c.DelRoutes) == 2 && !c.ReplaceTable
		}},
		{"egress removed from the config: everything goes", State{}, dir.Observe(), func(c Changes) bool {
			return c.DeleteTable && !c.ReplaceTable && len(c.DelRules) == 2 && len(c.DelRoutes) == 2
		}},
		{"nothing wanted, nothing there", State{}, Observed{}, Changes.Empty},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Diff(tt.want, tt.obs)
			if !tt.check(c) {
				t.Fatalf("changes: %s", c.Summary())
			}
			// Applying the changes reaches the plan: a second diff is empty.
			if d := Diff(tt.want, tt.want.Observe()); !d.Empty() {
				t.Fatalf("plan does not match itself: %s", d.Summary())
			}
		})
	}
}

func TestPlanOrderKeepsSlots(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.200"), netip.MustParseAddr("10.0.0.201"), netip.MustParseAddr("10.0.0.202")
	// Only b has rules now (a's policy went away): b keeps slot 1; c is not
	// an address this node elects and is ignored.
	r := []Rule{{IP: b, From: []netip.Prefix{pods}, To: []netip.Prefix{any4}}, {IP: c, From: []netip.Prefix{pods}, To: []netip.Prefix{any4}}}
	st := Plan(Input{Rules: r, Order: []netip.Addr{a, b}, Gateways: map[netip.Addr]Gateway{b: {Addr: netip.MustParseAddr("10.0.0.12")}}, Settings: settings()})
	want := []IPRule{{Family: 4, Priority: 7950, Mark: 0x200000, Mask: 0xf00000, Table: 7951}}
	if !slices.Equal(st.IPRules, want) || len(st.Routes) != 1 || st.Routes[0].Table != 7951 {
		t.Fatalf("rules %v routes %v", st.IPRules, st.Routes)
	}
	if _, ok := st.Roles[c]; ok {
		t.Fatalf("an address outside Order got a role: %v", st.Roles)
	}
}
