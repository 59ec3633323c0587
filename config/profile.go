package config

import (
	"fmt"
	"strings"
)

// Profiles vipd knows (VIPD_PROFILE).
const (
	ProfileDefault = "default"
	ProfileFast    = "fast"
)

// ProfileSetting is one value a profile gives a setting that was not set
// explicitly (flag or environment).
type ProfileSetting struct {
	Env   string
	Value string
}

// ProfileTiming is one internal timing a profile sets (no setting of its
// own): documented so that an operator knows what the profile changes.
type ProfileTiming struct {
	Name    string
	Default string // in the default profile
	Fast    string // in the fast profile
	Doc     string
}

// fastSettings are the settings VIPD_PROFILE=fast changes, unless given.
var fastSettings = []ProfileSetting{
	{Env: "VIPD_HEALTH_INTERVAL", Value: "200ms"},
	{Env: "VIPD_HEALTH_TIMEOUT", Value: "1s"},
	{Env: "VIPD_MEMORY_LOCK", Value: "on"},
}

// profileTimings are the internal timings each profile sets. The values
// are those of cluster.TimingsFor; TestProfileTimingsDocumented (cmd/vipd)
// keeps them in step.
var profileTimings = []ProfileTiming{
	{Name: "gossip probe interval", Default: "5s", Fast: "200ms", Doc: "memberlist probes one member this often (it keeps the membership; the lease election detects a lost holder by its lease)"},
	{Name: "gossip probe timeout", Default: "500ms", Fast: "100ms", Doc: "a probe not answered within this asks other members to try"},
	{Name: "gossip suspicion multiplier", Default: "2", Fast: "2", Doc: "a silent member is suspect for this many probe intervals (x log10 of the cluster size, at least 1) before it is declared dead"},
	{Name: "gossip interval", Default: "5s", Fast: "20ms", Doc: "how often metadata changes (health, verification reports) are gossiped (they also ride on every probe and its answer; the lease election sends its own messages directly)"},
	{Name: "gossip full sync interval", Default: "30s", Fast: "10s", Doc: "each member exchanges its whole view with a random member this often (over TCP), repairing anything gossip missed"},
	{Name: "lease tick", Default: "50ms", Fast: "10ms", Doc: "the lease election's clock step: its timers count ticks (cluster/lease)"},
	{Name: "lease heartbeat interval", Default: "350ms", Fast: "50ms", Doc: "the leader renews its lease with a majority of the voters this often"},
	{Name: "lease election timeout", Default: "800ms", Fast: "150ms", Doc: "a voter that hears no leader for this long (randomised up to twice as long) starts an election; the holder lets go of an address before a new leader can grant it"},
	{Name: "l2 conflict probe wait", Default: "50ms", Fast: "25ms", Doc: "before binding, a new holder waits this long for another host to answer its ARP probe or neighbour solicitation for the VIP (l2)"},
}

// ProfileSettings returns the settings profile sets when they are not
// given explicitly (nil for the default profile).
func ProfileSettings(profile string) []ProfileSetting {
	if profile == ProfileFast {
		return append([]ProfileSetting(nil), fastSettings...)
	}
	return nil
}

// ProfileTimings returns the internal timings of the profiles.
func ProfileTimings() []ProfileTiming { return append([]ProfileTiming(nil), profileTimings...) }

func profileValue(profile, env string) (string, bool) {
	for _, s := range ProfileSettings(profile) {
		if s.Env == env {
			return s.Value, true
		}
	}
	return "", false
}

// ProfileLines describes what the effective profile set, for check-config:
// the settings it gave a value (those not set explicitly) and its timings.
func (c *Config) ProfileLines() []string {
	var out []string
	for _, s := range ProfileSettings(c.Profile) {
		how := "set by the profile"
		for _, e := range c.Explicit {
			if e == s.Env {
				how = "given explicitly: the profile's " + s.Value + " is not used"
			}
		}
		out = append(out, fmt.Sprintf("# VIPD_PROFILE=%s: %s=%s (%s)", c.Profile, s.Env, s.Value, how))
	}
	for _, t := range profileTimings {
		v := t.Default
		if c.Profile == ProfileFast {
			v = t.Fast
		}
		out = append(out, fmt.Sprintf("# VIPD_PROFILE=%s: %s %s", c.Profile, t.Name, v))
	}
	return out
}

func profileMarkdown(b *strings.Builder) {
	b.WriteString("\n## Profiles (`VIPD_PROFILE`)\n\n")
	b.WriteString("`VIPD_PROFILE=fast` is for LANs that can afford more packets (the lease renewed every 50 ms, quicker gossip) and want a quicker failover: it changes the settings below that are not given explicitly (a flag or a variable that is set always wins) and the internal timings of the second table. `vipd check-config` prints what the profile set. `default` keeps every default of the tables above.\n\n")
	b.WriteString("| setting | default profile | fast profile |\n|---|---|---|\n")
	for _, s := range fastSettings {
		def := ""
		if st, ok := Lookup(s.Env); ok {
			def = st.Default
		}
		fmt.Fprintf(b, "| `%s` | `%s` | `%s` |\n", s.Env, def, s.Value)
	}
	b.WriteString("\n| timing | default profile | fast profile | meaning |\n|---|---|---|---|\n")
	for _, t := range profileTimings {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", t.Name, t.Default, t.Fast, t.Doc)
	}
}
