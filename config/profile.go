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
}

// profileTimings are the internal timings each profile sets. The values
// are those of cluster.TimingsFor; TestProfileTimingsDocumented (cmd/vipd)
// keeps them in step.
var profileTimings = []ProfileTiming{
	{Name: "gossip probe interval", Default: "5s", Fast: "200ms", Doc: "memberlist probes one member this often (in the default profile the member heartbeat detects; memberlist keeps the membership)"},
	{Name: "gossip probe timeout", Default: "500ms", Fast: "100ms", Doc: "a probe not answered within this asks other members to try"},
	{Name: "gossip suspicion multiplier", Default: "2", Fast: "2", Doc: "a silent member is suspect for this many probe intervals (x log10 of the cluster size, at least 1) before it is declared dead"},
	{Name: "gossip interval", Default: "5s", Fast: "20ms", Doc: "how often metadata changes (claims, releases, health) are gossiped (they also ride on every probe and its answer; a planned handover sends its messages directly; in the default profile every change is also pushed to every member at once, and a member whose heartbeats carry metadata not seen yet, or whose relays carry newer metadata of a member not heard directly, is asked for its state)"},
	{Name: "gossip full sync interval", Default: "30s", Fast: "10s", Doc: "each member exchanges its whole view with a random member this often (over TCP), repairing anything gossip missed"},
	{Name: "holder heartbeat interval", Default: "off", Fast: "40ms", Doc: "a node that holds a VIP sends an authenticated heartbeat to every member this often, over the gossip transport (encrypted with the gossip key)"},
	{Name: "holder heartbeat misses", Default: "off", Fast: "4", Doc: "a holder whose heartbeats stop for this many intervals is taken as gone: the others elect a new holder at once instead of waiting for the gossip failure detector; after irregular heartbeats (a loaded host) the deadline stretches to twice the largest recent gap, at most 4 times, and shrinks back over a few seconds"},
	{Name: "member heartbeat interval", Default: "250ms", Fast: "off", Doc: "every member sends an authenticated heartbeat (HMAC-SHA256 under a key derived from the gossip key) to every member this often, to the gossip port (UDP), on a grid aligned to the clock; a member reads the heartbeats queued for it once per interval instead of waking for each"},
	{Name: "member heartbeat misses", Default: "3", Fast: "off", Doc: "a member with no sign of life for this many intervals counts as gone for the election and for quorum: a lost holder is replaced, and a holder that hears too few members lets go, without waiting for the gossip failure detector; a sign of life is its heartbeat, or another member's heartbeat saying it heard it (so a lost link between two members that both reach a third kills neither); the deadline never stretches"},
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
	b.WriteString("`VIPD_PROFILE=fast` is for LANs that can afford more packets (a holder heartbeat every 40 ms, quicker gossip) and want a quicker failover: it changes the settings below that are not given explicitly (a flag or a variable that is set always wins) and the internal timings of the second table. `vipd check-config` prints what the profile set. `default` keeps every default of the tables above.\n\n")
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
