// Package sim is the strict simulator of the lease machine
// (cluster/lease): many nodes on one fake true clock, each with its own
// clock rate within the drift bound, a network that loses, delays,
// reorders and duplicates messages, one-way and non-transitive link
// faults, partitions, gossip (View) relayed over any path, crashes with and
// without persisted state, hard deletions, graceful leaves, witnesses,
// health flaps and transfers.
//
// The invariant is strict: at no instant of true time do two nodes of one
// cluster hold the same address. A node holds an address from the Output
// that lists it until the earlier of its lease end (converted to true time
// through the node's clock) or the Output that drops it; a node that
// crashes keeps holding until its lease end (nobody released the address).
// The only exceptions: two clusters that bootstrapped apart and have not
// merged yet (the l2 probe is the fence then): holders in different
// clusters are not compared; and a planned transfer's make-before-break
// overlap, accepted only when both holders' last Outputs declared it
// (Output.Overlaps, each naming the other, each window covering the whole
// overlap) and the overlap lasts at most Overlap/(1-Drift) of true time.
package sim

import (
	"container/heap"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// Sim is one deterministic run.
type Sim struct {
	Cfg   lease.Config // profile timings; Name/Role/Priority per node
	rnd   *rand.Rand
	rndH  *rand.Rand // Held delays (own source: the schedules' draws stay as they were)
	epoch time.Time
	now   time.Time // true time
	q     queue
	seq   uint64

	nodes map[string]*Node
	names []string

	block map[[2]string]bool // a -> b dropped
	Loss  float64
	Dup   float64
	Delay [2]time.Duration // uniform delay range

	want []lease.Address

	holds      map[string]map[string]holdRec // key -> node -> record
	Violations []string
	trace      []string
	TraceAll   bool
	Steps      int

	lastFault time.Duration
	NoteCount map[string]int      // how often each decision was noted
	legacy    map[string][]string // old-protocol members and the addresses they claim

	// Observers
	OnHold func(key, node string, at time.Time)
	// Overlaps: the length of every accepted make-before-break overlap
	// (from the second holder's start to the first release).
	Overlaps []time.Duration
	ovOpen   map[string]ovRec // key -> the running overlap
	// NoHeld: the runtime never reports a bind (Held) with this
	// probability (a successor whose bind fails: the overlap ends at its
	// bound).
	NoHeld float64
}

type ovRec struct {
	a, b       string
	start, end time.Time // end: the earlier of the two holds' ends when accepted
}

// ovClose ends key's open overlap at the first of its holders' ends (or at
// now, when one released now).
func (s *Sim) ovClose(key string, releasedNow bool) {
	o, ok := s.ovOpen[key]
	if !ok {
		return
	}
	end := s.now
	if o.end.Before(end) {
		end = o.end
	}
	if !releasedNow {
		ra, rb := s.holds[key][o.a], s.holds[key][o.b]
		end = ra.end
		if rb.end.Before(end) {
			end = rb.end
		}
		if o.end.Before(end) {
			end = o.end
		}
		if end.After(s.now) {
			return // both still hold
		}
	}
	s.Overlaps = append(s.Overlaps, end.Sub(o.start))
	delete(s.ovOpen, key)
}

type holdRec struct {
	end     time.Time // true time
	cluster uint64
	since   time.Time
}

// Node is one simulated machine.
type Node struct {
	Name      string
	Role      lease.Role
	Priority  int
	Healthy   bool
	Up        bool
	Deleted   bool
	Persisted []byte
	saved     []savedState // the states saved lately, oldest first (Rollback)
	rate      float64
	lbase     time.Time // local clock reading at tbase
	tbase     time.Time
	m         *lease.Machine
	timerGen  uint64
	meta      []byte
	lastView  string
	inc       uint64
	Notes     []lease.Note
	claims    string
	viewSeq   uint64
	viewSeen  uint64
	ovs       map[string]lease.Overlap // the last Output's overlaps, Until in true time
}

type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// New returns a simulator with the given profile timings and seed.
func New(cfg lease.Config, seed int64) *Sim {
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Sim{
		Cfg:   cfg,
		rnd:   rand.New(rand.NewSource(seed)),
		rndH:  rand.New(rand.NewSource(seed ^ 0x5eed)),
		epoch: epoch,
		now:   epoch,
		nodes: map[string]*Node{},
		block: map[[2]string]bool{},
		holds: map[string]map[string]holdRec{},
		Delay: [2]time.Duration{200 * time.Microsecond, 2 * time.Millisecond},
	}
	return s
}

// Now is the simulated true time since the start.
func (s *Sim) Now() time.Duration { return s.now.Sub(s.epoch) }

// Rand is the run's random source (faults draw from it).
func (s *Sim) Rand() *rand.Rand { return s.rnd }

func (s *Sim) logf(format string, a ...any) {
	if strings.HasPrefix(format, "FAULT") {
		s.lastFault = s.Now()
	}
	line := fmt.Sprintf("%9.3fs ", s.now.Sub(s.epoch).Seconds()) + fmt.Sprintf(format, a...)
	s.trace = append(s.trace, line)
	if !s.TraceAll && len(s.trace) > 400 {
		s.trace = s.trace[len(s.trace)-300:]
	}
}

// Trace returns the last trace lines.
func (s *Sim) Trace() string { return strings.Join(s.trace, "\n") }

func (s *Sim) at(t time.Time, fn func()) {
	s.seq++
	heap.Push(&s.q, &event{at: t, seq: s.seq, fn: fn})
}

// After runs fn at now+d (true time).
func (s *Sim) After(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

// maxQueued bounds the events in flight: a healthy cluster of any size
// the schedules build keeps a few thousand; past this the nodes answer
// each other without end (a message storm) and the schedule fails rather
// than running out of memory.
const maxQueued = 200000

// Run advances true time by d.
func (s *Sim) Run(d time.Duration) {
	end := s.now.Add(d)
	for s.q.Len() > 0 {
		if s.q.Len() > maxQueued {
			s.Violations = append(s.Violations, fmt.Sprintf("at %v: message storm: %d events queued; the run stops here", s.Now(), s.q.Len()))
			s.logf("STORM %d events queued", s.q.Len())
			s.q = s.q[:0]
			break
		}
		e := s.q[0]
		if e.at.After(end) {
			break
		}
		heap.Pop(&s.q)
		if e.at.After(s.now) {
			s.now = e.at
		}
		e.fn()
	}
	s.now = end
}

// Want sets the addresses every node must place.
func (s *Sim) Want(addrs []lease.Address) {
	s.want = append([]lease.Address(nil), addrs...)
	for _, name := range s.names {
		if n := s.nodes[name]; n.Up {
			s.step(n, lease.Want{Addresses: s.want})
		}
	}
}

func (n *Node) local(t time.Time) time.Time {
	return n.lbase.Add(time.Duration(float64(t.Sub(n.tbase)) * n.rate))
}

func (n *Node) trueOf(l time.Time) time.Time {
	return n.tbase.Add(time.Duration(float64(l.Sub(n.lbase)) / n.rate))
}

// NodeOpts configures AddNode.
type NodeOpts struct {
	Role        lease.Role
	Priority    int
	ExpectPeers bool
	Unhealthy   bool
}

// AddNode starts a new machine without state.
func (s *Sim) AddNode(name string, o NodeOpts) *Node {
	d := s.Cfg.Drift
	rate := 1 - d + 2*d*s.rnd.Float64()
	n := &Node{Name: name, Role: o.Role, Priority: o.Priority, Healthy: !o.Unhealthy, rate: rate, tbase: s.now,
		lbase: s.epoch.Add(time.Duration(s.rnd.Int63n(int64(time.Hour))))}
	if _, ok := s.nodes[name]; !ok {
		s.names = append(s.names, name)
	}
	s.nodes[name] = n
	s.start(n, nil, o.ExpectPeers)
	return n
}

// Node returns a node by name.
func (s *Sim) Node(name string) *Node { return s.nodes[name] }

// AddTwin starts a machine that calls itself claims (another machine
// with a name already in use); the simulator routes messages for claims to
// the original, so the twin only ever sends.
func (s *Sim) AddTwin(simName, claims string) *Node {
	n := s.AddNode(simName, NodeOpts{ExpectPeers: true})
	n.claims = claims
	s.start(n, nil, true)
	return n
}

func (s *Sim) cfgFor(n *Node, expect bool) lease.Config {
	c := s.Cfg
	c.Name = n.Name
	if n.claims != "" {
		c.Name = n.claims
	}
	c.Role = n.Role
	c.Priority = n.Priority
	c.ExpectPeers = expect
	n.inc++
	c.Incarnation = uint64(s.rnd.Int63()) | 1
	return c
}

func (s *Sim) start(n *Node, persisted []byte, expect bool) {
	m, err := lease.New(s.cfgFor(n, expect), persisted, n.local(s.now))
	if err != nil {
		s.Violations = append(s.Violations, fmt.Sprintf("%s: New: %v", n.Name, err))
		return
	}
	n.m = m
	n.Up = true
	n.ovs = nil
	n.Persisted = persisted
	n.lastView = ""
	s.logf("%s starts (state=%v)", n.Name, persisted != nil)
	if n.Role == lease.Voter {
		s.step(n, lease.Health{Healthy: n.Healthy})
	}
	s.step(n, lease.Want{Addresses: s.want})
	s.gossip()
}

// savedState is one state a node saved, at a true time.
type savedState struct {
	at   time.Time
	data []byte
}

// keepSaved is how many saved states a node remembers for Rollback.
const keepSaved = 64

// Rollback crashes a node and restarts it after restartAfter from the
// last state it had saved at least back before now (its oldest
// remembered one if none is that old): a VM reverted to a snapshot, a
// state directory restored from a backup.
func (s *Sim) Rollback(name string, back, restartAfter time.Duration) {
	n := s.nodes[name]
	if n == nil || !n.Up {
		return
	}
	old := n.Persisted
	for _, st := range n.saved {
		if s.now.Sub(st.at) < back {
			break
		}
		old = st.data
	}
	if len(n.saved) > 0 && s.now.Sub(n.saved[0].at) < back {
		old = n.saved[0].data
	}
	s.Crash(name, true, restartAfter) // it restarts from n.Persisted
	n.Persisted = old
	s.logf("FAULT %s's state goes back %v", name, back)
}

// Crash stops a node's process without a clean stop; it restarts after
// delay (negative: never) with its persisted state or wiped.
func (s *Sim) Crash(name string, keepState bool, restartAfter time.Duration) {
	n := s.nodes[name]
	if n == nil || !n.Up {
		return
	}
	n.Up = false
	n.m = nil
	n.timerGen++
	s.logf("FAULT %s crashes (keep state=%v, restart in %v)", name, keepState, restartAfter)
	if !keepState {
		n.Persisted = nil
	}
	s.gossip()
	if restartAfter >= 0 {
		s.After(restartAfter, func() {
			if n.Deleted || n.Up {
				return
			}
			s.start(n, n.Persisted, true)
		})
	}
}

// Delete powers a machine off for good (no clean stop, link gone).
func (s *Sim) Delete(name string) {
	n := s.nodes[name]
	if n == nil {
		return
	}
	s.Crash(name, false, -1)
	n.Deleted = true
	s.logf("FAULT %s deleted", name)
}

// Leave stops a node gracefully: it hands over and leaves the configuration.
func (s *Sim) Leave(name string) {
	n := s.nodes[name]
	if n == nil || !n.Up {
		return
	}
	s.logf("%s leaves", name)
	s.step(n, lease.Leave{})
}

// SetHealthy flips a node's apiserver health.
func (s *Sim) SetHealthy(name string, h bool) {
	n := s.nodes[name]
	if n == nil {
		return
	}
	n.Healthy = h
	if n.Up && n.Role == lease.Voter {
		s.logf("%s healthy=%v", name, h)
		s.step(n, lease.Health{Healthy: h})
	}
}

// Transfer asks node name for a planned handover.
func (s *Sim) Transfer(name, to string) {
	n := s.nodes[name]
	if n == nil || !n.Up {
		return
	}
	s.logf("%s handover to %q", name, to)
	s.step(n, lease.Transfer{To: to})
}

// Forget runs vipd forget on node name.
func (s *Sim) Forget(name, target string) {
	n := s.nodes[name]
	if n == nil || !n.Up {
		return
	}
	s.step(n, lease.Forget{Name: target})
}

// Block drops messages a -> b (one way).
func (s *Sim) Block(a, b string) {
	s.block[[2]string{a, b}] = true
	s.logf("FAULT %s -> %s blocked", a, b)
}

// Cut drops messages both ways between a and b.
func (s *Sim) Cut(a, b string) { s.Block(a, b); s.Block(b, a) }

// Partition splits the nodes into groups (nodes not listed are alone).
func (s *Sim) Partition(groups ...[]string) {
	side := map[string]int{}
	for i, g := range groups {
		for _, n := range g {
			side[n] = i + 1
		}
	}
	for _, a := range s.names {
		for _, b := range s.names {
			if a != b && (side[a] == 0 || side[a] != side[b]) {
				s.block[[2]string{a, b}] = true
			}
		}
	}
	s.logf("FAULT partition %v", groups)
	s.gossip()
}

// Heal removes every link fault, loss and duplication.
func (s *Sim) Heal() {
	s.block = map[[2]string]bool{}
	s.Loss, s.Dup = 0, 0
	s.logf("FAULT healed")
	s.gossip()
}

func (s *Sim) step(n *Node, ev lease.Event) {
	if !n.Up || n.m == nil {
		return
	}
	s.Steps++
	out := n.m.Step(n.local(s.now), ev)
	s.apply(n, out)
}

func (s *Sim) apply(n *Node, out lease.Output) {
	for _, note := range out.Notes {
		if s.NoteCount == nil {
			s.NoteCount = map[string]int{}
		}
		s.NoteCount[note.Msg]++
		if s.TraceAll || !strings.HasPrefix(note.Msg, "refused a vote") {
			s.logf("%s: %s %v", n.Name, note.Msg, note.Attrs)
		}
	}
	if out.Persist != nil {
		n.Persisted = out.Persist
		n.saved = append(n.saved, savedState{at: s.now, data: out.Persist})
		if len(n.saved) > keepSaved {
			n.saved = slices.Delete(n.saved, 0, len(n.saved)-keepSaved)
		}
	}
	n.ovs = map[string]lease.Overlap{}
	for k, o := range out.Overlaps {
		o.Until = n.trueOf(o.Until)
		n.ovs[k] = o
	}
	if fresh := s.checkHolds(n, out.Holds); len(fresh) > 0 {
		s.held(n, fresh)
	}
	for _, msg := range out.Send {
		s.send(n.Name, msg)
	}
	if out.Meta != nil {
		n.meta = out.Meta
		s.gossip()
	}
	n.timerGen++
	gen := n.timerGen
	next := n.trueOf(out.Next)
	if !next.After(s.now) {
		next = s.now.Add(time.Microsecond)
	}
	s.at(next, func() {
		if n.timerGen == gen && n.Up {
			s.step(n, lease.Tick{})
		}
	})
}

// held reports keys bound and announced (lease.Held) after the runtime's
// bind time, unless the bind "fails" (NoHeld).
func (s *Sim) held(n *Node, keys []string) {
	if s.NoHeld > 0 && s.rndH.Float64() < s.NoHeld {
		return
	}
	inc := n.inc
	d := 300*time.Microsecond + time.Duration(s.rndH.Int63n(int64(3*time.Millisecond)))
	s.After(d, func() {
		if n.Up && n.inc == inc {
			s.step(n, lease.Held{Keys: keys})
		}
	})
}

// overlapOK: n and o both hold key over [start, end) of true time; allowed
// only as a planned transfer's overlap both declared, within the bound.
func (s *Sim) overlapOK(n, o *Node, key string, start, end time.Time) bool {
	const slack = time.Microsecond
	dn, okn := n.ovs[key]
	do, oko := o.ovs[key]
	if !okn || !oko || dn.With != o.Name || do.With != n.Name || dn.Old == do.Old {
		return false
	}
	if dn.Until.Add(slack).Before(end) || do.Until.Add(slack).Before(end) {
		return false
	}
	return end.Sub(start) <= OverlapBound(s.Cfg)+slack
}

// OverlapBound is the longest a planned transfer's make-before-break may
// last in true time: the old holder keeps the address at most cfg.Overlap
// on its own clock, which may run slow by up to cfg.Drift (300 ms of a
// default-profile node's clock is up to 303.03 ms of true time).
func OverlapBound(cfg lease.Config) time.Duration {
	return time.Duration(float64(cfg.Overlap) / (1 - cfg.Drift))
}

func (s *Sim) checkHolds(n *Node, h map[string]time.Time) []string {
	var freshKeys []string
	cluster := n.m.ClusterID()
	for key, recs := range s.holds {
		if _, ok := h[key]; !ok {
			if r, ok := recs[n.Name]; ok && r.end.After(s.now) {
				r.end = s.now
				recs[n.Name] = r
				s.logf("%s releases %s", n.Name, key)
				if o, ok := s.ovOpen[key]; ok && (o.a == n.Name || o.b == n.Name) {
					s.ovClose(key, true)
				}
			}
		}
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		end := n.trueOf(h[key])
		if !end.After(s.now) {
			continue
		}
		s.ovClose(key, false)
		recs := s.holds[key]
		if recs == nil {
			recs = map[string]holdRec{}
			s.holds[key] = recs
		}
		prev, had := recs[n.Name]
		fresh := !had || !prev.end.After(s.now)
		for o, r := range recs {
			if o == n.Name || !r.end.After(s.now) || r.cluster != cluster {
				continue
			}
			nSince := s.now
			if !fresh {
				nSince = prev.since
			}
			start := maxTime(r.since, nSince)
			ovEnd := end
			if r.end.Before(ovEnd) {
				ovEnd = r.end
			}
			if s.overlapOK(n, s.nodes[o], key, start, ovEnd) {
				if _, open := s.ovOpen[key]; !open {
					if s.ovOpen == nil {
						s.ovOpen = map[string]ovRec{}
					}
					s.ovOpen[key] = ovRec{a: n.Name, b: o, start: start, end: ovEnd}
					s.logf("%s and %s overlap on %s (planned, %v at most)", n.Name, o, key, ovEnd.Sub(start))
				}
				continue
			}
			v := fmt.Sprintf("at %v: %s and %s both hold %s (%s until %v)", s.Now(), n.Name, o, key, o, r.end.Sub(s.epoch))
			s.logf("VIOLATION %s", v)
			s.Violations = append(s.Violations, v)
		}
		since := s.now
		if !fresh {
			since = prev.since
		}
		recs[n.Name] = holdRec{end: end, cluster: cluster, since: since}
		if fresh {
			freshKeys = append(freshKeys, key)
			s.logf("%s holds %s", n.Name, key)
			if s.OnHold != nil {
				s.OnHold(key, n.Name, s.now)
			}
		}
	}
	return freshKeys
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *Sim) send(from string, msg lease.Message) {
	to := s.nodes[msg.To]
	if to == nil || s.block[[2]string{from, msg.To}] {
		return
	}
	copies := 1
	if s.Loss > 0 && s.rnd.Float64() < s.Loss {
		copies = 0
	}
	if copies == 1 && s.Dup > 0 && s.rnd.Float64() < s.Dup {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		d := s.Delay[0] + time.Duration(s.rnd.Int63n(int64(s.Delay[1]-s.Delay[0])+1))
		data := msg.Data
		s.After(d, func() {
			if !to.Up || s.block[[2]string{from, to.Name}] {
				return
			}
			if s.TraceAll {
				s.logf("deliver %s -> %s (%d bytes) %s", from, to.Name, len(data), lease.Describe(data))
			}
			s.step(to, lease.Receive{From: from, Data: data})
		})
	}
}

// reach: nodes b that a can gossip with over any path of working links
// (memberlist relays), both ways.
func (s *Sim) reach(a string) map[string]bool {
	seen := map[string]bool{a: true}
	stack := []string{a}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, y := range s.names {
			ny := s.nodes[y]
			if seen[y] || !ny.Up || s.block[[2]string{x, y}] || s.block[[2]string{y, x}] {
				continue
			}
			seen[y] = true
			stack = append(stack, y)
		}
	}
	return seen
}

// gossip delivers a fresh View to every node whose view changed, after a
// gossip delay.
func (s *Sim) gossip() {
	for _, name := range s.names {
		n := s.nodes[name]
		if !n.Up {
			continue
		}
		r := s.reach(name)
		var ms []lease.Member
		var sb strings.Builder
		for _, o := range s.names {
			on := s.nodes[o]
			if on.Deleted && !r[o] {
				continue
			}
			alive := r[o] && on.Up
			ms = append(ms, lease.Member{Name: o, Alive: alive, Meta: on.meta})
			fmt.Fprintf(&sb, "%s:%v:%s;", o, alive, on.meta)
		}
		for _, o := range sortedNames(s.legacy) {
			ms = append(ms, lease.Member{Name: o, Alive: true, Meta: []byte("old"), Claims: s.legacy[o]})
			fmt.Fprintf(&sb, "%s:legacy:%v;", o, s.legacy[o])
		}
		key := sb.String()
		if key == n.lastView {
			continue
		}
		n.lastView = key
		d := 5*time.Millisecond + time.Duration(s.rnd.Int63n(int64(20*time.Millisecond)))
		n.viewSeq++
		seq := n.viewSeq
		s.After(d, func() {
			// memberlist converges: an older view never replaces a newer one
			if seq > n.viewSeen {
				n.viewSeen = seq
				s.step(n, lease.View{Members: ms})
			}
		})
	}
}

// Holders: nodes holding key now (true time).
func (s *Sim) Holders(key string) []string {
	var out []string
	for n, r := range s.holds[key] {
		if r.end.After(s.now) && s.nodes[n].Up {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// HeldSince: how long key has been held by its current single holder.
func (s *Sim) HeldSince(key string) (string, time.Duration) {
	h := s.Holders(key)
	if len(h) != 1 {
		return "", 0
	}
	return h[0], s.now.Sub(s.holds[key][h[0]].since)
}

// Status of a node (zero if down).
func (s *Sim) Status(name string) lease.Status {
	n := s.nodes[name]
	if n == nil || n.m == nil {
		return lease.Status{}
	}
	return n.m.Status()
}

// Names of all nodes ever added.
func (s *Sim) Names() []string { return append([]string(nil), s.names...) }

// Up lists the nodes whose process runs.
func (s *Sim) Up() []string {
	var out []string
	for _, n := range s.names {
		if s.nodes[n].Up {
			out = append(out, n)
		}
	}
	return out
}

// Legacy makes an old-protocol member (the previous release) appear in
// every node's View claiming keys; nil claims removes it.
func (s *Sim) Legacy(name string, claims []string) {
	if s.legacy == nil {
		s.legacy = map[string][]string{}
	}
	if claims == nil {
		delete(s.legacy, name)
	} else {
		s.legacy[name] = claims
	}
	s.logf("legacy member %s claims %v", name, claims)
	s.gossip()
}

func sortedNames(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
