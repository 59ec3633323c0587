package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestEgressValid(t *testing.T) {
	c, err := load(t, "VIPD_EGRESS", " 10.0.0.200 from 10.244.0.0/16,10.245.1.7 to 0.0.0.0/0 ; fd00::200 from fd00:10:244::/56 to 2001:db8::/32,64:ff9b::/96;10.0.0.200 from 10.246.0.0/16 to 192.0.2.0/24;",
		"VIPD_EGRESS_CLUSTER_CIDRS", "10.244.0.0/16, 10.96.0.0/12")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Egress) != 3 {
		t.Fatalf("rules: %v", c.Egress)
	}
	r := c.Egress[0]
	if r.IP != netip.MustParseAddr("10.0.0.200") || len(r.From) != 2 || r.From[1] != netip.MustParsePrefix("10.245.1.7/32") || r.To[0] != netip.MustParsePrefix("0.0.0.0/0") {
		t.Fatalf("rule 0: %+v", r)
	}
	if got := c.EgressIPs(); len(got) != 2 || got[1] != netip.MustParseAddr("fd00::200") {
		t.Fatalf("egress IPs: %v", got)
	}
	// The egress IPs join the elected addresses, once each, after VIPD_ADDRESS.
	want := []string{"10.0.0.100/32", "10.0.0.200/32", "fd00::200/128"}
	if len(c.Addresses) != len(want) {
		t.Fatalf("addresses %v, want %v", c.Addresses, want)
	}
	for i, w := range want {
		if c.Addresses[i].String() != w {
			t.Fatalf("addresses %v, want %v", c.Addresses, want)
		}
	}
	if len(c.EgressClusterCIDRs) != 2 {
		t.Fatalf("cluster CIDRs: %v", c.EgressClusterCIDRs)
	}
	// The effective value reads back the same.
	var eff string
	for _, l := range c.Effective() {
		if v, ok := strings.CutPrefix(l, "VIPD_EGRESS="); ok {
			eff = v
		}
	}
	c2, err := load(t, "VIPD_EGRESS", eff)
	if err != nil || len(c2.Egress) != 3 || c2.Egress[1].String() != c.Egress[1].String() {
		t.Fatalf("round trip: %v %v", err, c2)
	}

	// An egress IP that is also a VIP is elected once.
	c, err = load(t, "VIPD_ADDRESS", "10.0.0.200/32", "VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0")
	if err != nil || len(c.Addresses) != 1 {
		t.Fatalf("VIP and egress IP: %v %v", err, c)
	}
	// Egress alone needs no VIPD_ADDRESS.
	c, err = Load(mapSource(map[string]string{"VIPD_NODE_NAME": "n1", "VIPD_EGRESS": "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0"}))
	if err != nil || len(c.Addresses) != 1 || c.Addresses[0].String() != "10.0.0.200/32" {
		t.Fatalf("egress without VIPD_ADDRESS: %v %v", err, c)
	}
	c, err = load(t, "VIPD_EGRESS_MARK_MASK", "0x3000", "VIPD_EGRESS_TABLE", "1000", "VIPD_EGRESS_RULE_PRIORITY", "90")
	if err != nil || c.EgressMarkMask != 0x3000 || c.EgressTable != 1000 || c.EgressRulePriority != 90 {
		t.Fatalf("numbers: %v %+v", err, c)
	}
}

func TestEgressInvalid(t *testing.T) {
	tests := []struct {
		kv           []string
		name, value  string
		wantAccepted string
	}{
		{[]string{"VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16"}, "VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16", "five words"},
		{[]string{"VIPD_EGRESS", "10.0.0.200 to 10.244.0.0/16 from 0.0.0.0/0"}, "VIPD_EGRESS", "10.0.0.200 to 10.244.0.0/16 from 0.0.0.0/0", "five words"},
		{[]string{"VIPD_EGRESS", "10.0.0.200/32 from 10.244.0.0/16 to 0.0.0.0/0"}, "VIPD_EGRESS", "10.0.0.200/32 from 10.244.0.0/16 to 0.0.0.0/0", "without a prefix length"},
		{[]string{"VIPD_EGRESS", "127.0.0.1 from 10.244.0.0/16 to 0.0.0.0/0"}, "VIPD_EGRESS", "127.0.0.1 from 10.244.0.0/16 to 0.0.0.0/0", "not loopback"},
		{[]string{"VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0;10.0.0.201 from 10.244.1.0/16 to 0.0.0.0/0"}, "VIPD_EGRESS", "10.0.0.201 from 10.244.1.0/16 to 0.0.0.0/0", "network address"},
		{[]string{"VIPD_EGRESS", "10.0.0.200 from fd00::/64 to 0.0.0.0/0"}, "VIPD_EGRESS", "10.0.0.200 from fd00::/64 to 0.0.0.0/0", "family"},
		{[]string{"VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to ,"}, "VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to ,", "at least one CIDR"},
		{[]string{"VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0", "VIPD_MODE", "bgp", "VIPD_BGP_LOCAL_AS", "65001", "VIPD_BGP_PEERS", "10.0.0.1:65000"}, "VIPD_EGRESS", "10.0.0.200 from 10.244.0.0/16 to 0.0.0.0/0", "l2 mode only"},
		{[]string{"VIPD_EGRESS", "10.0.0.1 from 10.244.0.0/16 to 0.0.0.0/0;10.0.0.2 from 10.244.0.0/16 to 0.0.0.0/0;10.0.0.3 from 10.244.0.0/16 to 0.0.0.0/0;10.0.0.4 from 10.244.0.0/16 to 0.0.0.0/0", "VIPD_EGRESS_MARK_MASK", "0x3"}, "VIPD_EGRESS", "4 egress IPs", "at most 3 distinct egress IPs"},
		{[]string{"VIPD_EGRESS_CLUSTER_CIDRS", "10.244.0.0/16,banana"}, "VIPD_EGRESS_CLUSTER_CIDRS", "banana", "CIDR"},
		{[]string{"VIPD_EGRESS_MARK_MASK", "0x5"}, "VIPD_EGRESS_MARK_MASK", "0x5", "contiguous"},
		{[]string{"VIPD_EGRESS_MARK_MASK", "0x1"}, "VIPD_EGRESS_MARK_MASK", "0x1", "2 to 8 bits"},
		{[]string{"VIPD_EGRESS_TABLE", "254"}, "VIPD_EGRESS_TABLE", "254", "from 256"},
		{[]string{"VIPD_EGRESS_RULE_PRIORITY", "32766"}, "VIPD_EGRESS_RULE_PRIORITY", "32766", "to 32765"},
		{[]string{"VIPD_EGRESS_POLICIES", "yes"}, "VIPD_EGRESS_POLICIES", "yes", "on or off"},
		{[]string{"VIPD_EGRESS_POLICIES", "on", "VIPD_MODE", "cloud"}, "VIPD_EGRESS_POLICIES", "on", "l2 mode only"},
		{[]string{"VIPD_EGRESS_POLICIES", "on", "VIPD_ADDRESS", ""}, "VIPD_ADDRESS", "", "at least one address (the control-plane VIP, or VIPD_EGRESS)"},
	}
	for _, tt := range tests {
		_, err := load(t, tt.kv...)
		var ce *Error
		if !errors.As(err, &ce) {
			t.Fatalf("%v: want a config error, got %v", tt.kv, err)
		}
		if ce.Name != tt.name || ce.Value != tt.value || !strings.Contains(ce.Accepted, tt.wantAccepted) {
			t.Errorf("%v: got %q", tt.kv, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error is not one line: %q", tt.kv, err)
		}
	}
}
