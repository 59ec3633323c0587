package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Config shapes a cluster node.
type Config struct {
	Name     string
	Bind     netip.AddrPort // VIPD_GOSSIP_BIND
	Peers    []string       // VIPD_PEERS, host[:port]
	KeyFile  string         // VIPD_GOSSIP_KEY_FILE
	Priority int
	Quorum   QuorumRule
	StateDir string
	VIPs     []string
	Timings  Timings
	// ClaimSettle is how long a claim is gossiped before this node acts
	// on it. Zero for l2, where acquiring is quick and a probe guards it;
	// cloud mode waits a couple of gossip rounds, because two nodes
	// assigning the same reserved IP at once each cost an API action.
	ClaimSettle time.Duration
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
// give 5 to 7 s.
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

// DefaultTimings returns the tuned defaults described on Timings.
func DefaultTimings() Timings {
	return Timings{
		ProbeInterval:           200 * time.Millisecond,
		ProbeTimeout:            100 * time.Millisecond,
		SuspicionMult:           2,
		SuspicionMaxTimeoutMult: 3,
		GossipInterval:          50 * time.Millisecond,
		PushPullInterval:        10 * time.Second,
		IndirectChecks:          2,
		RetransmitMult:          3,
	}
}

// DefaultPort is the gossip port when a peer is given without one.
const DefaultPort = 7950

// BootstrapGrace is how long a node with configured peers, that has never
// seen another member, waits for them before it holds VIPs alone.
const BootstrapGrace = 2 * time.Second

// Node is this node's membership in the cluster and its elections.
type Node struct {
	cfg Config
	log *slog.Logger
	ml  *memberlist.Memberlist

	mu          sync.Mutex
	meta        Meta
	healthy     bool
	known       Known
	knownMod    time.Time
	quorum      QuorumResult
	decisions   map[string]Decision
	wake        chan struct{}
	started     time.Time
	keyErrAt    time.Time            // last gossip rejected for a key mismatch
	claimedAt   map[string]time.Time // when we claimed each VIP
	pausedUntil map[string]time.Time // no claim before this (after a release)

	mMembers *prometheus.GaugeVec
	mQuorum  prometheus.Gauge
}

// New validates the configuration and creates the memberlist (it binds the
// gossip port) without joining anybody yet.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Node, error) {
	if cfg.Timings == (Timings{}) {
		cfg.Timings = DefaultTimings()
	}
	known, mod, err := LoadKnown(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("VIPD_STATE_DIR: %w", err)
	}
	n := &Node{
		cfg: cfg, log: log.With("component", "cluster"),
		meta:      Meta{Priority: cfg.Priority},
		known:     known,
		knownMod:  mod,
		decisions: map[string]Decision{},
		claimedAt: map[string]time.Time{}, pausedUntil: map[string]time.Time{},
		wake:    make(chan struct{}, 1),
		started: time.Now(),
		mMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_cluster_members", Help: "Gossip members by state (alive, suspect, dead, left).",
		}, []string{"state"}),
		mQuorum: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_cluster_quorum", Help: "1 while this node has quorum (or is bootstrapping alone).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{n.mMembers, n.mQuorum} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
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
	// Lifeguard's awareness stretches a node's probe timing when its own
	// probes go unanswered. With several nodes down at once (a rack) that
	// alone slowed detection from ~1.5 s to ~6 s in the lab; 2 keeps some
	// protection against a starved node without that cost.
	mc.AwarenessMaxMultiplier = 2
	mc.DeadNodeReclaimTime = 5 * time.Second // a restarted node may rejoin under its name at once
	mc.Delegate = (*delegate)(n)
	mc.Events = (*events)(n)
	mc.Logger = log2slog(n.log, n.keyMismatch)
	if cfg.KeyFile != "" {
		key, err := readKey(cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		mc.SecretKey = key
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	} else {
		n.log.Warn("gossip is not encrypted: set VIPD_GOSSIP_KEY_FILE so that only nodes with the key can join and vote")
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("VIPD_GOSSIP_BIND %s: %w", cfg.Bind, err)
	}
	n.ml = ml
	return n, nil
}

// readKey reads a 16, 24 or 32 byte AES key, raw or base64.
func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("VIPD_GOSSIP_KEY_FILE: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if k, err := base64.StdEncoding.DecodeString(s); err == nil && validKeyLen(len(k)) {
		return k, nil
	}
	if validKeyLen(len(s)) {
		return []byte(s), nil
	}
	if len(s) > 0 {
		// Any other passphrase: derive a 32-byte key, as MetalLB does.
		k := sha256.Sum256([]byte(s))
		return k[:], nil
	}
	return nil, fmt.Errorf("VIPD_GOSSIP_KEY_FILE %s is empty: want a key of 16, 24 or 32 bytes (raw or base64) or a passphrase", path)
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// SetHealthy publishes this node's apiserver health.
func (n *Node) SetHealthy(healthy bool) {
	n.mu.Lock()
	n.healthy = healthy
	n.mu.Unlock()
	n.poke()
}

// SetHolding reports the core's holding state for vip. The cluster claims
// a VIP itself, before the core acquires it (see evaluate); a release by the
// core (health lost, shutdown, failed acquire) withdraws the claim at once
// and keeps the node from claiming it again for ReclaimPause, so another
// node gets its chance.
func (n *Node) SetHolding(vip string, holding bool) {
	n.mu.Lock()
	changed := false
	if holding {
		// Only confirm a claim the election stands behind: an acquire that
		// finished after the decision changed must not make a new claim.
		if n.decisions[vip].Holder {
			changed = n.claimLocked(vip)
		}
	} else {
		changed = n.unclaimLocked(vip)
		n.pausedUntil[vip] = time.Now().Add(ReclaimPause)
		time.AfterFunc(ReclaimPause, n.poke)
	}
	n.mu.Unlock()
	if changed {
		n.publish()
	}
	n.poke()
}

// ReclaimPause is how long a node does not claim a VIP again after its core
// released it.
const ReclaimPause = 500 * time.Millisecond

// claimLocked adds vip to our claims with a term above every term seen, so
// the newest claim wins a healed partition. It reports whether the claim is
// new.
func (n *Node) claimLocked(vip string) bool {
	if n.meta.Holds(vip) {
		return false
	}
	term := n.meta.Term
	if n.ml != nil {
		for _, m := range n.ml.Members() {
			if mm, err := decodeMeta(m.Meta); err == nil && mm.Term > term {
				term = mm.Term
			}
		}
	}
	n.meta.Term = term + 1
	n.meta.Holding = append(append([]string(nil), n.meta.Holding...), vip)
	n.claimedAt[vip] = time.Now()
	return true
}

// unclaimLocked removes vip from our claims; it reports whether it was there.
func (n *Node) unclaimLocked(vip string) bool {
	if !n.meta.Holds(vip) {
		return false
	}
	h := make([]string, 0, len(n.meta.Holding))
	for _, v := range n.meta.Holding {
		if v != vip {
			h = append(h, v)
		}
	}
	n.meta.Holding = h
	delete(n.claimedAt, vip)
	return true
}

func (n *Node) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// publish gossips the current metadata at once.
func (n *Node) publish() {
	if err := n.ml.UpdateNode(time.Second); err != nil {
		n.log.Warn("gossip metadata update failed", "err", err)
	}
}

// Run joins the peers and reports every change of decision through decide
// until ctx is done. It keeps re-joining peers that are not members.
func (n *Node) Run(ctx context.Context, decide func(vip string, holder bool, reason string)) error {
	n.join()
	rejoin := time.NewTicker(5 * time.Second)
	defer rejoin.Stop()
	safety := time.NewTicker(500 * time.Millisecond)
	defer safety.Stop()
	for {
		n.evaluate(decide)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.wake:
		case <-safety.C:
		case <-rejoin.C:
			if n.ml.NumMembers()-1 < len(n.cfg.Peers) {
				n.join()
			}
		}
	}
}

func (n *Node) join() {
	var peers []string
	for _, p := range n.cfg.Peers {
		peers = append(peers, withPort(p))
	}
	if len(peers) == 0 {
		return
	}
	joined, err := n.ml.Join(peers)
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, "decrypt") || strings.Contains(msg, "encrypt") || strings.Contains(msg, "No installed keys") {
			n.keyMismatch()
			n.log.Error("gossip peers rejected: encryption key mismatch (check VIPD_GOSSIP_KEY_FILE on every node)", "joined", joined, "err", err)
			return
		}
		n.log.Info("gossip join incomplete; retrying in the background", "joined", joined, "peers", peers, "err", err)
		return
	}
	n.log.Debug("gossip join", "joined", joined)
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

// keyMismatch records that gossip failed for a key mismatch.
func (n *Node) keyMismatch() {
	n.mu.Lock()
	n.keyErrAt = time.Now()
	n.mu.Unlock()
	n.poke()
}

// evaluate recomputes quorum, eligibility and every decision, and reports
// the decisions that changed.
func (n *Node) evaluate(decide func(vip string, holder bool, reason string)) {
	view := n.view()
	n.mu.Lock()
	n.rememberLocked(view)
	q := Quorum(view, n.known.Names(), n.cfg.Quorum)
	if q.Bootstrap && len(n.cfg.Peers) > 0 && time.Since(n.started) < BootstrapGrace {
		// Nodes of a new cluster start together: give the configured peers
		// a moment to answer before holding alone, or each would bootstrap.
		q.OK = false
		q.Reason = fmt.Sprintf("bootstrap: waiting up to %v for the configured peers", BootstrapGrace)
	}
	if q.Bootstrap && !n.keyErrAt.IsZero() && time.Since(n.keyErrAt) < time.Minute {
		// Alone because the peers reject our key (or we theirs): holding
		// alone would be a split brain with the real cluster.
		q.OK = false
		q.Reason = "gossip key mismatch with peers (VIPD_GOSSIP_KEY_FILE): not holding alone"
	}
	eligible := n.healthy && q.OK
	metaChanged := eligible != n.meta.Eligible || n.healthy != n.meta.Healthy
	if q.OK != n.quorum.OK && n.quorum.Reason != "" {
		if q.OK {
			n.log.Info("quorum regained", "reason", q.Reason)
		} else {
			n.log.Warn("quorum lost: releasing every VIP", "reason", q.Reason)
		}
	}
	n.quorum = q
	n.meta.Eligible, n.meta.Healthy = eligible, n.healthy
	n.mu.Unlock()
	if metaChanged {
		n.publish()
		view = n.view()
	}
	n.updateMetrics(view, q)
	type change struct {
		vip string
		d   Decision
	}
	var changes []change
	n.mu.Lock()
	claimed := false
	for _, v := range n.cfg.VIPs {
		d := Decide(view, v)
		switch {
		case d.Holder && !n.meta.Holds(v) && time.Now().Before(n.pausedUntil[v]):
			d = Decision{Reason: "released moments ago: letting another node take it"}
		case d.Holder && !n.meta.Holds(v):
			// Claim first, act after: the claim is gossiped before (l2: as)
			// the VIP is acquired, so nodes elected at the same moment from
			// different views settle on one (highest term, then name).
			claimed = n.claimLocked(v) || claimed
			if n.cfg.ClaimSettle > 0 {
				time.AfterFunc(n.cfg.ClaimSettle, n.poke)
				d = Decision{Leader: n.cfg.Name, Reason: "claimed; letting the claim settle"}
			}
		case d.Holder && time.Since(n.claimedAt[v]) < n.cfg.ClaimSettle:
			d = Decision{Leader: n.cfg.Name, Reason: "claimed; letting the claim settle"}
		case !d.Holder && n.meta.Holds(v):
			claimed = n.unclaimLocked(v) || claimed
		}
		old, seen := n.decisions[v]
		if !seen || old.Holder != d.Holder || old.Leader != d.Leader {
			changes = append(changes, change{v, d})
		}
		n.decisions[v] = d
	}
	n.mu.Unlock()
	if claimed {
		n.publish()
	}
	for _, c := range changes {
		n.log.Info("election", "vip", c.vip, "holder", c.d.Holder, "leader", c.d.Leader, "reason", c.d.Reason)
		decide(c.vip, c.d.Holder, c.d.Reason)
	}
}

// rememberLocked adds alive members to the persisted known set.
func (n *Node) rememberLocked(v View) {
	// Pick up `vipd forget` edits made while running.
	if k, mod, err := LoadKnown(n.cfg.StateDir); err == nil && !mod.Equal(n.knownMod) {
		n.known, n.knownMod = k, mod
	}
	changed := false
	for _, m := range v.Members {
		if m.State != Alive {
			continue
		}
		if _, ok := n.known.Members[m.Name]; !ok {
			n.known.Members[m.Name] = KnownMember{Addr: m.Addr, FirstSeen: time.Now().UTC()}
			changed = true
			if m.Name != n.cfg.Name {
				n.log.Info("new cluster member remembered", "member", m.Name, "addr", m.Addr)
			}
		}
	}
	if changed {
		mod, err := SaveKnown(n.cfg.StateDir, n.known)
		if err != nil {
			n.log.Error("cannot persist cluster members", "err", err)
			return
		}
		n.knownMod = mod
	}
}

// view converts memberlist's members into the election's view.
func (n *Node) view() View {
	v := View{Self: n.cfg.Name}
	for _, m := range n.ml.Members() {
		meta, err := decodeMeta(m.Meta)
		if err != nil {
			n.log.Warn("ignoring member with unreadable metadata", "member", m.Name, "err", err)
			continue
		}
		st := Alive
		switch m.State {
		case memberlist.StateSuspect:
			st = Suspect
		case memberlist.StateDead:
			st = Dead
		case memberlist.StateLeft:
			st = Left
		}
		v.Members = append(v.Members, Member{Name: m.Name, Addr: m.Address(), State: st, Meta: meta})
	}
	return v
}

func (n *Node) updateMetrics(v View, q QuorumResult) {
	counts := map[State]int{}
	for _, m := range v.Members {
		counts[m.State]++
	}
	for _, s := range []State{Alive, Suspect, Dead, Left} {
		n.mMembers.WithLabelValues(s.String()).Set(float64(counts[s]))
	}
	if q.OK {
		n.mQuorum.Set(1)
	} else {
		n.mQuorum.Set(0)
	}
}

// Close leaves the cluster (so the others react at once instead of waiting
// for the failure detector) and stops gossiping.
func (n *Node) Close() error {
	err := n.ml.Leave(500 * time.Millisecond)
	return errors.Join(err, n.ml.Shutdown())
}

// StatusDoc is the cluster's section of /status.
type StatusDoc struct {
	Quorum    QuorumResult        `json:"quorum"`
	Members   []MemberStatus      `json:"members"`
	Known     []string            `json:"known"`
	Elections map[string]Decision `json:"elections"`
}

// MemberStatus is one member in /status.
type MemberStatus struct {
	Name     string   `json:"name"`
	Addr     string   `json:"addr"`
	State    string   `json:"state"`
	Healthy  bool     `json:"healthy"`
	Eligible bool     `json:"eligible"`
	Priority int      `json:"priority"`
	Term     uint64   `json:"term"`
	Holding  []string `json:"holding,omitempty"`
}

// Status returns the cluster view for /status.
func (n *Node) Status() any {
	v := n.view()
	n.mu.Lock()
	defer n.mu.Unlock()
	doc := StatusDoc{Quorum: n.quorum, Known: n.known.Names(), Elections: map[string]Decision{}}
	for k, d := range n.decisions {
		doc.Elections[k] = d
	}
	for _, m := range v.Members {
		doc.Members = append(doc.Members, MemberStatus{Name: m.Name, Addr: m.Addr, State: m.State.String(),
			Healthy: m.Meta.Healthy, Eligible: m.Meta.Eligible, Priority: m.Meta.Priority, Term: m.Meta.Term, Holding: m.Meta.Holding})
	}
	return doc
}

func decodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, nil
	}
	err := json.Unmarshal(b, &m)
	return m, err
}

// delegate gives memberlist our metadata.
type delegate Node

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	b, err := json.Marshal(d.meta)
	d.mu.Unlock()
	if err != nil || len(b) > limit {
		d.log.Error("node metadata too large to gossip: too many VIPs", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events wakes the election on every membership change.
type events Node

func (e *events) NotifyJoin(m *memberlist.Node) {
	e.log.Info("member joined", "member", m.Name, "addr", m.Address())
	(*Node)(e).poke()
}
func (e *events) NotifyLeave(m *memberlist.Node) {
	how := "left or died"
	if m.State == memberlist.StateLeft {
		how = "left"
	} else if m.State == memberlist.StateDead {
		how = "declared dead"
	}
	e.log.Info("member "+how, "member", m.Name, "addr", m.Address())
	(*Node)(e).poke()
}
func (e *events) NotifyUpdate(*memberlist.Node) { (*Node)(e).poke() }

// log2slog routes memberlist's log lines ("[LEVEL] memberlist: ...") into
// slog at the matching level.
func log2slog(l *slog.Logger, keyMismatch func()) *log.Logger {
	return log.New(writerFunc(func(p []byte) (int, error) {
		s := strings.TrimSpace(string(p))
		lvl := slog.LevelDebug
		switch {
		case strings.HasPrefix(s, "[ERR]"):
			lvl = slog.LevelError
		case strings.HasPrefix(s, "[WARN]"):
			lvl = slog.LevelWarn
		}
		if i := strings.Index(s, "memberlist: "); i >= 0 {
			s = s[i+len("memberlist: "):]
		}
		if strings.Contains(s, "No installed keys could decrypt") || strings.Contains(s, "Encryption is configured but remote state is not encrypted") {
			lvl = slog.LevelError
			keyMismatch()
			s = "gossip from a node with another key or no key rejected (check VIPD_GOSSIP_KEY_FILE): " + s
		}
		l.Log(context.Background(), lvl, s)
		return len(p), nil
	}), "", 0)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
