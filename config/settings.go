package config

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Setting is one row of the configuration table.
type Setting struct {
	Env      string // environment variable
	Flag     string // long flag name, without dashes
	Default  string
	Section  string // heading in --help and the env file
	Doc      string // one sentence
	Accepted string // the accepted form, used in errors
	Secret   bool   // redacted by check-config
	parse    func(c *Config, v string) error
	format   func(c *Config) string
}

// Sections, in documentation order.
const (
	SecVIP     = "Virtual IP"
	SecHealth  = "Health check"
	SecCluster = "Cluster (l2 and cloud election)"
	SecBGP     = "BGP and BFD (bgp mode)"
	SecCloud   = "Cloud (cloud mode)"
	SecOps     = "Observability"
	SecKube    = "Kubernetes controllers (optional)"
)

// DefaultHealthURL is the local kube-apiserver's liveness endpoint.
const DefaultHealthURL = "https://127.0.0.1:6443/livez"

// ReadyzURL is the default of VIPD_HEALTH_READYZ_URL for a health URL:
// the same URL with its final /livez replaced by /readyz (a query is
// dropped), or "" (not probed) when the path does not end in /livez.
func ReadyzURL(healthURL string) string {
	u, err := url.Parse(healthURL)
	if err != nil || !strings.HasSuffix(u.Path, "/livez") {
		return ""
	}
	u.Path = strings.TrimSuffix(u.Path, "/livez") + "/readyz"
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return u.String()
}

var table = []Setting{
	{Env: "VIPD_ADDRESS", Flag: "address", Section: SecVIP,
		Doc:      "Comma list of virtual IPs in CIDR form (/32 for IPv4, /128 for IPv6). Required, except when only controllers run.",
		Accepted: "a comma list of host prefixes such as 10.0.0.100/32,fd00::100/128",
		parse:    parseAddresses, format: func(c *Config) string { return joinPrefixes(c.Addresses) }},
	{Env: "VIPD_MODE", Flag: "mode", Default: ModeL2, Section: SecVIP,
		Doc:      "How the VIP is announced: l2 (one elected holder, ARP/NDP), bgp (every healthy node, ECMP), cloud (elected holder moves a reserved IP).",
		Accepted: "one of l2, bgp, cloud",
		parse: func(c *Config, v string) error {
			switch v {
			case ModeL2, ModeBGP, ModeCloud:
				c.Mode = v
				return nil
			}
			return errInvalid
		}, format: func(c *Config) string { return c.Mode }},
	{Env: "VIPD_INTERFACE", Flag: "interface", Section: SecVIP,
		Doc:      "Interface the VIP is bound on in l2 mode. Empty: the interface of the default route.",
		Accepted: "an interface name of at most 15 characters",
		parse: func(c *Config, v string) error {
			if len(v) > 15 || strings.ContainsAny(v, "/ \t") {
				return errInvalid
			}
			c.Interface = v
			return nil
		}, format: func(c *Config) string { return c.Interface }},
	{Env: "VIPD_NODE_NAME", Flag: "node-name", Section: SecVIP,
		Doc:      "This node's name in the cluster. Empty: the host name.",
		Accepted: "a name of 1-63 characters without spaces or commas",
		parse: func(c *Config, v string) error {
			if v == "" {
				h, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("VIPD_NODE_NAME is empty and the host name is unknown: %w", err)
				}
				v = h
			}
			if len(v) > 63 || strings.ContainsAny(v, " \t,") {
				return errInvalid
			}
			c.NodeName = v
			return nil
		}, format: func(c *Config) string { return c.NodeName }},

	{Env: "VIPD_HEALTH_URL", Flag: "health-url", Default: DefaultHealthURL, Section: SecHealth,
		Doc:      "The local kube-apiserver liveness URL probed every interval.",
		Accepted: "an http or https URL such as https://127.0.0.1:6443/livez",
		parse: func(c *Config, v string) error {
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return errInvalid
			}
			c.HealthURL = v
			return nil
		}, format: func(c *Config) string { return c.HealthURL }},
	{Env: "VIPD_HEALTH_READYZ_URL", Flag: "health-readyz-url", Section: SecHealth,
		Doc:      "The local kube-apiserver readiness URL, probed after every good liveness probe: when its shutdown check fails (the apiserver got SIGTERM and serves out its --shutdown-delay-duration) this node hands its VIPs over at once. Empty: VIPD_HEALTH_URL with /livez replaced by /readyz (off when it does not end in /livez); off: not probed.",
		Accepted: "off, or an http or https URL on the same scheme, host and port as VIPD_HEALTH_URL, such as https://127.0.0.1:6443/readyz",
		parse: func(c *Config, v string) error {
			switch {
			case v == "off":
				c.HealthReadyzURL = ""
				return nil
			case v == "":
				c.HealthReadyzURL = ReadyzURL(c.HealthURL)
				return nil
			}
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return errInvalid
			}
			if h, err := url.Parse(c.HealthURL); err != nil || h.Scheme != u.Scheme || h.Host != u.Host {
				return errInvalid
			}
			c.HealthReadyzURL = v
			return nil
		}, format: func(c *Config) string {
			if c.HealthReadyzURL == "" {
				return "off"
			}
			return c.HealthReadyzURL
		}},
	durationSetting("VIPD_HEALTH_INTERVAL", "health-interval", "1s", SecHealth, "Time between health probes.", 10*time.Millisecond, time.Hour,
		func(c *Config) *time.Duration { return &c.HealthInterval }),
	durationSetting("VIPD_HEALTH_TIMEOUT", "health-timeout", "3s", SecHealth, "Time a health probe may take before it counts as failed.", 10*time.Millisecond, time.Minute,
		func(c *Config) *time.Duration { return &c.HealthTimeout }),
	intSetting("VIPD_FAIL_THRESHOLD", "fail-threshold", "3", SecHealth, "Consecutive failed probes that make the node unhealthy.", 1, 100,
		func(c *Config) *int { return &c.FailThreshold }),
	intSetting("VIPD_RISE_THRESHOLD", "rise-threshold", "1", SecHealth, "Consecutive good probes that make the node healthy again.", 1, 100,
		func(c *Config) *int { return &c.RiseThreshold }),
	pathSetting("VIPD_SA_TOKEN_PATH", "sa-token-path", "/var/run/secrets/kubernetes.io/serviceaccount/token", SecHealth,
		"Bearer token for the probe when no client certificate exists. Until a certificate or token was loaded, HTTP 401 also counts as healthy (pre-bootstrap).",
		func(c *Config) *string { return &c.SATokenPath }),
	pathSetting("VIPD_HEALTH_CA_FILE", "health-ca-file", "/etc/kubernetes/pki/ca.crt", SecHealth,
		"CA bundle that verifies the apiserver certificate. While the file does not exist (or when empty), verification is skipped, allowed for loopback URLs only.",
		func(c *Config) *string { return &c.HealthCAFile }),
	pathSetting("VIPD_HEALTH_CLIENT_CERT", "health-client-cert", "/var/lib/kubelet/pki/kubelet-client-current.pem", SecHealth,
		"Client certificate (PEM) the probe authenticates with, used instead of the token while it exists; re-read when replaced. Empty: none.",
		func(c *Config) *string { return &c.HealthClientCert }),
	pathSetting("VIPD_HEALTH_CLIENT_KEY", "health-client-key", "/var/lib/kubelet/pki/kubelet-client-current.pem", SecHealth,
		"Private key (PEM) of VIPD_HEALTH_CLIENT_CERT; may be the same file. Empty: none.",
		func(c *Config) *string { return &c.HealthClientKey }),

	{Env: "VIPD_PEERS", Flag: "peers", Section: SecCluster,
		Doc:      "Comma list of gossip peers as host[:port]. Empty: a lone node (bootstrap).",
		Accepted: "a comma list of host[:port] such as 10.0.0.11,10.0.0.12:7950,[fd00::12]:7950",
		parse: func(c *Config, v string) error {
			c.Peers = nil
			for _, p := range splitList(v) {
				if err := checkHostPort(p); err != nil {
					return &Error{Name: "VIPD_PEERS", Value: p, Accepted: "host[:port] with a port 1-65535, IPv6 in brackets"}
				}
				c.Peers = append(c.Peers, p)
			}
			return nil
		}, format: func(c *Config) string { return strings.Join(c.Peers, ",") }},
	{Env: "VIPD_GOSSIP_BIND", Flag: "gossip-bind", Default: "0.0.0.0:7950", Section: SecCluster,
		Doc:      "Address and port the gossip (memberlist) listener binds, TCP and UDP.",
		Accepted: "ip:port such as 0.0.0.0:7950 or [::]:7950",
		parse: func(c *Config, v string) error {
			ap, err := netip.ParseAddrPort(v)
			if err != nil || ap.Port() == 0 {
				return errInvalid
			}
			c.GossipBind = ap
			return nil
		}, format: func(c *Config) string { return c.GossipBind.String() }},
	pathSetting("VIPD_GOSSIP_KEY_FILE", "gossip-key-file", "", SecCluster,
		"File with the gossip encryption key, the same on every node (make one with: vipd keygen --out /etc/vipd/gossip.key). Required in l2 and cloud mode with VIPD_PEERS unless VIPD_GOSSIP_INSECURE=true.",
		func(c *Config) *string { return &c.GossipKeyFile }),
	boolSetting("VIPD_GOSSIP_INSECURE", "gossip-insecure", "false", SecCluster,
		"Allow plaintext, unauthenticated gossip without VIPD_GOSSIP_KEY_FILE: anyone who reaches the gossip port can join and vote. For labs only.",
		func(c *Config) *bool { return &c.GossipInsecure }),
	intSetting("VIPD_PRIORITY", "priority", "0", SecCluster, "Election priority; higher wins when no node holds the VIP. Never preempts a holder unless VIPD_PREEMPT_DELAY is set.", -1000, 1000,
		func(c *Config) *int { return &c.Priority }),
	{Env: "VIPD_PREEMPT_DELAY", Flag: "preempt-delay", Default: "off", Section: SecCluster,
		Doc:      "off: a holder keeps its VIPs (VIPD_PRIORITY never preempts). A duration: a holder hands a VIP over (planned handover) to a node with a higher VIPD_PRIORITY once that node has been eligible for this long without a break.",
		Accepted: "off, or a duration from 1s to 24h such as 30s",
		parse: func(c *Config, v string) error {
			if v == "off" || v == "0" {
				c.PreemptDelay = 0
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > 24*time.Hour {
				return errInvalid
			}
			c.PreemptDelay = d
			return nil
		}, format: func(c *Config) string {
			if c.PreemptDelay == 0 {
				return "off"
			}
			return c.PreemptDelay.String()
		}},
	{Env: "VIPD_QUORUM", Flag: "quorum", Default: "auto", Section: SecCluster,
		Doc:      "Removed with the gossip election: still accepted (env files of earlier releases carry it) but ignored with a warning. The lease election counts the agreed voters; a witness (VIPD_ROLE=witness) gives two-node clusters their third vote.",
		Accepted: "auto, off, or a number 1-100",
		parse: func(c *Config, v string) error {
			switch v {
			case "auto":
				c.Quorum = Quorum{}
			case "off":
				c.Quorum = Quorum{Off: true}
			default:
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 || n > 100 {
					return errInvalid
				}
				c.Quorum = Quorum{Fixed: n}
			}
			return nil
		}, format: func(c *Config) string { return c.Quorum.String() }},
	durationSetting("VIPD_MEMBER_EXPIRY", "member-expiry", "10m", SecCluster,
		"Removed with the gossip election: still accepted (env files of earlier releases carry it) but ignored with a warning. The lease election removes a dead voter after 20 s while a majority remains (docs/lease.md).",
		10*time.Second, 30*24*time.Hour, func(c *Config) *time.Duration { return &c.MemberExpiry }),
	pathSetting("VIPD_STATE_DIR", "state-dir", "/var/lib/vipd", SecCluster,
		"Directory for persistent state (the lease election's state, lease.state, and the control socket).",
		func(c *Config) *string { return &c.StateDir }),
	{Env: "VIPD_ELECTION", Flag: "election", Default: ElectionLease, Section: SecCluster,
		Doc:      "Which election decides the holder in l2 and cloud mode: lease, a holder lease granted by a majority of voters (raft underneath; see docs/lease.md), the only one. The gossip election of earlier releases was removed: VIPD_ELECTION=gossip is refused. A rolling upgrade from a release without the lease meets the old nodes through their claims (docs/lease.md).",
		Accepted: "lease",
		parse: func(c *Config, v string) error {
			switch v {
			case ElectionLease:
				c.Election = v
				return nil
			case "gossip":
				return &Error{Name: "VIPD_ELECTION", Value: v, Accepted: "lease (the gossip election was removed; remove the setting or set VIPD_ELECTION=lease, see docs/lease.md)"}
			}
			return errInvalid
		}, format: func(c *Config) string { return c.Election }},
	enumSetting("VIPD_ROLE", "role", RoleVoter, SecCluster,
		"voter: votes and may hold addresses; witness: votes and never holds (the third vote of a two-node cluster: needs no apiserver and no VIP interface, runs on any small machine).",
		[]string{RoleVoter, RoleWitness}, func(c *Config) *string { return &c.Role }),
	intSetting("VIPD_NICE", "nice", "-10", SecCluster,
		"Scheduling priority (nice value) of every vipd thread, set at start: the lease must be renewed by a majority every few ticks (fast profile: 50 ms, lease 127 ms), and a node starved of CPU by other processes loses it. -10 lets vipd run before ordinary processes (corosync and keepalived also raise their priority); 0 leaves it as started. Needs CAP_SYS_NICE (root has it); without it vipd warns once and runs as started. Child processes (vipd-controllers feeds) inherit it.",
		-20, 19, func(c *Config) *int { return &c.Nice }),
	enumSetting("VIPD_MEMORY_LOCK", "memory-lock", "off", SecCluster,
		"on: 5 s after start (past start-up, whose pages are returned first) vipd locks the memory it touches in RAM (mlockall with MCL_ONFAULT), so that a host that reclaims idle memory ahead of need (DAMON, memory.reclaim, a tight cgroup limit) cannot page out the code and runtime tables a lease renewal or a collection needs: read back from disk on a loaded machine they stalled vipd for up to a second, longer than the fast profile's lease outlives. Costs 3 to 4 MB of resident memory (the binary's pages it would otherwise return every minute). Needs LimitMEMLOCK=infinity (vipd.service sets it) or CAP_IPC_LOCK; without, vipd warns once and runs unlocked. The fast profile sets on.",
		[]string{"off", "on"}, func(c *Config) *string { return &c.MemoryLock }),
	enumSetting("VIPD_PROFILE", "profile", ProfileDefault, SecCluster,
		"Timing profile: fast tightens the lease election's timers and the failure detector for LANs that can afford it (see Profiles below); explicit settings win over the profile.",
		[]string{ProfileDefault, ProfileFast}, func(c *Config) *string { return &c.Profile }),
	{Env: "VIPD_VERIFY_INTERVAL", Flag: "verify-interval", Default: "1s", Section: SecCluster,
		Doc:      "l2 mode with VIPD_PEERS: how often each node resolves the VIPs another node holds (one batched ARP probe / neighbour solicitation per VIP, as a client would) to verify that the holder's announcements arrive. When most of the other nodes cannot reach a VIP through its holder for two rounds, the holder gives it up and another node takes it (docs/troubleshooting.md). off: no verification.",
		Accepted: "off, or a duration from 200ms to 1m such as 1s",
		parse: func(c *Config, v string) error {
			if v == "off" || v == "0" {
				c.VerifyInterval = 0
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < 200*time.Millisecond || d > time.Minute {
				return errInvalid
			}
			c.VerifyInterval = d
			return nil
		}, format: func(c *Config) string {
			if c.VerifyInterval == 0 {
				return "off"
			}
			return c.VerifyInterval.String()
		}},
	intSetting("VIPD_VERIFY_PORT", "verify-port", "0", SecCluster,
		"l2 mode: a TCP port (e.g. 6443) each verification round also connects to through the VIP: a VIP whose holder answers ARP but whose service cannot be reached counts as unreachable. 0: ARP / neighbour probes only.", 0, 65535,
		func(c *Config) *int { return &c.VerifyPort }),

	{Env: "VIPD_BGP_LOCAL_AS", Flag: "bgp-local-as", Section: SecBGP,
		Doc:      "This node's AS number (required in bgp mode).",
		Accepted: "an AS number 1-4294967295",
		parse: func(c *Config, v string) error {
			if v == "" {
				c.BGPLocalAS = 0
				return nil
			}
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n == 0 {
				return errInvalid
			}
			c.BGPLocalAS = uint32(n)
			return nil
		}, format: func(c *Config) string { return uintOrEmpty(uint64(c.BGPLocalAS)) }},
	{Env: "VIPD_BGP_ROUTER_ID", Flag: "bgp-router-id", Section: SecBGP,
		Doc:      "BGP router ID. Empty: the first IPv4 address of the node.",
		Accepted: "an IPv4 address such as 10.0.0.11",
		parse: func(c *Config, v string) error {
			c.BGPRouterID = netip.Addr{}
			if v == "" {
				return nil
			}
			a, err := netip.ParseAddr(v)
			if err != nil || !a.Is4() {
				return errInvalid
			}
			c.BGPRouterID = a
			return nil
		}, format: func(c *Config) string {
			if c.BGPRouterID.IsValid() {
				return c.BGPRouterID.String()
			}
			return ""
		}},
	{Env: "VIPD_BGP_PEERS", Flag: "bgp-peers", Section: SecBGP,
		Doc:      "Comma list of BGP peers as address:as[:option=value...], IPv6 as [2001:db8::1]:65000; options port, password, multihop, hold, keepalive.",
		Accepted: "a comma list of address:as[:option=value...]",
		parse:    func(c *Config, v string) error { c.BGPPeers = v; return nil },
		format:   func(c *Config) string { return redactPeerPasswords(c.BGPPeers) }},
	pathSetting("VIPD_BGP_PEERS_FILE", "bgp-peers-file", "", SecBGP,
		"YAML file of BGP peers (per-peer password_file, multihop, timers) and per-VIP path attributes; instead of VIPD_BGP_PEERS.",
		func(c *Config) *string { return &c.BGPPeersFile }),
	rawSetting("VIPD_BGP_COMMUNITIES", "bgp-communities", SecBGP,
		"Communities on every VIP route from this node: AS:value or well-known names such as no-export.",
		"a comma list of AS:value (each 0-65535) or well-known names", func(c *Config) *string { return &c.BGPCommunities }),
	rawSetting("VIPD_BGP_LARGE_COMMUNITIES", "bgp-large-communities", SecBGP,
		"Large communities (RFC 8092) on every VIP route from this node.",
		"a comma list of global:local1:local2", func(c *Config) *string { return &c.BGPLargeCommunities }),
	rawSetting("VIPD_BGP_LOCAL_PREF", "bgp-local-pref", SecBGP,
		"LOCAL_PREF on every VIP route (iBGP peers only; higher wins). Empty: not set.",
		"empty or a whole number 0-4294967295", func(c *Config) *string { return &c.BGPLocalPref }),
	rawSetting("VIPD_BGP_MED", "bgp-med", SecBGP,
		"MULTI_EXIT_DISC on every VIP route (lower wins). Empty: not set.",
		"empty or a whole number 0-4294967295", func(c *Config) *string { return &c.BGPMED }),
	intSetting("VIPD_BGP_AS_PATH_PREPEND", "bgp-as-path-prepend", "0", SecBGP,
		"Extra copies of this node's AS on its VIP routes: a backup node prepends so the router prefers the others.", 0, 10,
		func(c *Config) *int { return &c.BGPPrepend }),
	boolSetting("VIPD_BGP_GRACEFUL_RESTART", "bgp-graceful-restart", "false", SecBGP,
		"Advertise graceful restart: the router keeps this node's routes through a vipd restart (off: a restarting node should not attract traffic).",
		func(c *Config) *bool { return &c.BGPGracefulRestart }),
	durationSetting("VIPD_BGP_RESTART_TIME", "bgp-restart-time", "10s", SecBGP,
		"Graceful-restart time offered to the router (with VIPD_BGP_GRACEFUL_RESTART).", time.Second, 4095*time.Second,
		func(c *Config) *time.Duration { return &c.BGPRestartTime }),
	boolSetting("VIPD_BFD_ENABLED", "bfd-enabled", "false", SecBGP, "Run BFD with every BGP peer; a BFD Down resets the BGP session at once.",
		func(c *Config) *bool { return &c.BFDEnabled }),
	intSetting("VIPD_BFD_DETECT_MULT", "bfd-detect-mult", "3", SecBGP, "BFD detection multiplier.", 1, 255,
		func(c *Config) *int { return &c.BFDDetectMult }),
	durationSetting("VIPD_BFD_TX_INTERVAL", "bfd-tx-interval", "300ms", SecBGP, "BFD desired minimum transmit interval.", 10*time.Millisecond, time.Minute,
		func(c *Config) *time.Duration { return &c.BFDTxInterval }),
	durationSetting("VIPD_BFD_RX_INTERVAL", "bfd-rx-interval", "300ms", SecBGP, "BFD required minimum receive interval.", 10*time.Millisecond, time.Minute,
		func(c *Config) *time.Duration { return &c.BFDRxInterval }),

	intSetting("VIPD_BFD_MULTIHOP_MIN_TTL", "bfd-multihop-min-ttl", "254", SecBGP,
		"Lowest TTL accepted on multihop BFD packets (RFC 5883): 255 minus the hops allowed.", 1, 255,
		func(c *Config) *int { return &c.BFDMultihopMinTTL }),

	enumSetting("VIPD_CLOUD_PROVIDER", "cloud-provider", "digitalocean", SecCloud,
		"Provider of the IP that cloud mode moves: digitalocean (reserved IPs) or hetzner (Hetzner Cloud floating IPs).",
		[]string{"digitalocean", "hetzner"}, func(c *Config) *string { return &c.CloudProvider }),
	{Env: "DIGITALOCEAN_ACCESS_TOKEN", Flag: "do-token", Section: SecCloud, Secret: true,
		Doc:      "DigitalOcean API token (prefer VIPD_DO_TOKEN_FILE: environment and flags are visible to other root processes).",
		Accepted: "a token without spaces",
		parse: func(c *Config, v string) error {
			if strings.ContainsAny(v, " \t\n") {
				return errInvalid
			}
			c.DOToken = v
			return nil
		}, format: func(c *Config) string { return c.DOToken }},
	pathSetting("VIPD_DO_TOKEN_FILE", "do-token-file", "", SecCloud, "File holding the DigitalOcean API token.",
		func(c *Config) *string { return &c.DOTokenFile }),
	urlSetting("VIPD_DO_API_URL", "do-api-url", "https://api.digitalocean.com/", SecCloud, "DigitalOcean API base URL.",
		func(c *Config) *string { return &c.DOAPIURL }),
	urlSetting("VIPD_DO_METADATA_URL", "do-metadata-url", "http://169.254.169.254/metadata/v1", SecCloud, "Droplet metadata service base URL.",
		func(c *Config) *string { return &c.DOMetadataURL }),
	{Env: "VIPD_CLOUD_BIND_INTERFACE", Flag: "cloud-bind-interface", Section: SecCloud,
		Doc: "Bind the cloud IP on this interface while holding it (and remove it on release). Empty: the provider's default: " +
			"not bound with digitalocean (its reserved IPs reach the anchor IP), the interface of the default route with hetzner " +
			"(a server must have its floating IPs configured). none: never bound (the address is configured by other means).",
		Accepted: "an interface name of at most 15 characters, or none",
		parse: func(c *Config, v string) error {
			if len(v) > 15 || strings.ContainsAny(v, "/ \t") {
				return errInvalid
			}
			c.CloudBindInterface = v
			return nil
		}, format: func(c *Config) string { return c.CloudBindInterface }},
	{Env: "VIPD_DO_DROPLET_ID", Flag: "do-droplet-id", Section: SecCloud,
		Doc:      "This node's droplet ID. Empty: read from the metadata service.",
		Accepted: "a positive droplet ID",
		parse: func(c *Config, v string) error {
			c.DODropletID = 0
			if v == "" {
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return errInvalid
			}
			c.DODropletID = n
			return nil
		}, format: func(c *Config) string { return uintOrEmpty(uint64(c.DODropletID)) }},
	{Env: "HCLOUD_TOKEN", Flag: "hcloud-token", Section: SecCloud, Secret: true,
		Doc:      "Hetzner Cloud project API token with Read & Write permission (prefer VIPD_HCLOUD_TOKEN_FILE: environment and flags are visible to other root processes).",
		Accepted: "a token without spaces",
		parse: func(c *Config, v string) error {
			if strings.ContainsAny(v, " \t\n") {
				return errInvalid
			}
			c.HcloudToken = v
			return nil
		}, format: func(c *Config) string { return c.HcloudToken }},
	pathSetting("VIPD_HCLOUD_TOKEN_FILE", "hcloud-token-file", "", SecCloud, "File holding the Hetzner Cloud API token (read again when the API answers 401).",
		func(c *Config) *string { return &c.HcloudTokenFile }),
	urlSetting("VIPD_HCLOUD_API_URL", "hcloud-api-url", "https://api.hetzner.cloud/v1", SecCloud, "Hetzner Cloud API base URL.",
		func(c *Config) *string { return &c.HcloudAPIURL }),
	urlSetting("VIPD_HCLOUD_METADATA_URL", "hcloud-metadata-url", "http://169.254.169.254/hetzner/v1/metadata", SecCloud, "Hetzner Cloud server metadata service base URL.",
		func(c *Config) *string { return &c.HcloudMetadataURL }),
	{Env: "VIPD_HCLOUD_SERVER_ID", Flag: "hcloud-server-id", Section: SecCloud,
		Doc:      "This node's Hetzner Cloud server ID. Empty: read from the metadata service (instance-id).",
		Accepted: "a positive server ID",
		parse: func(c *Config, v string) error {
			c.HcloudServerID = 0
			if v == "" {
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return errInvalid
			}
			c.HcloudServerID = n
			return nil
		}, format: func(c *Config) string { return uintOrEmpty(uint64(c.HcloudServerID)) }},
	{Env: "VIPD_HCLOUD_FLOATING_IP_ID", Flag: "hcloud-floating-ip-id", Section: SecCloud,
		Doc:      "IDs of the floating IPs (comma list), so vipd reads them directly instead of finding each VIPD_ADDRESS in the project's list. Empty: found by address.",
		Accepted: "a comma list of positive floating IP IDs",
		parse: func(c *Config, v string) error {
			c.HcloudFloatingIPIDs = nil
			for _, f := range strings.Split(v, ",") {
				f = strings.TrimSpace(f)
				if f == "" {
					continue
				}
				n, err := strconv.ParseInt(f, 10, 64)
				if err != nil || n <= 0 {
					return errInvalid
				}
				c.HcloudFloatingIPIDs = append(c.HcloudFloatingIPIDs, n)
			}
			return nil
		}, format: func(c *Config) string {
			var out []string
			for _, id := range c.HcloudFloatingIPIDs {
				out = append(out, strconv.FormatInt(id, 10))
			}
			return strings.Join(out, ",")
		}},

	{Env: "VIPD_METRICS_ADDRESS", Flag: "metrics-address", Default: "127.0.0.1:9469", Section: SecOps,
		Doc:      "Listen address for /metrics, /status and /healthz. Empty: disabled.",
		Accepted: "host:port such as 127.0.0.1:9469",
		parse: func(c *Config, v string) error {
			if v != "" {
				if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
					return errInvalid
				}
			}
			c.MetricsAddress = v
			return nil
		}, format: func(c *Config) string { return c.MetricsAddress }},
	enumSetting("VIPD_LOG_LEVEL", "log-level", "info", SecOps, "Log level.", []string{"debug", "info", "warn", "error"},
		func(c *Config) *string { return &c.LogLevel }),
	enumSetting("VIPD_LOG_FORMAT", "log-format", "text", SecOps, "Log format.", []string{"text", "json"},
		func(c *Config) *string { return &c.LogFormat }),

	pathSetting("VIPD_KUBECONFIG", "kubeconfig", "", SecKube, "Kubeconfig for the controllers. Empty: in-cluster configuration.",
		func(c *Config) *string { return &c.Kubeconfig }),
	{Env: "VIPD_CONTROLLERS", Flag: "controllers", Section: SecKube,
		Doc:      "Comma list of controllers to run: floatingippool, nodednsrecordset (FLIPOP-compatible), services (LoadBalancer Services from IPPools), ipam (Cluster API IPAddressClaims from IPPools), cordon (only the cordon watch, which runs with any of them: kubectl cordon or drain of this node hands its VIPs over; l2 and cloud mode with peers). Empty: none.",
		Accepted: "a comma list of floatingippool, nodednsrecordset, services, ipam, cordon",
		parse: func(c *Config, v string) error {
			for _, n := range splitList(v) {
				switch n {
				case "floatingippool", "nodednsrecordset", "services", "ipam", "cordon":
				default:
					return &Error{Name: "VIPD_CONTROLLERS", Value: n, Accepted: "a comma list of floatingippool, nodednsrecordset, services, ipam, cordon"}
				}
			}
			c.Controllers = v
			return nil
		}, format: func(c *Config) string { return c.Controllers }},
	boolSetting("VIPD_SERVICES_DEFAULT_CLASS", "default-class", "false", SecKube,
		"The services controller also serves LoadBalancer Services without a spec.loadBalancerClass (besides class vipd.io/lb).",
		func(c *Config) *bool { return &c.ServicesDefaultClass }),
	urlSetting("VIPD_CLOUDFLARE_API_URL", "cloudflare-api-url", "https://api.cloudflare.com/client/v4/", SecKube, "Cloudflare API base URL.",
		func(c *Config) *string { return &c.CloudflareAPIURL }),
	{Env: "CLOUDFLARE_API_TOKEN", Flag: "cloudflare-token", Section: SecKube, Secret: true,
		Doc:      "Cloudflare API token for DNS records of the controllers.",
		Accepted: "a token without spaces",
		parse: func(c *Config, v string) error {
			if v == "" {
				// FLIPOP's name for it, so FLIPOP's Secret works unchanged.
				v = strings.TrimSpace(os.Getenv("CLOUDFLARE_TOKEN"))
			}
			if strings.ContainsAny(v, " \t\n") {
				return errInvalid
			}
			c.CloudflareToken = v
			return nil
		}, format: func(c *Config) string { return c.CloudflareToken }},
	{Env: "VIPD_POOLS", Flag: "pools", Default: "off", Section: SecKube,
		Doc:      "on: also announce the allocated addresses of IPPools this node is eligible for (needs VIPD_KUBECONFIG; VIPD_ADDRESS becomes optional). See docs/pools-announcing.md.",
		Accepted: "on or off",
		parse: func(c *Config, v string) error {
			switch v {
			case "on":
				c.Pools = true
			case "off", "":
				c.Pools = false
			default:
				return errInvalid
			}
			return nil
		}, format: func(c *Config) string {
			if c.Pools {
				return "on"
			}
			return "off"
		}},
}

// errInvalid tells Load to report the setting's own accepted form.
var errInvalid = fmt.Errorf("invalid")

func durationSetting(env, flag, def, sec, doc string, lo, hi time.Duration, field func(*Config) *time.Duration) Setting {
	acc := fmt.Sprintf("a duration from %v to %v such as %s", lo, hi, def)
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc, Accepted: acc,
		parse: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < lo || d > hi {
				return errInvalid
			}
			*field(c) = d
			return nil
		}, format: func(c *Config) string { return field(c).String() }}
}

func intSetting(env, flag, def, sec, doc string, lo, hi int, field func(*Config) *int) Setting {
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc,
		Accepted: fmt.Sprintf("a whole number from %d to %d", lo, hi),
		parse: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				return errInvalid
			}
			*field(c) = n
			return nil
		}, format: func(c *Config) string { return strconv.Itoa(*field(c)) }}
}

func boolSetting(env, flag, def, sec, doc string, field func(*Config) *bool) Setting {
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc, Accepted: "true or false",
		parse: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return errInvalid
			}
			*field(c) = b
			return nil
		}, format: func(c *Config) string { return strconv.FormatBool(*field(c)) }}
}

// rawSetting keeps the text for another package to parse (it reports
// errors with the setting's name); only control characters are refused.
func rawSetting(env, flag, sec, doc, accepted string, field func(*Config) *string) Setting {
	return Setting{Env: env, Flag: flag, Section: sec, Doc: doc, Accepted: accepted,
		parse: func(c *Config, v string) error {
			if strings.ContainsAny(v, "\n\r\x00") {
				return errInvalid
			}
			*field(c) = strings.TrimSpace(v)
			return nil
		}, format: func(c *Config) string { return *field(c) }}
}

func pathSetting(env, flag, def, sec, doc string, field func(*Config) *string) Setting {
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc, Accepted: "an absolute path",
		parse: func(c *Config, v string) error {
			if v != "" && !strings.HasPrefix(v, "/") {
				return errInvalid
			}
			*field(c) = v
			return nil
		}, format: func(c *Config) string { return *field(c) }}
}

func urlSetting(env, flag, def, sec, doc string, field func(*Config) *string) Setting {
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc, Accepted: "an http or https URL",
		parse: func(c *Config, v string) error {
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return errInvalid
			}
			*field(c) = v
			return nil
		}, format: func(c *Config) string { return *field(c) }}
}

func enumSetting(env, flag, def, sec, doc string, values []string, field func(*Config) *string) Setting {
	return Setting{Env: env, Flag: flag, Default: def, Section: sec, Doc: doc, Accepted: "one of " + strings.Join(values, ", "),
		parse: func(c *Config, v string) error {
			for _, ok := range values {
				if v == ok {
					*field(c) = v
					return nil
				}
			}
			return errInvalid
		}, format: func(c *Config) string { return *field(c) }}
}

func parseAddresses(c *Config, v string) error {
	c.Addresses = nil
	seen := map[netip.Addr]bool{}
	for _, item := range splitList(v) {
		p, err := netip.ParsePrefix(item)
		if err != nil {
			// A bare address is accepted as its host prefix.
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return &Error{Name: "VIPD_ADDRESS", Value: item, Accepted: "an IP address in CIDR form such as 10.0.0.100/32 or fd00::100/128"}
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		a := p.Addr()
		if a.Zone() != "" || p.Bits() != a.BitLen() {
			return &Error{Name: "VIPD_ADDRESS", Value: item, Accepted: "a host prefix (/32 for IPv4, /128 for IPv6): a VIP is a single address"}
		}
		if a.Is4In6() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			return &Error{Name: "VIPD_ADDRESS", Value: item, Accepted: "a unicast address that is not loopback, link-local or unspecified"}
		}
		if seen[a] {
			return &Error{Name: "VIPD_ADDRESS", Value: item, Accepted: "each VIP listed once"}
		}
		seen[a] = true
		c.Addresses = append(c.Addresses, p)
	}
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func checkHostPort(p string) error {
	host, port := p, ""
	if strings.HasPrefix(p, "[") || strings.Count(p, ":") == 1 {
		h, pt, err := net.SplitHostPort(p)
		if err != nil {
			if strings.HasPrefix(p, "[") && strings.HasSuffix(p, "]") {
				host = strings.Trim(p, "[]")
			} else {
				return err
			}
		} else {
			host, port = h, pt
		}
	}
	if host == "" || strings.ContainsAny(host, " /") {
		return fmt.Errorf("bad host")
	}
	if strings.Contains(host, ":") {
		if _, err := netip.ParseAddr(host); err != nil {
			return err
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("bad port")
		}
	}
	return nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func uintOrEmpty(n uint64) string {
	if n == 0 {
		return ""
	}
	return strconv.FormatUint(n, 10)
}

// redactPeerPasswords hides password=... options in a VIPD_BGP_PEERS value.
func redactPeerPasswords(v string) string {
	parts := strings.Split(v, ":")
	for i, p := range parts {
		if strings.HasPrefix(p, "password=") {
			end := strings.IndexByte(p, ',')
			if end < 0 {
				parts[i] = "password=<redacted>"
			} else {
				parts[i] = "password=<redacted>" + p[end:]
			}
		}
	}
	return strings.Join(parts, ":")
}
