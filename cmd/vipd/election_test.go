package main

import (
	"fmt"
	"strings"
	"testing"
)

// VIPD_ELECTION=gossip (the removed election) is refused in one line
// naming the setting, the value and the accepted form. The lease election
// does not carry the VIPs in the gossip metadata: no limit on their number
// (issue 10, Found 5, was the gossip election's).
func TestCheckConfigRefusesTheGossipElection(t *testing.T) {
	var vips []string
	for i := 0; i < 24; i++ {
		vips = append(vips, fmt.Sprintf("10.0.%d.100/32", i))
	}
	code, out, errs := run(t, map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_PEERS": "10.9.0.2,10.9.0.3",
		"VIPD_GOSSIP_INSECURE": "true", "VIPD_ELECTION": "gossip"}, "check-config")
	if code != exitConfig || !strings.Contains(errs, `invalid VIPD_ELECTION="gossip": want lease (the gossip election was removed`) ||
		strings.Count(strings.TrimSpace(errs), "\n") != 0 || out != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	code, _, errs = run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": "10.9.0.2,10.9.0.3",
		"VIPD_GOSSIP_INSECURE": "true", "VIPD_ELECTION": "lease"}, "check-config")
	if code != 0 {
		t.Fatalf("lease: exit %d, %s", code, errs)
	}
}
