package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/config"
)

// TestProfileTimingsDocumented: the timings docs/configuration.md and
// check-config list for each profile are the ones the cluster runs with.
func TestProfileTimingsDocumented(t *testing.T) {
	doc := map[string][2]string{}
	for _, pt := range config.ProfileTimings() {
		doc[pt.Name] = [2]string{pt.Default, pt.Fast}
	}
	for i, profile := range []string{config.ProfileDefault, config.ProfileFast} {
		tm := cluster.TimingsFor(profile)
		lc := lease.ProfileConfig(profile)
		want := map[string]string{
			"gossip probe interval":       tm.ProbeInterval.String(),
			"gossip probe timeout":        tm.ProbeTimeout.String(),
			"gossip suspicion multiplier": itoa(tm.SuspicionMult),
			"gossip interval":             tm.GossipInterval.String(),
			"gossip full sync interval":   tm.PushPullInterval.String(),
			"lease tick":                  lc.Tick.String(),
			"lease heartbeat interval":    (time.Duration(lc.HeartbeatTicks) * lc.Tick).String(),
			"lease election timeout":      (time.Duration(lc.ElectionTicks) * lc.Tick).String(),
			"l2 conflict probe wait":      probeWait(profile).String(),
		}
		if len(want) != len(doc) {
			t.Fatalf("documented timings %v, checked %v", doc, want)
		}
		for name, v := range want {
			if doc[name][i] != v {
				t.Errorf("%s profile: %s documented as %q, runs with %q", profile, name, doc[name][i], v)
			}
		}
	}
	if config.ProfileFast != cluster.ProfileFast || config.ProfileDefault != cluster.ProfileDefault {
		t.Fatal("profile names differ between config and cluster")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestCheckConfigProfile: check-config prints what the profile set, and a
// bad profile is one line naming the setting and the accepted values.
func TestCheckConfigProfile(t *testing.T) {
	t.Setenv("VIPD_ADDRESS", "10.0.0.9/32")
	t.Setenv("VIPD_NODE_NAME", "n")
	t.Setenv("VIPD_PROFILE", "fast")
	code, out, errs := run(t, nil, "check-config")
	if code != 0 || !strings.Contains(out, "VIPD_PROFILE=fast\n") || !strings.Contains(out, "VIPD_HEALTH_INTERVAL=200ms\n") ||
		!strings.Contains(out, "# VIPD_PROFILE=fast: lease heartbeat interval 50ms") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = run(t, nil, "check-config", "--health-interval", "300ms")
	if code != 0 || !strings.Contains(out, "VIPD_HEALTH_INTERVAL=300ms\n") || !strings.Contains(out, "VIPD_HEALTH_INTERVAL=200ms (given explicitly") {
		t.Fatalf("flag over profile: exit %d\n%s\n%s", code, out, errs)
	}
	t.Setenv("VIPD_PROFILE", "quick")
	code, _, errs = run(t, nil, "check-config")
	if code != exitConfig || strings.TrimSpace(errs) != `vipd: invalid VIPD_PROFILE="quick": want one of default, fast` {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}
