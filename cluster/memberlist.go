package cluster

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config shapes this node's memberlist (discovery, the authenticated
// transport, health and metadata gossip) under the lease election.
type Config struct {
	Name    string
	Bind    netip.AddrPort // VIPD_GOSSIP_BIND
	Peers   []string       // VIPD_PEERS, host[:port]
	KeyFile string         // VIPD_GOSSIP_KEY_FILE (for messages)
	// Keys are the gossip keys (config.ReadGossipKeys), the primary first:
	// every one is accepted, the first is used to send (rotation).
	Keys [][]byte
	// Insecure allows gossip without a key (VIPD_GOSSIP_INSECURE). Without
	// it, NewLease refuses peers without a key.
	Insecure bool
	StateDir string
	Timings  Timings
	// LocalAddrs returns this host's addresses, to drop this node from
	// Peers (nil: the host's interface addresses).
	LocalAddrs func() ([]netip.Addr, error)
}

// Timings are the memberlist failure-detector settings.
//
// The defaults are tuned for 3 to 7 control-plane nodes on one LAN: a node
// probes one peer every ProbeInterval, gives it ProbeTimeout to answer
// (then asks IndirectChecks others to try), and a peer that stays silent is
// suspect for SuspicionMult x max(1, log10(N)) x ProbeInterval before it is
// declared dead. For 3 to 9 nodes that is 2 x 200 ms = 400 ms of suspicion,
// after up to ~2 probe rounds to notice: a crashed node is declared dead
// after about 0.8 to 1.2 s. memberlist's own LAN defaults (1 s, 500 ms, x4)
// give 5 to 7 s. Probing once a second instead would cut an idle node's
// CPU by about a third but take 3.3 s to notice a lost holder (measured in
// the lab, docs/l2.md "Idle cost"): slower than keepalived's default.
type Timings struct {
	ProbeInterval           time.Duration
	ProbeTimeout            time.Duration
	SuspicionMult           int
	SuspicionMaxTimeoutMult int
	GossipInterval          time.Duration
	PushPullInterval        time.Duration
	IndirectChecks          int
	RetransmitMult          int
}

// DefaultTimings returns the tuned timings described on Timings: the base
// of both profiles (TimingsFor).
func DefaultTimings() Timings {
	return Timings{
		ProbeInterval:           200 * time.Millisecond,
		ProbeTimeout:            100 * time.Millisecond,
		SuspicionMult:           2,
		SuspicionMaxTimeoutMult: 3,
		GossipInterval:          200 * time.Millisecond,
		PushPullInterval:        30 * time.Second,
		IndirectChecks:          2,
		RetransmitMult:          3,
	}
}

// DefaultPort is the gossip port when a peer is given without one.
const DefaultPort = 7950

// newMemberlist creates the memberlist of a node: vipd's timings and transport, the gossip keyring, and the
// given delegates. It binds the gossip port and joins nobody yet.
//
// keyMismatch is told the sender of each packet or connection memberlist
// could not authenticate (invalid when the line names none; ours when it
// was this node's own join to a peer) and reports whether that sender
// counts as a node with another key (see log2slog).
func newMemberlist(cfg Config, log *slog.Logger, d memberlist.Delegate, ev memberlist.EventDelegate, cf memberlist.ConflictDelegate, keyMismatch func(from netip.Addr, ours bool) bool, now func() time.Time) (*memberlist.Memberlist, *transport, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.BindAddr = cfg.Bind.Addr().String()
	mc.BindPort = int(cfg.Bind.Port())
	mc.AdvertisePort = int(cfg.Bind.Port())
	t := cfg.Timings
	mc.ProbeInterval, mc.ProbeTimeout = t.ProbeInterval, t.ProbeTimeout
	mc.SuspicionMult, mc.SuspicionMaxTimeoutMult = t.SuspicionMult, t.SuspicionMaxTimeoutMult
	mc.GossipInterval, mc.PushPullInterval = t.GossipInterval, t.PushPullInterval
	mc.IndirectChecks, mc.RetransmitMult = t.IndirectChecks, t.RetransmitMult
	mc.TCPTimeout = time.Second
	// No LZW compression: vipd's packets are a few hundred bytes, which
	// it barely shrinks, and it allocates a 64 KB table per packet sent
	// (and one per packet read), which made most of an idle vipd's
	// garbage and CPU. Members with compression still on are understood
	// (a compressed packet says so), so a rolling upgrade mixes fine.
	mc.EnableCompression = false
	// Lifeguard's awareness stretches a node's probe timing when its own
	// probes go unanswered. With several nodes down at once (a rack) that
	// alone slowed detection from ~1.5 s to ~6 s in the lab; 2 keeps some
	// protection against a starved node without that cost.
	mc.AwarenessMaxMultiplier = 2
	mc.DeadNodeReclaimTime = 5 * time.Second // a restarted node may rejoin under its name at once
	mc.Delegate = d
	mc.Events = ev
	mc.Conflict = cf
	mc.Logger = log2slog(log, keyMismatch, now)
	if len(cfg.Keys) > 0 {
		ring, err := memberlist.NewKeyring(cfg.Keys, cfg.Keys[0])
		if err != nil {
			return nil, nil, fmt.Errorf("VIPD_GOSSIP_KEY_FILE %s: %w", cfg.KeyFile, err)
		}
		mc.Keyring = ring
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	} else {
		log.Warn("gossip is not authenticated (VIPD_GOSSIP_INSECURE=true): anyone who reaches the gossip port can join and vote")
	}
	tr, err := newTransport(cfg.Bind, log)
	if err != nil {
		return nil, nil, fmt.Errorf("VIPD_GOSSIP_BIND %s: %w", cfg.Bind, err)
	}
	mc.Transport = tr
	mc.BindPort, mc.AdvertisePort = tr.Port(), tr.Port()
	ml, err := memberlist.Create(mc)
	if err != nil {
		tr.Shutdown()
		return nil, nil, fmt.Errorf("VIPD_GOSSIP_BIND %s: %w", cfg.Bind, err)
	}
	return ml, tr, nil
}

// dropSelf removes the peers that are this node itself (an address of this
// host at the gossip port): the same VIPD_PEERS on every node is the
// documented setup, and joining oneself would count as reaching a peer.
func dropSelf(peers []string, bind netip.AddrPort, local func() ([]netip.Addr, error)) ([]string, error) {
	if local == nil {
		local = interfaceAddrs
	}
	addrs, err := local()
	if err != nil {
		return nil, fmt.Errorf("VIPD_PEERS: cannot list this host's addresses: %w", err)
	}
	mine := map[netip.Addr]bool{}
	for _, a := range addrs {
		mine[a.Unmap()] = true
	}
	if bind.Addr().IsValid() && !bind.Addr().IsUnspecified() {
		mine = map[netip.Addr]bool{bind.Addr().Unmap(): true}
	}
	var out []string
	for _, p := range peers {
		hp := withPort(p)
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(host)
		if err == nil && mine[a.Unmap()] && port == strconv.Itoa(int(bind.Port())) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// isKeyError reports whether a memberlist error or log line means that the
// other side uses another gossip key, or none.
func isKeyError(s string) bool {
	s = strings.ToLower(s)
	for _, k := range []string{"no installed keys could decrypt", "encryption is configured but remote state is not encrypted",
		"remote state is encrypted and encryption is not configured", "decrypt packet failed"} {
		if strings.Contains(s, k) {
			return true
		}
	}
	return false
}

func withPort(p string) string {
	if _, _, err := net.SplitHostPort(p); err == nil {
		return p
	}
	if strings.Contains(p, ":") && !strings.HasPrefix(p, "[") {
		return "[" + p + "]:" + strconv.Itoa(DefaultPort)
	}
	return net.JoinHostPort(strings.Trim(p, "[]"), strconv.Itoa(DefaultPort))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// How often the rejections of unauthenticated gossip are logged: a node
// with another key retries every few seconds, a flood of stray packets
// arrives many times a second; each is counted, the log says how many.
const (
	keyErrorLogEvery = 10 * time.Second
	strayLogEvery    = time.Minute
)

// StrayGossipWarning is logged (at most once a minute) for packets and
// connections on the gossip port that could not be authenticated and come
// from an address that is neither in VIPD_PEERS nor a member.
const StrayGossipWarning = "gossip port: unauthenticated traffic from an address that is not a peer or member ignored"

// log2slog routes memberlist's log lines ("[LEVEL] memberlist: ...") into
// slog at the matching level.
//
// Lines saying memberlist could not authenticate a packet or connection
// (isKeyError) go to keyMismatch with the sender they name. It reports
// whether the sender counts: a peer this node joined, a peer or a member
// sending to it, whose traffic under
// another key means one side runs with the wrong key (logged as an error
// naming VIPD_GOSSIP_KEY_FILE, at most once per keyErrorLogEvery). Anything
// else on the port (a scanner, a stray or forged packet) is no evidence
// about keys: it is logged as StrayGossipWarning, at most once per
// strayLogEvery, and changes nothing.
func log2slog(l *slog.Logger, keyMismatch func(from netip.Addr, ours bool) bool, now func() time.Time) *log.Logger {
	var (
		mu    sync.Mutex
		key   = logLimit{every: keyErrorLogEvery}
		stray = logLimit{every: strayLogEvery}
	)
	return log.New(writerFunc(func(p []byte) (int, error) {
		s := strings.TrimSpace(string(p))
		lvl := slog.LevelDebug
		switch {
		case strings.HasPrefix(s, "[ERR"):
			lvl = slog.LevelError
		case strings.HasPrefix(s, "[WARN]"):
			lvl = slog.LevelWarn
		}
		if i := strings.Index(s, "memberlist: "); i >= 0 {
			s = s[i+len("memberlist: "):]
		}
		if !isKeyError(s) {
			l.Log(context.Background(), lvl, s)
			return len(p), nil
		}
		counts := keyMismatch(sourceOf(s))
		mu.Lock()
		lim, msg := &stray, StrayGossipWarning
		lvl = slog.LevelWarn
		if counts {
			lim, msg = &key, "gossip from a node with another key or no key rejected (check VIPD_GOSSIP_KEY_FILE)"
			lvl = slog.LevelError
		}
		ok, missed := lim.allow(now())
		mu.Unlock()
		if ok {
			attrs := []any{"err", s}
			if missed > 0 {
				attrs = append(attrs, "more_since_last_warning", missed)
			}
			l.Log(context.Background(), lvl, msg, attrs...)
		}
		return len(p), nil
	}), "", 0)
}

// sourceOf returns the sender a memberlist log line names: "from=ADDR"
// (packets and connections it received) or, with ours, "failed to join
// ADDR:" (this node's own join to a peer); invalid when there is none.
func sourceOf(s string) (from netip.Addr, ours bool) {
	var tok string
	if i := strings.Index(s, "from="); i >= 0 {
		tok = s[i+len("from="):]
	} else if i := strings.Index(s, "failed to join "); i >= 0 {
		tok, ours = s[i+len("failed to join "):], true
	} else {
		return netip.Addr{}, false
	}
	if j := strings.IndexAny(tok, " ,;"); j >= 0 {
		tok = tok[:j]
	}
	ap, err := netip.ParseAddrPort(strings.TrimSuffix(tok, ":"))
	if err != nil {
		return netip.Addr{}, ours
	}
	return ap.Addr().Unmap(), ours
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Profile names, as VIPD_PROFILE takes them.
const (
	ProfileDefault = "default"
	ProfileFast    = "fast"
)

// TimingsFor returns the memberlist timings of a profile. memberlist only
// carries the membership, the metadata and the lease election's messages
// (the lease detects a lost holder itself): the default profile probes
// slowly (every 5 s) and gossips metadata every 5 s; the fast profile keeps
// DefaultTimings' detector and gossips metadata every 20 ms.
func TimingsFor(profile string) Timings {
	t := DefaultTimings()
	if profile == ProfileFast {
		t.GossipInterval = 20 * time.Millisecond
		t.PushPullInterval = 10 * time.Second
		return t
	}
	t.ProbeInterval = 5 * time.Second
	t.ProbeTimeout = 500 * time.Millisecond
	t.GossipInterval = 5 * time.Second
	t.RetransmitMult = 6
	return t
}
