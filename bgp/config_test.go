package bgp

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParsePeers(t *testing.T) {
	a4 := netip.MustParseAddr("192.0.2.1")
	a6 := netip.MustParseAddr("2001:db8::1")
	tests := []struct {
		in   string
		want []Peer
	}{
		{"", nil},
		{"192.0.2.1:65000", []Peer{{Address: a4, AS: 65000, Hold: 9 * time.Second, Keepalive: 3 * time.Second}}},
		{" 192.0.2.1:65000 , [2001:db8::1]:4200000000 ", []Peer{
			{Address: a4, AS: 65000, Hold: 9 * time.Second, Keepalive: 3 * time.Second},
			{Address: a6, AS: 4200000000, Hold: 9 * time.Second, Keepalive: 3 * time.Second},
		}},
		{"192.0.2.1:65000:port=1179:password=s3cr=t:multihop=3:hold=30s:keepalive=10", []Peer{
			{Address: a4, AS: 65000, Port: 1179, Password: "s3cr=t", Multihop: 3, Hold: 30 * time.Second, Keepalive: 10 * time.Second},
		}},
		{"[2001:db8::1]:65000:hold=6", []Peer{{Address: a6, AS: 65000, Hold: 6 * time.Second, Keepalive: 2 * time.Second}}},
		{"192.0.2.1:65000:keepalive=1s", []Peer{{Address: a4, AS: 65000, Hold: 3 * time.Second, Keepalive: time.Second}}},
		{"192.0.2.1:65000:hold=0", []Peer{{Address: a4, AS: 65000}}},
	}
	for _, tt := range tests {
		got, err := ParsePeers(tt.in)
		if err != nil {
			t.Errorf("ParsePeers(%q): %v", tt.in, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("ParsePeers(%q) = %+v, want %+v", tt.in, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("ParsePeers(%q)[%d] = %+v, want %+v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}

func TestParsePeersErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"192.0.2.1", "missing ':as'"},
		{"192.0.2.1:", "AS \"\""},
		{"192.0.2.1:0", "AS \"0\""},
		{"192.0.2.1:abc", "AS \"abc\""},
		{"192.0.2.1:4294967296", "AS \"4294967296\""},
		{"router:65000", "not an IP address"},
		{"2001:db8::1:65000", "brackets"},
		{"[2001:db8::1:65000", "missing ']'"},
		{"[2001:db8::1]65000", "missing ':as'"},
		{"192.0.2.1:65000:port=0", "port \"0\""},
		{"192.0.2.1:65000:port=70000", "port \"70000\""},
		{"192.0.2.1:65000:multihop=256", "multihop \"256\""},
		{"192.0.2.1:65000:hold=2s", "at least 3s"},
		{"192.0.2.1:65000:hold=1.5s", "whole seconds"},
		{"192.0.2.1:65000:hold=9:keepalive=9", "shorter than hold"},
		{"192.0.2.1:65000:password=", "password is empty"},
		{"192.0.2.1:65000:colour=blue", "unknown option \"colour\""},
		{"192.0.2.1:65000:bfd", "want name=value"},
		{"192.0.2.1:65000,192.0.2.1:65001", "appears twice; want each router address once"},
		{"0.0.0.0:65000", "cannot be a BGP peer"},
		{"[fe80::1%eth0]:65000", "zones"},
	}
	for _, tt := range tests {
		_, err := ParsePeers(tt.in)
		if err == nil {
			t.Errorf("ParsePeers(%q): no error", tt.in)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tt.want) {
			t.Errorf("ParsePeers(%q) = %q, want it to mention %q", tt.in, msg, tt.want)
		}
		// Every error names the setting and the accepted form, on one line.
		if !strings.HasPrefix(msg, "VIPD_BGP_PEERS: ") || !strings.Contains(msg, "want ") || strings.Contains(msg, "\n") {
			t.Errorf("ParsePeers(%q) error %q lacks the setting name or the accepted form", tt.in, msg)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{LocalAS: 65001, RouterID: netip.MustParseAddr("192.0.2.11"),
		Peers: []Peer{{Address: netip.MustParseAddr("192.0.2.1"), AS: 65000}}}
	if err := good.withDefaults().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no AS", func(c *Config) { c.LocalAS = 0 }, "VIPD_BGP_LOCAL_AS"},
		{"no router id", func(c *Config) { c.RouterID = netip.Addr{} }, "VIPD_BGP_ROUTER_ID"},
		{"v6 router id", func(c *Config) { c.RouterID = netip.MustParseAddr("2001:db8::1") }, "want a non-zero IPv4"},
		{"no peers", func(c *Config) { c.Peers = nil }, "VIPD_BGP_PEERS: required"},
		{"dup peers", func(c *Config) { c.Peers = append(c.Peers, c.Peers[0]) }, "appears twice"},
		{"bad timers", func(c *Config) { c.Peers[0].Hold, c.Peers[0].Keepalive = 4*time.Second, 5*time.Second }, "shorter than hold"},
		{"fractional restart", func(c *Config) { c.RestartTime = 1500 * time.Millisecond }, "whole seconds"},
	}
	for _, tt := range tests {
		c := good
		c.Peers = append([]Peer(nil), good.Peers...)
		tt.mod(&c)
		err := c.withDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	c := Config{Peers: []Peer{{AS: 1}, {AS: 2, Hold: 30 * time.Second}, {AS: 3, Port: 1179, Hold: 6 * time.Second, Keepalive: time.Second}}}.withDefaults()
	if c.Interface != "lo" || c.IdleHoldAfterReset != DefaultIdleHoldAfterReset || c.ConnectRetry != DefaultConnectRetry || c.RestartTime != DefaultRestartTime {
		t.Errorf("defaults not applied: %+v", c)
	}
	want := []struct {
		port            uint16
		hold, keepalive time.Duration
	}{{179, DefaultHold, DefaultKeepalive}, {179, 30 * time.Second, 10 * time.Second}, {1179, 6 * time.Second, time.Second}}
	for i, w := range want {
		p := c.Peers[i]
		if p.Port != w.port || p.Hold != w.hold || p.Keepalive != w.keepalive {
			t.Errorf("peer %d: %+v, want port %d hold %v keepalive %v", i, p, w.port, w.hold, w.keepalive)
		}
	}
}
