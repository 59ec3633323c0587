package cluster

import (
	"hash/fnv"
	"maps"
	"slices"
	"time"
)

// MemberBeats is the pure tracker of member heartbeats (HeartbeatConfig
// Members; beatsock.go carries them): every member sends a beat to every
// member on a clock-aligned grid and reads the queued ones once per tick.
// A watched member with no evidence of life for Misses intervals is
// silent: the Election takes it as dead, for its claims and for quorum.
//
// Evidence is a beat read from the member (stamped with the read time,
// like the lazy read itself), or a relay: every beat lists the members its
// sender read a beat from in its last two ticks, with how many ticks ago
// (0 or 1), and a mention of age a counts as a beat read a+1 intervals
// before the mention is read (it waited in the socket for at most an
// interval). A relay is therefore never fresher than the sender's own
// read, and a member that stops beating is silent as soon through relays
// as directly. Relays are one hop: a sender lists only what
// it read itself. They do for member beats what memberlist's indirect
// probes do for its pings: when the link between two members fails but
// both still reach a third, neither takes the other as dead. Without them
// each would elect itself over the other (cluster/sim: two holders for as
// long as the cut lasts). A member that nobody hears, the holder whose
// link went down, is silent for everyone after the same Misses intervals.
//
// The deadline does not stretch (as the holder heartbeat's does): a
// stretched deadline would keep counting a member for quorum, and let a
// cut-off minority claim (cluster/sim found it). A node's own late tick
// is allowed for instead (Tick), since the beats wait in its socket.
type MemberBeats struct {
	cfg     HeartbeatConfig
	last    map[string]time.Time // watched members: last evidence (or when watched)
	direct  map[string]int       // ticks since a beat was read from the member (-1: none yet)
	silent  map[string]bool
	byHash  map[uint64]string
	have    map[string]uint32 // MetaHash of the metadata this node has of each member
	stale   map[string]int    // beats in a row that carried other metadata
	rstale  map[string]int    // ticks in a row whose relays carried other metadata
	self    uint64            // BeatHash of this node's name (0: not checked)
	heard   time.Time         // when a member last read this node's beat, by the relays (or watching began)
	unheard bool              // no member has read this node's beats for the deadline
	ran     time.Time         // the last tick's run
	names   []string          // the watched members, sorted (the order of verdicts)
	relays  []BeatHeard       // the last tick's relay list (reused)
}

// BeatMember is a member to watch, with the hash of the metadata this
// node's view has of it (MetaHash; 0: unknown, never stale).
type BeatMember struct {
	Name string
	Meta uint32
}

// BeatTick is what a tick found.
type BeatTick struct {
	Events []HolderSilent
	Heard  []BeatHeard // the relay list of this node's own beat
	// Pull names the members whose beat carried metadata other than this
	// node's view has of them (again every 8 more beats that do):
	// a claim or a release did not reach this node (the push and the
	// gossip were lost). The Node asks them for their state at once.
	// It also names a member whose relay carried, for a member this node
	// hears only through relays, metadata other than this node's: the
	// relaying member has the newer state of the one this node cannot
	// reach directly (memberlist's state exchange brings every member's).
	Pull []string
}

// staleBeats is how many beats in a row must disagree with the view
// before a pull, staleEvery how often the pull is repeated while they
// still disagree. One is enough: a beat read at a tick was sent after the
// push of the change it announces, which arrives first unless it was lost
// (and then the pull is what brings the change).
const (
	staleBeats = 1
	staleEvery = 8
)

// BeatIn is a beat read from the socket.
type BeatIn struct {
	Name  string
	Meta  uint32      // MetaHash of its sender's metadata
	Heard []BeatHeard // the members its sender read lately
}

// MetaHash is the hash of a node's encoded metadata that beats carry
// (FNV-32a of the bytes memberlist gossips; 0 is "unknown").
func MetaHash(encoded []byte) uint32 {
	if len(encoded) == 0 {
		return 0
	}
	h := fnv.New32a()
	h.Write(encoded)
	return max(h.Sum32(), 1)
}

// BeatHeard is a relay: a member (BeatHash of its name) whose beat the
// sender read Age ticks before it sent this one, and the MetaHash of the
// metadata the sender has of it (0: unknown).
type BeatHeard struct {
	Hash uint64
	Age  uint8
	Meta uint32
}

// BeatHash names a member in a beat's relay list.
func BeatHash(name string) uint64 {
	h := uint64(14695981039346656037) // FNV-1a, 64 bits (hash/fnv's New64a, without its allocation)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

// beatRelayTicks is how many of its last ticks a sender lists a member
// read in: the last two, so that a beat that arrived just after one read
// still reaches the list.
const beatRelayTicks = 2

// NewMemberBeats returns the tracker of the node named self for cfg
// (Interval and Misses).
//
// A member is alive for the election only while the two hear each other,
// as memberlist's probes (a round trip) require: a node whose own beats
// are listed in no member's relay list for twice the deadline
// (unheardMult; its packets do not get out, while it still reads
// everyone's) takes every member as silent. Otherwise it would keep its
// quorum on one-way evidence, and, with metadata nobody can refresh (a
// pull needs both ways), claim a VIP that another holds (cluster/sim found
// it). An empty self turns the check off (tests of the other rules).
func NewMemberBeats(cfg HeartbeatConfig, self string) *MemberBeats {
	m := &MemberBeats{cfg: cfg, last: map[string]time.Time{}, direct: map[string]int{}, silent: map[string]bool{}, byHash: map[uint64]string{},
		have: map[string]uint32{}, stale: map[string]int{}, rstale: map[string]int{}}
	if self != "" {
		m.self = BeatHash(self)
	}
	return m
}

// Deadline is how long a member may be without evidence.
func (m *MemberBeats) Deadline() time.Duration { return m.cfg.Deadline() }

// Watch sets the members expected to beat. A new one gets a full deadline
// from now; one no longer watched is dropped, and a silent verdict on it
// withdrawn (it no longer matters, and must not keep it out of the vote
// should it come back as another incarnation).
func (m *MemberBeats) Watch(members []BeatMember, now time.Time) []HolderSilent {
	var out []HolderSilent
	want := map[string]bool{}
	changed := false
	for _, bm := range members {
		n := bm.Name
		want[n] = true
		if m.have[n] != bm.Meta {
			m.stale[n], m.rstale[n] = 0, 0
		}
		m.have[n] = bm.Meta
		if _, ok := m.last[n]; !ok {
			m.last[n] = now
			m.direct[n] = -1
			m.byHash[BeatHash(n)] = n
			changed = true
		}
	}
	for _, n := range m.names {
		if want[n] {
			continue
		}
		delete(m.last, n)
		delete(m.direct, n)
		delete(m.have, n)
		delete(m.stale, n)
		delete(m.rstale, n)
		delete(m.byHash, BeatHash(n))
		changed = true
		if m.silent[n] {
			delete(m.silent, n)
			out = append(out, HolderSilent{Name: n, Silent: false})
		}
	}
	if changed {
		if len(m.names) == 0 {
			m.heard = now // a full deadline to be heard
		}
		m.names = slices.Sorted(maps.Keys(m.last))
	}
	return out
}

// Tick is one grid tick, run at now: it takes the beats read from the
// socket, reports the members that became silent or were heard again, and
// returns the relay list for this node's own beat.
func (m *MemberBeats) Tick(now time.Time, in []BeatIn) BeatTick {
	var t BeatTick
	iv := m.cfg.Interval
	if !m.ran.IsZero() && now.Sub(m.ran) > 2*iv {
		// This node did not run for a while: what was sent meanwhile
		// waits unread, and is read now. Nobody is found silent before
		// it had one more interval to be read.
		floor := now.Add(iv - m.Deadline())
		for n, t := range m.last {
			if !m.silent[n] && t.Before(floor) {
				m.last[n] = floor
			}
		}
		if !m.unheard && m.heard.Before(floor) {
			m.heard = floor
		}
	}
	m.ran = now
	for n, a := range m.direct {
		if a >= 0 {
			m.direct[n] = a + 1
		}
	}
	for _, b := range in {
		if _, ok := m.last[b.Name]; !ok {
			continue // not (yet) a member this node watches
		}
		m.last[b.Name] = now
		m.direct[b.Name] = 0
		if b.Meta == 0 || m.have[b.Name] == 0 || b.Meta == m.have[b.Name] {
			m.stale[b.Name] = 0
			continue
		}
		m.stale[b.Name]++
		if k := m.stale[b.Name]; k == staleBeats || (k > staleBeats && (k-staleBeats)%staleEvery == 0) {
			t.Pull = append(t.Pull, b.Name)
		}
	}
	// Relays: evidence of life, and of metadata this node may lack. A
	// member read directly in the last ticks speaks for itself (above: a
	// relaying member may well have older metadata of it); for one heard
	// only through others, a relay that carries other metadata than this
	// node's view names who to pull from.
	var from map[string]string // member -> the first relay that disagrees
	for _, b := range in {
		if _, ok := m.last[b.Name]; !ok {
			continue
		}
		for _, h := range b.Heard {
			if h.Age >= beatRelayTicks {
				continue // never sent: older evidence is not relayed
			}
			if h.Hash == m.self && m.self != 0 {
				// b reads this node's beats: evidence as old as a relay's.
				if at := now.Add(-time.Duration(h.Age+1) * iv); m.heard.Before(at) {
					m.heard = at
				}
				continue
			}
			n, ok := m.byHash[h.Hash]
			if !ok || n == b.Name {
				continue
			}
			if relayed := now.Add(-time.Duration(h.Age+1) * iv); m.last[n].Before(relayed) {
				m.last[n] = relayed
			}
			if h.Meta != 0 && m.have[n] != 0 && h.Meta != m.have[n] && !m.heardLately(n) && from[n] == "" {
				if from == nil {
					from = map[string]string{}
				}
				from[n] = b.Name
			}
		}
	}
	for n, k := range m.rstale {
		if from[n] == "" && k != 0 {
			m.rstale[n] = 0
		}
	}
	for _, n := range m.names {
		r := from[n]
		if r == "" {
			continue
		}
		m.rstale[n]++
		if k := m.rstale[n]; (k == staleBeats || (k > staleBeats && (k-staleBeats)%staleEvery == 0)) && !slices.Contains(t.Pull, r) {
			t.Pull = append(t.Pull, r)
		}
	}
	m.relays = m.relays[:0]
	m.unheard = m.self != 0 && len(m.names) > 0 && now.Sub(m.heard) >= unheardMult*m.Deadline()
	for _, n := range m.names {
		quiet := m.unheard || now.Sub(m.last[n]) >= m.Deadline()
		switch {
		case quiet && !m.silent[n]:
			m.silent[n] = true
			t.Events = append(t.Events, HolderSilent{Name: n, Silent: true})
		case !quiet && m.silent[n]:
			delete(m.silent, n)
			t.Events = append(t.Events, HolderSilent{Name: n, Silent: false})
		}
		if a := m.direct[n]; a >= 0 && a < beatRelayTicks {
			m.relays = append(m.relays, BeatHeard{Hash: BeatHash(n), Age: uint8(a), Meta: m.have[n]})
		}
	}
	if len(m.relays) > 0 {
		t.Heard = m.relays // valid until the next Tick
	}
	return t
}

// unheardMult stretches the deadline for "nobody reads this node": the
// evidence is thinner than for a member's life (only beats that list this
// node, where a member's life is shown by its own beats and every relay of
// it), and a verdict takes every member at once. With the plain deadline,
// 50 % packet loss in a 3-node cluster cost a node its quorum every few
// seconds (cluster/sim, no holder for seconds).
const unheardMult = 2

// heardLately reports whether a beat was read from n in this tick or the
// last beatRelayTicks.
func (m *MemberBeats) heardLately(n string) bool {
	a := m.direct[n]
	return a >= 0 && a <= beatRelayTicks
}

// Silent returns the watched members currently silent, sorted.
func (m *MemberBeats) Silent() []string { return slices.Sorted(maps.Keys(m.silent)) }
