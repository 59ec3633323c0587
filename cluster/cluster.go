package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Config shapes a cluster node.
type Config struct {
	Name    string
	Bind    netip.AddrPort // VIPD_GOSSIP_BIND
	Peers   []string       // VIPD_PEERS, host[:port]
	KeyFile string         // VIPD_GOSSIP_KEY_FILE (for messages)
	// Keys are the gossip keys (config.ReadGossipKeys), the primary first:
	// every one is accepted, the first is used to send (rotation).
	Keys [][]byte
	// Insecure allows gossip without a key (VIPD_GOSSIP_INSECURE). Without
	// it, New refuses peers without a key.
	Insecure bool
	Priority int
	Quorum   QuorumRule
	StateDir string
	VIPs     []string
	Timings  Timings
	// Heartbeat is the holder heartbeat (VIPD_PROFILE=fast); zero: off.
	Heartbeat HeartbeatConfig
	// ClaimSettle: see ElectionConfig.
	ClaimSettle time.Duration
	// MemberExpiry: see ElectionConfig (VIPD_MEMBER_EXPIRY).
	MemberExpiry time.Duration
	// PreemptDelay: see ElectionConfig (VIPD_PREEMPT_DELAY).
	PreemptDelay time.Duration
	// LocalAddrs returns this host's addresses, to drop this node from
	// Peers (nil: the host's interface addresses).
	LocalAddrs func() ([]netip.Addr, error)
	// Pools: this node announces pool addresses (Meta.Pools).
	Pools bool
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

// DefaultTimings returns the tuned timings described on Timings: those of
// VIPD_PROFILE=fast (FastTimings), and the base of the default profile's
// BeatTimings, where member heartbeats detect instead.
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

// safetyEvery is how often Run re-reads the view without being woken
// (membership events and the election's own deadline wake it) and checks
// that every configured peer is a member (else it joins them again): each
// wake-up of an idle vipd costs CPU, so this is only a backstop, and one
// ticker does both.
const safetyEvery = 5 * time.Second

// DefaultPort is the gossip port when a peer is given without one.
const DefaultPort = 7950

// Node is this node's membership in the cluster: the glue between
// memberlist and the Election state machine, which it owns. Every input
// reaches the election through Run's goroutine, one at a time.
type Node struct {
	cfg   Config
	peers []string // VIPD_PEERS without this node's own addresses
	log   *slog.Logger
	ml    *memberlist.Memberlist

	inbox   chan Event // health, holding, failures, key errors, conflicts
	wake    chan struct{}
	syncReq chan struct{} // state exchanges asked of syncLoop
	pushReq chan struct{} // metadata pushes asked of pushLoop (member beats)
	pullReq chan string   // members syncLoop asks for their state (member beats)

	mu        sync.Mutex
	metaEnc   []byte // what NodeMeta hands memberlist
	left      []string
	status    StatusDoc
	election  *Election // touched by Run's goroutine only (and New)
	localAddr string    // this node's gossip address (set once after Create)
	leaving   bool      // Close has begun: gossip Meta.Leaving
	knownMod  time.Time
	knownEnc  []byte // the member list as LocalState sends it

	mMembers  *prometheus.GaugeVec
	mQuorum   prometheus.Gauge
	mBroken   *prometheus.GaugeVec
	mConflict prometheus.Gauge

	hb *heartbeat // the holder heartbeat (heartbeat.go)
	hbMetrics

	waiters []*waiter // handover requests waiting for results (Run's goroutine only)
	prepare func(vip string)
}

// New validates the configuration and creates the memberlist (it binds the
// gossip port) without joining anybody yet.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Node, error) {
	if cfg.Timings == (Timings{}) {
		cfg.Timings = DefaultTimings()
	}
	if err := MetaFits(cfg.VIPs); err != nil {
		return nil, err
	}
	peers, err := dropSelf(cfg.Peers, cfg.Bind, cfg.LocalAddrs)
	if err != nil {
		return nil, err
	}
	if len(peers) > 0 && len(cfg.Keys) == 0 && !cfg.Insecure {
		return nil, fmt.Errorf("VIPD_GOSSIP_KEY_FILE is not set: with VIPD_PEERS, gossip must be authenticated (make a key with `vipd keygen --out /etc/vipd/gossip.key` and set VIPD_GOSSIP_KEY_FILE on every node, or set VIPD_GOSSIP_INSECURE=true to accept unauthenticated peers)")
	}
	known, mod, err := LoadKnown(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("VIPD_STATE_DIR: %w", err)
	}
	knownEnc := encodeKnown(known)
	n := &Node{
		cfg: cfg, peers: peers, log: log.With("component", "cluster"),
		knownMod:  mod,
		knownEnc:  knownEnc,
		hb:        newHeartbeat(cfg.Heartbeat, cfg.Name),
		hbMetrics: newHBMetrics(),
		inbox:     make(chan Event, 64),
		wake:      make(chan struct{}, 1),
		syncReq:   make(chan struct{}, 1),
		pushReq:   make(chan struct{}, 1),
		pullReq:   make(chan string, 8),
		election: NewElection(ElectionConfig{
			Name: cfg.Name, VIPs: cfg.VIPs, Priority: cfg.Priority, Quorum: cfg.Quorum, Peers: len(peers) > 0,
			Beat:        cfg.Heartbeat.Members && cfg.Heartbeat.Interval > 0,
			ClaimSettle: cfg.ClaimSettle, MemberExpiry: cfg.MemberExpiry, Pools: cfg.Pools, PreemptDelay: cfg.PreemptDelay,
		}, known, time.Now()),
		mMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_cluster_members", Help: "Gossip members by state (alive, suspect), and known members (known).",
		}, []string{"state"}),
		mQuorum: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_cluster_quorum", Help: "1 while this node has quorum (or is bootstrapping alone).",
		}),
		mBroken: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_vip_broken", Help: "1 while this node cannot hold the VIP (acquire failed, interface down, another holder) and leaves it to the others.",
		}, []string{"vip"}),
		mConflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_cluster_name_conflict", Help: "1 while another node gossips under this node's name (VIPD_NODE_NAME); this node then holds nothing.",
		}),
	}
	n.metaEnc, _ = encodeMeta(n.election.Meta())
	if reg != nil {
		for _, c := range []prometheus.Collector{n.mMembers, n.mQuorum, n.mBroken, n.mConflict, n.mHBSent, n.mHBSilent} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, v := range cfg.VIPs {
		n.mBroken.WithLabelValues(v).Set(0)
	}
	ml, tr, err := newMemberlist(cfg, n.log, (*delegate)(n), (*events)(n), (*conflicts)(n), func() { n.send(KeyMismatch{}) })
	if err != nil {
		return nil, err
	}
	n.ml = ml
	n.localAddr = ml.LocalNode().Address()
	if cfg.Heartbeat.Members && cfg.Heartbeat.Interval > 0 {
		bs, err := openBeatSocket(tr.udp)
		if err != nil {
			ml.Shutdown()
			return nil, fmt.Errorf("VIPD_GOSSIP_BIND %s: %w", cfg.Bind, err)
		}
		n.hb.sock, n.hb.codec, n.hb.replay, n.hb.log = bs, newBeatCodec(beatKeys(cfg.Keys)), beatReplay{}, n.log
		n.hb.pull = n.requestPull
	}
	return n, nil
}

// newMemberlist creates the memberlist of a node (gossip election or lease
// election): vipd's timings and transport, the gossip keyring, and the
// given delegates. It binds the gossip port and joins nobody yet.
func newMemberlist(cfg Config, log *slog.Logger, d memberlist.Delegate, ev memberlist.EventDelegate, cf memberlist.ConflictDelegate, keyMismatch func()) (*memberlist.Memberlist, *transport, error) {
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
	mc.Logger = log2slog(log, keyMismatch)
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

// SetHealthy publishes this node's apiserver health.
func (n *Node) SetHealthy(healthy bool) { n.send(HealthChanged{Healthy: healthy}) }

// SetHolding reports the core's holding state for vip. The cluster claims
// a VIP itself, before the core acquires it; a release by the core withdraws
// the claim at once and keeps the node from claiming it again for
// ReclaimPause, so another node gets its chance.
func (n *Node) SetHolding(vip string, holding bool) { n.send(HoldingChanged{VIP: vip, Held: holding}) }

// SetFailed reports that this node could not acquire vip or lost it: the
// election leaves it to another node for a while.
func (n *Node) SetFailed(vip, reason string) { n.send(AcquireFailed{VIP: vip, Reason: reason}) }

// SetUnverified publishes whether this node can reach vip, held by another
// node, on the wire (Meta.Unverified).
func (n *Node) SetUnverified(vip string, unreachable bool) {
	n.send(Unverified{VIP: vip, Unreachable: unreachable})
}

// MemberAddr returns the gossip IP address of the named member, if it is
// in view.
func (n *Node) MemberAddr(name string) (netip.Addr, bool) {
	// memberlist's own list: no metadata to decode (called every round).
	for _, m := range n.ml.Members() {
		if m.Name != name {
			continue
		}
		a, ok := netip.AddrFromSlice(m.Addr)
		return a.Unmap(), ok
	}
	return netip.Addr{}, false
}

// UnverifiedBy returns the alive members other than this node that report
// they cannot reach vip (Meta.Unverified), and how many alive members
// other than this node there are.
func (n *Node) UnverifiedBy(vip string) (reporters []string, others int) {
	for _, m := range n.members() {
		if m.Name == n.cfg.Name || m.State != Alive {
			continue
		}
		others++
		if slices.Contains(m.Meta.Unverified, vip) {
			reporters = append(reporters, m.Name)
		}
	}
	return reporters, others
}

// send queues an event for Run. It never blocks: when the queue is full
// the event is dropped after a wake-up (every input is a level that the
// next one repeats, except holding changes, which the core repeats on its
// next transition).
func (n *Node) send(ev Event) {
	select {
	case n.inbox <- ev:
	default:
		n.log.Warn("election queue full: event dropped", "event", fmt.Sprintf("%T", ev))
	}
	n.poke()
}

func (n *Node) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Run joins the peers and reports every change of decision through decide
// until ctx is done. It keeps re-joining peers that are not members.
func (n *Node) Run(ctx context.Context, decide func(vip string, d Decision)) error {
	syncDone := make(chan struct{})
	go func() { // a slow peer must not delay a decision
		defer close(syncDone)
		n.syncLoop(ctx)
	}()
	defer func() { <-syncDone }()
	n.requestSync()
	pushDone := make(chan struct{})
	go func() {
		defer close(pushDone)
		n.pushLoop(ctx)
	}()
	defer func() { <-pushDone }()
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		n.hb.run(ctx, n.ml, n.cfg.Name, n.heartbeatSilent, n.mHBSent)
	}()
	defer func() { <-hbDone }()
	timer := time.NewTimer(0)
	defer timer.Stop()
	safety := time.NewTicker(safetyEvery)
	defer safety.Stop()
	for {
		n.step(Tick{}, decide, timer)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.wake:
		case <-timer.C:
		case <-safety.C:
			if n.ml.NumMembers()-1 < len(n.peers) {
				n.requestSync()
			}
		}
		for more := true; more; {
			select {
			case ev := <-n.inbox:
				if r, ok := ev.(handoverRequest); ok {
					n.startWaiter(r, n.step(r.HandoverRequested, decide, nil))
					continue
				}
				n.step(ev, decide, nil)
			default:
				more = false
			}
		}
	}
}

// step feeds the view and one event to the election and carries out its
// output; timer (when not nil) is armed for the next deadline.
func (n *Node) step(ev Event, decide func(string, Decision), timer *time.Timer) Output {
	now := time.Now()
	n.mu.Lock()
	left := n.left
	n.left = nil
	n.mu.Unlock()
	n.pickUpForget()
	view := n.members()
	out := n.election.Step(ViewChanged{Members: view, Left: left}, now)
	o2 := n.election.Step(ev, now)
	out.Decisions = mergeDecisions(out.Decisions, o2.Decisions)
	out.Logs = append(out.Logs, o2.Logs...)
	if o2.Meta != nil {
		out.Meta = o2.Meta
	}
	if o2.Known != nil {
		out.Known = o2.Known
	}
	out.Next = o2.Next
	out.Send = append(out.Send, o2.Send...)
	out.Prepare = append(out.Prepare, o2.Prepare...)
	out.Handovers = append(out.Handovers, o2.Handovers...)
	out.Sync = out.Sync || o2.Sync
	if out.Sync {
		n.requestSync()
	}
	for _, l := range out.Logs {
		lvl := slog.LevelInfo
		if l.Warn {
			lvl = slog.LevelWarn
		}
		n.log.Log(context.Background(), lvl, l.Msg, l.Args...)
	}
	if out.Known != nil {
		enc := encodeKnown(*out.Known)
		n.mu.Lock()
		n.knownEnc = enc
		n.mu.Unlock()
		if mod, err := SaveKnown(n.cfg.StateDir, *out.Known); err != nil {
			n.log.Error("cannot persist cluster members", "err", err)
		} else {
			n.mu.Lock()
			n.knownMod = mod
			n.mu.Unlock()
		}
	}
	// A planned handover's messages and decisions go out before the
	// metadata broadcast below (encoding and queueing it): the holder
	// keeps its claim until the successor's is seen, so nobody else acts
	// meanwhile.
	early := map[string]bool{}
	for _, d := range out.Decisions {
		if d.Handover || n.election.ho.out[d.VIP] != nil {
			early[d.VIP] = true
			n.log.Info("election", "vip", d.VIP, "holder", d.Holder, "leader", d.Leader, "handover", true, "reason", d.Reason)
			decide(d.VIP, d.Decision)
		}
	}
	for _, m := range out.Send {
		n.sendMsg(m)
	}
	if out.Meta != nil {
		m := *out.Meta
		n.mu.Lock()
		m.Leaving = n.leaving
		n.mu.Unlock()
		b, err := encodeMeta(m)
		if err == nil && len(b) <= MetaLimit {
			n.mu.Lock()
			n.metaEnc = b
			n.mu.Unlock()
			// UpdateNode queues the broadcast; the loop does not wait
			// for it to be done (RetransmitMult transmissions, several
			// gossip rounds): membership events wait behind the loop, and
			// a member that joined meanwhile would be counted late. A new
			// holder binds (after its l2 probe) while its claim is on its
			// way; a newer change replaces a queued one. (A zero
			// timeout would wait for ever.)
			_ = n.ml.UpdateNode(time.Nanosecond)
			if n.hb.mb != nil {
				// Member beats slow memberlist's gossip to a round every
				// 5 s: every change (a claim, a release, health) is
				// pushed to every member at once instead (pushLoop).
				n.requestPush()
			}
		} else {
			n.log.Error("node metadata does not fit the gossip limit: keeping the last one", "bytes", len(b), "limit", MetaLimit)
		}
	}
	n.mu.Lock()
	own := MetaHash(n.metaEnc)
	n.mu.Unlock()
	for _, ev := range n.hb.update(n.cfg.Name, view, n.election.Meta(), own, now) {
		n.heartbeatSilent(ev)
	}
	st := n.election.Status(now)
	n.updateMetrics(st)
	n.mu.Lock()
	n.status.Election = st
	n.mu.Unlock()
	for _, d := range out.Decisions {
		if early[d.VIP] {
			continue
		}
		n.log.Info("election", "vip", d.VIP, "holder", d.Holder, "leader", d.Leader, "lone", d.Lone, "reason", d.Reason)
		decide(d.VIP, d.Decision)
	}
	for _, v := range out.Prepare {
		if n.prepare != nil {
			n.prepare(v)
		} else {
			n.send(Prepared{VIP: v, Err: "this node cannot prepare"})
		}
	}
	n.deliver(out.Handovers)
	if timer != nil && !out.Next.IsZero() {
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(time.Until(out.Next), 0))
	}
	return out
}

// mergeDecisions keeps the last decision of each VIP.
func mergeDecisions(a, b []VIPDecision) []VIPDecision {
	for _, d := range b {
		found := false
		for i := range a {
			if a[i].VIP == d.VIP {
				a[i], found = d, true
			}
		}
		if !found {
			a = append(a, d)
		}
	}
	return a
}

// encodeKnown is k as LocalState sends it (nil: nothing to send).
func encodeKnown(k Known) []byte {
	if len(k.Members) == 0 {
		return nil
	}
	b, err := json.Marshal(Known{Members: k.Members})
	if err != nil {
		return nil
	}
	return b
}

// pickUpForget reloads the member list after `vipd forget` changed it.
func (n *Node) pickUpForget() {
	// A stat per step, the file read only when it changed.
	if st, err := os.Stat(filepath.Join(n.cfg.StateDir, MembersFile)); err == nil {
		n.mu.Lock()
		same := st.ModTime().Equal(n.knownMod)
		n.mu.Unlock()
		if same {
			return
		}
	}
	k, mod, err := LoadKnown(n.cfg.StateDir)
	n.mu.Lock()
	same := mod.Equal(n.knownMod)
	n.mu.Unlock()
	if err != nil || same {
		return
	}
	n.election.Forgotten(k)
	n.mu.Lock()
	n.knownMod = mod
	n.knownEnc = encodeKnown(k) // peers must not learn a forgotten member back
	n.mu.Unlock()
}

// requestPull asks syncLoop for a state exchange with the member at addr
// (member beats: its beats carry metadata this node has not seen).
func (n *Node) requestPull(addr string) {
	select {
	case n.pullReq <- addr:
	default:
	}
}

// requestPush asks pushLoop to push this node's metadata now.
func (n *Node) requestPush() {
	select {
	case n.pushReq <- struct{}{}:
	default:
	}
}

// pushLoop pushes this node's metadata to every member when asked, until
// ctx is done: a memberlist ping to each, which carries the queued
// metadata broadcast with it (memberlist piggybacks broadcasts on the
// packets it sends), so a claim reaches every member within a round trip
// instead of at the next gossip round (a second with member beats). The
// pings run at once; a member that does not answer is waited for up to
// the probe timeout, and the next push waits for that.
func (n *Node) pushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.pushReq:
		}
		n.pingAll()
	}
}

// pingAll pings every other member at once and waits for the answers (at
// most the probe timeout): each ping carries memberlist's queued
// broadcasts with it.
func (n *Node) pingAll() {
	var wg sync.WaitGroup
	for _, m := range n.ml.Members() {
		if m.Name == n.cfg.Name || m.State == memberlist.StateDead || m.State == memberlist.StateLeft {
			continue
		}
		addr := &net.UDPAddr{IP: m.Addr, Port: int(m.Port)}
		wg.Go(func() { _, _ = n.ml.Ping(m.Name, addr) })
	}
	wg.Wait()
}

// requestSync asks syncLoop for a join (a state exchange with the peers
// and the members in view); requests made while one runs are merged.
func (n *Node) requestSync() {
	select {
	case n.syncReq <- struct{}{}:
	default:
	}
}

// syncLoop runs the joins requestSync asks for, one at a time, until ctx
// is done (Run waits for it).
func (n *Node) syncLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.syncReq:
			n.join()
		case addr := <-n.pullReq:
			// A member's beats carry other metadata than gossip brought,
			// or its relays carry other metadata of a member this node
			// hears only through it: a state exchange with it brings its
			// current metadata and what it has of the others.
			if _, err := n.ml.Join([]string{addr}); err != nil {
				n.log.Info("member's metadata is out of date here; asking it for its state failed", "addr", addr, "err", err)
			} else {
				n.log.Info("member's metadata was out of date here: exchanged state with it", "addr", addr)
			}
		}
	}
}

// join exchanges state (memberlist's push/pull over TCP) with every
// configured peer and every member in view: it brings back members the
// others still see, with their current metadata.
func (n *Node) join() {
	var peers []string
	seen := map[string]bool{}
	for _, p := range n.peers {
		p = withPort(p)
		seen[p] = true
		peers = append(peers, p)
	}
	for _, m := range n.ml.Members() {
		a := m.FullAddress().Addr
		if m.Name != n.cfg.Name && !seen[a] {
			seen[a] = true
			peers = append(peers, a)
		}
	}
	if len(peers) == 0 {
		return
	}
	joined, err := n.ml.Join(peers)
	if err != nil {
		if isKeyError(err.Error()) {
			n.send(KeyMismatch{})
			n.log.Error("gossip peers rejected: encryption key mismatch (check VIPD_GOSSIP_KEY_FILE on every node)", "joined", joined, "err", err)
			return
		}
		n.log.Info("gossip join incomplete; retrying in the background", "joined", joined, "peers", peers, "err", err)
		return
	}
	n.log.Debug("gossip join", "joined", joined)
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

// members converts memberlist's members (alive and suspect) into the
// election's view.
func (n *Node) members() []Member {
	var out []Member
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
		out = append(out, Member{Name: m.Name, Addr: m.Address(), State: st, Meta: meta, MetaHash: MetaHash(m.Meta)})
	}
	return out
}

func (n *Node) updateMetrics(st ElectionStatus) {
	counts := map[State]int{}
	for _, m := range n.ml.Members() {
		switch m.State {
		case memberlist.StateSuspect:
			counts[Suspect]++
		default:
			counts[Alive]++
		}
	}
	n.mMembers.WithLabelValues("alive").Set(float64(counts[Alive]))
	n.mMembers.WithLabelValues("suspect").Set(float64(counts[Suspect]))
	n.mMembers.WithLabelValues("known").Set(float64(len(st.Known)))
	n.mQuorum.Set(b2f(st.Quorum.OK))
	for _, v := range n.cfg.VIPs {
		_, broken := st.Broken[v]
		n.mBroken.WithLabelValues(v).Set(b2f(broken))
	}
	n.mConflict.Set(b2f(st.NameConflict != ""))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Close leaves the cluster (so the others react at once instead of waiting
// for the failure detector) and stops gossiping. It first gossips that this
// node is leaving, so that the others stop counting it for quorum at once
// (memberlist's leave notification does not tell a leave from a death).
func (n *Node) Close() error {
	n.mu.Lock()
	n.leaving = true
	m, err := decodeMeta(n.metaEnc)
	if err == nil {
		m.Leaving = true
		if b, err := encodeMeta(m); err == nil && len(b) <= MetaLimit {
			n.metaEnc = b
		}
	}
	n.mu.Unlock()
	if n.hb.mb != nil {
		// Member heartbeats: gossip rounds are 5 s apart, so the leaving
		// metadata and memberlist's leave are pushed to every member
		// (pings carry them) instead of waited for.
		_ = n.ml.UpdateNode(time.Nanosecond)
		n.pingAll()
		_ = n.ml.Leave(time.Nanosecond) // queues the leave: a timeout error
		n.pingAll()
		return n.ml.Shutdown()
	}
	if err := n.ml.UpdateNode(300 * time.Millisecond); err != nil {
		n.log.Debug("gossiping the leave", "err", err)
	}
	err = n.ml.Leave(500 * time.Millisecond)
	return errors.Join(err, n.ml.Shutdown())
}

// StatusDoc is the cluster's section of /status.
type StatusDoc struct {
	Election ElectionStatus `json:"-"`
	// Flattened for /status readers (vipd status).
	Quorum       QuorumResult        `json:"quorum"`
	Members      []MemberStatus      `json:"members"`
	Known        []string            `json:"known"`
	Elections    map[string]Decision `json:"elections"`
	Broken       map[string]string   `json:"broken,omitempty"`
	NameConflict string              `json:"name_conflict,omitempty"`
	Handover     HandoverStatus      `json:"handover"`
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
	Broken   []string `json:"broken,omitempty"`
	// Unverified: VIPs the member cannot reach through their holder.
	Unverified []string `json:"unverified,omitempty"`
}

// Status returns the cluster view for /status.
func (n *Node) Status() any {
	ms := n.members()
	n.mu.Lock()
	st := n.status.Election
	n.mu.Unlock()
	doc := StatusDoc{Quorum: st.Quorum, Known: st.Known, Elections: st.Elections, Broken: st.Broken, NameConflict: st.NameConflict, Handover: st.Handover}
	for _, m := range ms {
		doc.Members = append(doc.Members, MemberStatus{Name: m.Name, Addr: m.Addr, State: m.State.String(),
			Healthy: m.Meta.Healthy, Eligible: m.Meta.Eligible, Priority: m.Meta.Priority, Term: m.Meta.Term,
			Holding: m.Meta.Holding, Broken: m.Meta.Broken, Unverified: m.Meta.Unverified})
	}
	return doc
}

// delegate gives memberlist our metadata.
type delegate Node

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.metaEnc) > limit {
		return nil // never happens: New checked MetaFits and step keeps the last fitting one
	}
	return d.metaEnc
}
func (d *delegate) NotifyMsg(msg []byte) {
	n := (*Node)(d)
	if len(msg) > 0 && msg[0] == heartbeatMagic {
		evs, ok := n.hb.heard(msg, n.cfg.Name, time.Now())
		if !ok {
			return
		}
		for _, ev := range evs {
			n.heartbeatSilent(ev)
		}
		return
	}
	m, ok := decodeMsg(msg)
	if !ok {
		d.log.Debug("ignoring an unreadable user message", "bytes", len(msg))
		return
	}
	n.send(MessageReceived{Msg: m})
}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState is this node's member list, sent with every state exchange
// (push/pull) so that a peer that started without one counts the same
// members (PeerKnown). Older versions send none and ignore it.
func (d *delegate) LocalState(join bool) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.knownEnc
}

// MergeRemoteState hands a peer's member list to the election.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) == 0 {
		return
	}
	var k Known
	if err := json.Unmarshal(buf, &k); err != nil || len(k.Members) == 0 {
		d.log.Debug("ignoring an unreadable member list from a peer", "bytes", len(buf), "err", err)
		return
	}
	(*Node)(d).send(PeerKnown{Known: k})
}

// events wakes the election on every membership change.
type events Node

func (e *events) NotifyJoin(m *memberlist.Node) {
	e.log.Info("member joined", "member", m.Name, "addr", m.Address())
	(*Node)(e).poke()
}
func (e *events) NotifyLeave(m *memberlist.Node) {
	how := "declared dead"
	if meta, err := decodeMeta(m.Meta); err == nil && meta.Leaving {
		how = "left"
		e.mu.Lock()
		e.left = append(e.left, m.Name)
		e.mu.Unlock()
	}
	e.log.Info("member "+how, "member", m.Name, "addr", m.Address())
	(*Node)(e).poke()
}
func (e *events) NotifyUpdate(*memberlist.Node) { (*Node)(e).poke() }

// conflicts hears of two nodes with one name. memberlist calls it with
// its node lock held: it must not call back into memberlist.
type conflicts Node

func (c *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	n := (*Node)(c)
	if existing.Name == n.cfg.Name {
		addr := other.Address()
		if existing.Address() != n.localAddr {
			addr = existing.Address()
		}
		n.log.Error("another node uses this node's name: set a unique VIPD_NODE_NAME on every node", "name", existing.Name, "other", addr)
		n.send(NameConflict{Addr: addr})
		return
	}
	n.log.Error("two nodes use one name: set a unique VIPD_NODE_NAME on every node", "name", existing.Name, "addr", existing.Address(), "other", other.Address())
}

// log2slog routes memberlist's log lines ("[LEVEL] memberlist: ...") into
// slog at the matching level.
func log2slog(l *slog.Logger, keyMismatch func()) *log.Logger {
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
		if isKeyError(s) {
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
