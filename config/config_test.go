package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func mapSource(m map[string]string) Source {
	return func(s *Setting) (string, bool) {
		v, ok := m[s.Env]
		return v, ok
	}
}

func load(t *testing.T, kv ...string) (*Config, error) {
	t.Helper()
	m := map[string]string{"VIPD_ADDRESS": "10.0.0.100/32", "VIPD_NODE_NAME": "n1"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return Load(mapSource(m))
}

func TestDefaults(t *testing.T) {
	c, err := load(t)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.100/32")}, Mode: ModeL2, NodeName: "n1",
		HealthURL: DefaultHealthURL, HealthReadyzURL: "https://127.0.0.1:6443/readyz", HealthInterval: time.Second, HealthTimeout: 3 * time.Second,
		FailThreshold: 3, RiseThreshold: 1, SATokenPath: "/var/run/secrets/kubernetes.io/serviceaccount/token",
		HealthCAFile: "/etc/kubernetes/pki/ca.crt", HealthClientCert: "/var/lib/kubelet/pki/kubelet-client-current.pem",
		HealthClientKey: "/var/lib/kubelet/pki/kubelet-client-current.pem",
		GossipBind:      netip.MustParseAddrPort("0.0.0.0:7950"), StateDir: "/var/lib/vipd", MemberExpiry: 10 * time.Minute, Profile: ProfileDefault, VerifyInterval: time.Second,
		Election: ElectionLease, Role: RoleVoter, Nice: -10, MemoryLock: "off",
		BFDDetectMult: 3, BFDTxInterval: 300 * time.Millisecond, BFDRxInterval: 300 * time.Millisecond,
		BGPRestartTime: 10 * time.Second, BFDMultihopMinTTL: 254,
		CloudProvider: "digitalocean", DOAPIURL: "https://api.digitalocean.com/", DOMetadataURL: "http://169.254.169.254/metadata/v1",
		HcloudAPIURL: "https://api.hetzner.cloud/v1", HcloudMetadataURL: "http://169.254.169.254/hetzner/v1/metadata",
		MetricsAddress: "127.0.0.1:9469", LogLevel: "info", LogFormat: "text", CloudflareAPIURL: "https://api.cloudflare.com/client/v4/",
		EgressTable: DefaultEgressTable, EgressRulePriority: DefaultEgressRulePriority, EgressMarkMask: DefaultEgressMarkMask,
	}
	if got := strings.Join(c.Effective(), "\n"); got != strings.Join(want.Effective(), "\n") {
		t.Fatalf("defaults differ:\n got %s\nwant %s", got, strings.Join(want.Effective(), "\n"))
	}
}

func TestValid(t *testing.T) {
	tests := []struct {
		env, value string
		check      func(c *Config) bool
	}{
		{"VIPD_ADDRESS", "10.0.0.100/32, fd00::100/128", func(c *Config) bool { return len(c.Addresses) == 2 && c.Addresses[1].Addr().Is6() }},
		{"VIPD_ADDRESS", "10.0.0.100", func(c *Config) bool { return c.Addresses[0].Bits() == 32 }},
		{"VIPD_MODE", "bgp", nil}, // needs BGP settings: see TestCombinations
		{"VIPD_MODE", "cloud", func(c *Config) bool { return c.Mode == ModeCloud }},
		{"VIPD_INTERFACE", "eth0", func(c *Config) bool { return c.Interface == "eth0" }},
		{"VIPD_HEALTH_INTERVAL", "100ms", func(c *Config) bool { return c.HealthInterval == 100*time.Millisecond }},
		{"VIPD_HEALTH_READYZ_URL", "off", func(c *Config) bool { return c.HealthReadyzURL == "" }},
		{"VIPD_HEALTH_READYZ_URL", "https://127.0.0.1:6443/readyz?exclude=etcd", func(c *Config) bool {
			return c.HealthReadyzURL == "https://127.0.0.1:6443/readyz?exclude=etcd"
		}},
		{"VIPD_HEALTH_TIMEOUT", "2s", func(c *Config) bool { return c.HealthTimeout == 2*time.Second }},
		{"VIPD_FAIL_THRESHOLD", "5", func(c *Config) bool { return c.FailThreshold == 5 }},
		{"VIPD_RISE_THRESHOLD", "2", func(c *Config) bool { return c.RiseThreshold == 2 }},
		{"VIPD_PEERS", "10.0.0.11, 10.0.0.12:7950,[fd00::1]:7950,node3", func(c *Config) bool { return len(c.Peers) == 4 }},
		{"VIPD_GOSSIP_BIND", "[::]:7951", func(c *Config) bool { return c.GossipBind.Port() == 7951 }},
		{"VIPD_PRIORITY", "-5", func(c *Config) bool { return c.Priority == -5 }},
		{"VIPD_QUORUM", "off", func(c *Config) bool { return c.Quorum.Off }},
		{"VIPD_PREEMPT_DELAY", "30s", func(c *Config) bool { return c.PreemptDelay == 30*time.Second }},
		{"VIPD_PREEMPT_DELAY", "off", func(c *Config) bool { return c.PreemptDelay == 0 }},
		{"VIPD_VERIFY_INTERVAL", "off", func(c *Config) bool { return c.VerifyInterval == 0 }},
		{"VIPD_VERIFY_INTERVAL", "500ms", func(c *Config) bool { return c.VerifyInterval == 500*time.Millisecond }},
		{"VIPD_VERIFY_PORT", "6443", func(c *Config) bool { return c.VerifyPort == 6443 }},
		{"VIPD_QUORUM", "2", func(c *Config) bool { return c.Quorum.Fixed == 2 }},
		{"VIPD_BFD_ENABLED", "true", func(c *Config) bool { return c.BFDEnabled }},
		{"VIPD_DO_DROPLET_ID", "1234", func(c *Config) bool { return c.DODropletID == 1234 }},
		{"VIPD_METRICS_ADDRESS", "", func(c *Config) bool { return c.MetricsAddress == "" }},
		{"VIPD_LOG_FORMAT", "json", func(c *Config) bool { return c.LogFormat == "json" }},
		{"VIPD_CONTROLLERS", "floatingippool,nodednsrecordset", func(c *Config) bool { return c.Controllers != "" }},
	}
	for _, tt := range tests {
		if tt.check == nil {
			continue
		}
		t.Run(tt.env+"="+tt.value, func(t *testing.T) {
			c, err := load(t, tt.env, tt.value, "VIPD_GOSSIP_INSECURE", "true")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Fatalf("%s=%q parsed wrongly: %+v", tt.env, tt.value, c)
			}
		})
	}
}

func TestInvalid(t *testing.T) {
	tests := []struct{ env, value, wantValue, wantAccepted string }{
		{"VIPD_ADDRESS", "10.0.0.0/24", "10.0.0.0/24", "host prefix"},
		{"VIPD_ADDRESS", "10.0.0.1/32,banana", "banana", "CIDR form"},
		{"VIPD_ADDRESS", "127.0.0.1/32", "127.0.0.1/32", "not loopback"},
		{"VIPD_ADDRESS", "10.0.0.1,10.0.0.1/32", "10.0.0.1/32", "once"},
		{"VIPD_ADDRESS", "", "", "at least one VIP"},
		{"VIPD_MODE", "l3", "l3", "one of l2, bgp, cloud"},
		{"VIPD_POOLS", "yes", "yes", "on or off"},
		{"VIPD_INTERFACE", "this-name-is-far-too-long", "this-name-is-far-too-long", "15 characters"},
		{"VIPD_NODE_NAME", "a b", "a b", "without spaces"},
		{"VIPD_HEALTH_URL", "ftp://x/livez", "ftp://x/livez", "https URL"},
		{"VIPD_HEALTH_READYZ_URL", "readyz", "readyz", "same scheme, host and port"},
		{"VIPD_HEALTH_READYZ_URL", "https://10.0.0.1:6443/readyz", "https://10.0.0.1:6443/readyz", "same scheme, host and port"},
		{"VIPD_HEALTH_INTERVAL", "1", "1", "duration"},
		{"VIPD_HEALTH_INTERVAL", "1ms", "1ms", "duration from 10ms"},
		{"VIPD_HEALTH_TIMEOUT", "-1s", "-1s", "duration"},
		{"VIPD_FAIL_THRESHOLD", "0", "0", "from 1 to 100"},
		{"VIPD_RISE_THRESHOLD", "x", "x", "whole number"},
		{"VIPD_SA_TOKEN_PATH", "relative/token", "relative/token", "absolute path"},
		{"VIPD_PEERS", "10.0.0.1:99999", "10.0.0.1:99999", "port 1-65535"},
		{"VIPD_GOSSIP_BIND", "7950", "7950", "ip:port"},
		{"VIPD_PRIORITY", "5000", "5000", "-1000 to 1000"},
		{"VIPD_QUORUM", "most", "most", "auto, off, or a number"},
		{"VIPD_PREEMPT_DELAY", "100ms", "100ms", "off, or a duration from 1s to 24h"},
		{"VIPD_PREEMPT_DELAY", "soon", "soon", "off, or a duration from 1s to 24h"},
		{"VIPD_VERIFY_INTERVAL", "100ms", "100ms", "off, or a duration from 200ms to 1m"},
		{"VIPD_VERIFY_PORT", "70000", "70000", "a whole number from 0 to 65535"},
		{"VIPD_BGP_LOCAL_AS", "-1", "-1", "AS number"},
		{"VIPD_BGP_ROUTER_ID", "fd00::1", "fd00::1", "IPv4 address"},
		{"VIPD_BFD_ENABLED", "yes", "yes", "true or false"},
		{"VIPD_BFD_DETECT_MULT", "0", "0", "from 1 to 255"},
		{"VIPD_BFD_TX_INTERVAL", "1us", "1us", "duration"},
		{"VIPD_CLOUD_PROVIDER", "aws", "aws", "digitalocean"},
		{"VIPD_DO_API_URL", "api.digitalocean.com", "api.digitalocean.com", "URL"},
		{"VIPD_DO_DROPLET_ID", "abc", "abc", "positive droplet ID"},
		{"VIPD_METRICS_ADDRESS", "9469", "9469", "host:port"},
		{"VIPD_LOG_LEVEL", "verbose", "verbose", "debug, info, warn, error"},
		{"VIPD_LOG_FORMAT", "xml", "xml", "text, json"},
		{"VIPD_CONTROLLERS", "floatingippool,dns", "dns", "floatingippool, nodednsrecordset"},
		{"VIPD_CLOUD_BIND_INTERFACE", "a/b", "a/b", "interface name"},
		{"VIPD_ROLE", "observer", "observer", "one of voter, witness"},
		{"VIPD_ELECTION", "raft", "raft", "lease"},
		{"VIPD_ELECTION", "gossip", "gossip", "lease (the gossip election was removed"},
	}
	for _, tt := range tests {
		t.Run(tt.env+"="+tt.value, func(t *testing.T) {
			_, err := load(t, tt.env, tt.value)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("want a config error, got %v", err)
			}
			msg := err.Error()
			if ce.Name != tt.env || ce.Value != tt.wantValue || !strings.Contains(msg, tt.wantAccepted) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q: want name %s, value %q, accepted form containing %q, one line", msg, tt.env, tt.wantValue, tt.wantAccepted)
			}
		})
	}
}

func TestCombinations(t *testing.T) {
	tests := []struct {
		name    string
		kv      []string
		wantErr string
	}{
		{"bgp needs AS", []string{"VIPD_MODE", "bgp", "VIPD_BGP_PEERS", "10.0.0.1:65000"}, "VIPD_BGP_LOCAL_AS"},
		{"bgp needs peers", []string{"VIPD_MODE", "bgp", "VIPD_BGP_LOCAL_AS", "65001"}, "VIPD_BGP_PEERS"},
		{"bgp complete", []string{"VIPD_MODE", "bgp", "VIPD_BGP_LOCAL_AS", "65001", "VIPD_BGP_PEERS", "10.0.0.1:65000"}, ""},
		{"cloud is IPv4 only", []string{"VIPD_MODE", "cloud", "VIPD_ADDRESS", "fd00::1/128"}, "single IPv4 addresses"},
		{"cloud holds one reserved IP", []string{"VIPD_MODE", "cloud", "VIPD_ADDRESS", "10.0.0.1/32,10.0.0.2/32"}, "one reserved IPv4 address"},
		{"a hetzner server holds several floating IPs", []string{"VIPD_MODE", "cloud", "VIPD_CLOUD_PROVIDER", "hetzner", "VIPD_ADDRESS", "10.0.0.1/32,10.0.0.2/32"}, ""},
		{"unknown cloud provider", []string{"VIPD_MODE", "cloud", "VIPD_CLOUD_PROVIDER", "equinix"}, `invalid VIPD_CLOUD_PROVIDER="equinix": want one of digitalocean, hetzner`},
		{"floating IP ids need hetzner", []string{"VIPD_MODE", "cloud", "VIPD_HCLOUD_FLOATING_IP_ID", "7"}, "empty unless VIPD_CLOUD_PROVIDER=hetzner"},
		{"floating IP ids", []string{"VIPD_MODE", "cloud", "VIPD_CLOUD_PROVIDER", "hetzner", "VIPD_HCLOUD_FLOATING_IP_ID", "7, 8"}, ""},
		{"bad floating IP id", []string{"VIPD_MODE", "cloud", "VIPD_CLOUD_PROVIDER", "hetzner", "VIPD_HCLOUD_FLOATING_IP_ID", "7,x"}, `invalid VIPD_HCLOUD_FLOATING_IP_ID="7,x": want a comma list of positive floating IP IDs`},
		{"bad server id", []string{"VIPD_MODE", "cloud", "VIPD_CLOUD_PROVIDER", "hetzner", "VIPD_HCLOUD_SERVER_ID", "-1"}, "VIPD_HCLOUD_SERVER_ID"},
		{"controllers only", []string{"VIPD_ADDRESS", "", "VIPD_CONTROLLERS", "floatingippool"}, ""},
		{"pools without a VIP", []string{"VIPD_ADDRESS", "", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/etc/vipd/kubeconfig"}, ""},
		{"pools need a kubeconfig", []string{"VIPD_ADDRESS", "", "VIPD_POOLS", "on"}, "VIPD_KUBECONFIG"},
		{"pools not in cloud mode", []string{"VIPD_MODE", "cloud", "VIPD_ADDRESS", "10.0.0.1/32", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/k"}, "VIPD_POOLS"},
		{"pools with peers need the gossip key", []string{"VIPD_ADDRESS", "", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/k", "VIPD_PEERS", "10.0.0.2"}, "VIPD_GOSSIP_KEY_FILE"},
		{"witness without a VIP", []string{"VIPD_ADDRESS", "", "VIPD_ROLE", "witness", "VIPD_PEERS", "10.0.0.2,10.0.0.3", "VIPD_GOSSIP_KEY_FILE", "/k"}, ""},
		{"witness with the voters' env file", []string{"VIPD_ROLE", "witness", "VIPD_PEERS", "10.0.0.2,10.0.0.3", "VIPD_GOSSIP_KEY_FILE", "/k"}, ""},
		{"witness needs peers", []string{"VIPD_ADDRESS", "", "VIPD_ROLE", "witness", "VIPD_GOSSIP_KEY_FILE", "/k"}, "VIPD_PEERS"},
		{"witness needs the gossip key", []string{"VIPD_ROLE", "witness", "VIPD_PEERS", "10.0.0.2"}, "VIPD_GOSSIP_KEY_FILE"},
		{"witness not in bgp mode", []string{"VIPD_MODE", "bgp", "VIPD_ROLE", "witness", "VIPD_PEERS", "10.0.0.2"}, "VIPD_ROLE"},
		{"witness holds no pool addresses", []string{"VIPD_ROLE", "witness", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/k", "VIPD_PEERS", "10.0.0.2", "VIPD_GOSSIP_KEY_FILE", "/k"}, "VIPD_POOLS"},
		{"lease election with pools in a cluster", []string{"VIPD_ELECTION", "lease", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/k", "VIPD_PEERS", "10.0.0.2", "VIPD_GOSSIP_KEY_FILE", "/k"}, ""},
		{"lease election with egress policies in a cluster", []string{"VIPD_ELECTION", "lease", "VIPD_EGRESS_POLICIES", "on", "VIPD_KUBECONFIG", "/k", "VIPD_PEERS", "10.0.0.2", "VIPD_GOSSIP_KEY_FILE", "/k"}, ""},
		{"pools in bgp mode need the AS", []string{"VIPD_ADDRESS", "", "VIPD_MODE", "bgp", "VIPD_POOLS", "on", "VIPD_KUBECONFIG", "/k"}, "VIPD_BGP_LOCAL_AS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.kv...)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("got %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestEffectiveRedactsSecrets(t *testing.T) {
	c, err := load(t, "DIGITALOCEAN_ACCESS_TOKEN", "dop_v1_secret", "CLOUDFLARE_API_TOKEN", "cfsecret",
		"VIPD_BGP_PEERS", "10.0.0.1:65000:password=hunter2:port=1179,10.0.0.2:65000")
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Join(c.Effective(), "\n")
	for _, secret := range []string{"dop_v1_secret", "cfsecret", "hunter2"} {
		if strings.Contains(out, secret) {
			t.Fatalf("secret %q printed:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "VIPD_BGP_PEERS=10.0.0.1:65000:password=<redacted>:port=1179,10.0.0.2:65000") {
		t.Fatalf("peers not redacted as expected:\n%s", out)
	}
}

func TestUnknown(t *testing.T) {
	got := Unknown([]string{"VIPD_ADDRES=1", "VIPD_MODE=l2", "PATH=/bin", "VIPD_TEST_BINARY=x"})
	if len(got) != 1 || got[0] != "VIPD_ADDRES" {
		t.Fatalf("got %v", got)
	}
}

func TestEnvFileListsEverySetting(t *testing.T) {
	var b strings.Builder
	if err := WriteEnvFile(&b, map[string]string{"VIPD_ADDRESS": "10.0.0.100/32"}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range Settings() {
		if !strings.Contains(out, s.Env+"=") {
			t.Errorf("env file misses %s", s.Env)
		}
	}
	if !strings.Contains(out, "\nVIPD_ADDRESS=10.0.0.100/32\n") || !strings.Contains(out, "\n#VIPD_MODE=l2\n") {
		t.Fatalf("env file:\n%s", out)
	}
}

func TestEnvironRoundTrips(t *testing.T) {
	c, err := load(t, "VIPD_PRIORITY", "5", "DIGITALOCEAN_ACCESS_TOKEN", "tok", "VIPD_ADDRESS", "10.0.0.1/32,fd00::1/128", "VIPD_QUORUM", "off")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, kv := range c.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	c2, err := Load(mapSource(m))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Environ(), "\n") != strings.Join(c2.Environ(), "\n") || c2.DOToken != "tok" {
		t.Fatalf("round trip differs:\n%v\n%v", c.Environ(), c2.Environ())
	}
}

func TestEnvFileQuotes(t *testing.T) {
	var b strings.Builder
	if err := WriteEnvFile(&b, map[string]string{"VIPD_NODE_NAME": `a b"$c`, "VIPD_ADDRESS": "10.0.0.1/32,fd00::1/128"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nVIPD_NODE_NAME=\"a b\\\"\\$c\"\n", "\nVIPD_ADDRESS=10.0.0.1/32,fd00::1/128\n"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("env file lacks %q", want)
		}
	}
}

func TestQuoteEnvValueKeepsBytes(t *testing.T) {
	for in, want := range map[string]string{"": "", "a-b": "a-b", "a b": `"a b"`, "x\xc5y": "\"x\xc5y\"", "é": "\"é\"", "a\nb": `"a\nb"`} {
		if got := QuoteEnvValue(in); got != want {
			t.Errorf("QuoteEnvValue(%q) = %q, want %q", in, got, want)
		}
	}
}

// FLIPOP's CLOUDFLARE_TOKEN works when CLOUDFLARE_API_TOKEN is not set;
// CLOUDFLARE_API_TOKEN wins when both are.
func TestCloudflareTokenFLIPOPName(t *testing.T) {
	t.Setenv("CLOUDFLARE_TOKEN", "flipop-cf")
	c, err := load(t, "VIPD_CONTROLLERS", "nodednsrecordset")
	if err != nil {
		t.Fatal(err)
	}
	if c.CloudflareToken != "flipop-cf" {
		t.Fatalf("token %q, want CLOUDFLARE_TOKEN's", c.CloudflareToken)
	}
	c, err = load(t, "VIPD_CONTROLLERS", "nodednsrecordset", "CLOUDFLARE_API_TOKEN", "api-cf")
	if err != nil {
		t.Fatal(err)
	}
	if c.CloudflareToken != "api-cf" {
		t.Fatalf("token %q, want CLOUDFLARE_API_TOKEN's", c.CloudflareToken)
	}
}

// TestReadyzURLDerived: without VIPD_HEALTH_READYZ_URL the readiness URL
// follows VIPD_HEALTH_URL.
func TestReadyzURLDerived(t *testing.T) {
	for _, tc := range []struct{ health, want string }{
		{"https://127.0.0.1:6443/livez", "https://127.0.0.1:6443/readyz"},
		{"https://[::1]:16443/livez?verbose", "https://[::1]:16443/readyz"},
		{"https://127.0.0.1:6443/prefix/livez", "https://127.0.0.1:6443/prefix/readyz"},
		{"https://127.0.0.1:6443/healthz", ""},
		{"http://127.0.0.1:8080/", ""},
	} {
		c, err := load(t, "VIPD_HEALTH_URL", tc.health)
		if err != nil {
			t.Fatalf("%s: %v", tc.health, err)
		}
		if c.HealthReadyzURL != tc.want {
			t.Errorf("VIPD_HEALTH_URL=%s: readyz URL %q, want %q", tc.health, c.HealthReadyzURL, tc.want)
		}
	}
}

func TestWitnessImpliesLease(t *testing.T) {
	c, err := load(t, "VIPD_ADDRESS", "", "VIPD_ROLE", "witness", "VIPD_PEERS", "10.0.0.2", "VIPD_GOSSIP_KEY_FILE", "/k")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Witness() || c.Election != ElectionLease {
		t.Fatalf("role %q election %q, want a witness in the lease election", c.Role, c.Election)
	}
}

// Settings only the removed gossip election read are still accepted (an
// env file written for it keeps working) with one line each naming the
// setting and what replaces it; nothing when they are not set.
func TestIgnoredUnderTheLease(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		want []string
	}{
		{nil, nil},
		{[]string{"VIPD_QUORUM", "off", "VIPD_MEMBER_EXPIRY", "1h"}, []string{"VIPD_QUORUM is ignored (the gossip election that read it was removed): ", "VIPD_MEMBER_EXPIRY is ignored (the gossip election that read it was removed): "}},
		{[]string{"VIPD_QUORUM", "3", "VIPD_ELECTION", "lease"}, []string{"VIPD_QUORUM is ignored "}},
	} {
		c, err := load(t, tc.kv...)
		if err != nil {
			t.Fatal(err)
		}
		got := c.Ignored()
		if len(got) != len(tc.want) {
			t.Fatalf("%v: %q, want %d lines", tc.kv, got, len(tc.want))
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w) || strings.Contains(got[i], "\n") {
				t.Errorf("%v: %q, want %q...", tc.kv, got[i], w)
			}
		}
	}
	c, _ := load(t, "VIPD_QUORUM", "off")
	if got := c.Ignored(); len(got) != 1 || !strings.Contains(got[0], "VIPD_ROLE=witness") {
		t.Errorf("VIPD_QUORUM=off does not point to the witness: %q", got)
	}
}
