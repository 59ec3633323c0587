package main

import (
	"fmt"
	"strings"
	"testing"
)

// Issue 10, Found 5: more VIPs than the gossip metadata holds used to make
// every VIP flap; check-config (and run) now refuse them in one line. The
// limit is the gossip election's (VIPD_ELECTION=gossip): the lease election
// (the default) does not carry the VIPs in the metadata.
func TestCheckConfigRejectsTooManyVIPsForGossip(t *testing.T) {
	var vips []string
	for i := 0; i < 24; i++ {
		vips = append(vips, fmt.Sprintf("10.0.%d.100/32", i))
	}
	code, out, errs := run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": "10.9.0.2,10.9.0.3",
		"VIPD_GOSSIP_INSECURE": "true", "VIPD_ELECTION": "gossip"}, "check-config")
	if code != exitConfig || !strings.Contains(errs, "VIPD_ADDRESS has 24 VIPs") || strings.Count(strings.TrimSpace(errs), "\n") != 0 || out != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	// The lease election has no such limit.
	code, _, errs = run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": "10.9.0.2,10.9.0.3",
		"VIPD_GOSSIP_INSECURE": "true", "VIPD_ELECTION": "lease"}, "check-config")
	if code != 0 {
		t.Fatalf("lease: exit %d, %s", code, errs)
	}
	// Without peers there is no gossip and no such limit.
	code, _, errs = run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": ""}, "check-config")
	if code != 0 {
		t.Fatalf("no peers: exit %d, %s", code, errs)
	}
}
