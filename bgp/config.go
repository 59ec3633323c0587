package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Defaults chosen for fast, safe failover of a VIP route.
const (
	// DefaultHold is the BGP hold time offered to each peer. 9 s (with a 3 s
	// keepalive) bounds detection of a dead node without BFD to 9 s while
	// tolerating two lost keepalives; BFD is the sub-second mechanism.
	DefaultHold = 9 * time.Second
	// DefaultKeepalive is a third of DefaultHold, as RFC 4271 suggests.
	DefaultKeepalive = 3 * time.Second
	// DefaultIdleHoldAfterReset is how long a peer stays idle after a hard
	// reset (BFD Down) before reconnecting. GoBGP's own default is 30 s.
	DefaultIdleHoldAfterReset = time.Second
	// DefaultConnectRetry is the interval between connection attempts to a
	// peer that does not answer (GoBGP waits 1-2x this, randomised, and
	// never less than 1 s). 1 s is GoBGP's floor: a router that starts
	// accepting connections is dialled within 2 s.
	DefaultConnectRetry = time.Second
	// DefaultRestartTime is the graceful-restart time offered when graceful
	// restart is enabled. Short on purpose: while it runs, the router keeps
	// forwarding to a node that may be dead.
	DefaultRestartTime = 10 * time.Second
	// MaxRestartTime is the largest restart time the capability carries
	// (12 bits of seconds, RFC 4724).
	MaxRestartTime = 4095 * time.Second
)

// PeersEnv is the setting ParsePeers reads; its errors name it.
const PeersEnv = "VIPD_BGP_PEERS"

const peersForm = "address:as[:option=value...] separated by commas, IPv6 addresses in brackets " +
	"(e.g. 192.0.2.1:65000:password=s3cret,[2001:db8::1]:65000:hold=9s); " +
	"options: port=1-65535, password=TEXT (no ':' or ','), password-file=PATH (any characters), multihop=1-255, hold=0|3s-65535s, keepalive=DURATION"

// Peer is one BGP neighbour (the router) the speaker connects to.
type Peer struct {
	Address  netip.Addr
	AS       uint32
	Port     uint16 // 0: 179
	Password string // TCP MD5 (RFC 2385); empty: none. Never logged or shown.
	// PasswordFile names a file holding the password (any characters; one
	// trailing newline is dropped). ResolvePasswords reads it into Password.
	PasswordFile string
	// Multihop > 0 allows an eBGP session over that many hops (TTL); 0 is a
	// directly connected single-hop session.
	Multihop  uint8
	Hold      time.Duration // 0 after ParsePeers means DefaultHold; see Config.withDefaults
	Keepalive time.Duration
}

// String is the peer's address with a non-default port, used as its label.
func (p Peer) String() string {
	if p.Port != 0 && p.Port != 179 {
		return netip.AddrPortFrom(p.Address, p.Port).String()
	}
	return p.Address.String()
}

// Config is the speaker's configuration.
type Config struct {
	LocalAS  uint32
	RouterID netip.Addr // an IPv4 address (BGP identifier)
	Peers    []Peer
	// ListenPort is the port to accept BGP connections on. 0 (the default)
	// does not listen at all: sessions are active only, dialled by vipd.
	ListenPort uint16
	// GracefulRestart advertises the capability. Off by default: the router
	// would keep forwarding to a dead node's address for RestartTime.
	GracefulRestart bool
	RestartTime     time.Duration // 0: DefaultRestartTime
	// IdleHoldAfterReset and ConnectRetry: 0 picks the defaults above.
	IdleHoldAfterReset time.Duration
	ConnectRetry       time.Duration
	// Interface is where VIPs are bound: "lo" unless set.
	Interface string
	// Attributes are set on every VIP's route (this node's policy, e.g. a
	// backup node's AS-path prepend); VIPAttributes override them per VIP.
	Attributes    Attributes
	VIPAttributes map[netip.Prefix]Attributes
}

func (c Config) withDefaults() Config {
	if c.Interface == "" {
		c.Interface = "lo"
	}
	if c.RestartTime == 0 {
		c.RestartTime = DefaultRestartTime
	}
	if c.IdleHoldAfterReset == 0 {
		c.IdleHoldAfterReset = DefaultIdleHoldAfterReset
	}
	if c.ConnectRetry == 0 {
		c.ConnectRetry = DefaultConnectRetry
	}
	peers := make([]Peer, len(c.Peers))
	for i, p := range c.Peers {
		if p.Port == 0 {
			p.Port = 179
		}
		if p.Hold == 0 && p.Keepalive == 0 {
			p.Hold, p.Keepalive = DefaultHold, DefaultKeepalive
		} else if p.Keepalive == 0 {
			p.Keepalive = p.Hold / 3
		}
		peers[i] = p
	}
	c.Peers = peers
	return c
}

// Validate checks the configuration. The error is the first problem found,
// on one line, naming the setting and the accepted form.
func (c Config) Validate() error {
	var errs []error
	if c.LocalAS == 0 {
		errs = append(errs, errors.New("VIPD_BGP_LOCAL_AS: required in bgp mode; want an AS number 1-4294967295"))
	}
	if !c.RouterID.Is4() || c.RouterID.IsUnspecified() {
		errs = append(errs, fmt.Errorf("VIPD_BGP_ROUTER_ID: %q is not usable; want a non-zero IPv4 address (e.g. this node's address)", addrText(c.RouterID)))
	}
	if len(c.Peers) == 0 {
		errs = append(errs, fmt.Errorf("%s: required in bgp mode; want %s", PeersEnv, peersForm))
	}
	seen := map[netip.Addr]bool{}
	for _, p := range c.Peers {
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q: %w; want %s", PeersEnv, p.String(), err, peersForm))
		}
		if seen[p.Address] {
			errs = append(errs, fmt.Errorf("%s: peer %s appears twice; want each router address once", PeersEnv, p.Address))
		}
		seen[p.Address] = true
	}
	if err := c.Attributes.validate(); err != nil {
		errs = append(errs, fmt.Errorf("VIPD_BGP_AS_PATH_PREPEND: %w", err))
	}
	for v, a := range c.VIPAttributes {
		if err := a.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: VIP %s: %w", PeersFileEnv, v, err))
		}
	}
	if c.GracefulRestart && (c.RestartTime < time.Second || c.RestartTime > MaxRestartTime) {
		errs = append(errs, fmt.Errorf("VIPD_BGP_RESTART_TIME: %v: want whole seconds from 1s to %v", c.RestartTime, MaxRestartTime))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"restart time", c.RestartTime}, {"idle hold after reset", c.IdleHoldAfterReset}, {"connect retry", c.ConnectRetry}} {
		if d.v < 0 || d.v%time.Second != 0 {
			errs = append(errs, fmt.Errorf("bgp %s %v: want whole seconds", d.name, d.v))
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func (p Peer) validate() error {
	switch {
	case !p.Address.IsValid():
		return errors.New("no address")
	case p.Address.IsUnspecified() || p.Address.IsMulticast():
		return fmt.Errorf("address %s cannot be a BGP peer", p.Address)
	case p.Address.Zone() != "":
		return fmt.Errorf("address %s: zones (link-local peers) are not supported", p.Address)
	case p.AS == 0:
		return errors.New("AS 0 is not valid")
	case len(p.Password) > 80:
		return errors.New("password longer than 80 bytes (TCP MD5 limit)")
	}
	if err := checkTimers(p.Hold, p.Keepalive); err != nil {
		return err
	}
	return nil
}

func checkTimers(hold, keepalive time.Duration) error {
	if hold%time.Second != 0 || keepalive%time.Second != 0 {
		return fmt.Errorf("hold %v / keepalive %v: BGP timers are whole seconds", hold, keepalive)
	}
	if hold < 0 || keepalive < 0 {
		return errors.New("negative timer")
	}
	if hold != 0 && hold < 3*time.Second {
		return fmt.Errorf("hold %v: must be 0 (no keepalives) or at least 3s (RFC 4271)", hold)
	}
	if hold > 65535*time.Second {
		return fmt.Errorf("hold %v: at most 65535s", hold)
	}
	if hold != 0 && keepalive >= hold {
		return fmt.Errorf("keepalive %v must be shorter than hold %v", keepalive, hold)
	}
	return nil
}

// ParsePeers parses the VIPD_BGP_PEERS value: a comma-separated list of
// address:as[:option=value...]. IPv6 addresses are written in brackets.
// Options: port, password, multihop, hold, keepalive. Durations accept Go
// syntax ("9s") or plain seconds ("9"). An empty string gives no peers.
func ParsePeers(s string) ([]Peer, error) {
	var peers []Peer
	seen := map[netip.Addr]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		p, err := parsePeer(item)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %s; want %s", PeersEnv, redactPassword(item), hidePassword(err.Error(), item), peersForm)
		}
		if seen[p.Address] {
			return nil, fmt.Errorf("%s: %q: peer %s appears twice; want each router address once", PeersEnv, redactPassword(item), p.Address)
		}
		seen[p.Address] = true
		peers = append(peers, p)
	}
	return peers, nil
}

func parsePeer(item string) (Peer, error) {
	var p Peer
	var addrText, rest string
	if strings.HasPrefix(item, "[") {
		end := strings.Index(item, "]")
		if end < 0 {
			return p, errors.New("missing ']' after IPv6 address")
		}
		addrText, rest = item[1:end], item[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return p, errors.New("missing ':as' after the address")
		}
		rest = rest[1:]
	} else {
		var ok bool
		addrText, rest, ok = strings.Cut(item, ":")
		if !ok {
			return p, errors.New("missing ':as' after the address")
		}
	}
	a, err := netip.ParseAddr(addrText)
	if err != nil {
		if strings.Count(item, ":") > 2 && !strings.HasPrefix(item, "[") {
			return p, errors.New("IPv6 addresses must be written in brackets")
		}
		return p, fmt.Errorf("address %q is not an IP address", addrText)
	}
	p.Address = a.Unmap()
	fields := strings.Split(rest, ":")
	as, err := strconv.ParseUint(fields[0], 10, 32)
	if err != nil || as == 0 {
		return p, fmt.Errorf("AS %q: want a number 1-4294967295", fields[0])
	}
	p.AS = uint32(as)
	haveHold, haveKeepalive := false, false
	for _, opt := range fields[1:] {
		name, val, ok := strings.Cut(opt, "=")
		if !ok {
			return p, fmt.Errorf("option %q: want name=value", opt)
		}
		switch name {
		case "port":
			v, err := strconv.ParseUint(val, 10, 16)
			if err != nil || v == 0 {
				return p, fmt.Errorf("port %q: want 1-65535", val)
			}
			p.Port = uint16(v)
		case "password":
			if val == "" {
				return p, errors.New("password is empty")
			}
			p.Password = val
		case "password-file":
			if !strings.HasPrefix(val, "/") {
				return p, fmt.Errorf("password-file %q: want an absolute path", val)
			}
			p.PasswordFile = val
		case "multihop":
			v, err := strconv.ParseUint(val, 10, 8)
			if err != nil || v == 0 {
				return p, fmt.Errorf("multihop %q: want a TTL 1-255", val)
			}
			p.Multihop = uint8(v)
		case "hold":
			d, err := parseSeconds(val)
			if err != nil {
				return p, fmt.Errorf("hold %q: %w", val, err)
			}
			p.Hold, haveHold = d, true
		case "keepalive":
			d, err := parseSeconds(val)
			if err != nil {
				return p, fmt.Errorf("keepalive %q: %w", val, err)
			}
			p.Keepalive, haveKeepalive = d, true
		default:
			return p, fmt.Errorf("unknown option %q", name)
		}
	}
	if p.Password != "" && p.PasswordFile != "" {
		return p, errors.New("both password and password-file given; want one")
	}
	fillTimers(&p, haveHold, haveKeepalive)
	if err := p.validate(); err != nil {
		return p, err
	}
	return p, nil
}

// fillTimers fills the timers the way the speaker will, so the check sees
// the pair used.
func fillTimers(p *Peer, haveHold, haveKeepalive bool) {
	switch {
	case !haveHold && !haveKeepalive:
		p.Hold, p.Keepalive = DefaultHold, DefaultKeepalive
	case haveHold && !haveKeepalive:
		p.Keepalive = (p.Hold / 3).Truncate(time.Second)
	case !haveHold && haveKeepalive:
		p.Hold = 3 * p.Keepalive
		if p.Keepalive == 0 {
			p.Hold = 0
		}
	}
}

func parseSeconds(s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want whole seconds, e.g. 9 or 9s")
	}
	if d%time.Second != 0 || d < 0 {
		return 0, errors.New("want whole seconds, e.g. 9 or 9s")
	}
	return d, nil
}

// redactPassword hides a password=... option of a peer item, and whatever
// follows it: a password with ':' in it (which is not allowed) would
// otherwise show up as further "options".
func redactPassword(item string) string {
	i := strings.Index(item, "password=")
	if i < 0 {
		return item
	}
	return item[:i] + "password=<redacted>"
}

// hidePassword removes from an error message about item every quoted piece
// of the text after "password=" (the password and, when it held ':', its
// fragments parsed as options), so that no error ever echoes a password.
func hidePassword(msg, item string) string {
	i := strings.Index(item, "password=")
	if i < 0 {
		return msg
	}
	for _, piece := range strings.Split(item[i+len("password="):], ":") {
		if piece == "" {
			continue
		}
		name, value, _ := strings.Cut(piece, "=")
		for _, s := range []string{piece, name, value} {
			if s != "" {
				msg = strings.ReplaceAll(msg, strconv.Quote(s), `"<redacted>"`)
			}
		}
	}
	return msg
}
