package main

import (
	"fmt"
	"strings"
	"testing"
)

// Issue 10, Found 5: more VIPs than the gossip metadata holds used to make
// every VIP flap; check-config (and run) now refuse them in one line.
func TestCheckConfigRejectsTooManyVIPsForGossip(t *testing.T) {
	var vips []string
	for i := 0; i < 24; i++ {
		vips = append(vips, fmt.Sprintf("10.0.%d.100/32", i))
	}
	code, out, errs := run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": "10.9.0.2,10.9.0.3",
		"VIPD_GOSSIP_KEY_FILE": "/dev/null", "VIPD_GOSSIP_INSECURE": "true"}, "check-config")
	if code != exitConfig || !strings.Contains(errs, "VIPD_ADDRESS has 24 VIPs") || strings.Count(strings.TrimSpace(errs), "\n") != 0 || out != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	// Without peers there is no gossip and no such limit.
	code, _, errs = run(t, map[string]string{"VIPD_ADDRESS": strings.Join(vips, ","), "VIPD_PEERS": ""}, "check-config")
	if code != 0 {
		t.Fatalf("no peers: exit %d, %s", code, errs)
	}
}
