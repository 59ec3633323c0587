package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/internal/gridclock"
	"github.com/vipd/vipd/internal/wire"
)

// HandoverResult is how a handover ended (or why it was refused): the
// control socket's answer, declared once in internal/wire for vipd and
// vipd-controllers.
type HandoverResult = wire.HandoverResult

// HandoverWait bounds a requested handover (`vipd handover`, the control
// socket): a leadership transfer with make-before-break takes well under
// a second; this leaves room for a loaded cluster.
func HandoverWait() time.Duration { return 4 * time.Second }

// safetyEvery is how often Run re-reads the view without being woken
// (membership events and the machine's own deadline wake it) and checks
// that every configured peer is a member (else it joins them again): each
// wake-up of an idle vipd costs CPU, so this is only a backstop.
const safetyEvery = 5 * time.Second

// LeaseConfig shapes a node of the lease election.
type LeaseConfig struct {
	// Cluster: name, gossip bind, peers, keys, state directory, timings
	// (the gossip election's fields are ignored).
	Cluster Config
	// Machine is the lease machine's configuration (lease.ProfileConfig
	// plus name, role, priority, preemption).
	Machine lease.Config
	// Addresses are the configured control-plane VIPs.
	Addresses []lease.Address
	// Clock: nil is the real (monotonic) clock, its timer a timerfd
	// (gridclock.Precise: one wake-up per deadline where a Go timer costs
	// up to three).
	Clock Clock
}

// reliableAbove is the size from which a message goes over memberlist's
// reliable path (TCP) instead of a UDP packet: a packet must fit one
// datagram with memberlist's encryption overhead on a 1500-byte MTU.
const reliableAbove = 1024

// maxReliableInFlight bounds the TCP sends under way; more are dropped
// (the machine retries: raft resends what was not acknowledged).
const maxReliableInFlight = 16

// LeaseNode is this node in the lease election: memberlist for discovery,
// the authenticated transport, failure hints and metadata; the lease
// machine (cluster/lease) for every decision, driven by a leaseLoop.
type LeaseNode struct {
	cfg   LeaseConfig
	peers []string
	log   *slog.Logger
	ml    *memberlist.Memberlist
	loop  *leaseLoop
	state stateFile

	syncReq  chan struct{}
	pushReq  chan struct{} // metadata changed: push it to every member
	sendSem  chan struct{}
	sends    sync.WaitGroup
	joinedCh chan struct{}

	mu      sync.Mutex
	meta    []byte
	members map[string]lease.Member
	reports map[string]memberReports // each member's metadata reports, decoded once per change
	addrs   map[string]string        // member name -> gossip address
	want    map[lease.Kind][]lease.Address
	running bool

	peerAddrs  map[netip.Addr]bool  // VIPD_PEERS' addresses (names resolved at each join retry)
	localAddr  string               // this node's gossip address (set once after Create)
	vetoPosted map[string]time.Time // postVeto's last post by kind
	broken     map[string]string    // VIPs this node could not hold, with why (until it holds them)
	// the last handover of each VIP this node ran (vipd handover, a
	// graceful stop)
	handovers map[string]HandoverResult

	mMembers *prometheus.GaugeVec
	mQuorum  prometheus.Gauge
	mTerm    prometheus.Gauge
	mLeader  prometheus.Gauge
	mBroken  *prometheus.GaugeVec
	mSendErr prometheus.Counter
	mRecvBad prometheus.Counter
	mReject  *prometheus.CounterVec
}

// NewLease reads the persisted state, creates the lease machine and the
// memberlist (binding the gossip port) without joining anybody yet. A
// damaged state file stops it with an error naming the file.
func NewLease(cfg LeaseConfig, log *slog.Logger, reg prometheus.Registerer) (*LeaseNode, error) {
	return newLeaseWith(cfg, log, reg, func(c lease.Config, persisted []byte, now time.Time) (leaseMachine, error) {
		return lease.New(c, persisted, now)
	})
}

func newLeaseWith(cfg LeaseConfig, log *slog.Logger, reg prometheus.Registerer,
	newMachine func(lease.Config, []byte, time.Time) (leaseMachine, error)) (*LeaseNode, error) {
	if cfg.Cluster.Timings == (Timings{}) {
		cfg.Cluster.Timings = DefaultTimings()
	}
	if cfg.Clock == nil {
		cfg.Clock = gridclock.Precise{}
	}
	cfg.Machine.Name = cfg.Cluster.Name
	cfg.Machine.ExpectPeers = len(cfg.Cluster.Peers) > 0
	peers, err := dropSelf(cfg.Cluster.Peers, cfg.Cluster.Bind, cfg.Cluster.LocalAddrs)
	if err != nil {
		return nil, err
	}
	if len(peers) > 0 && len(cfg.Cluster.Keys) == 0 && !cfg.Cluster.Insecure {
		return nil, fmt.Errorf("VIPD_GOSSIP_KEY_FILE is not set: with VIPD_PEERS, gossip must be authenticated (make a key with `vipd keygen --out /etc/vipd/gossip.key` and set VIPD_GOSSIP_KEY_FILE on every node, or set VIPD_GOSSIP_INSECURE=true to accept unauthenticated peers)")
	}
	log = log.With("component", "cluster", "election", "lease")
	st := newStateFile(cfg.Cluster.StateDir)
	persisted, err := st.Load()
	if err != nil {
		return nil, fmt.Errorf("VIPD_STATE_DIR: %w", err)
	}
	// The identity this node takes if it starts without state, or with
	// the state of a configuration it had left (lease.New decides): a
	// new incarnation, whose raft id must differ from any id a previous
	// life under this name had.
	var b [8]byte
	for cfg.Machine.Incarnation == 0 {
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("lease election: drawing an incarnation: %w", err)
		}
		cfg.Machine.Incarnation = binary.BigEndian.Uint64(b[:])
	}
	m, err := newMachine(cfg.Machine, persisted, cfg.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("VIPD_STATE_DIR: lease state %s: %w (%s)", st.path, err, leaseStateAdvice)
	}
	n := &LeaseNode{
		cfg: cfg, peers: peers, log: log, state: st,
		syncReq:    make(chan struct{}, 1),
		pushReq:    make(chan struct{}, 1),
		sendSem:    make(chan struct{}, maxReliableInFlight),
		joinedCh:   make(chan struct{}),
		members:    map[string]lease.Member{},
		reports:    map[string]memberReports{},
		addrs:      map[string]string{},
		vetoPosted: map[string]time.Time{},
		peerAddrs:  literalPeers(peers),
		broken:     map[string]string{},
		handovers:  map[string]HandoverResult{},
		want:       map[lease.Kind][]lease.Address{lease.ControlPlane: cfg.Addresses},
		mMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_cluster_members", Help: "Members by state: alive and dead as memberlist sees them; voters, learners and witnesses of the lease election's configuration.",
		}, []string{"state"}),
		mQuorum: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_cluster_quorum", Help: "1 while this node is the leader with a lease a majority granted, or follows a live leader.",
		}),
		mTerm: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_election_term", Help: "The lease election's current term (raft term).",
		}),
		mLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_election_leader", Help: "1 while this node is the lease election's leader.",
		}),
		mBroken: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_vip_broken", Help: "1 while this node cannot hold the VIP (acquire failed, interface down) and leaves it to the others.",
		}, []string{"vip"}),
		mSendErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_election_send_errors_total", Help: "Lease election messages the transport could not send (peer unknown, socket error, too many in flight).",
		}),
		mRecvBad: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_election_messages_dropped_total", Help: "Lease election messages received and dropped as unreadable (bad envelope, oversized, from this node's own name).",
		}),
		mReject: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_cluster_gossip_rejected_total", Help: "Packets and connections on the gossip port that could not be authenticated, by sender: peer (in VIPD_PEERS or a member: another key) or other (ignored).",
		}, []string{"sender"}),
	}
	n.mReject.WithLabelValues("peer")
	n.mReject.WithLabelValues("other")
	for _, a := range cfg.Addresses {
		n.mBroken.WithLabelValues(a.Key).Set(0)
	}
	n.loop = newLeaseLoop(m, cfg.Clock, n, st, log)
	n.loop.late = newLateness(cfg.Machine)
	n.loop.ovt = newOverlapTracker(cfg.Machine.Name, log)
	core := map[string]bool{}
	for _, a := range cfg.Addresses {
		core[a.Key] = true // the vip core reports their binds (SetHolding)
	}
	n.loop.ovt.reported = func(key string) bool { return core[key] }
	n.loop.witness = cfg.Machine.Role == lease.Witness
	n.loop.expectPeers = len(cfg.Cluster.Peers) > 0
	n.loop.meta = n.publishMeta
	if reg != nil {
		nameConflict := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vipd_cluster_name_conflict", Help: "1 while another node gossiped under this node's name (VIPD_NODE_NAME) within the last 30 s; this node then holds nothing as the only voter of a cluster of its own.",
		}, func() float64 { return b2f(n.nameConflict(n.cfg.Clock.Now())) })
		for _, c := range append([]prometheus.Collector{n.mMembers, n.mQuorum, n.mTerm, n.mLeader, n.mBroken, n.mSendErr, n.mRecvBad, n.mReject, nameConflict, leaseRemaining{n}}, n.loop.ovt.collectors()...) {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	ml, _, err := newMemberlist(cfg.Cluster, log, (*leaseDelegate)(n), (*leaseEvents)(n), (*leaseConflicts)(n), n.keyError, cfg.Clock.Now)
	if err != nil {
		return nil, err
	}
	n.ml = ml
	n.localAddr = ml.LocalNode().Address()
	return n, nil
}

// keyError is told the sender of gossip memberlist could not authenticate
// and reports whether it counts as a node with another key: a peer this
// node joined (ours), a peer (VIPD_PEERS) or member sending to it, or a
// sender the log line did not name. Only then does a node that is alone
// in its cluster stand back (keyEvent): a stray or forged packet from
// anywhere else (a port scan) must not take the VIP from the kubeadm
// first node.
func (n *LeaseNode) keyError(from netip.Addr, ours bool) bool {
	if !ours && from.IsValid() && !n.knownSender(from) {
		n.mReject.WithLabelValues("other").Inc()
		return false
	}
	n.mReject.WithLabelValues("peer").Inc()
	n.postVeto(keyEvent{})
	return true
}

// knownSender reports whether a is the address of a peer or a member.
func (n *LeaseNode) knownSender(a netip.Addr) bool {
	a = a.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.peerAddrs[a] {
		return true
	}
	for _, s := range n.addrs {
		if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// peerHost splits a VIPD_PEERS entry into its host and, when the host is
// an IP address, that address.
func peerHost(p string) (host string, addr netip.Addr, ok bool) {
	host, _, err := net.SplitHostPort(withPort(p))
	if err != nil {
		return "", netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host, netip.Addr{}, true
	}
	return host, a.Unmap(), true
}

// literalPeers returns the addresses of the peers given as IP addresses.
func literalPeers(peers []string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, p := range peers {
		if _, a, ok := peerHost(p); ok && a.IsValid() {
			out[a] = true
		}
	}
	return out
}

// resolvePeers adds the addresses of the peers given by name (a name that
// does not resolve now keeps what it resolved to before), so that their
// gossip to this node counts too (its own joins count without).
func (n *LeaseNode) resolvePeers(ctx context.Context) {
	for _, p := range n.peers {
		host, a, ok := peerHost(p)
		if !ok || a.IsValid() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		as, err := net.DefaultResolver.LookupNetIP(rctx, "ip", host)
		cancel()
		if err != nil {
			continue
		}
		n.mu.Lock()
		for _, a := range as {
			n.peerAddrs[a.Unmap()] = true
		}
		n.mu.Unlock()
	}
}

// postVeto hands a key error or name conflict to the loop, at most once a
// second of each kind: memberlist logs one per packet, which must not
// crowd the machine's messages out of the queue.
func (n *LeaseNode) postVeto(ev lease.Event) {
	now := n.cfg.Clock.Now()
	kind := fmt.Sprintf("%T", ev)
	n.mu.Lock()
	last := n.vetoPosted[kind]
	ok := last.IsZero() || now.Sub(last) >= time.Second
	if ok {
		n.vetoPosted[kind] = now
	}
	n.mu.Unlock()
	if ok {
		n.loop.post(ev)
	}
}

// nameConflict reports whether another node gossiped under this node's
// name within ConflictHold before now (vipd_cluster_name_conflict).
func (n *LeaseNode) nameConflict(now time.Time) bool {
	n.mu.Lock()
	last := n.vetoPosted[fmt.Sprintf("%T", conflictEvent{})]
	n.mu.Unlock()
	return !last.IsZero() && now.Sub(last) < ConflictHold
}

// Holder returns the node that holds vip as this node knows it (the
// leader's placement; this node's own holds) and that node's gossip
// address: the egress directors route to it. "" when none is known.
func (n *LeaseNode) Holder(vip string) (name string, addr netip.Addr) {
	st, holds, _ := n.loop.snapshot()
	if _, mine := holds[vip]; mine {
		name = n.cfg.Cluster.Name
	} else if name = st.Holders[vip]; name == "" {
		return "", netip.Addr{}
	}
	n.mu.Lock()
	a := n.addrs[name]
	n.mu.Unlock()
	if name == n.cfg.Cluster.Name {
		a = n.localAddr
	}
	if ap, err := netip.ParseAddrPort(a); err == nil {
		addr = ap.Addr().Unmap()
	}
	return name, addr
}

// SetHealthy feeds this node's apiserver health to the machine.
func (n *LeaseNode) SetHealthy(healthy bool) { n.loop.post(lease.Health{Healthy: healthy}) }

// SetHolding is the core's report that it bound and announced vip (or
// let it go). The machine decides the holds; a bind is fed to it as Held,
// which a planned transfer's successor needs to end the overlap early.
func (n *LeaseNode) SetHolding(vip string, holding bool) {
	n.log.Debug("core holding", "vip", vip, "holding", holding)
	if holding {
		// bound and announced: a planned transfer's successor tells the
		// old holder to let go (make-before-break)
		n.loop.post(lease.Held{Keys: []string{vip}})
		n.mBroken.WithLabelValues(vip).Set(0)
		n.mu.Lock()
		delete(n.broken, vip)
		n.mu.Unlock()
	}
}

// Bound is the pools' and egress addresses' report that this node bound
// and announced keys (SetHolding for many, without its per-address
// metric): a planned transfer's successor tells the old holder to let go.
func (n *LeaseNode) Bound(keys []string) {
	if len(keys) > 0 {
		n.loop.post(lease.Held{Keys: keys})
	}
}

// OnOverlap sets fn to hear of every planned transfer's agreed
// make-before-break overlap of an address this node holds: when it starts
// (on), and when it ends while this node still holds it. Set before Run; fn runs on the election's
// goroutine and must not block.
func (n *LeaseNode) OnOverlap(fn func(key string, o lease.Overlap, on bool)) {
	n.loop.ovt.notify = fn
}

// SetFailed reports that this node could not hold vip (interface down,
// acquire failed): it counts as unhealthy for a short pause, so the lease
// goes to another node.
func (n *LeaseNode) SetFailed(vip, reason string) {
	n.log.Warn("cannot hold an address: stepping aside for a while", "vip", vip, "reason", reason, "pause", failedPause)
	n.mBroken.WithLabelValues(vip).Set(1)
	n.mu.Lock()
	n.broken[vip] = "last attempt failed " + n.cfg.Clock.Now().Format("15:04:05") + ": " + reason
	n.mu.Unlock()
	n.loop.post(failedEvent{})
}

// SetAddresses replaces the addresses of one kind (pool, egress) the
// cluster must place, with the nodes that may hold each (Restricted,
// Nodes); the control-plane VIPs come from the configuration.
func (n *LeaseNode) SetAddresses(kind lease.Kind, addrs []lease.Address) {
	as := make([]lease.Address, len(addrs))
	for i, a := range addrs {
		a.Kind = kind
		as[i] = a
	}
	n.mu.Lock()
	n.want[kind] = as
	ev := n.wantLocked()
	n.mu.Unlock()
	n.loop.post(ev)
}

func (n *LeaseNode) wantLocked() lease.Want {
	var all []lease.Address
	for _, k := range []lease.Kind{lease.ControlPlane, lease.Pool, lease.Egress} {
		all = append(all, n.want[k]...)
	}
	return lease.Want{Addresses: all}
}

// Forget removes a dead member from the configuration (vipd forget).
func (n *LeaseNode) Forget(name string) error {
	if !n.loop.post(lease.Forget{Name: name}) {
		return errors.New("election busy: try again")
	}
	return nil
}

// Run joins the peers and runs the election until ctx is done, handing
// the holds and releases of every step to decide. It returns an error when the state
// cannot be saved (the daemon then stops).
func (n *LeaseNode) Run(ctx context.Context, decide func([]LeaseDecision)) error {
	n.loop.decide = decide
	n.mu.Lock()
	n.running = true
	want := n.wantLocked()
	n.mu.Unlock()
	n.loop.post(want)
	n.postView()
	syncDone := make(chan struct{})
	go func() {
		defer close(syncDone)
		n.syncLoop(ctx)
	}()
	pushDone := make(chan struct{})
	go func() {
		defer close(pushDone)
		n.pushLoop(ctx)
	}()
	err := n.loop.run(ctx)
	<-syncDone
	<-pushDone
	n.sends.Wait()
	return err
}

// syncLoop joins the peers at start and every safetyEvery while some
// configured peer is not a member, until ctx is done.
func (n *LeaseNode) syncLoop(ctx context.Context) {
	t := time.NewTicker(safetyEvery)
	defer t.Stop()
	n.join()
	n.resolvePeers(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n.ml.NumMembers()-1 < len(n.peers) {
				n.resolvePeers(ctx)
				n.join()
			}
		case <-n.syncReq:
			n.join()
		}
	}
}

func (n *LeaseNode) join() {
	if len(n.peers) == 0 {
		return
	}
	peers := make([]string, len(n.peers))
	for i, p := range n.peers {
		peers[i] = withPort(p)
	}
	joined, err := n.ml.Join(peers)
	if err != nil {
		lvl := slog.LevelInfo
		if isKeyError(err.Error()) {
			lvl = slog.LevelError
		}
		n.log.Log(context.Background(), lvl, "gossip join incomplete; retrying in the background", "joined", joined, "peers", peers, "err", err)
	}
}

// Send hands one machine message to memberlist: a UDP packet when small
// (best effort, like raft expects), the reliable TCP path when large, in
// the background with a bound on sends in flight. Both are encrypted and
// authenticated with the gossip key.
func (n *LeaseNode) Send(to string, data []byte) error {
	var node *memberlist.Node
	for _, m := range n.ml.Members() {
		if m.Name == to {
			node = m
			break
		}
	}
	if node == nil {
		n.mSendErr.Inc()
		return fmt.Errorf("%s is not a gossip member", to)
	}
	b, err := encodeLease(n.cfg.Cluster.Name, data)
	if err != nil {
		n.mSendErr.Inc()
		return err
	}
	if len(b) <= reliableAbove {
		if err := n.ml.SendBestEffort(node, b); err != nil {
			n.mSendErr.Inc()
			return fmt.Errorf("send to %s: %w", to, err)
		}
		return nil
	}
	select {
	case n.sendSem <- struct{}{}:
	default:
		n.mSendErr.Inc()
		return fmt.Errorf("send to %s: %d reliable sends in flight", to, maxReliableInFlight)
	}
	n.sends.Add(1)
	go func() {
		defer n.sends.Done()
		defer func() { <-n.sendSem }()
		if err := n.ml.SendReliable(node, b); err != nil {
			n.mSendErr.Inc()
			n.log.Debug("lease message not sent", "to", to, "bytes", len(b), "err", err)
		}
	}()
	return nil
}

// publishMeta makes meta this node's memberlist metadata (the loop's
// goroutine).
func (n *LeaseNode) publishMeta(meta []byte) {
	if len(meta) > memberlist.MetaMaxSize {
		n.log.Error("lease metadata does not fit memberlist's limit: keeping the last one", "bytes", len(meta), "limit", memberlist.MetaMaxSize)
		return
	}
	n.mu.Lock()
	n.meta = append([]byte(nil), meta...)
	n.mu.Unlock()
	_ = n.ml.UpdateNode(time.Nanosecond) // queues the broadcast; does not wait
	select {
	case n.pushReq <- struct{}{}:
	default:
	}
}

// pushLoop pushes this node's metadata to every member when it changed,
// until ctx is done: a ping to each carries memberlist's queued broadcast
// with it. Gossip rounds are seconds apart in the default profile (their
// only other job is discovery), and the machine's discovery and joins read
// the metadata (cluster id, leader): a node that bootstraps must be seen
// by the others within a round trip, not at the next gossip round.
func (n *LeaseNode) pushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.pushReq:
		}
		var wg sync.WaitGroup
		for _, m := range n.ml.Members() {
			if m.Name == n.cfg.Cluster.Name {
				continue
			}
			addr := &net.UDPAddr{IP: m.Addr, Port: int(m.Port)}
			wg.Go(func() { _, _ = n.ml.Ping(m.Name, addr) })
		}
		wg.Wait()
	}
}

// postView gives the machine memberlist's current view.
func (n *LeaseNode) postView() {
	// Snapshot and queue under one lock: two memberlist events at once
	// must not queue their views in the other order (an older view would
	// replace a newer one). post never blocks.
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running {
		return
	}
	ms := make([]lease.Member, 0, len(n.members))
	for _, k := range sortedKeys(n.members) {
		m := n.members[k]
		m.Meta = slices.Clone(m.Meta)
		ms = append(ms, m)
	}
	n.loop.post(lease.View{Members: ms})
}

func (n *LeaseNode) memberChanged(m *memberlist.Node, alive bool) {
	if m.Name == n.cfg.Cluster.Name {
		return
	}
	mb := lease.Member{Name: m.Name, Alive: alive, Meta: slices.Clone(m.Meta)}
	if claims, ok := oldClaims(m.Meta); ok {
		// A node of the previous release (the gossip election): the
		// addresses it claims, which the leader never grants while it is
		// alive (the upgrade meeting). The machine ignores these for
		// members that publish its own metadata.
		mb.Claims = claims
	}
	n.putMember(mb, m.Address())
	n.postView()
}

// putMember records a member as memberlist last told it, with the reports
// its metadata carries (decoded here, once per change).
func (n *LeaseNode) putMember(mb lease.Member, addr string) {
	rs, witness, ok := lease.ReportsOf(mb.Meta)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.members[mb.Name] = mb
	n.reports[mb.Name] = memberReports{rs: rs, witness: witness, ok: ok}
	n.addrs[mb.Name] = addr
}

// HandOver moves what this node holds to another node (a leadership
// transfer; stopping: leave the configuration too) and waits until this
// node holds none of vips (all it holds when empty) and another node does,
// or ctx ends.
func (n *LeaseNode) HandOver(ctx context.Context, vips []string, to string, stopping bool) ([]HandoverResult, error) {
	start := n.cfg.Clock.Now()
	st0, holds, _ := n.loop.snapshot()
	if rs := n.refuseHandover(st0, holds, vips, to, stopping, start); rs != nil {
		return rs, nil
	}
	if len(vips) == 0 {
		vips = sortedKeys(holds)
	}
	var ev lease.Event = lease.Transfer{To: to}
	if stopping {
		ev = lease.Leave{}
	}
	if len(vips) == 0 && !stopping {
		return []HandoverResult{{Reason: "this node holds no VIP", At: start, Refused: true}}, nil
	}
	if !n.loop.post(ev) {
		return nil, errors.New("election busy: try again")
	}
	var leftBy time.Time
	for {
		st, holds, stepped := n.loop.snapshot()
		done := true
		for _, v := range vips {
			_, mine := holds[v]
			elsewhere := st.Holders[v] != "" && st.Holders[v] != n.cfg.Cluster.Name
			// A node that left the configuration no longer hears who
			// holds what: released is all it can know.
			if mine || !elsewhere && !(stopping && st.Removed) {
				done = false
			}
		}
		if done && stopping && !st.Removed {
			// The addresses moved (or there were none): give the machine
			// a moment to leave the configuration too, so the others do
			// not wait for RemoveAfter to drop this node.
			if leftBy.IsZero() {
				leftBy = n.cfg.Clock.Now().Add(leaveWait)
			}
			done = !n.cfg.Clock.Now().Before(leftBy)
		}
		if done {
			rs := make([]HandoverResult, 0, len(vips))
			for _, v := range vips {
				r := HandoverResult{VIP: v, To: st.Holders[v], OK: true, At: start, Took: n.cfg.Clock.Now().Sub(start), Reason: "lease transferred"}
				if r.To == n.cfg.Cluster.Name {
					r.To = ""
				}
				if r.To == "" {
					r.Reason = "released and left the configuration (the successor is not known here)"
				}
				rs = append(rs, r)
			}
			n.noteHandovers(rs)
			return rs, nil
		}
		select {
		case <-n.loop.stopped:
			return nil, errors.New("the election stopped during the handover")
		case <-ctx.Done():
			rs := make([]HandoverResult, 0, len(vips))
			for _, v := range vips {
				r := HandoverResult{VIP: v, At: start, Took: n.cfg.Clock.Now().Sub(start)}
				if _, mine := holds[v]; mine {
					r.Reason = "still held here: no successor took the lease in time"
				} else {
					r.Reason = "released; no other holder known yet"
				}
				rs = append(rs, r)
			}
			n.noteHandovers(rs)
			return rs, ctx.Err()
		case <-stepped:
		}
	}
}

// noteHandovers keeps the results for /status (vipd status: "last
// handover VIP: done to n2").
func (n *LeaseNode) noteHandovers(rs []HandoverResult) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range rs {
		n.handovers[r.VIP] = r
	}
}

// leaveWait bounds the wait for this node's removal from the
// configuration at a graceful stop, once its addresses moved.
const leaveWait = 500 * time.Millisecond

// refuseHandover checks a vipd handover request before anything moves:
// a VIP this node does not have, a successor that is not a member or is
// this node. It returns nil when the request may go on.
func (n *LeaseNode) refuseHandover(st lease.Status, holds map[string]time.Time, vips []string, to string, stopping bool, now time.Time) []HandoverResult {
	if stopping {
		return nil
	}
	var out []HandoverResult
	refuse := func(v, reason string) {
		out = append(out, HandoverResult{VIP: v, To: to, Reason: reason, At: now, Refused: true})
	}
	n.mu.Lock()
	var configured []string
	for _, k := range []lease.Kind{lease.ControlPlane, lease.Pool, lease.Egress} {
		for _, a := range n.want[k] {
			configured = append(configured, a.Key)
		}
	}
	var members []string
	healthy := map[string]bool{}
	for _, k := range sortedKeys(n.members) {
		if n.members[k].Alive {
			members = append(members, k)
			healthy[k], _ = lease.MetaHealthy(n.members[k].Meta)
		}
	}
	n.mu.Unlock()
	for _, v := range vips {
		if !slices.Contains(configured, v) {
			refuse(v, v+" is not one of this node's VIPs (VIPD_ADDRESS: "+strings.Join(configured, ",")+")")
		}
	}
	if out != nil {
		return out
	}
	if len(vips) == 0 {
		vips = sortedKeys(holds)
	}
	v := strings.Join(vips, ",")
	switch {
	case to == n.cfg.Cluster.Name:
		refuse(v, to+" is this node, which holds "+v+" already")
	case to != "" && !slices.Contains(members, to):
		refuse(v, "no member named "+to+" (members: "+strings.Join(members, ", ")+")")
	case slices.Contains(st.Witnesses, to):
		refuse(v, to+" is a witness: it votes and never holds")
	case to != "" && !slices.Contains(st.Voters, to):
		refuse(v, to+" is not a voter of the lease election yet (voters: "+strings.Join(st.Voters, ", ")+")")
	case to != "" && !healthy[to]:
		refuse(v, to+" is not eligible: its apiserver is unhealthy")
	}
	return out
}

// LeaseStatusDoc is the cluster's section of /status in the lease election.
type LeaseStatusDoc struct {
	Election   string               `json:"election"` // "lease"
	Role       string               `json:"role"`
	State      string               `json:"state"`
	Leader     string               `json:"leader"`
	Term       uint64               `json:"term"`
	Quorum     bool                 `json:"quorum_ok"`
	Voters     []string             `json:"voters"`
	Learners   []string             `json:"learners"`
	Witnesses  []string             `json:"witnesses"`
	LeaseUntil time.Time            `json:"lease_until,omitzero"`
	LeaseLeft  string               `json:"lease_left,omitempty"`
	Holders    map[string]string    `json:"holders"`
	Holds      map[string]time.Time `json:"holds"`
	Members    []LeaseMemberStatus  `json:"members"`
	Broken     map[string]string    `json:"broken,omitempty"`
	// LastHandover is the last handover of each VIP this node ran.
	LastHandover map[string]HandoverResult `json:"last_handover,omitempty"`
}

// LeaseMemberStatus is one memberlist member in /status. Healthy is what
// it publishes about its apiserver; Eligible: alive, healthy and a voter
// (it may hold addresses).
type LeaseMemberStatus struct {
	Name     string `json:"name"`
	Addr     string `json:"addr"`
	Alive    bool   `json:"alive"`
	Healthy  bool   `json:"healthy"`
	Eligible bool   `json:"eligible"`
}

// Status returns the lease election's view for /status.
func (n *LeaseNode) Status() any {
	st, holds, _ := n.loop.snapshot()
	doc := LeaseStatusDoc{Election: "lease", Role: n.cfg.Machine.Role.String(), State: st.State, Leader: st.Leader, Term: st.Term, Quorum: st.Quorum,
		Voters: st.Voters, Learners: st.Learners, Witnesses: st.Witnesses, LeaseUntil: st.LeaseUntil, Holders: st.Holders, Holds: holds}
	if !st.LeaseUntil.IsZero() {
		doc.LeaseLeft = st.LeaseUntil.Sub(n.cfg.Clock.Now()).Round(time.Millisecond).String()
	}
	n.mu.Lock()
	if len(n.broken) > 0 {
		doc.Broken = maps.Clone(n.broken)
	}
	if len(n.handovers) > 0 {
		doc.LastHandover = maps.Clone(n.handovers)
	}
	for _, k := range sortedKeys(n.members) {
		m := n.members[k]
		healthy, _ := lease.MetaHealthy(m.Meta)
		doc.Members = append(doc.Members, LeaseMemberStatus{Name: k, Addr: n.addrs[k], Alive: m.Alive, Healthy: healthy,
			Eligible: m.Alive && healthy && slices.Contains(st.Voters, k)})
	}
	n.mu.Unlock()
	n.updateMetrics(st)
	return doc
}

func (n *LeaseNode) updateMetrics(st lease.Status) {
	alive, dead := 1, 0 // this node
	n.mu.Lock()
	for _, m := range n.members {
		if m.Alive {
			alive++
		} else {
			dead++
		}
	}
	n.mu.Unlock()
	n.mMembers.WithLabelValues("alive").Set(float64(alive))
	n.mMembers.WithLabelValues("dead").Set(float64(dead))
	n.mMembers.WithLabelValues("voters").Set(float64(len(st.Voters)))
	n.mMembers.WithLabelValues("learners").Set(float64(len(st.Learners)))
	n.mMembers.WithLabelValues("witnesses").Set(float64(len(st.Witnesses)))
	n.mQuorum.Set(b2f(st.Quorum))
	n.mTerm.Set(float64(st.Term))
	n.mLeader.Set(b2f(st.Leader != "" && st.Leader == n.cfg.Cluster.Name))
}

// Close leaves memberlist and stops gossiping (after Run returned: the
// machine's Leave, if any, went out while it ran).
func (n *LeaseNode) Close() error {
	err := n.ml.Leave(300 * time.Millisecond)
	return errors.Join(err, n.ml.Shutdown())
}

// leaseRemaining collects vipd_lease_remaining_seconds at scrape time.
type leaseRemaining struct{ n *LeaseNode }

var leaseRemainingDesc = prometheus.NewDesc("vipd_lease_remaining_seconds",
	"Time left on this node's lease of each address it holds (renewed before it ends; the address is released at 0).", []string{"address"}, nil)

func (r leaseRemaining) Describe(ch chan<- *prometheus.Desc) { ch <- leaseRemainingDesc }
func (r leaseRemaining) Collect(ch chan<- prometheus.Metric) {
	st, holds, _ := r.n.loop.snapshot()
	r.n.updateMetrics(st)
	now := r.n.cfg.Clock.Now()
	for _, k := range sortedKeys(holds) {
		ch <- prometheus.MustNewConstMetric(leaseRemainingDesc, prometheus.GaugeValue, max(holds[k].Sub(now).Seconds(), 0), k)
	}
}

// leaseDelegate gives memberlist the lease metadata and hands it messages.
type leaseDelegate LeaseNode

func (d *leaseDelegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}

func (d *leaseDelegate) NotifyMsg(msg []byte) {
	n := (*LeaseNode)(d)
	from, data, err := decodeLease(msg)
	if errors.Is(err, errNotLease) {
		n.mRecvBad.Inc()
		n.log.Debug("ignoring a message of the gossip election (mixed versions?)", "bytes", len(msg))
		return
	}
	if err != nil || from == n.cfg.Cluster.Name {
		n.mRecvBad.Inc()
		n.log.Debug("ignoring an unreadable lease message", "bytes", len(msg), "from", from, "err", err)
		return
	}
	n.loop.post(lease.Receive{From: from, Data: data})
}
func (d *leaseDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *leaseDelegate) LocalState(join bool) []byte                { return nil }
func (d *leaseDelegate) MergeRemoteState(buf []byte, join bool)     {}

// leaseEvents turns memberlist's events into Views.
type leaseEvents LeaseNode

func (e *leaseEvents) NotifyJoin(m *memberlist.Node) {
	e.log.Info("member joined", "member", m.Name, "addr", m.Address())
	(*LeaseNode)(e).memberChanged(m, true)
}
func (e *leaseEvents) NotifyLeave(m *memberlist.Node) {
	how := "declared dead"
	if m.State == memberlist.StateLeft {
		how = "left"
	}
	e.log.Info("member "+how, "member", m.Name, "addr", m.Address())
	(*LeaseNode)(e).memberChanged(m, false)
}
func (e *leaseEvents) NotifyUpdate(m *memberlist.Node) { (*LeaseNode)(e).memberChanged(m, true) }

// leaseConflicts logs two nodes with one name: memberlist refuses the
// second at join; the machine refuses duplicate names in its configuration.
type leaseConflicts LeaseNode

func (c *leaseConflicts) NotifyConflict(existing, other *memberlist.Node) {
	n := (*LeaseNode)(c)
	if existing.Name == n.cfg.Cluster.Name {
		// memberlist holds its node lock here: no calls back into it.
		addr := other.Address()
		if existing.Address() != n.localAddr {
			addr = existing.Address()
		}
		c.log.Error("another node uses this node's name: set a unique VIPD_NODE_NAME on every node", "name", existing.Name, "other", addr)
		n.postVeto(conflictEvent{})
		return
	}
	c.log.Error("two nodes use one name: set a unique VIPD_NODE_NAME on every node", "name", existing.Name, "addr", existing.Address(), "other", other.Address())
}
