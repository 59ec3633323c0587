// Package sim is a deterministic simulator of a vipd cluster: N in-process
// nodes, each the real cluster.Election and vip.Core, over a simulated
// network, failure detector, data plane and clock. A seed fixes a random
// schedule of faults (partitions, one-way links, drops, crashes, restarts
// with and without the state directory, health flaps, failed acquires,
// interfaces going down, joins, leaves, replacements, duplicate names, a
// node with another gossip key) and the invariants are checked at every
// step. A failing seed replays exactly, with its trace.
//
// The network model follows memberlist closely enough for the election:
// a node hears another directly or through one intermediary (indirect
// probes and gossip relay), metadata travels with what it hears, silence
// makes a member suspect after SuspectAfter and dead after DeadAfter, and a
// graceful leave is seen as "left" by those that hear it. The data plane is
// one L2 segment: a VIP bound on a node whose interface is up answers, and
// an acquire probe (or a lone holder's periodic probe) sees every other
// answering node.
//
// Options.Fast adds the fast profile's holder heartbeat; Options.Beats
// models member beats (every member beats to every member, directly, on a
// clock-aligned grid, read lazily one tick later) beside memberlist's
// slowed detector (cluster.BeatTimings).
package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/vip"
)

// Timing of the simulated network.
const (
	Tick          = 10 * time.Millisecond
	GossipEvery   = 50 * time.Millisecond // probes and their answers
	SuspectAfter  = 400 * time.Millisecond
	DeadAfter     = 1000 * time.Millisecond
	Detection     = DeadAfter + 500*time.Millisecond // failure noticed and acted on
	RestartDelay  = time.Second                      // systemd's RestartSec
	ReconcileTime = vip.ReconcileEvery
	ProbeWindow   = 50 * time.Millisecond // the l2 conflict probe's wait
)

// The failure detector next to member beats (Options.Beats,
// cluster.BeatTimings: a probe every 5 s, 500 ms probe timeout,
// SuspicionMult 2, gossip every 5 s), from the same formula as the
// constants above (200 ms probes: 2 x 200 ms to suspect, + 2 x 200 ms of
// suspicion, + 200 ms for the verdict to spread = 1 s):
//   - a member is probed by one of the others about once per probe
//     interval, and a probe that fails marks it suspect when its ack
//     handler times out, one (awareness-scaled) probe interval after the
//     ping: suspect after about 2 x 5 s = 10 s;
//   - memberlist's suspicion timer is SuspicionMult x max(1, log10(n)) x
//     ProbeInterval = 2 x 1 x 5 s = 10 s for up to 9 nodes, and with
//     SuspicionMult 2 it expects k = SuspicionMult-2 = 0 confirmations, so
//     it starts at that minimum (no Lifeguard stretch);
//   - the dead message then spreads in one gossip round (5 s).
//
// So dead after 10 + 10 + 5 = 25 s (between 15 s for a probe right after
// the crash and about 25 s). Beats decide long before.
const (
	BeatSuspectAfter = 10 * time.Second
	BeatDeadAfter    = 25 * time.Second
	BeatMetaEvery    = 5 * time.Second // cluster.BeatTimings' GossipInterval
)

// BeatDetection is the detection time the invariants allow where member
// beats decide (two holders, a missing holder): the tracker's deadline
// (3 x 250 ms), one interval for the lazy read (a beat sent at grid tick
// k is read at tick k+1, so a member is found silent up to Deadline +
// Interval after its last beat went out), and the 500 ms that Detection
// also allows for acting on it. It equals Detection (1.5 s).
var BeatDetection = cluster.BeatHeartbeat().Deadline() + cluster.BeatHeartbeat().Interval + 500*time.Millisecond

// MetaEvery is how often metadata changes reach a member that hears
// another in the default profile (cluster.DefaultTimings' gossip
// interval; the fast profile's is below GossipEvery).
const MetaEvery = 200 * time.Millisecond

// VIP is the simulated VIP.
var VIP = netip.MustParsePrefix("10.0.0.100/32")

// Options shape a run.
type Options struct {
	Seed     int64
	Nodes    int           // initial cluster size (3 when zero)
	Duration time.Duration // faults are injected during this time (10 min when zero)
	Expiry   time.Duration // VIPD_MEMBER_EXPIRY (1 min when zero)
	Trace    bool          // keep the whole trace (else the last lines only)
	// QuorumOff runs every node with VIPD_QUORUM=off: the invariants must
	// catch the split brain that follows (a check that the checks work).
	QuorumOff bool
	// NoProbe models a mode without a data-plane probe (cloud: an assign
	// simply moves the IP): safety rests on the election alone.
	NoProbe bool
	// Fast runs every node with VIPD_PROFILE=fast: the holder heartbeat
	// (cluster.FastHeartbeat), sent directly (never relayed) and lost
	// with the gossip drop rate, beside the same failure detector.
	Fast bool
	// Beats runs every node with member beats (the default profile's new
	// detector, cluster.BeatHeartbeat and cluster.BeatTimings): every
	// running node sends a beat every Interval on the clock-aligned grid,
	// directly (never relayed) to each member of its view with Meta.Beat
	// that it reaches, lost with the gossip drop rate, not heard under
	// another key; the receiver reads its socket at its next grid tick.
	// memberlist's own detector is slowed to BeatSuspectAfter and
	// BeatDeadAfter, and metadata travels every BeatMetaEvery. Not with
	// Fast.
	Beats bool
	// Script replaces the random faults by these steps (scenario tests).
	Script []Step
	// Observe, when set, is called after every simulated tick.
	Observe func(*Sim)
	// Priorities (VIPD_PRIORITY) by node name; PreemptDelay for every node.
	Priorities   map[string]int
	PreemptDelay time.Duration
	// NoHandovers leaves planned handovers (vipd handover, a stop with a
	// handover, lost or failed handover messages, a crash mid-handover)
	// out of the random schedule.
	NoHandovers bool
}

// TCPTimeout is how long a handover message to a node that does not
// answer takes to fail (memberlist's TCPTimeout in vipd).
const TCPTimeout = time.Second

// simMsg is a handover message (or its failure) on its way.
type simMsg struct {
	at time.Time
	to *node
	ev cluster.Event
}

// Step is one scripted action at a time after the start.
type Step struct {
	At time.Duration
	Do func(*Sim)
}

// Result is what one run found.
type Result struct {
	Seed       int64
	Simulated  time.Duration
	Violations []string
	Trace      []string
	Failovers  int
	// MaxTwoHolders is the longest time two nodes held the VIP at once.
	MaxTwoHolders time.Duration
}

// node is one simulated machine with its vipd.
type node struct {
	id        int
	name      string
	key       string
	up        bool // machine running
	running   bool // vipd running
	linkUp    bool // whole network
	vipIf     bool // VIP interface up
	healthy   bool
	brokenAcq bool // every acquire fails (netlink refusal)
	bound     bool // VIP bound in the kernel
	deleted   bool
	restartAt time.Time
	state     *cluster.Known  // the state directory (nil: none)
	stopping  bool            // a planned stop waits for its handovers
	stopAt    time.Time       // then stops at the latest
	hoPending map[string]bool // handovers the planned stop waits for

	el     *cluster.Election
	hb     *cluster.Heartbeats  // VIPD_PROFILE=fast
	mb     *cluster.MemberBeats // member beats (Options.Beats)
	beats  []cluster.BeatIn     // member beats waiting in the socket (Options.Beats)
	relay  []cluster.BeatHeard  // the relay list of its next beat
	pushed cluster.Meta         // the metadata it last pushed (Options.Beats)
	core   *vip.Core
	next   time.Time // election's next deadline
	cnext  time.Time

	heard      map[int]time.Time    // last time this node heard each other node
	meta       map[int]cluster.Meta // metadata last heard from each node
	metaAt     map[int]time.Time    // when it was taken
	exchanged  map[int]bool         // state exchanges since its start (cluster.PeerKnown)
	left       map[int]bool         // nodes seen leaving gracefully
	pending    []string             // names that left, for the next view
	keyErrAt   time.Time
	boundSince time.Time
	grewAt     time.Time
	startedAt  time.Time
}

// Sim is one simulated cluster.
type Sim struct {
	opt         Options
	rnd         *rand.Rand
	now         time.Time
	start       time.Time
	nodes       []*node
	block       map[[2]int]bool // directed: from -> to dropped
	drop        float64         // probability a gossip exchange is lost
	trace       []string
	viol        []string
	multiSince  time.Time
	noneSince   time.Time
	lastTopo    time.Time
	deletedAt   map[int]time.Time
	deletedName map[string]time.Time
	failovers   int
	lastHolder  string
	seq         int
	pendingStop []stopAt
	msgs        []simMsg
	msgLoss     float64 // probability a handover message is lost silently
	lossKind    cluster.MsgKind
	hrnd        *rand.Rand // the handover schedule's own source
	handovers   []cluster.HandoverResult
	crashOn     *crashOn
	// The failure detector's timings (Options.Fast) and the detection
	// time the invariants allow.
	suspectAfter, deadAfter, detection time.Duration
	// forget is the detection time of memberlist's own detector, from
	// which a member's expiry runs (the election forgets a member dead
	// in memberlist's view, not a silent one): the growth invariants
	// use it. metaEvery is how often metadata changes travel.
	forget, metaEvery time.Duration
	maxMulti          time.Duration // longest time with two holders
	multiStart        time.Time     // when the current one began
}

// crashOn crashes a node's vipd when a handover message of a kind is
// delivered to (or sent by) it: mid-handover crashes.
type crashOn struct {
	node string
	kind cluster.MsgKind
	send bool // when the node sends it (else when it receives it)
}

func vipHealth(h bool) vip.Event    { return vip.HealthChanged{Healthy: h, Reason: "sim"} }
func elHealth(h bool) cluster.Event { return cluster.HealthChanged{Healthy: h} }

// Run simulates one seed.
func Run(opt Options) Result {
	if opt.Nodes == 0 {
		opt.Nodes = 3
	}
	if opt.Nodes < 0 {
		opt.Nodes = 0 // the script starts every node
	}
	if opt.Duration == 0 {
		opt.Duration = 10 * time.Minute
	}
	if opt.Expiry == 0 {
		opt.Expiry = time.Minute
	}
	s := &Sim{opt: opt, rnd: rand.New(rand.NewSource(opt.Seed)), hrnd: rand.New(rand.NewSource(opt.Seed * 7919)), block: map[[2]int]bool{}, deletedAt: map[int]time.Time{}, deletedName: map[string]time.Time{}}
	s.now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.start = s.now
	s.suspectAfter, s.deadAfter, s.detection = SuspectAfter, DeadAfter, Detection
	s.forget, s.metaEvery = Detection, MetaEvery
	if opt.Beats {
		if opt.Fast {
			panic("sim: Options.Beats and Options.Fast are exclusive")
		}
		// memberlist's detector is slow; beats decide who is gone (for
		// claims and for quorum) within BeatDetection. Expiry still runs
		// from memberlist's verdict.
		s.suspectAfter, s.deadAfter, s.detection = BeatSuspectAfter, BeatDeadAfter, BeatDetection
		s.forget, s.metaEvery = BeatDeadAfter+500*time.Millisecond, BeatMetaEvery
	}
	if opt.Fast {
		// Two holders are bounded by the heartbeat's deadline where it
		// decides, by the failure detector elsewhere.
		s.detection = Detection
	}
	for i := 0; i < opt.Nodes; i++ {
		n := s.addNode(fmt.Sprintf("cp%d", i), "k")
		n.healthy = true
		s.startVipd(n, true)
	}
	s.lastTopo = s.now
	end := s.now.Add(opt.Duration)
	nextFault := s.now.Add(10 * time.Second)
	nextHandover := s.now.Add(7 * time.Second)
	script := opt.Script
	for s.now.Before(end) {
		for len(script) > 0 && !s.now.Before(s.start.Add(script[0].At)) {
			script[0].Do(s)
			s.lastTopo = s.now
			script = script[1:]
		}
		if opt.Script == nil && !s.now.Before(nextFault) {
			s.fault()
			nextFault = s.now.Add(time.Duration(2+s.rnd.Intn(12)) * time.Second)
		}
		if opt.Script == nil && !opt.NoHandovers && !s.now.Before(nextHandover) {
			s.handoverFault()
			nextHandover = s.now.Add(time.Duration(3+s.hrnd.Intn(15)) * time.Second)
		}
		s.step()
		if opt.Observe != nil {
			opt.Observe(s)
		}
	}
	// Heal everything and let the cluster settle: then exactly one holder,
	// and every member list is the set of nodes that exist.
	for _, p := range s.pendingStop {
		if !p.n.deleted {
			s.stopVipd(p.n, true)
			s.remove(p.n)
		}
	}
	s.pendingStop = nil
	s.heal()
	for settle := s.now.Add(opt.Expiry + 30*time.Second); s.now.Before(settle); {
		s.step()
	}
	s.final()
	return Result{Seed: opt.Seed, Simulated: s.now.Sub(s.start), Violations: s.viol, Trace: s.trace, Failovers: s.failovers, MaxTwoHolders: s.maxMulti}
}

func (s *Sim) logf(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", s.now.Sub(s.start).Seconds()) + fmt.Sprintf(format, args...)
	s.trace = append(s.trace, line)
	if !s.opt.Trace && len(s.trace) > 400 {
		s.trace = s.trace[len(s.trace)-300:]
	}
}

func (s *Sim) violate(format string, args ...any) {
	msg := fmt.Sprintf("%9.3fs ", s.now.Sub(s.start).Seconds()) + fmt.Sprintf(format, args...)
	s.logf("VIOLATION: %s", fmt.Sprintf(format, args...))
	if len(s.viol) < 10 {
		s.viol = append(s.viol, msg)
	}
}

// remove takes n out of the cluster for good (its machine is gone).
func (s *Sim) remove(n *node) {
	n.deleted, n.up, n.bound = true, false, false
	s.deletedAt[n.id] = s.now
	s.deletedName[n.name] = s.now
}

func (s *Sim) addNode(name, key string) *node {
	n := &node{id: len(s.nodes), name: name, key: key, up: true, linkUp: true, vipIf: true,
		heard: map[int]time.Time{}, meta: map[int]cluster.Meta{}, metaAt: map[int]time.Time{}, left: map[int]bool{}, state: &cluster.Known{Members: map[string]cluster.KnownMember{}}}
	s.nodes = append(s.nodes, n)
	return n
}

// startVipd starts (or restarts) vipd on n, with its state directory or
// without one (a wiped or new machine).
func (s *Sim) startVipd(n *node, withState bool) {
	if !withState || n.state == nil {
		n.state = &cluster.Known{Members: map[string]cluster.KnownMember{}}
	}
	n.running, n.startedAt = true, s.now
	n.stopping, n.stopAt, n.hoPending = false, time.Time{}, map[string]bool{}
	n.heard, n.meta, n.left, n.pending = map[int]time.Time{}, map[int]cluster.Meta{}, map[int]bool{}, nil
	n.metaAt = map[int]time.Time{}
	n.exchanged = map[int]bool{}
	n.hb, n.mb, n.relay = nil, nil, nil
	n.beats = nil // a new socket
	if s.opt.Fast {
		n.hb = cluster.NewHeartbeats(cluster.FastHeartbeat())
	}
	if s.opt.Beats {
		n.mb = cluster.NewMemberBeats(cluster.BeatHeartbeat(), n.name)
	}
	n.el = cluster.NewElection(cluster.ElectionConfig{Name: n.name, VIPs: []string{VIP.String()}, Peers: true, MemberExpiry: s.opt.Expiry, Beat: s.opt.Beats,
		Quorum: cluster.QuorumRule{Off: s.opt.QuorumOff}, Priority: s.opt.Priorities[n.name], PreemptDelay: s.opt.PreemptDelay}, *n.state, s.now)
	n.core = vip.New([]netip.Prefix{VIP}, vip.Options{Elect: true, Announce: true, Check: true, Jitter: time.Duration(n.id*37%500) * time.Millisecond})
	n.next, n.cnext = s.now, s.now
	s.coreStep(n, vip.Observed{VIP: VIP, Present: n.bound})
	s.coreStep(n, vip.HealthChanged{Healthy: n.healthy})
	s.elStep(n, cluster.HealthChanged{Healthy: n.healthy})
	s.logf("%s: vipd started (state dir kept: %v)", n.name, withState)
}

// stopVipd stops vipd: gracefully (release, then leave) or by a crash
// (the VIP stays bound until vipd runs again).
func (s *Sim) stopVipd(n *node, graceful bool) {
	if !n.running {
		return
	}
	if graceful {
		s.coreStep(n, vip.Shutdown{Reason: "stop"})
		for _, o := range s.nodes {
			if o != n && o.running && s.hears(o, n) {
				o.left[n.id] = true
				o.pending = append(o.pending, n.name)
			}
		}
	}
	n.running = false
	n.el, n.core = nil, nil
	s.logf("%s: vipd stopped (graceful: %v)", n.name, graceful)
}

// reach reports whether packets from a reach b directly.
func (s *Sim) reach(a, b *node) bool {
	return a.up && b.up && a.linkUp && b.linkUp && !s.block[[2]int{a.id, b.id}]
}

// hears reports whether o hears n: directly, or through a third node
// (memberlist's indirect probes and gossip relay); same key only.
func (s *Sim) hears(o, n *node) bool {
	if !n.running || !o.running || o.key != n.key {
		return false
	}
	if s.reach(n, o) {
		return true
	}
	for _, m := range s.nodes {
		if m != n && m != o && m.running && m.key == n.key && s.reach(n, m) && s.reach(m, o) {
			return true
		}
	}
	return false
}

// roundTrip reports whether o's probes of n are answered: both ways
// directly, or through a third node both can reach both ways.
func (s *Sim) roundTrip(o, n *node) bool {
	if s.reach(o, n) && s.reach(n, o) {
		return true
	}
	for _, m := range s.nodes {
		if m != n && m != o && m.running && m.key == n.key && s.reach(o, m) && s.reach(m, o) && s.reach(m, n) && s.reach(n, m) {
			return true
		}
	}
	return false
}

// step advances the simulation by one Tick.
func (s *Sim) step() {
	s.now = s.now.Add(Tick)
	gossip := s.now.Sub(s.start)%GossipEvery == 0
	meta := s.opt.Fast || s.now.Sub(s.start)%s.metaEvery == 0
	for len(s.pendingStop) > 0 && !s.now.Before(s.pendingStop[0].at) {
		n := s.pendingStop[0].n
		s.pendingStop = s.pendingStop[1:]
		if !n.deleted {
			s.stopVipd(n, true)
			s.remove(n)
			s.lastTopo = s.now
			s.logf("%s stopped gracefully and removed (replaced)", n.name)
		}
	}
	s.deliverMsgs()
	if s.opt.Beats {
		s.pushMeta()
	}
	for _, n := range s.nodes {
		if n.running && n.stopping && !s.now.Before(n.stopAt) {
			s.stopVipd(n, true)
			n.restartAt = s.now.Add(RestartDelay)
			s.logf("%s: planned stop done, restart in %v", n.name, RestartDelay)
		}
		if !n.up && n.running {
			s.stopVipd(n, false)
		}
		if n.up && !n.running && !n.deleted && !n.restartAt.IsZero() && !s.now.Before(n.restartAt) {
			n.restartAt = time.Time{}
			s.startVipd(n, true)
		}
	}
	if gossip {
		for _, o := range s.nodes {
			if !o.running {
				continue
			}
			for _, n := range s.nodes {
				if n == o || !n.running {
					continue
				}
				if n.key != o.key && s.reach(n, o) && s.rnd.Float64() < 0.2 {
					o.keyErrAt = s.now
					s.elStep(o, cluster.KeyMismatch{})
				}
				if !s.hears(o, n) || s.rnd.Float64() < s.drop {
					continue
				}
				if n.name == o.name {
					s.elStep(o, cluster.NameConflict{Addr: fmt.Sprintf("node%d", n.id)})
					continue
				}
				// The state exchange of o's first join with n (direct TCP
				// both ways) brings n's member list (cluster.PeerKnown).
				if !o.exchanged[n.id] && s.reach(o, n) && s.reach(n, o) && n.state != nil && o.el != nil {
					o.exchanged[n.id] = true
					s.elStep(o, cluster.PeerKnown{Known: cluster.Known{Members: maps.Clone(n.state.Members)}})
				}
				// Gossip (metadata) needs a path from n to o; liveness
				// needs o's probe answered: a round trip, direct or
				// through an intermediary (indirect probe).
				// Metadata changes travel with the gossip rounds, but a
				// member that (re)appears (a join's state exchange, the
				// alive message of a restarted or returning member)
				// brings its current metadata with it.
				back := o.metaAt[n.id].Before(n.startedAt) || s.now.Sub(o.heard[n.id]) >= s.deadAfter
				if meta || back {
					o.meta[n.id], o.metaAt[n.id] = n.el.Meta(), s.now
				}
				if s.roundTrip(o, n) {
					o.heard[n.id] = s.now
					delete(o.left, n.id)
				}
			}
		}
		for _, n := range s.nodes {
			if n.running {
				s.elStep(n, cluster.Tick{})
			}
		}
	}
	if s.opt.Fast {
		s.heartbeats()
	}
	if s.opt.Beats {
		s.memberBeats()
	}
	for _, n := range s.nodes {
		if !n.running {
			continue
		}
		if !n.next.IsZero() && !s.now.Before(n.next) {
			s.elStep(n, cluster.Tick{})
		}
		if (!n.cnext.IsZero() && !s.now.Before(n.cnext)) || s.now.Sub(s.start)%ReconcileTime == 0 {
			if s.now.Sub(s.start)%ReconcileTime == 0 {
				s.coreStep(n, vip.Observed{VIP: VIP, Present: n.bound})
			}
			s.coreStep(n, vip.Tick{})
		}
	}
	s.check()
}

// view is what o's memberlist reports: itself and the members it heard
// within DeadAfter (suspect after SuspectAfter); one name once.
func (s *Sim) view(o *node) ([]cluster.Member, []string) {
	ms := append([]cluster.Member{{Name: o.name, State: cluster.Alive, Meta: o.el.Meta()}}, s.others(o)...)
	left := o.pending
	o.pending = nil
	return ms, left
}

// others is o's view without o itself.
func (s *Sim) others(o *node) []cluster.Member {
	var ms []cluster.Member
	for _, id := range s.inView(o) {
		n, t := s.nodes[id], o.heard[id]
		st := cluster.Alive
		if s.now.Sub(t) >= s.suspectAfter {
			st = cluster.Suspect
		}
		ms = append(ms, cluster.Member{Name: n.name, Addr: fmt.Sprintf("node%d", n.id), State: st, Meta: o.meta[id]})
	}
	return ms
}

// inView returns the ids of the other members in o's view: heard within
// DeadAfter, not seen leaving, one node per name.
func (s *Sim) inView(o *node) []int {
	seen := map[string]bool{o.name: true}
	ids := make([]int, 0, len(o.heard))
	for id := range o.heard {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	out := ids[:0]
	for _, id := range ids {
		n := s.nodes[id]
		if o.left[id] || s.now.Sub(o.heard[id]) >= s.deadAfter || seen[n.name] {
			continue
		}
		seen[n.name] = true
		out = append(out, id)
	}
	return out
}

// elStep feeds the view and ev to n's election and carries out its output.
func (s *Sim) elStep(n *node, ev cluster.Event) {
	ms, left := s.view(n)
	out := n.el.Step(cluster.ViewChanged{Members: ms, Left: left}, s.now)
	s.elOut(n, out)
	if _, tick := ev.(cluster.Tick); n.el == nil || tick {
		return // a view change is evaluated like a tick
	}
	s.elOut(n, n.el.Step(ev, s.now))
}

func (s *Sim) elOut(n *node, out cluster.Output) {
	if out.Known != nil {
		k := cluster.Known{Members: map[string]cluster.KnownMember{}}
		for name, m := range out.Known.Members {
			k.Members[name] = m
		}
		n.state = &k
	}
	n.next = out.Next
	for _, l := range out.Logs {
		s.logf("%s: %s %v", n.name, l.Msg, l.Args)
	}
	for _, m := range out.Send {
		s.sendMsg(n, m)
	}
	for _, r := range out.Handovers {
		s.logf("%s: handover of %s to %q: ok=%v (%s)", n.name, r.VIP, r.To, r.OK, r.Reason)
		s.handovers = append(s.handovers, r)
		delete(n.hoPending, r.VIP)
	}
	if n.stopping && len(n.hoPending) == 0 {
		n.stopAt = s.now // the handovers ended: stop at the next tick
	}
	for _, d := range out.Decisions {
		s.logf("%s: decision holder=%v leader=%q lone=%v handover=%v (%s)", n.name, d.Holder, d.Leader, d.Lone, d.Handover, d.Reason)
		s.coreStep(n, vip.Elected{VIP: VIP, Holder: d.Holder, Reason: d.Reason, Lone: d.Lone,
			Handover: d.Handover, PrevHolder: d.PrevHolder, FaultAt: d.FaultAt, PrevHeardAt: d.PrevHeardAt})
		if n.el == nil {
			return
		}
	}
	for range out.Prepare {
		s.coreStep(n, vip.PrepareHandover{VIP: VIP})
		if n.el == nil {
			return
		}
	}
}

// coreStep feeds ev to n's core and carries out its actions on the
// simulated data plane, as the driver does.
func (s *Sim) coreStep(n *node, ev vip.Event) {
	if n.core == nil {
		return
	}
	out := n.core.Step(ev, s.now)
	queue := out.Actions
	trans := out.Transitions
	prepared := out.Prepared
	n.cnext = out.Next
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		var o vip.Output
		if err := s.do(n, a); err != nil {
			o = n.core.Step(vip.Failed{Action: a, Err: err}, s.now)
		} else {
			o = n.core.Step(vip.Done{Action: a}, s.now)
		}
		queue = append(queue, o.Actions...)
		trans = append(trans, o.Transitions...)
		prepared = append(prepared, o.Prepared...)
		n.cnext = o.Next
	}
	for _, p := range prepared {
		ev := cluster.Prepared{VIP: VIP.String()}
		if p.Err != nil {
			ev.Err = p.Err.Error()
		}
		s.elStep(n, ev)
		if n.el == nil {
			return
		}
	}
	for _, t := range trans {
		s.logf("%s: core held=%v failed=%v (%s)", n.name, t.Held, t.Failed, t.Cause)
		switch {
		case t.Failed:
			s.elStep(n, cluster.AcquireFailed{VIP: VIP.String(), Reason: t.Cause})
		default:
			s.elStep(n, cluster.HoldingChanged{VIP: VIP.String(), Held: t.Held})
		}
		if n.el == nil {
			return
		}
	}
}

// answering reports whether n answers for the VIP on the segment.
func answering(n *node) bool { return n.up && n.linkUp && n.vipIf && n.bound }

// holding reports whether n holds the VIP: it answers (l2), or, without a
// data-plane probe (cloud, where an assign moves the IP), its vipd
// believes it holds it and would move it back.
func (s *Sim) holding(n *node) bool {
	if !s.opt.NoProbe {
		return answering(n)
	}
	return n.up && n.running && n.core != nil && n.core.State()[0].Held
}

// do carries out one core action on the data plane.
func (s *Sim) do(n *node, a vip.Action) error {
	other := func() *node {
		if s.opt.NoProbe {
			return nil
		}
		for _, o := range s.nodes {
			// A probe takes ProbeWindow: a node that bound within it is
			// not seen (two acquires in one window both bind).
			if o != n && answering(o) && s.now.Sub(o.boundSince) >= ProbeWindow {
				return o
			}
		}
		return nil
	}
	switch a.Kind {
	case vip.Acquire:
		if !n.linkUp || !n.vipIf {
			return fmt.Errorf("eth0: %w", vip.ErrLinkDown)
		}
		if n.brokenAcq {
			return errors.New("netlink: operation not permitted")
		}
		if s.opt.NoProbe {
			// Cloud: an assign moves the IP; a lone node does not take an
			// IP another instance holds (cloud.Announcer.AcquireLone).
			for _, o := range s.nodes {
				if o != n && o.bound && o.up {
					if a.Lone {
						return fmt.Errorf("assigned to node%d: %w", o.id, errHeldElsewhere)
					}
					o.bound = false
				}
			}
		}
		// A handover's acquire binds without the probe (l2's
		// AcquireHandover): the invariants check that this is safe.
		if o := other(); o != nil && !n.bound && !a.Handover {
			return &vip.ConflictError{VIP: VIP.Addr(), MAC: mac(o.id)}
		}
		if !n.bound {
			n.boundSince = s.now
		}
		n.bound = true
	case vip.Release:
		n.bound = false
	case vip.Prepare:
		if !n.linkUp || !n.vipIf {
			return fmt.Errorf("eth0: %w", vip.ErrLinkDown)
		}
	case vip.Check:
		if !n.linkUp || !n.vipIf {
			return fmt.Errorf("eth0: %w", vip.ErrLinkDown)
		}
		if o := other(); a.Probe && o != nil {
			return &vip.ConflictError{VIP: VIP.Addr(), MAC: mac(o.id)}
		}
	}
	return nil
}

var errHeldElsewhere = errors.New("held by another instance")

func mac(id int) net.HardwareAddr { return net.HardwareAddr{2, 0, 0, 0, 0, byte(id)} }

// members is the ground truth: nodes that exist (not deleted) and use the
// cluster's key.
func (s *Sim) members() []*node {
	var out []*node
	for _, n := range s.nodes {
		if !n.deleted && n.key == "k" {
			out = append(out, n)
		}
	}
	return out
}

// check asserts the invariants after a step.
func (s *Sim) check() {
	var holders []string
	for _, n := range s.nodes {
		if s.holding(n) {
			holders = append(holders, n.name)
		}
		// No stale VIP: a running vipd whose core does not hold the VIP
		// has it bound for at most a reconcile period.
		if n.running && n.bound && n.core != nil && !n.core.State()[0].Held && s.now.Sub(n.boundSince) > 2*ReconcileTime && n.linkUp && n.vipIf {
			st := n.core.State()[0]
			if s.now.Sub(st.Last.At) > 2*ReconcileTime {
				s.violate("stale VIP on %s: bound while its vipd does not hold it", n.name)
				n.boundSince = s.now // report once a period
			}
		}
	}
	h := strings.Join(holders, ",")
	if len(holders) == 1 && h != s.lastHolder {
		if s.lastHolder != "" {
			s.failovers++
		}
		s.lastHolder = h
	}
	// Safety: never two holders longer than one detection time.
	if len(holders) > 1 {
		if s.multiSince.IsZero() {
			s.multiSince = s.now
			s.logf("two holders: %s", h)
		}
		if s.multiStart.IsZero() {
			s.multiStart = s.now
		}
		s.maxMulti = max(s.maxMulti, s.now.Sub(s.multiStart))
		if s.now.Sub(s.multiSince) > s.detection {
			s.violate("%d holders (%s) for %v", len(holders), h, s.now.Sub(s.multiSince))
			s.multiSince = s.now
		}
	} else {
		s.multiSince, s.multiStart = time.Time{}, time.Time{}
	}
	// Liveness: a majority of healthy, mutually connected, correctly keyed
	// members, stable for detection + 1 s, has a holder.
	if len(holders) == 0 && s.majorityStable() {
		if s.noneSince.IsZero() {
			s.noneSince = s.now
		}
		if s.now.Sub(s.noneSince) > s.detection+time.Second {
			s.violate("no holder for %v although a healthy connected majority exists:\n%s", s.now.Sub(s.noneSince), s.Status())
			s.noneSince = s.now
		}
	} else {
		s.noneSince = time.Time{}
	}
	// No unbounded growth: a node with quorum stops counting a member that
	// no longer exists within the expiry of its deletion (or of the node's
	// own start, when it was down meanwhile).
	exist := map[string]bool{}
	for _, n := range s.members() {
		exist[n.name] = true
	}
	for _, n := range s.nodes {
		if !n.running || n.key != "k" || n.el == nil || s.now.Sub(n.grewAt) < time.Minute {
			continue
		}
		for _, name := range n.state.Names() {
			if exist[name] {
				continue
			}
			t := s.deletedName[name]
			if n.startedAt.After(t) {
				t = n.startedAt
			}
			if s.now.Sub(t) > s.opt.Expiry+s.forget+10*time.Second && n.el.Status(s.now).Quorum.OK {
				n.grewAt = s.now
				s.violate("%s still counts %s, deleted %v ago", n.name, name, s.now.Sub(t))
			}
		}
	}
}

// majorityStable reports whether, since the last topology change plus a
// settling time, a majority of the members are able and mutually
// connected: the condition under which a holder is guaranteed.
func (s *Sim) majorityStable() bool {
	if s.now.Sub(s.lastTopo) < 2*time.Second {
		return false
	}
	// Deleted members still count until the others forget them.
	total := len(s.members())
	for _, t := range s.deletedAt {
		if s.now.Sub(t) < s.opt.Expiry+s.forget+5*time.Second {
			total++
		}
	}
	var able []*node
	names := map[string]int{}
	for _, n := range s.members() {
		names[n.name]++
	}
	for _, n := range s.members() {
		// A node that saw a name clash stays out until it sees every
		// known member again (cluster.ConflictHold): not able.
		if n.running && n.up && n.linkUp && n.vipIf && n.healthy && !n.brokenAcq && names[n.name] == 1 &&
			n.el.Status(s.now).NameConflict == "" {
			able = append(able, n)
		}
	}
	// The largest mutually connected group of able nodes.
	var best []*node
	for _, a := range able {
		group := []*node{a}
		for _, b := range able {
			if b == a {
				continue
			}
			ok := true
			for _, g := range group {
				if !s.reach(g, b) || !s.reach(b, g) {
					ok = false
				}
			}
			if ok {
				group = append(group, b)
			}
		}
		if len(group) > len(best) {
			best = group
		}
	}
	if len(best) <= total/2 {
		return false
	}
	// A node alone in its member list that hears a vipd with another
	// gossip key does not hold the VIP alone (cluster.KeyVeto: it may be
	// the one cut off from the real cluster by a wrong key): no holder
	// is due until the operator removes the foreign node or fixes a key.
	if len(best) == 1 && len(best[0].state.Members) <= 1 {
		for _, o := range s.nodes {
			if o.running && o.up && o.linkUp && o.key != best[0].key && (s.reach(o, best[0]) || s.reach(best[0], o)) {
				return false
			}
		}
	}
	// The protocol's own precondition: the group is a majority of every
	// member list among it. It fails only after more than a minority of a
	// node's members vanished without a leave it heard (documented: the
	// rest then wait for "vipd forget").
	for _, g := range best {
		in := 0
		for _, o := range best {
			if _, ok := g.state.Members[o.name]; ok {
				in++
			}
		}
		if len(g.state.Members) > 1 && in <= len(g.state.Members)/2 {
			return false
		}
	}
	return true
}

// final checks the healed, settled cluster.
func (s *Sim) final() {
	var holders []string
	for _, n := range s.nodes {
		if s.holding(n) {
			holders = append(holders, n.name)
		}
	}
	if s.majorityStable() && len(holders) != 1 {
		s.violate("after healing: %d holders (%v)", len(holders), holders)
	}
	// Every member list of a node with quorum holds only nodes that exist.
	exist := map[string]bool{}
	for _, n := range s.members() {
		exist[n.name] = true
	}
	for _, n := range s.members() {
		if n.el == nil || !n.el.Status(s.now).Quorum.OK {
			continue
		}
		for _, name := range n.state.Names() {
			if !exist[name] {
				s.violate("after healing: %s still counts %s, which no longer exists", n.name, name)
			}
		}
	}
}

// heal ends every fault: links up, partitions gone, nodes healthy and
// running, duplicate and foreign nodes stopped.
func (s *Sim) heal() {
	s.block = map[[2]int]bool{}
	s.drop = 0
	names := map[string]bool{}
	for _, n := range s.nodes {
		if n.deleted {
			continue
		}
		if n.key != "k" || names[n.name] {
			// The operator removes the impostor.
			s.stopVipd(n, true)
			s.remove(n)
			continue
		}
		names[n.name] = true
		n.up, n.linkUp, n.vipIf, n.healthy, n.brokenAcq = true, true, true, true, false
		if !n.running {
			s.startVipd(n, true)
		} else {
			s.coreStep(n, vip.HealthChanged{Healthy: true})
			s.elStep(n, cluster.HealthChanged{Healthy: true})
		}
	}
	s.lastTopo = s.now
	s.logf("healed")
}

// Status is every running node's election status, for debugging a trace.
func (s *Sim) Status() string {
	var b strings.Builder
	for _, n := range s.nodes {
		if n.el != nil {
			st := n.el.Status(s.now)
			fmt.Fprintf(&b, "%s(node%d): quorum %+v known %v\n", n.name, n.id, st.Quorum, st.Known)
		}
	}
	return b.String()
}

// Scripting helpers for scenario tests.

// Node returns the first node (not removed) with this name.
func (s *Sim) Node(name string) *node {
	for _, n := range s.nodes {
		if n.name == name && !n.deleted {
			return n
		}
	}
	return nil
}

// Join starts a new healthy node (empty state directory) with a key.
func (s *Sim) Join(name, key string) {
	n := s.addNode(name, key)
	n.healthy = true
	s.startVipd(n, false)
}

// StopAndRemove stops a node's vipd gracefully, then its machine is gone.
func (s *Sim) StopAndRemove(name string) {
	n := s.Node(name)
	s.stopVipd(n, true)
	s.remove(n)
}

// Delete removes a node's machine without a stop.
func (s *Sim) Delete(name string) {
	n := s.Node(name)
	s.stopVipd(n, false)
	s.remove(n)
}

// Holders returns the nodes answering for the VIP.
func (s *Sim) Holders() []string {
	var out []string
	for _, n := range s.nodes {
		if s.holding(n) {
			out = append(out, fmt.Sprintf("%s(node%d)", n.name, n.id))
		}
	}
	return out
}

// Known returns the member list of the running node with this name.
func (s *Sim) Known(name string) []string { return s.Node(name).state.Names() }

// SetVIPInterface sets a node's VIP interface up or down.
func (s *Sim) SetVIPInterface(name string, up bool) { s.Node(name).vipIf = up }

// SetAcquireBroken makes every acquire of a node fail (or work again).
func (s *Sim) SetAcquireBroken(name string, broken bool) { s.Node(name).brokenAcq = broken }

// Now is the simulated time since the start.
func (s *Sim) Now() time.Duration { return s.now.Sub(s.start) }

// heartbeats runs the holder heartbeat of VIPD_PROFILE=fast: every
// claimant sends one each interval, directly to the nodes it reaches (no
// relay), lost like gossip; each node watches the claimants in its view
// and feeds the verdicts of its tracker into its election.
func (s *Sim) heartbeats() {
	hb := cluster.FastHeartbeat()
	if s.now.Sub(s.start)%hb.Interval == 0 {
		for _, n := range s.nodes {
			if !n.running || n.el == nil || len(n.el.Meta().Holding) == 0 {
				continue
			}
			for _, o := range s.nodes {
				if o == n || !o.running || o.hb == nil || o.key != n.key || !s.reach(n, o) || s.rnd.Float64() < s.drop {
					continue
				}
				for _, ev := range o.hb.HeardTerm(n.name, max(n.el.Meta().Term, 1), s.now) {
					s.logf("%s: heartbeat verdict %+v", o.name, ev)
					s.elStep(o, ev)
				}
			}
		}
	}
	for _, o := range s.nodes {
		if !o.running || o.hb == nil {
			continue
		}
		var claimants []string
		for id, t := range o.heard {
			n := s.nodes[id]
			if !o.left[id] && s.now.Sub(t) < s.deadAfter && n.name != o.name && len(o.meta[id].Holding) > 0 {
				claimants = append(claimants, n.name)
			}
		}
		sort.Strings(claimants)
		evs := append(o.hb.Watch(claimants, s.now), o.hb.Expire(s.now)...)
		for _, ev := range evs {
			s.logf("%s: heartbeat verdict %+v", o.name, ev)
			if o.el == nil {
				break
			}
			s.elStep(o, ev)
		}
	}
}

// metaHash stands for cluster.MetaHash of a node's encoded metadata: the
// sim compares decoded metadata, so any stable digest of it will do.
func metaHash(m cluster.Meta) uint32 {
	b, err := json.Marshal(m)
	if err != nil {
		return 0
	}
	return cluster.MetaHash(b)
}

// pushMeta models Node.pushLoop (member beats): a node whose metadata
// changed pings every member of its view at once, and each ping carries
// the change with it (memberlist piggybacks its queued broadcasts): it
// needs a path from the node, and is lost with the gossip drop rate. The
// receiver's election sees it at once.
func (s *Sim) pushMeta() {
	for _, n := range s.nodes {
		if !n.running || n.el == nil {
			continue
		}
		m := n.el.Meta()
		if reflect.DeepEqual(m, n.pushed) {
			continue
		}
		n.pushed = m
		for _, id := range s.inView(n) {
			o := s.nodes[id]
			if !o.running || o.el == nil || o.key != n.key || !s.hears(o, n) || s.rnd.Float64() < s.drop {
				continue
			}
			o.meta[n.id], o.metaAt[n.id] = m, s.now
			s.elStep(o, cluster.Tick{})
		}
	}
}

// memberBeats runs the member beats (Options.Beats), as the beat socket's
// loop does (cluster/heartbeat.go runBeats): every node watches the other
// members of its view that take beats (Meta.Beat), whenever its view may
// have changed; on each grid tick (a multiple of the interval: the
// members' clocks agree) it first reads the beats queued in its socket
// since the last tick, then reports the members silent for their
// deadline, then sends its own beat (its term while it claims a VIP, else
// 0) to every member of its view that takes beats. A beat goes directly
// (no relay): it needs a direct link, is lost with the gossip drop rate,
// and one under another gossip key (or carrying the receiver's own name)
// is not heard. Sent on tick k, it is read on tick k+1.
func (s *Sim) memberBeats() {
	hb := cluster.BeatHeartbeat()
	grid := s.now.Sub(s.start)%hb.Interval == 0
	for _, o := range s.nodes {
		if !o.running || o.mb == nil {
			continue
		}
		var watch []cluster.BeatMember
		for _, m := range s.others(o) {
			if m.Meta.Beat {
				watch = append(watch, cluster.BeatMember{Name: m.Name, Meta: metaHash(m.Meta)})
			}
		}
		evs := o.mb.Watch(watch, s.now)
		var pull []string
		if grid {
			t := o.mb.Tick(s.now, o.beats)
			evs, o.relay, pull = append(evs, t.Events...), t.Heard, t.Pull
			o.beats = nil
		}
		for _, ev := range evs {
			if o.el == nil {
				break
			}
			s.logf("%s: beat verdict %+v", o.name, ev)
			s.elStep(o, ev)
		}
		// A pull is a state exchange over TCP with the member: it needs
		// the direct link both ways. It brings the member's metadata and
		// what it has of the others (memberlist's push/pull carries every
		// member's state; the newer incarnation wins: here, the copy
		// taken later).
		for _, name := range pull {
			for _, id := range s.inView(o) {
				n := s.nodes[id]
				if n.name != name || !n.running || n.el == nil || !s.reach(o, n) || !s.reach(n, o) {
					continue
				}
				s.logf("%s: pulled %s's state (its beats or relays carry other metadata)", o.name, n.name)
				o.meta[n.id], o.metaAt[n.id] = n.el.Meta(), s.now
				for mid, at := range n.metaAt {
					if mid != o.id && mid != n.id && at.After(o.metaAt[mid]) {
						o.meta[mid], o.metaAt[mid] = n.meta[mid], at
					}
				}
				if o.el != nil {
					s.elStep(o, cluster.Tick{})
				}
			}
		}
	}
	if !grid {
		return
	}
	for _, n := range s.nodes {
		if !n.running || n.el == nil {
			continue
		}
		for _, id := range s.inView(n) {
			o := s.nodes[id]
			if !n.meta[id].Beat || !o.running || !s.reach(n, o) || s.rnd.Float64() < s.drop {
				continue
			}
			if o.key != n.key || o.name == n.name {
				continue // fails the receiver's MAC check, or its own name
			}
			o.beats = append(o.beats, cluster.BeatIn{Name: n.name, Meta: metaHash(n.el.Meta()), Heard: n.relay})
		}
	}
}
