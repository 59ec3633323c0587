package config

import "testing"

func TestElects(t *testing.T) {
	peers := []string{"10.0.0.2"}
	for _, tc := range []struct {
		mode  string
		peers bool
		want  bool
	}{
		{ModeL2, true, true},
		{ModeL2, false, false},
		{ModeCloud, true, true},
		{ModeCloud, false, false},
		{ModeBGP, true, false},
	} {
		c := &Config{Mode: tc.mode}
		if tc.peers {
			c.Peers = peers
		}
		if got := c.Elects(); got != tc.want {
			t.Errorf("mode %s, peers %v: Elects = %v, want %v", tc.mode, tc.peers, got, tc.want)
		}
	}
}
