package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/internal/gridclock"
)

// The holder heartbeat (VIPD_PROFILE=fast), and the glue of the member
// heartbeats (the default profile: HeartbeatConfig.Members, MemberBeats,
// beatsock.go).
//
// memberlist notices a dead member only after its probe rounds and the
// suspicion time (about 0.8 to 1.2 s with DefaultTimings). With a heartbeat
// configured, a node that claims a VIP also sends a small message to every
// member each Interval, directly (not gossiped), as a memberlist user
// message: with a gossip key it is encrypted and authenticated like all
// gossip, and a message under another key is dropped by memberlist before
// vipd sees it. A member that hears nothing from a claimant for Misses
// intervals feeds HolderSilent into its Election, which then treats the
// claimant as dead and elects a new holder at once. A heartbeat heard again
// withdraws the verdict.
//
// What the heartbeat trades: a holder whose heartbeats are lost (a loaded
// or partitioned network) is replaced although it may still answer. In l2
// mode the successor's ARP/NDP probe sees the old holder answering and
// refuses to bind; the old holder gives the VIP up when it sees the
// successor's higher term. So a false verdict costs a failover, never two
// holders beyond one detection time (cluster/sim checks this).

// HeartbeatConfig is the holder heartbeat. A zero Interval turns it off.
type HeartbeatConfig struct {
	Interval time.Duration
	Misses   int
	// Members: every member sends heartbeats to every member on the
	// gossip port's beat socket (beatsock.go), on a clock-aligned grid,
	// and reads the queued ones once per Interval; every member is
	// watched, so a silent member also stops counting for quorum.
	Members bool
}

// Deadline is how long a claimant may stay silent.
func (c HeartbeatConfig) Deadline() time.Duration { return time.Duration(c.Misses) * c.Interval }

// Profile names, as VIPD_PROFILE takes them.
const (
	ProfileDefault = "default"
	ProfileFast    = "fast"
)

// FastTimings are the memberlist timings of VIPD_PROFILE=fast: the
// failure detector of DefaultTimings (the heartbeat does the quick
// detection of a silent holder; a tighter detector only declared loaded
// nodes dead in the lab) and quicker gossip of metadata, so that claims
// and releases reach the others sooner.
func FastTimings() Timings {
	t := DefaultTimings()
	t.GossipInterval = 20 * time.Millisecond
	t.PushPullInterval = 10 * time.Second
	return t
}

// FastHeartbeat is the heartbeat of VIPD_PROFILE=fast: a silent holder is
// replaced after 4 x 40 ms = 160 ms.
func FastHeartbeat() HeartbeatConfig {
	return HeartbeatConfig{Interval: 40 * time.Millisecond, Misses: 4}
}

// TimingsFor returns the timings and heartbeat of a profile (default:
// member heartbeats, fast: the holder heartbeat).
func TimingsFor(profile string) (Timings, HeartbeatConfig) {
	if profile == ProfileFast {
		return FastTimings(), FastHeartbeat()
	}
	return BeatTimings(), BeatHeartbeat()
}

// BeatTimings are the default profile's memberlist timings, next to member
// heartbeats: memberlist keeps the membership at a slow pace (a probe
// every 5 s), the heartbeats detect.
func BeatTimings() Timings {
	t := DefaultTimings()
	t.ProbeInterval = 5 * time.Second
	t.ProbeTimeout = 500 * time.Millisecond
	// Metadata changes are pushed to every member at once (Node.pushLoop:
	// one transmission each, N-1 of them), a member whose beats carry
	// metadata it has not seen is asked for its state (MemberBeats), and
	// the gossip round is only a backstop: every 5 s. A broadcast may be
	// sent 6 x ceil(log10(N+1)) times, so it still goes out with a round.
	t.GossipInterval = 5 * time.Second
	t.RetransmitMult = 6
	return t
}

// BeatHeartbeat is the default profile's member heartbeat: a member with
// no sign of life for 3 x 250 ms is taken as gone.
func BeatHeartbeat() HeartbeatConfig {
	return HeartbeatConfig{Interval: 250 * time.Millisecond, Misses: 3, Members: true}
}

// HolderSilent tells the Election that a member claiming a VIP stopped
// (Silent) or resumed sending heartbeats. A silent member counts as dead
// for the election (its claims and its vote) until it is heard again.
type HolderSilent struct {
	Name   string
	Silent bool
}

func (HolderSilent) isElectionEvent() {}

// silence applies a HolderSilent to the election.
func (e *Election) silence(ev HolderSilent, out *Output) {
	if ev.Name == e.cfg.Name {
		return
	}
	if e.silent == nil {
		e.silent = map[string]bool{}
	}
	switch {
	case ev.Silent && !e.silent[ev.Name]:
		e.silent[ev.Name] = true
		out.log(true, "holder heartbeats stopped: taking it as gone without waiting for the failure detector", "member", ev.Name)
	case !ev.Silent && e.silent[ev.Name]:
		delete(e.silent, ev.Name)
		out.log(false, "holder heartbeats resumed", "member", ev.Name)
	}
}

// Heartbeats is the pure tracker of the claimants' heartbeats on one
// node: which members it expects heartbeats from, when it last heard each,
// and which are silent. Each method returns the HolderSilent events to feed
// into the Election.
//
// The deadline adapts to a loaded host: it is at least twice the largest
// recent gap between two heartbeats of that claimant (a gap raises it at
// once, it shrinks back over some seconds of regular heartbeats), between
// the configured deadline and MaxDeadlineFactor times it. A holder that
// stalled once is not replaced for the next, similar stall; a quiet
// cluster keeps the configured deadline.
type Heartbeats struct {
	cfg    HeartbeatConfig
	last   map[string]time.Time     // watched claimants: last heard (or armed)
	gap    map[string]time.Duration // recent largest gap between heartbeats, decaying
	term   map[string]uint64        // the term of the claimant's last heartbeat (HeardTerm)
	silent map[string]bool
}

// MaxDeadlineFactor bounds how far a claimant's deadline stretches after
// irregular heartbeats.
const MaxDeadlineFactor = 4

// gapDecay is how slowly the remembered gap shrinks: by 1/gapDecay of its
// excess over each regular gap (at 40 ms, a 250 ms gap stretches the
// deadline for about 6 s).
const gapDecay = 128

// NewHeartbeats returns a tracker; with a zero config it never reports.
func NewHeartbeats(cfg HeartbeatConfig) *Heartbeats {
	return &Heartbeats{cfg: cfg, last: map[string]time.Time{}, gap: map[string]time.Duration{}, term: map[string]uint64{}, silent: map[string]bool{}}
}

// Deadline is how long name may be silent now.
func (h *Heartbeats) Deadline(name string) time.Duration {
	d := max(h.cfg.Deadline(), 2*h.gap[name])
	return min(d, MaxDeadlineFactor*h.cfg.Deadline())
}

// Watch sets the members expected to send heartbeats (the other members
// that claim a VIP in this node's view). A new claimant gets a full
// deadline from now; a member that no longer claims anything is dropped,
// and if it was silent that verdict is withdrawn (it no longer matters
// for its claims, and must not keep it out of the vote).
func (h *Heartbeats) Watch(claimants []string, now time.Time) []HolderSilent {
	if h.cfg.Interval <= 0 {
		return nil
	}
	var out []HolderSilent
	want := map[string]bool{}
	for _, n := range claimants {
		want[n] = true
		if _, ok := h.last[n]; !ok {
			h.last[n] = now
		}
	}
	for _, n := range slices.Sorted(maps.Keys(h.last)) {
		if want[n] {
			continue
		}
		delete(h.last, n)
		delete(h.gap, n)
		delete(h.term, n)
		if h.silent[n] {
			delete(h.silent, n)
			out = append(out, HolderSilent{Name: n, Silent: false})
		}
	}
	return out
}

// Heard records a heartbeat from name. Heartbeats from members that claim
// nothing in this node's view are ignored (the claim may not have reached
// this node yet: it is armed when it does).
func (h *Heartbeats) Heard(name string, now time.Time) []HolderSilent {
	return h.HeardTerm(name, 0, now)
}

// HeardTerm records a heartbeat from name that carries the sender's term
// (0: unknown, as Heard). Only gaps between heartbeats of one claim teach
// the deadline: the wait from arming to a claim's first heartbeat, and
// the pause of a claimant that released and claimed again (a new term),
// are not stalls, and learning them stretched the next failover's
// detection (a holder re-elected after a failed acquire was then replaced
// after 640 ms instead of 160 ms in the lab).
func (h *Heartbeats) HeardTerm(name string, term uint64, now time.Time) []HolderSilent {
	if _, ok := h.last[name]; !ok {
		return nil
	}
	learn := true
	if term != 0 {
		learn = h.term[name] == term
		h.term[name] = term
	}
	if g := now.Sub(h.last[name]); g > 0 {
		switch cur := h.gap[name]; {
		case !learn:
		case g > cur:
			h.gap[name] = g
		default:
			h.gap[name] = cur - (cur-g)/gapDecay
		}
		h.last[name] = now
	}
	if h.silent[name] {
		delete(h.silent, name)
		return []HolderSilent{{Name: name, Silent: false}}
	}
	return nil
}

// Expire reports the watched claimants silent for the deadline.
func (h *Heartbeats) Expire(now time.Time) []HolderSilent {
	var out []HolderSilent
	for _, n := range slices.Sorted(maps.Keys(h.last)) {
		if !h.silent[n] && now.Sub(h.last[n]) >= h.Deadline(n) {
			h.silent[n] = true
			out = append(out, HolderSilent{Name: n, Silent: true})
		}
	}
	return out
}

// Next is when Expire may next report something (zero: nothing watched).
func (h *Heartbeats) Next() time.Time {
	var next time.Time
	for n, t := range h.last {
		if h.silent[n] {
			continue
		}
		d := t.Add(h.Deadline(n))
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next
}

// Stalled tells the tracker that this node itself did not run from since
// to now (its timer fired that late): heartbeats that arrived meanwhile
// wait unread in the socket, so no claimant is found silent before it had
// one more interval from now to be read.
func (h *Heartbeats) Stalled(since, now time.Time) {
	if now.Sub(since) <= h.cfg.Interval {
		return
	}
	for n, t := range h.last {
		floor := now.Add(h.cfg.Interval - h.Deadline(n))
		if !h.silent[n] && t.Before(floor) {
			h.last[n] = floor
		}
	}
}

// Silent returns the watched claimants currently silent, sorted.
func (h *Heartbeats) Silent() []string { return slices.Sorted(maps.Keys(h.silent)) }

// Heartbeat wire format: a magic byte, a version, the sender's term (8
// bytes) and its name. It travels inside memberlist's (encrypted) packets.
const (
	heartbeatMagic   = 0xb7
	heartbeatVersion = 1
	heartbeatMaxName = 255
)

func encodeHeartbeat(name string, term uint64) []byte {
	b := make([]byte, 0, 10+len(name))
	b = append(b, heartbeatMagic, heartbeatVersion)
	b = binary.BigEndian.AppendUint64(b, term)
	return append(b, name...)
}

var errNotHeartbeat = errors.New("not a heartbeat")

func decodeHeartbeat(b []byte) (name string, term uint64, err error) {
	if len(b) < 11 || b[0] != heartbeatMagic || b[1] != heartbeatVersion || len(b)-10 > heartbeatMaxName {
		return "", 0, errNotHeartbeat
	}
	return string(b[10:]), binary.BigEndian.Uint64(b[2:10]), nil
}

// heartbeat is the Node's heartbeat glue: the sender (while this node
// claims a VIP) and the tracker fed by memberlist's NotifyMsg.
type heartbeat struct {
	cfg      HeartbeatConfig
	sock     *beatSocket // Members mode
	codec    *beatCodec  // Members mode: beat MACs under the derived keys
	msgs     []beatMsg   // Members mode: decode slots, reused
	targets  []netip.AddrPort
	replay   beatReplay
	seq      uint64
	log      *slog.Logger
	readErr  bool // the last drain failed (logged once)
	sendErr  bool // the last send failed for a member (logged once)
	mu       sync.Mutex
	hb       *Heartbeats
	mb       *MemberBeats      // Members mode
	in       []BeatIn          // Members mode: the beats read this tick
	addrs    map[string]string // Members mode: gossip address by member name
	metaHash uint32            // Members mode: MetaHash of this node's metadata
	pull     func(addr string) // Members mode: ask a member for its state
	term     uint64            // this node's term while it claims a VIP, 0 when it claims none
	wake     chan struct{}
}

func newHeartbeat(cfg HeartbeatConfig, self string) *heartbeat {
	h := &heartbeat{cfg: cfg, hb: NewHeartbeats(cfg), wake: make(chan struct{}, 1)}
	if cfg.Members {
		h.mb = NewMemberBeats(cfg, self)
	}
	return h
}

func (h *heartbeat) on() bool { return h != nil && h.cfg.Interval > 0 }

// silentMembers returns the members the member heartbeats found silent
// (nil without member heartbeats).
func (h *heartbeat) silentMembers() map[string]bool {
	if h == nil || h.mb == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]bool{}
	for _, n := range h.mb.Silent() {
		out[n] = true
	}
	return out
}

// update is called by Node.step with the current view: it watches the
// other claimants and sends whether this node claims anything.
func (h *heartbeat) update(self string, view []Member, own Meta, ownHash uint32, now time.Time) []HolderSilent {
	if !h.on() {
		return nil
	}
	var claimants []string
	var watch []BeatMember
	var targets []netip.AddrPort
	addrs := map[string]string{}
	for _, m := range view {
		if m.Name == self || (m.State != Alive && m.State != Suspect) {
			continue
		}
		if h.cfg.Members {
			if !m.Meta.Beat {
				continue // an older version, or another profile: memberlist's detector only
			}
			if ap, err := netip.ParseAddrPort(m.Addr); err == nil {
				targets = append(targets, ap)
			}
			watch = append(watch, BeatMember{Name: m.Name, Meta: m.MetaHash})
			addrs[m.Name] = m.Addr
		} else if len(m.Meta.Holding) > 0 {
			claimants = append(claimants, m.Name)
		}
	}
	term := uint64(0)
	if len(own.Holding) > 0 {
		term = max(own.Term, 1)
	}
	h.mu.Lock()
	if h.mb != nil {
		// Sends and checks on its grid, whatever it claims: no wake-up.
		h.term, h.targets, h.addrs, h.metaHash = term, targets, addrs, ownHash
		out := h.mb.Watch(watch, now)
		h.mu.Unlock()
		return out
	}
	before := len(h.hb.last)
	out := h.hb.Watch(claimants, now)
	changed := len(h.hb.last) != before || len(out) > 0
	started := h.term == 0 && term != 0
	h.term = term
	h.mu.Unlock()
	if started || changed {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return out
}

// heard is called from memberlist's NotifyMsg.
func (h *heartbeat) heard(msg []byte, self string, now time.Time) ([]HolderSilent, bool) {
	name, term, err := decodeHeartbeat(msg)
	if err != nil || name == self {
		return nil, err == nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hb.HeardTerm(name, term, now), true
}

// run sends heartbeats while this node claims a VIP and reports silent
// claimants through report, until ctx is done.
func (h *heartbeat) run(ctx context.Context, ml *memberlist.Memberlist, self string, report func(HolderSilent), sent prometheus.Counter) {
	if !h.on() {
		return
	}
	if h.sock != nil {
		h.runBeats(ctx, self, report, sent)
		return
	}
	timer := time.NewTimer(h.cfg.Interval)
	defer timer.Stop()
	due := time.Now().Add(h.cfg.Interval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-h.wake:
		}
		now := time.Now()
		h.mu.Lock()
		h.hb.Stalled(due, now)
		term := h.term
		lost := h.hb.Expire(now)
		next := h.hb.Next()
		h.mu.Unlock()
		for _, ev := range lost {
			report(ev)
		}
		wait := time.Duration(0)
		if term != 0 {
			msg := encodeHeartbeat(self, term)
			for _, m := range ml.Members() {
				if m.Name != self {
					if ml.SendBestEffort(m, msg) == nil { // best effort: a lost heartbeat is what the misses allow for
						sent.Inc()
					}
				}
			}
			wait = h.cfg.Interval
		}
		if !next.IsZero() {
			if d := time.Until(next); wait == 0 || d < wait {
				wait = max(d, time.Millisecond)
			}
		}
		if wait == 0 {
			wait = time.Hour // nothing to send or watch: woken by update
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		due = time.Now().Add(wait)
	}
}

type hbMetrics struct {
	mHBSent   prometheus.Counter
	mHBSilent *prometheus.CounterVec
}

func newHBMetrics() hbMetrics {
	return hbMetrics{
		mHBSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_cluster_heartbeats_sent_total", Help: "Heartbeats sent to members, one per member: every member's every 250 ms (default profile), a holder's every 40 ms (VIPD_PROFILE=fast); best effort.",
		}),
		mHBSilent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_cluster_holder_silent_total", Help: "Times a member stopped sending heartbeats and was taken as gone for the election (default profile: any member; VIPD_PROFILE=fast: a member claiming a VIP).",
		}, []string{"member"}),
	}
}

// heartbeatSilent counts and forwards a heartbeat verdict to the election.
func (n *Node) heartbeatSilent(ev HolderSilent) {
	if ev.Silent {
		n.mHBSilent.WithLabelValues(ev.Name).Inc()
	}
	n.send(ev)
}

// runBeats is run in Members mode: on every multiple of the interval
// (wall clock, so that the members' ticks coincide when their clocks
// agree and a tick's reading, sending and probing share one wake-up) it
// reads the beats queued since the last tick, reports members silent for
// their deadline, and sends its own beat to every member that takes them.
func (h *heartbeat) runBeats(ctx context.Context, self string, report func(HolderSilent), sent prometheus.Counter) {
	defer h.sock.Close()
	iv := h.cfg.Interval
	wait := h.beatWait(ctx, iv)
	for {
		if !wait() {
			return
		}
		now := time.Now()
		h.mu.Lock()
		h.in = h.in[:0]
		err := h.sock.drain(func(pkt []byte, _ netip.AddrPort) {
			if len(h.in) == len(h.msgs) {
				h.msgs = append(h.msgs, beatMsg{})
			}
			m := &h.msgs[len(h.in)] // its Heard array is reused, one per slot
			if h.codec.decode(pkt, m) != nil || m.Name == self || !h.replay.fresh(*m) {
				return
			}
			h.in = append(h.in, BeatIn{Name: m.Name, Meta: m.Meta, Heard: m.Heard})
		})
		t := h.mb.Tick(now, h.in)
		evs := t.Events
		h.seq = nextSeq(h.seq, now.UnixNano())
		msg, _ := h.codec.encode(beatMsg{Name: self, Term: h.term, Seq: h.seq, Meta: h.metaHash, Heard: t.Heard})
		targets := h.targets
		var pulls []string
		for _, name := range t.Pull {
			if a, ok := h.addrs[name]; ok {
				pulls = append(pulls, a)
			}
		}
		h.mu.Unlock()
		for _, a := range pulls {
			if h.pull != nil {
				h.pull(a)
			}
		}
		if (err != nil) != h.readErr {
			h.readErr = err != nil
			if err != nil {
				h.log.Warn("member heartbeats cannot be read", "err", err)
			} else {
				h.log.Info("member heartbeats read again")
			}
		}
		for _, ev := range evs {
			report(ev)
		}
		n, err := h.sock.sendAll(msg, targets)
		sent.Add(float64(n))
		if (err != nil) != h.sendErr {
			h.sendErr = err != nil
			if err != nil {
				h.log.Warn("member heartbeats cannot be sent to every member", "err", err)
			}
		}
	}
}

// beatWait returns the wait for the next tick of runBeats (a gridclock
// timerfd, or a Go timer if that cannot be had). It returns false once ctx
// is done.
func (h *heartbeat) beatWait(ctx context.Context, iv time.Duration) func() bool {
	wait, _ := gridclock.Ticker(ctx, iv, func(err error) {
		h.log.Warn("member heartbeat clock", "err", err)
	})
	return wait
}
