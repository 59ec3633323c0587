package bgp

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	api "github.com/osrg/gobgp/v3/api"
)

func u32(v uint32) *uint32 { return &v }

func TestParseCommunities(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    []uint32
		wantErr string
	}{
		{"", nil, ""},
		{"65000:100", []uint32{65000<<16 | 100}, ""},
		{"65000:100, 65000:100 no-export", []uint32{65000<<16 | 100, 0xFFFFFF01}, ""},
		{"NO-ADVERTISE,0:0,65535:65535", []uint32{0xFFFFFF02, 0, 0xFFFFFFFF}, ""},
		{"65536:1", nil, "0-65535"},
		{"65000", nil, "AS:value"},
		{"65000:-1", nil, "0-65535"},
		{"a:b", nil, "0-65535"},
	} {
		got, err := ParseCommunities(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseCommunities(%q) error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseCommunities(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseLargeCommunities(t *testing.T) {
	got, err := ParseLargeCommunities("65000:1:2, 4294967295:0:4294967295,65000:1:2")
	if err != nil || !slices.Equal(got, []LargeCommunity{{65000, 1, 2}, {4294967295, 0, 4294967295}}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"1:2", "1:2:3:4", "4294967296:1:1", "x:1:1"} {
		if _, err := ParseLargeCommunities(bad); err == nil {
			t.Errorf("ParseLargeCommunities(%q) accepted", bad)
		}
	}
}

func TestAttributesOverAndPattrs(t *testing.T) {
	node := Attributes{Communities: []uint32{1}, MED: u32(5), Prepend: 2}
	vip := Attributes{Communities: []uint32{}, LocalPref: u32(200)}
	got := node.Over(vip)
	if len(got.Communities) != 0 || *got.MED != 5 || *got.LocalPref != 200 || got.Prepend != 2 {
		t.Errorf("Over = %+v", got)
	}
	if s := got.String(); s != "local-pref=200 med=5 prepend=2" {
		t.Errorf("String = %q", s)
	}
	if (Attributes{}).String() != "none" || !(Attributes{}).IsZero() {
		t.Error("zero attributes")
	}
	all := Attributes{Communities: []uint32{65000<<16 | 1, 0xFFFFFF01}, LargeCommunities: []LargeCommunity{{65000, 1, 2}},
		LocalPref: u32(50), MED: u32(7), Prepend: 3}
	p, err := vipPath(mustPrefix("198.51.100.10/32"), all, 65001)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range p.Pattrs {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		switch v := m.(type) {
		case *api.AsPathAttribute:
			seen["aspath"] = len(v.Segments) == 1 && slices.Equal(v.Segments[0].Numbers, []uint32{65001, 65001, 65001})
		case *api.MultiExitDiscAttribute:
			seen["med"] = v.Med == 7
		case *api.LocalPrefAttribute:
			seen["lp"] = v.LocalPref == 50
		case *api.CommunitiesAttribute:
			seen["comm"] = slices.Equal(v.Communities, all.Communities)
		case *api.LargeCommunitiesAttribute:
			seen["large"] = len(v.Communities) == 1 && v.Communities[0].GlobalAdmin == 65000 && v.Communities[0].LocalData2 == 2
		}
	}
	for _, k := range []string{"aspath", "med", "lp", "comm", "large"} {
		if !seen[k] {
			t.Errorf("path attribute %s missing or wrong: %v", k, p.Pattrs)
		}
	}
	if err := (Attributes{Prepend: MaxPrepend + 1}).validate(); err == nil {
		t.Error("prepend above the limit accepted")
	}
}

func TestPeersFile(t *testing.T) {
	good := `
peers:
  - address: 192.0.2.1
    as: 65000
    password_file: /etc/vipd/pw
    hold: 9s
  - address: "2001:db8::1"
    as: 65000
    port: 1179
    multihop: 2
    keepalive: 1
vips:
  198.51.100.10/32:
    communities: ["65000:100", no-export]
    large_communities: ["65000:1:2"]
    local_pref: 200
    med: 10
    as_path_prepend: 2
  2001:db8:ffff::10/128:
    communities: []
`
	pf, err := ParsePeersFile([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(pf.Peers) != 2 || pf.Peers[0].PasswordFile != "/etc/vipd/pw" || pf.Peers[0].Keepalive.Seconds() != 3 ||
		pf.Peers[1].Port != 1179 || pf.Peers[1].Multihop != 2 || pf.Peers[1].Hold.Seconds() != 3 {
		t.Errorf("peers = %+v", pf.Peers)
	}
	a := pf.VIPAttributes[mustPrefix("198.51.100.10/32")]
	if !slices.Equal(a.Communities, []uint32{65000<<16 | 100, 0xFFFFFF01}) || *a.LocalPref != 200 || *a.MED != 10 || a.Prepend != 2 || len(a.LargeCommunities) != 1 {
		t.Errorf("vip attributes = %+v", a)
	}
	if c := pf.VIPAttributes[mustPrefix("2001:db8:ffff::10/128")].Communities; c == nil || len(c) != 0 {
		t.Errorf("explicit empty community list = %#v, want empty non-nil", c)
	}
	for _, tt := range []struct{ text, want string }{
		{"peers: []", "no peers"},
		{"peers:\n  - address: 192.0.2.1\n    as: 65000\n    pasword_file: /x\n", "pasword_file"},
		{"peers:\n  - address: 192.0.2.1\n    as: 0\n", "AS 0"},
		{"peers:\n  - address: nope\n    as: 1\n", "not an IP address"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\n  - address: 192.0.2.1\n    as: 2\n", "twice"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\n    password_file: rel/pw\n", "absolute path"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\n    hold: 2s\n", "at least 3s"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\nvips:\n  198.51.100.0/24: {}\n", "single address"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\nvips:\n  198.51.100.1/32: {as_path_prepend: 11}\n", "prepend"},
		{"peers:\n  - address: 192.0.2.1\n    as: 1\nvips:\n  198.51.100.1/32: {communities: [\"1:70000\"]}\n", "0-65535"},
		{"peers: [", "yaml"},
	} {
		_, err := ParsePeersFile([]byte(tt.text))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParsePeersFile(%q) error %v, want one line with %q", tt.text, err, tt.want)
		}
	}
}

func TestReadPasswordFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	odd := "p:a,s s=w#rd!\"'\\"
	if pw, err := ReadPasswordFile(write("odd", odd+"\n")); err != nil || pw != odd {
		t.Errorf("got %q, %v; want %q", pw, err, odd)
	}
	if pw, err := ReadPasswordFile(write("crlf", "abc\r\n")); err != nil || pw != "abc" {
		t.Errorf("CRLF: got %q, %v", pw, err)
	}
	if pw, err := ReadPasswordFile(write("two", "abc\n\n")); err != nil || pw != "abc\n" {
		t.Errorf("only one newline is dropped: got %q, %v", pw, err)
	}
	secret := strings.Repeat("S3CRET", 14) // 84 bytes
	for _, tt := range []struct{ path, want string }{
		{write("empty", "\n"), "empty"},
		{write("long", secret), "1-80"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		_, err := ReadPasswordFile(tt.path)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("ReadPasswordFile(%s) error %v, want %q and no password text", tt.path, err, tt.want)
		}
	}
	peers := []Peer{{Address: mustAddr("192.0.2.1"), AS: 1, PasswordFile: write("ok", odd)}, {Address: mustAddr("192.0.2.2"), AS: 1}}
	if err := ResolvePasswords(peers, PeersEnv); err != nil || peers[0].Password != odd || peers[1].Password != "" {
		t.Errorf("ResolvePasswords: %v %+v", err, peers)
	}
	bad := []Peer{{Address: mustAddr("192.0.2.1"), AS: 1, PasswordFile: filepath.Join(dir, "missing")}}
	if err := ResolvePasswords(bad, PeersEnv); err == nil || !strings.HasPrefix(err.Error(), "VIPD_BGP_PEERS: peer 192.0.2.1: password file") {
		t.Errorf("ResolvePasswords error = %v", err)
	}
}

func TestDecideRecovery(t *testing.T) {
	const (
		idle = api.PeerState_IDLE
		act  = api.PeerState_ACTIVE
		os_  = api.PeerState_OPENSENT
		oc   = api.PeerState_OPENCONFIRM
		est  = api.PeerState_ESTABLISHED
	)
	for _, tt := range []struct {
		prev, next api.PeerState_SessionState
		disabled   bool
		streak     int
		want       bool
	}{
		{est, idle, false, 0, true},
		{est, idle, false, 99, true}, // a session that was up always comes back fast
		{est, idle, true, 0, false},  // vipd disabled it
		{os_, idle, false, 0, true},  // router closed during OPEN (e.g. still loading its config)
		{oc, idle, false, maxQuickRecoveries - 1, true},
		{os_, idle, false, maxQuickRecoveries, false}, // rejected again and again: GoBGP paces it
		{act, idle, false, 0, false},
		{idle, act, false, 0, false},
		{est, act, false, 0, false},
	} {
		if got := decideRecovery(tt.prev, tt.next, tt.disabled, tt.streak); got != tt.want {
			t.Errorf("decideRecovery(%v->%v, disabled %v, streak %d) = %v, want %v", tt.prev, tt.next, tt.disabled, tt.streak, got, tt.want)
		}
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

func TestParsePeersNeverEchoesPassword(t *testing.T) {
	for _, in := range []string{
		"192.0.2.1:65000:password=TOPSECRET:hold=1",
		"192.0.2.1:65000:password=TOPSECRET:bogus=1",
		"192.0.2.1:65000,192.0.2.1:65000:password=TOPSECRET",
		"192.0.2.1:65000:password=TOPSECRET:password-file=/x",
	} {
		_, err := ParsePeers(in)
		if err == nil || strings.Contains(err.Error(), "TOPSECRET") || !strings.Contains(err.Error(), "password=<redacted>") {
			t.Errorf("ParsePeers(%q) error %v: want an error with the password redacted", in, err)
		}
	}
	ps, err := ParsePeers("192.0.2.1:65000:password-file=/run/secrets/pw")
	if err != nil || ps[0].PasswordFile != "/run/secrets/pw" || ps[0].Password != "" {
		t.Errorf("password-file: %+v, %v", ps, err)
	}
	if _, err := ParsePeers("192.0.2.1:65000:password-file=rel"); err == nil {
		t.Error("relative password-file accepted")
	}
}
