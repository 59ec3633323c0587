// Package config is vipd's configuration contract: one declarative table of
// settings (environment variable, flag, default, parser, documentation) from
// which the loader, `--help`, `vipd check-config` and the default env file
// are all generated.
//
// Every setting is an environment variable (for /etc/vipd/vipd.env) and a
// flag; a flag that was given wins over the environment. An invalid value is
// reported as one line naming the variable, the value and the accepted form.
package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"
)

// Elections (VIPD_ELECTION) and roles (VIPD_ROLE).
const (
	ElectionLease = "lease"
	RoleVoter     = "voter"
	RoleWitness   = "witness"
)

// Witness reports whether this node only votes (VIPD_ROLE=witness).
func (c *Config) Witness() bool { return c.Role == RoleWitness }

// Elects reports whether this node's VIPs have one holder elected among
// the nodes (l2 and cloud mode with VIPD_PEERS); otherwise a healthy node
// holds every VIP (a lone node; bgp mode, where every node announces).
func (c *Config) Elects() bool {
	return (c.Mode == ModeL2 || c.Mode == ModeCloud) && len(c.Peers) > 0
}

// Modes vipd can announce a VIP in.
const (
	ModeL2    = "l2"
	ModeBGP   = "bgp"
	ModeCloud = "cloud"
)

// Config is the parsed, validated configuration.
type Config struct {
	Addresses []netip.Prefix
	Mode      string
	Interface string // empty: the interface of the default route
	NodeName  string

	HealthURL string
	// HealthReadyzURL is probed for the apiserver's graceful shutdown;
	// "" when off (VIPD_HEALTH_READYZ_URL).
	HealthReadyzURL string
	HealthInterval  time.Duration
	HealthTimeout   time.Duration
	FailThreshold   int
	RiseThreshold   int
	SATokenPath     string
	HealthCAFile    string
	// The probe's client certificate and key (may be one file).
	HealthClientCert, HealthClientKey string

	Peers         []string // host[:port]
	GossipBind    netip.AddrPort
	GossipKeyFile string
	Priority      int
	Nice          int    // VIPD_NICE
	MemoryLock    string // VIPD_MEMORY_LOCK: on, off
	Quorum        Quorum
	StateDir      string
	MemberExpiry  time.Duration
	PreemptDelay  time.Duration // VIPD_PREEMPT_DELAY; 0: off
	// VerifyInterval is VIPD_VERIFY_INTERVAL (0: off); VerifyPort is
	// VIPD_VERIFY_PORT (0: none).
	VerifyInterval time.Duration
	VerifyPort     int
	// GossipInsecure allows peers without VIPD_GOSSIP_KEY_FILE.
	GossipInsecure bool
	// GossipKeys are the keys in GossipKeyFile, the primary first; set by
	// ReadGossipKeys (Load reads no files).
	GossipKeys [][]byte
	// Profile is VIPD_PROFILE (default or fast); Explicit lists the
	// settings that were given (flag or environment), which the profile
	// does not change.
	Profile  string
	Explicit []string
	// Election is VIPD_ELECTION (lease: the only one left); Role is VIPD_ROLE
	// (voter or witness).
	Election string
	Role     string

	BGPLocalAS    uint32
	BGPRouterID   netip.Addr
	BGPPeers      string // raw VIPD_BGP_PEERS; parsed by the bgp package
	BFDEnabled    bool
	BFDDetectMult int
	BFDTxInterval time.Duration
	BFDRxInterval time.Duration

	// BGP peers file, path attributes and graceful restart; the raw
	// values are parsed by the bgp package.
	BGPPeersFile        string
	BGPCommunities      string
	BGPLargeCommunities string
	BGPLocalPref        string
	BGPMED              string
	BGPPrepend          int
	BGPGracefulRestart  bool
	BGPRestartTime      time.Duration
	BFDMultihopMinTTL   int

	CloudProvider string
	DOToken       string
	DOTokenFile   string
	DOAPIURL      string
	DOMetadataURL string
	DODropletID   int
	// Hetzner Cloud (VIPD_CLOUD_PROVIDER=hetzner).
	HcloudToken         string
	HcloudTokenFile     string
	HcloudAPIURL        string
	HcloudMetadataURL   string
	HcloudServerID      int64
	HcloudFloatingIPIDs []int64
	// CloudBindInterface also binds the reserved IP locally (cloud mode).
	CloudBindInterface string

	MetricsAddress string
	LogLevel       string
	LogFormat      string

	Kubeconfig       string
	Controllers      string // raw VIPD_CONTROLLERS; parsed by the kube package
	CloudflareToken  string
	CloudflareAPIURL string

	// Static egress (config/egress.go).
	Egress             []EgressRule
	EgressClusterCIDRs []netip.Prefix
	EgressTable        int
	EgressRulePriority int
	EgressMarkMask     uint32
	EgressPolicies     bool // VIPD_EGRESS_POLICIES=on

	// Pools (VIPD_POOLS=on): announce the allocated addresses of IPPools.
	Pools bool

	// ServicesDefaultClass: VIPD_SERVICES_DEFAULT_CLASS (--default-class).
	ServicesDefaultClass bool
}

// Quorum is VIPD_QUORUM: auto (majority of known members), off, or a fixed N.
type Quorum struct {
	Off   bool
	Fixed int // > 0 when a number was given
}

func (q Quorum) String() string {
	switch {
	case q.Off:
		return "off"
	case q.Fixed > 0:
		return fmt.Sprint(q.Fixed)
	default:
		return "auto"
	}
}

// Error is an invalid setting. Its message is one line.
type Error struct {
	Name     string // the environment variable
	Value    string
	Accepted string
	// Secret hides Value in the message: a token or password is never
	// echoed, only the setting's name and the accepted form.
	Secret bool
}

func (e *Error) Error() string {
	if e.Secret {
		return fmt.Sprintf("invalid %s (value not shown: it is a secret): want %s", e.Name, e.Accepted)
	}
	return fmt.Sprintf("invalid %s=%q: want %s", e.Name, e.Value, e.Accepted)
}

// Source returns the raw value of a setting and whether it was set at all.
// The loader in cmd/vipd backs it with viper (flags over environment).
type Source func(s *Setting) (string, bool)

// EnvSource reads settings from the process environment only.
func EnvSource(s *Setting) (string, bool) { return os.LookupEnv(s.Env) }

// Load parses every setting from src (defaults where unset), then checks the
// settings against each other. The first error is returned.
func Load(src Source) (*Config, error) {
	c := &Config{}
	profile := ProfileDefault
	for i := range table {
		if table[i].Env == "VIPD_PROFILE" {
			if v, ok := src(&table[i]); ok {
				profile = strings.TrimSpace(v)
			}
		}
	}
	for i := range table {
		s := &table[i]
		v, ok := src(s)
		if ok {
			c.Explicit = append(c.Explicit, s.Env)
		} else if pv, set := profileValue(profile, s.Env); set {
			v = pv
		} else {
			v = s.Default
		}
		v = strings.TrimSpace(v)
		if err := s.parse(c, v); err != nil {
			if errors.Is(err, errInvalid) {
				return nil, &Error{Name: s.Env, Value: v, Accepted: s.Accepted, Secret: s.Secret}
			}
			var ce *Error
			if s.Secret && errors.As(err, &ce) {
				ce.Secret = true
			}
			return nil, err
		}
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return c, nil
}

// gossipOnly are the settings only the removed gossip election read.
var gossipOnly = map[string]string{
	"VIPD_QUORUM":        "the lease election counts the agreed voters; for two control-plane nodes run a third voter, VIPD_ROLE=witness (docs/l2.md)",
	"VIPD_MEMBER_EXPIRY": "the lease election removes a dead voter after 20 s while a majority remains (docs/lease.md)",
}

// Ignored lists, one line each, the settings given explicitly that only
// the removed gossip election read: an env file written for it keeps
// working under the lease, with a warning.
func (c *Config) Ignored() []string {
	var out []string
	for _, env := range c.Explicit {
		if why, ok := gossipOnly[env]; ok {
			out = append(out, env+" is ignored (the gossip election that read it was removed): "+why)
		}
	}
	return out
}

// check validates combinations of settings.
func (c *Config) check() error {
	if err := c.checkEgress(); err != nil {
		return err
	}
	if c.Witness() {
		return c.checkWitness()
	}
	if len(c.Addresses) == 0 && c.Controllers == "" && !c.Pools {
		return &Error{Name: "VIPD_ADDRESS", Value: "", Accepted: "at least one VIP in CIDR form, e.g. 10.0.0.100/32,fd00::100/128 (required unless only VIPD_CONTROLLERS run or VIPD_POOLS=on)"}
	}
	if c.Pools && c.Kubeconfig == "" {
		return &Error{Name: "VIPD_KUBECONFIG", Value: "", Accepted: "the path of a kubeconfig, required with VIPD_POOLS=on (the pool addresses come from the Kubernetes API)"}
	}
	if c.Pools && c.Mode == ModeCloud {
		return &Error{Name: "VIPD_POOLS", Value: "on", Accepted: "off in cloud mode (pool addresses are announced in l2 or bgp mode)"}
	}
	if c.Mode == ModeBGP && (len(c.Addresses) > 0 || c.Pools) {
		if c.BGPLocalAS == 0 {
			return &Error{Name: "VIPD_BGP_LOCAL_AS", Value: "", Accepted: "an AS number 1-4294967295 (required in bgp mode)"}
		}
		if strings.TrimSpace(c.BGPPeers) == "" && c.BGPPeersFile == "" {
			return &Error{Name: "VIPD_BGP_PEERS", Value: "", Accepted: "at least one peer as address:as[:option=value...], or VIPD_BGP_PEERS_FILE (required in bgp mode)"}
		}
		if strings.TrimSpace(c.BGPPeers) != "" && c.BGPPeersFile != "" {
			return &Error{Name: "VIPD_BGP_PEERS_FILE", Value: c.BGPPeersFile, Accepted: "empty when VIPD_BGP_PEERS is set (give the peers in one place)"}
		}
	}
	if (c.Mode == ModeL2 || c.Mode == ModeCloud) && (len(c.Addresses) > 0 || c.Pools) && len(c.Peers) > 0 &&
		c.GossipKeyFile == "" && !c.GossipInsecure {
		return &Error{Name: "VIPD_GOSSIP_KEY_FILE", Value: "", Accepted: "a key file, required with VIPD_PEERS in " + c.Mode +
			" mode (without one anyone reaching the gossip port can join and vote): make one with `vipd keygen --out /etc/vipd/gossip.key`," +
			" copy it to every node and set VIPD_GOSSIP_KEY_FILE=/etc/vipd/gossip.key; VIPD_GOSSIP_INSECURE=true opts out (plaintext gossip)"}
	}
	if c.Mode == ModeCloud && c.CloudProvider != "hetzner" && len(c.Addresses) > 1 {
		return &Error{Name: "VIPD_ADDRESS", Value: joinPrefixes(c.Addresses), Accepted: "one reserved IPv4 address in cloud mode with digitalocean (a droplet holds one reserved IP)"}
	}
	if c.Mode == ModeCloud && len(c.Addresses) > 0 {
		for _, p := range c.Addresses {
			if !p.Addr().Is4() || p.Bits() != 32 {
				return &Error{Name: "VIPD_ADDRESS", Value: p.String(), Accepted: "single IPv4 addresses (a.b.c.d/32) in cloud mode (DigitalOcean reserved IPs and the Hetzner floating IPs vipd moves are IPv4)"}
			}
		}
	}
	if c.Mode == ModeCloud && c.CloudProvider != "hetzner" && len(c.HcloudFloatingIPIDs) > 0 {
		return &Error{Name: "VIPD_HCLOUD_FLOATING_IP_ID", Value: fmt.Sprint(c.HcloudFloatingIPIDs), Accepted: "empty unless VIPD_CLOUD_PROVIDER=hetzner"}
	}
	return nil
}

// checkWitness validates VIPD_ROLE=witness: a witness votes in the lease
// election of an l2 or cloud cluster and holds nothing, so it needs peers
// (and their key) but no VIP interface, apiserver or Kubernetes API.
// VIPD_ADDRESS may stay set (the same env file on every node): a witness
// never binds it.
func (c *Config) checkWitness() error {
	if c.Mode == ModeBGP {
		return &Error{Name: "VIPD_ROLE", Value: RoleWitness, Accepted: "voter in bgp mode (every healthy node announces: nothing to vote on); witness in l2 or cloud mode"}
	}
	if len(c.Peers) == 0 {
		return &Error{Name: "VIPD_PEERS", Value: "", Accepted: "the gossip addresses of the voters (host[:port], comma-separated): required with VIPD_ROLE=witness, which only votes"}
	}
	if c.Pools || c.Controllers != "" || c.EgressPolicies || len(c.Egress) > 0 {
		name, val := "VIPD_POOLS", "on"
		switch {
		case c.Controllers != "":
			name, val = "VIPD_CONTROLLERS", c.Controllers
		case c.EgressPolicies:
			name = "VIPD_EGRESS_POLICIES"
		case len(c.Egress) > 0:
			name, val = "VIPD_EGRESS", "(set)"
		}
		return &Error{Name: name, Value: val, Accepted: "off with VIPD_ROLE=witness (a witness votes and holds nothing)"}
	}
	if c.GossipKeyFile == "" && !c.GossipInsecure {
		return &Error{Name: "VIPD_GOSSIP_KEY_FILE", Value: "", Accepted: "the cluster's gossip key file, required with VIPD_ROLE=witness (the same key as the voters; VIPD_GOSSIP_INSECURE=true opts out)"}
	}
	return nil
}

// Settings returns the table, in documentation order.
func Settings() []Setting { return append([]Setting(nil), table...) }

// Lookup returns the setting with the given environment name.
func Lookup(env string) (Setting, bool) {
	for _, s := range table {
		if s.Env == env {
			return s, true
		}
	}
	return Setting{}, false
}

// Unknown returns VIPD_* variables in environ that are not settings: almost
// always a typo that would otherwise be silently ignored.
func Unknown(environ []string) []string {
	known := map[string]bool{}
	for _, s := range table {
		known[s.Env] = true
	}
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "VIPD_") && !known[k] && k != "VIPD_TEST_BINARY" {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// Effective lists every setting with its effective value as name=value
// lines, secrets redacted, in table order.
func (c *Config) Effective() []string {
	out := make([]string, 0, len(table))
	for _, s := range table {
		v := s.format(c)
		if s.Secret && v != "" {
			v = "<redacted>"
		}
		out = append(out, s.Env+"="+v)
	}
	return out
}

// Environ returns every setting as NAME=value with its effective value,
// secrets included: the environment that makes a child process load the
// same configuration (flags given to the parent included).
func (c *Config) Environ() []string {
	out := make([]string, 0, len(table))
	for _, s := range table {
		out = append(out, s.Env+"="+s.format(c))
	}
	return out
}

// NewLogger returns a slog logger writing to w at VIPD_LOG_LEVEL in
// VIPD_LOG_FORMAT (text or json).
func (c *Config) NewLogger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// ProviderControllers reports whether VIPD_CONTROLLERS names a controller
// that needs a DigitalOcean or Cloudflare token (floatingippool,
// nodednsrecordset); services and ipam need none.
func (c *Config) ProviderControllers() bool {
	for _, n := range splitList(c.Controllers) {
		if n == "floatingippool" || n == "nodednsrecordset" {
			return true
		}
	}
	return false
}
