package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestProfile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kv       []string
		interval time.Duration
		timeout  time.Duration
		profile  string
	}{
		{"default profile keeps the defaults", nil, time.Second, 3 * time.Second, ProfileDefault},
		{"fast sets health interval and timeout", []string{"VIPD_PROFILE", "fast"}, 200 * time.Millisecond, time.Second, ProfileFast},
		{"explicit interval wins over fast", []string{"VIPD_PROFILE", "fast", "VIPD_HEALTH_INTERVAL", "100ms"}, 100 * time.Millisecond, time.Second, ProfileFast},
		{"explicit timeout wins over fast", []string{"VIPD_PROFILE", " fast ", "VIPD_HEALTH_TIMEOUT", "3s"}, 200 * time.Millisecond, 3 * time.Second, ProfileFast},
		{"explicit default profile", []string{"VIPD_PROFILE", "default", "VIPD_HEALTH_INTERVAL", "2s"}, 2 * time.Second, 3 * time.Second, ProfileDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.kv...)
			if err != nil {
				t.Fatal(err)
			}
			if c.Profile != tc.profile || c.HealthInterval != tc.interval || c.HealthTimeout != tc.timeout {
				t.Fatalf("profile %q interval %v timeout %v, want %q %v %v", c.Profile, c.HealthInterval, c.HealthTimeout, tc.profile, tc.interval, tc.timeout)
			}
		})
	}
}

// VIPD_MEMORY_LOCK: off by default, on in the fast profile unless given;
// a bad value is one line naming the setting and the accepted values.
func TestMemoryLock(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{nil, "off"},
		{[]string{"VIPD_PROFILE", "fast"}, "on"},
		{[]string{"VIPD_PROFILE", "fast", "VIPD_MEMORY_LOCK", "off"}, "off"},
		{[]string{"VIPD_MEMORY_LOCK", "on"}, "on"},
	} {
		c, err := load(t, tc.kv...)
		if err != nil {
			t.Fatal(err)
		}
		if c.MemoryLock != tc.want {
			t.Errorf("%v: VIPD_MEMORY_LOCK %q, want %q", tc.kv, c.MemoryLock, tc.want)
		}
	}
	_, err := load(t, "VIPD_MEMORY_LOCK", "yes")
	if want := `invalid VIPD_MEMORY_LOCK="yes": want one of off, on`; err == nil || err.Error() != want {
		t.Fatalf("VIPD_MEMORY_LOCK=yes: %v, want %q", err, want)
	}
}

func TestProfileInvalid(t *testing.T) {
	for _, v := range []string{"turbo", "Fast", "fast,default"} {
		_, err := load(t, "VIPD_PROFILE", v)
		if err == nil {
			t.Fatalf("VIPD_PROFILE=%q accepted", v)
		}
		want := `invalid VIPD_PROFILE="` + v + `": want one of default, fast`
		if err.Error() != want || strings.Contains(err.Error(), "\n") {
			t.Fatalf("error %q, want %q", err, want)
		}
	}
}

// TestProfileLines: check-config says which values the profile set and
// which explicit settings it left alone.
func TestProfileLines(t *testing.T) {
	c, err := load(t, "VIPD_PROFILE", "fast", "VIPD_HEALTH_INTERVAL", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(c.ProfileLines(), "\n")
	for _, want := range []string{
		"# VIPD_PROFILE=fast: VIPD_HEALTH_TIMEOUT=1s (set by the profile)",
		"# VIPD_PROFILE=fast: VIPD_HEALTH_INTERVAL=200ms (given explicitly: the profile's 200ms is not used)",
		"# VIPD_PROFILE=fast: lease heartbeat interval 50ms",
		"# VIPD_PROFILE=fast: gossip interval 20ms",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("missing %q in\n%s", want, lines)
		}
	}
	d, _ := load(t)
	if l := strings.Join(d.ProfileLines(), "\n"); !strings.Contains(l, "lease heartbeat interval 350ms") || strings.Contains(l, "VIPD_HEALTH_TIMEOUT") {
		t.Errorf("default profile lines:\n%s", l)
	}
	if !slices.Contains(c.Explicit, "VIPD_HEALTH_INTERVAL") || slices.Contains(c.Explicit, "VIPD_HEALTH_TIMEOUT") {
		t.Errorf("explicit %v", c.Explicit)
	}
}
