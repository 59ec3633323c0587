package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
)

// secretMark is in every secret value below; it must never appear in an
// error, a warning or check-config's output.
const secretMark = "Sekr1tMark"

func assertNoSecret(t *testing.T, what string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		if strings.Contains(s, secretMark) {
			t.Errorf("%s shows the secret: %q", what, s)
		}
	}
}

// TestSecretSettingsNeverEchoed: every secret setting, set to a bad value,
// is rejected with an error naming the setting and the accepted form but
// not the value; set to a good value, check-config prints it redacted.
func TestSecretSettingsNeverEchoed(t *testing.T) {
	n := 0
	for _, s := range config.Settings() {
		if !s.Secret {
			continue
		}
		n++
		t.Run(s.Env, func(t *testing.T) {
			base := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "n1"}
			for _, bad := range []string{secretMark + " with a space", "dop_v1_" + secretMark + "\tx", secretMark + "\nsecond line"} {
				env := map[string]string{s.Env: bad}
				for k, v := range base {
					env[k] = v
				}
				code, out, errs := run(t, env, "check-config")
				if code != exitConfig || !strings.Contains(errs, s.Env) || !strings.Contains(errs, s.Accepted) {
					t.Errorf("bad %s: exit %d, %q: want exit 2 naming the setting and %q", s.Env, code, errs, s.Accepted)
				}
				assertNoSecret(t, "check-config", out, errs)
				// The same through a flag.
				code, out, errs = run(t, base, "check-config", "--"+s.Flag, bad)
				if code != exitConfig {
					t.Errorf("bad --%s: exit %d", s.Flag, code)
				}
				assertNoSecret(t, "check-config --"+s.Flag, out, errs)
			}
			env := map[string]string{s.Env: "dop_v1_" + secretMark}
			for k, v := range base {
				env[k] = v
			}
			code, out, errs := run(t, env, "check-config")
			if code != 0 || !strings.Contains(out, s.Env+"=<redacted>\n") {
				t.Errorf("good %s: exit %d, %q, stdout lacks %s=<redacted>", s.Env, code, errs, s.Env)
			}
			assertNoSecret(t, "check-config", out, errs)
		})
	}
	if n < 2 {
		t.Fatalf("%d secret settings, want at least DIGITALOCEAN_ACCESS_TOKEN and CLOUDFLARE_API_TOKEN", n)
	}
}

// TestBGPPeerPasswordNeverEchoed: a VIPD_BGP_PEERS value with a password
// and a mistake elsewhere (or in the password itself) is rejected without
// the password in the message.
func TestBGPPeerPasswordNeverEchoed(t *testing.T) {
	pw := "pw" + secretMark
	for _, peers := range []string{
		"192.0.2.1:65000:password=" + pw + ":hold=abc",
		"192.0.2.1:65000:password=" + pw + ":colon" + secretMark,         // ':' in the password
		"192.0.2.1:65000:password=" + pw + ":x=" + secretMark,            // looks like an option
		"192.0.2.1:0:password=" + pw,                                     // bad AS
		"192.0.2.1:65000:password=" + pw + ",192.0.2.1:65000",            // duplicate
		"192.0.2.1:65000:password=" + strings.Repeat(secretMark, 9),      // too long
		"[2001:db8::1]:65000:password=" + pw + ":multihop=" + secretMark, // bad option value after it
		"bogus:65000:password=" + pw,
	} {
		t.Run(peers, func(t *testing.T) {
			env := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "n1", "VIPD_MODE": "bgp",
				"VIPD_BGP_LOCAL_AS": "65001", "VIPD_BGP_ROUTER_ID": "10.0.0.1", "VIPD_BGP_PEERS": peers}
			code, out, errs := run(t, env, "check-config")
			if code != exitConfig || !strings.Contains(errs, "VIPD_BGP_PEERS") {
				t.Fatalf("exit %d, %q: want exit 2 naming VIPD_BGP_PEERS", code, errs)
			}
			assertNoSecret(t, "check-config", out, errs)
		})
	}
	// A valid one: check-config prints it redacted.
	env := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "n1", "VIPD_MODE": "bgp",
		"VIPD_BGP_LOCAL_AS": "65001", "VIPD_BGP_ROUTER_ID": "10.0.0.1", "VIPD_BGP_PEERS": "192.0.2.1:65000:password=" + pw + ":hold=9s"}
	code, out, errs := run(t, env, "check-config")
	if code != 0 || !strings.Contains(out, "VIPD_BGP_PEERS=192.0.2.1:65000:password=<redacted>:hold=9s\n") {
		t.Fatalf("exit %d, %q\n%s", code, errs, out)
	}
	assertNoSecret(t, "check-config", out, errs)
}

// TestMigrateNeverEchoesPasswords: the kube-vip BGP password appears in the
// generated env file (it is the configuration) but never in a warning or
// an error.
func TestMigrateNeverEchoesPasswords(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		input string
		code  int
	}{
		"bgp off, password set": {"vip_arp=true\naddress=10.0.0.100\ncp_enable=true\nbgp_peerpass=" + secretMark + "\nbgp_peers=192.0.2.1:65000:" + secretMark + "\n", 0},
		"bad bgp_peers entry":   {"bgp_enable=true\naddress=10.0.0.100\ncp_enable=true\nbgp_peers=192.0.2.1:65000:" + secretMark + ":maybe\n", exitConfig},
		"bad v6 entry":          {"bgp_enable=true\naddress=10.0.0.100\ncp_enable=true\nbgp_peers=[2001:db8::1]:x:" + secretMark + "\n", exitConfig},
		"bad unnumbered entry":  {"bgp_enable=true\naddress=10.0.0.100\ncp_enable=true\nbgp_peers=unnumbered:eth0:65000:" + secretMark + ":1:2:3:4:5\n", exitConfig},
	} {
		t.Run(name, func(t *testing.T) {
			in := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".env")
			if err := os.WriteFile(in, []byte(tc.input), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, errs := run(t, nil, "migrate", "kube-vip", in, "-o", filepath.Join(dir, "out.env"))
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errs)
			}
			if tc.code == 0 && !strings.Contains(errs, "warning: bgp_peerpass") {
				t.Fatalf("no warning about bgp_peerpass: %q", errs)
			}
			assertNoSecret(t, "migrate", errs)
		})
	}
}
