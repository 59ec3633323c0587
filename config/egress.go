package config

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
)

// SecEgress is the section of the static egress settings.
const SecEgress = "Egress (static egress IP through the VIP holder)"

// EgressRule is one rule of VIPD_EGRESS: traffic from the From CIDRs to the
// To CIDRs leaves the cluster with the source address IP, through the node
// that holds IP.
type EgressRule struct {
	IP   netip.Addr
	From []netip.Prefix
	To   []netip.Prefix
}

// String is the rule in VIPD_EGRESS form.
func (r EgressRule) String() string {
	return r.IP.String() + " from " + joinPrefixes(r.From) + " to " + joinPrefixes(r.To)
}

// EgressForm is the accepted form of VIPD_EGRESS, used in its errors.
const EgressForm = `rules "EGRESS_IP from CIDR[,CIDR...] to CIDR[,CIDR...]" separated by ";", ` +
	`e.g. "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0", the CIDRs of the egress IP's family`

// Egress defaults (docs/egress.md).
const (
	DefaultEgressTable        = 7950
	DefaultEgressRulePriority = 7950
	DefaultEgressMarkMask     = 0x00f00000
)

// egressSettings are appended to the table (settings.go) in this order.
var egressSettings = []Setting{
	{Env: "VIPD_EGRESS", Flag: "egress", Section: SecEgress,
		Doc: "Static egress rules (l2 mode): traffic from the pods in the from CIDRs to the to CIDRs leaves with EGRESS_IP as its source, through the node that holds EGRESS_IP; " +
			"each EGRESS_IP joins the elected addresses. Empty: no egress programming.",
		Accepted: EgressForm,
		parse: func(c *Config, v string) error {
			rules, err := ParseEgress(v)
			if err != nil {
				return err
			}
			c.Egress = rules
			return nil
		}, format: func(c *Config) string {
			s := make([]string, len(c.Egress))
			for i, r := range c.Egress {
				s[i] = r.String()
			}
			return strings.Join(s, ";")
		}},
	{Env: "VIPD_EGRESS_CLUSTER_CIDRS", Flag: "egress-cluster-cidrs", Section: SecEgress,
		Doc: "Comma list of the cluster's pod and service CIDRs: traffic to them is never sent to the egress gateway (the from CIDRs of every rule, " +
			"this node's own addresses and connections a service DNAT rewrote are excluded anyway). Set it when a rule's from is narrower than the pod CIDR.",
		Accepted: "a comma list of CIDRs such as 10.244.0.0/16,10.96.0.0/12,fd00:10:244::/56",
		parse: func(c *Config, v string) error {
			c.EgressClusterCIDRs = nil
			for _, item := range splitList(v) {
				p, err := parseCIDR(item)
				if err != nil {
					return &Error{Name: "VIPD_EGRESS_CLUSTER_CIDRS", Value: item, Accepted: "a CIDR with its network address, such as 10.244.0.0/16 or fd00:10:244::/56"}
				}
				c.EgressClusterCIDRs = append(c.EgressClusterCIDRs, p)
			}
			return nil
		}, format: func(c *Config) string { return joinPrefixes(c.EgressClusterCIDRs) }},
	intSetting("VIPD_EGRESS_TABLE", "egress-table", strconv.Itoa(DefaultEgressTable), SecEgress,
		"First routing table number of the egress routes on director nodes; the egress IPs use this table and the next ones (one per egress IP, at most 15).", 256, 1<<30,
		func(c *Config) *int { return &c.EgressTable }),
	intSetting("VIPD_EGRESS_RULE_PRIORITY", "egress-rule-priority", strconv.Itoa(DefaultEgressRulePriority), SecEgress,
		"Priority of the ip rules (fwmark to egress table) on director nodes; below main (32766), above any rule that must not see the egress traffic.", 1, 32765,
		func(c *Config) *int { return &c.EgressRulePriority }),
	{Env: "VIPD_EGRESS_MARK_MASK", Flag: "egress-mark-mask", Default: fmt.Sprintf("%#08x", DefaultEgressMarkMask), Section: SecEgress,
		Doc:      "The packet mark bits vipd uses to steer egress traffic on director nodes; other bits of the mark are kept. Must not overlap the CNI's or kube-proxy's mark bits.",
		Accepted: "a contiguous bit mask of 2 to 8 bits such as 0x00f00000 (enough values for every egress IP)",
		parse: func(c *Config, v string) error {
			n, err := strconv.ParseUint(v, 0, 32)
			m := uint32(n)
			if err != nil || m == 0 {
				return errInvalid
			}
			shifted := m >> bits.TrailingZeros32(m)
			ones := bits.OnesCount32(m)
			if shifted&(shifted+1) != 0 || ones < 2 || ones > 8 {
				return errInvalid
			}
			c.EgressMarkMask = m
			return nil
		}, format: func(c *Config) string { return fmt.Sprintf("%#08x", c.EgressMarkMask) }},
	{Env: "VIPD_EGRESS_POLICIES", Flag: "egress-policies", Default: "off", Section: SecEgress,
		Doc: "on: also program the EgressPolicy objects (vipd.io/v1alpha1) of the cluster (VIPD_KUBECONFIG), resolved to pod addresses by a vipd-controllers child; " +
			"an egress IP that is not in VIPD_ADDRESS or VIPD_EGRESS is held at run time by one of the nodes the policy's nodeSelector matches (docs/egress.md).",
		Accepted: "on or off",
		parse: func(c *Config, v string) error {
			switch v {
			case "on":
				c.EgressPolicies = true
			case "off":
				c.EgressPolicies = false
			default:
				return errInvalid
			}
			return nil
		}, format: func(c *Config) string {
			if c.EgressPolicies {
				return "on"
			}
			return "off"
		}},
}

// ParseEgress parses a VIPD_EGRESS value. Errors name one rule and the
// accepted form.
func ParseEgress(v string) ([]EgressRule, error) {
	var out []EgressRule
	for _, item := range strings.Split(v, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		r, why := parseEgressRule(item)
		if why != "" {
			return nil, &Error{Name: "VIPD_EGRESS", Value: item, Accepted: EgressForm + " (" + why + ")"}
		}
		out = append(out, r)
	}
	return out, nil
}

func parseEgressRule(item string) (EgressRule, string) {
	f := strings.Fields(item)
	if len(f) != 5 || f[1] != "from" || f[3] != "to" {
		return EgressRule{}, "five words: EGRESS_IP from CIDRS to CIDRS"
	}
	ip, err := netip.ParseAddr(f[0])
	if err != nil || ip.Zone() != "" {
		return EgressRule{}, "the egress IP is a single address without a prefix length"
	}
	if ip.Is4In6() || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() {
		return EgressRule{}, "the egress IP is a unicast address that is not loopback, link-local or unspecified"
	}
	r := EgressRule{IP: ip}
	for _, side := range []struct {
		text string
		dst  *[]netip.Prefix
	}{{f[2], &r.From}, {f[4], &r.To}} {
		items := splitList(side.text)
		if len(items) == 0 {
			return EgressRule{}, "at least one CIDR on each side"
		}
		for _, s := range items {
			p, err := parseCIDR(s)
			if err != nil {
				return EgressRule{}, fmt.Sprintf("%q is not a CIDR with its network address", s)
			}
			if p.Addr().Is4() != ip.Is4() {
				return EgressRule{}, fmt.Sprintf("%s is not of the egress IP's family", s)
			}
			*side.dst = append(*side.dst, p)
		}
	}
	return r, ""
}

// parseCIDR accepts a prefix whose address is its network address, or a
// bare address as its host prefix.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, err
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() || p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%s: not a network address", s)
	}
	return p, nil
}

// EgressIPs returns the distinct egress IPs of the rules, in rule order.
func (c *Config) EgressIPs() []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, r := range c.Egress {
		if !seen[r.IP] {
			seen[r.IP] = true
			out = append(out, r.IP)
		}
	}
	return out
}

// checkEgress validates VIPD_EGRESS against the other settings and adds
// the egress IPs to the elected addresses.
func (c *Config) checkEgress() error {
	if c.EgressPolicies {
		if c.Mode != ModeL2 {
			return &Error{Name: "VIPD_EGRESS_POLICIES", Value: "on", Accepted: "on in l2 mode only (the gateway is the one elected holder of the egress IP)"}
		}
		if len(c.Addresses) == 0 && len(c.Egress) == 0 {
			return &Error{Name: "VIPD_ADDRESS", Value: "", Accepted: "at least one address (the control-plane VIP, or VIPD_EGRESS) with VIPD_EGRESS_POLICIES=on: the nodes' cluster runs for their addresses"}
		}
	}
	if len(c.Egress) == 0 {
		return nil
	}
	if c.Mode != ModeL2 {
		return &Error{Name: "VIPD_EGRESS", Value: c.Egress[0].String(), Accepted: "egress rules in l2 mode only (the gateway is the one elected holder of the egress IP)"}
	}
	ips := c.EgressIPs()
	if limit := int(c.EgressMarkMask >> bits.TrailingZeros32(c.EgressMarkMask)); len(ips) > limit || len(ips) > 15 {
		return &Error{Name: "VIPD_EGRESS", Value: fmt.Sprintf("%d egress IPs", len(ips)),
			Accepted: fmt.Sprintf("at most %d distinct egress IPs (one mark value of VIPD_EGRESS_MARK_MASK and one routing table each, 15 at most)", min(limit, 15))}
	}
	for _, ip := range ips {
		p := netip.PrefixFrom(ip, ip.BitLen())
		found := false
		for _, a := range c.Addresses {
			if a == p {
				found = true
			}
		}
		if !found {
			c.Addresses = append(c.Addresses, p)
		}
	}
	return nil
}

// The egress settings follow the table of settings.go, as their own
// section (kept here so that settings.go stays as it is).
func init() { table = append(table, egressSettings...) }
