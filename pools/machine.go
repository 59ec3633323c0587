package pools

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// Defaults of Config.
const (
	// HandoverWait is how long a node that becomes an address's holder
	// while the previous holder is still alive and eligible (a node
	// joined, the address's eligible nodes changed) waits for that holder
	// to release, when it does not probe. With the probe (l2) it probes at
	// once and again every ProbeRetry while the old holder answers.
	HandoverWait = time.Second
	// JoinSettle is how long a member must have been in the view before
	// it counts as a candidate: a joining node (which takes nothing during
	// its StartupWait) is ready before the others hand it its share.
	JoinSettle = StartupWait + 500*time.Millisecond
	// StartupWait is how long after start a node leaves addresses alone:
	// its view of the cluster settles (memberlist joins) before it takes
	// or drops anything, including addresses a previous run left bound.
	StartupWait = 2 * time.Second
	// ProbeRetry is the pause before probing again when the probe was
	// answered during a hand-over (the previous holder has not released
	// yet).
	ProbeRetry = 250 * time.Millisecond
	// ConflictGrace is how long after a hand-over an answered probe is
	// taken for the previous holder, not for a conflict.
	ConflictGrace = 3 * time.Second
	// ConflictRetry is how often an address in conflict is probed again.
	ConflictRetry = 5 * time.Second
	// FailRetry is the pause after a failed bind or advertisement.
	FailRetry = time.Second
	// Burst, BurstSpacing and Refresh shape the announcements of a held
	// l2 address (as for the control-plane VIP): Burst gratuitous
	// ARP/NA BurstSpacing apart (Linux ignores updates within locktime),
	// then one every Refresh.
	Burst        = 5
	BurstSpacing = 1100 * time.Millisecond
	Refresh      = 30 * time.Second
	// Coalesce: announcements due within this much are sent together.
	Coalesce = 100 * time.Millisecond
)

// Config shapes a Machine.
type Config struct {
	// Name is this node's name (VIPD_NODE_NAME), as the cluster knows it.
	Name string
	// Probe: probe for another holder before binding an l2 address.
	Probe bool
	// Leased: the lease election places l2 addresses (l2 in a cluster):
	// this node holds one only while a Leases event says so, until that
	// lease's end, instead of by rendezvous over Members (this node alone
	// without a cluster, and in bgp mode).
	Leased bool
}

// Member is one cluster member as the election sees it: alive or suspect
// (dead and left members are not listed).
type Member struct {
	Name     string
	Suspect  bool
	Eligible bool // healthy, quorum, unique name (the election's Meta.Eligible)
	Pools    bool // runs with VIPD_POOLS=on
}

// Event is an input to the Machine.
type Event interface{ isPoolEvent() }

// Desired is the feed's view: every allocated address to announce.
type Desired struct{ Addresses []Address }

// View is the cluster membership, this node included.
type View struct{ Members []Member }

// Observed is what the kernel says: the l2 pool addresses bound on the
// interface now (a listing, at start and on every reconcile).
type Observed struct{ Bound []netip.Addr }

// Acquired reports how a batch of acquires went.
type Acquired struct{ Results []Result }

// Result of one acquire: Err is nil when bound (or advertised);
// ConflictMAC is set when another host answered the probe (not bound).
type Result struct {
	Addr        netip.Addr
	ConflictMAC string
	Err         error
}

// Tick is the passing of time, sent at Output.Next.
type Tick struct{}

// Leases (Config.Leased) are the l2 addresses the lease election lets this
// node hold, each until its lease end: the complete set, replacing the
// last. An address absent here, or whose end has passed, is released.
type Leases struct{ Until map[netip.Addr]time.Time }

// Shutdown releases every address.
type Shutdown struct{}

func (Desired) isPoolEvent()  {}
func (View) isPoolEvent()     {}
func (Observed) isPoolEvent() {}
func (Acquired) isPoolEvent() {}
func (Tick) isPoolEvent()     {}
func (Shutdown) isPoolEvent() {}
func (Leases) isPoolEvent()   {}

// Target is an address with how to announce it.
type Target struct {
	Addr  netip.Addr
	Mode  string
	Probe bool // l2: probe before binding
}

// Conflict is a newly detected conflict: another host answers for an
// address this node should hold.
type Conflict struct {
	Addr netip.Addr
	MAC  string
}

// Output is what one step asks of the driver.
type Output struct {
	Release   []Target     // unbind (l2) or withdraw (bgp); done first
	Acquire   []Target     // probe and bind (l2) or advertise (bgp); report with Acquired
	Announce  []netip.Addr // gratuitous ARP / unsolicited NA (l2)
	Conflicts []Conflict
	// Next is when the machine next wants a Tick; zero: no timer needed.
	Next time.Time
}

type state int

const (
	idle      state = iota // not held
	acquiring              // acquire in flight
	held
	conflict // another host answers: retry at retryAt
	backoff  // failed or probe answered during hand-over: retry at retryAt
)

func (s state) String() string {
	return [...]string{"idle", "acquiring", "held", "conflict", "backoff"}[s]
}

type slot struct {
	addr    Address
	state   state
	retryAt time.Time

	winner    string // l2: the holder by this node's view ("" none)
	from      string // the holder before the last change of winner
	changedAt time.Time

	nextAnnounce time.Time
	burstLeft    int

	conflictMAC string
	conflictAt  time.Time // first answer of this conflict episode

	adopting bool // acquiring an address found bound (left by a previous run)
}

// Machine decides, for this node, which pool addresses it holds. Use
// NewMachine. It is not safe for concurrent use.
type Machine struct {
	cfg      Config
	started  time.Time
	stopping bool
	desired  bool // a Desired has been seen

	members   map[string]Member
	firstSeen map[string]time.Time // when each member entered the view
	slots     map[netip.Addr]*slot
	known     map[netip.Addr]string // every address ever desired, with its mode: ours to release
	bound     map[netip.Addr]bool   // last Observed
	leases    map[netip.Addr]time.Time
}

// NewMachine starts a machine at now.
func NewMachine(cfg Config, now time.Time) *Machine {
	return &Machine{cfg: cfg, started: now,
		members: map[string]Member{}, firstSeen: map[string]time.Time{},
		slots: map[netip.Addr]*slot{},
		known: map[netip.Addr]string{},
		bound: map[netip.Addr]bool{},
	}
}

// Step feeds one event that happened at now.
func (m *Machine) Step(ev Event, now time.Time) Output {
	var out Output
	switch ev := ev.(type) {
	case Desired:
		m.setDesired(ev.Addresses, &out)
	case View:
		m.members = make(map[string]Member, len(ev.Members))
		for _, mb := range ev.Members {
			m.members[mb.Name] = mb
			if _, ok := m.firstSeen[mb.Name]; !ok {
				m.firstSeen[mb.Name] = now
			}
		}
		for n := range m.firstSeen {
			if _, ok := m.members[n]; !ok {
				delete(m.firstSeen, n)
			}
		}
	case Observed:
		m.observe(ev.Bound)
	case Acquired:
		m.acquired(ev.Results, now, &out)
	case Shutdown:
		m.stopping = true
	case Leases:
		m.leases = make(map[netip.Addr]time.Time, len(ev.Until))
		for a, u := range ev.Until {
			m.leases[a.Unmap()] = u
		}
	case Tick:
	}
	m.evaluate(now, &out)
	out.Next = m.next(now)
	return out
}

func (m *Machine) setDesired(addrs []Address, out *Output) {
	m.desired = true
	want := make(map[netip.Addr]Address, len(addrs))
	for _, a := range addrs {
		if !a.Addr.IsValid() || a.Mode != ModeL2 && a.Mode != ModeBGP {
			continue
		}
		a.Addr = a.Addr.Unmap()
		want[a.Addr] = a
	}
	for addr, s := range m.slots {
		a, ok := want[addr]
		if ok && a.Mode == s.addr.Mode {
			s.addr = a
			continue
		}
		// Gone from the pool (or its mode changed): withdraw at once.
		if s.state == held || s.state == acquiring {
			out.Release = append(out.Release, Target{Addr: addr, Mode: s.addr.Mode})
		}
		delete(m.slots, addr)
	}
	for addr, a := range want {
		m.known[addr] = a.Mode
		if _, ok := m.slots[addr]; !ok {
			m.slots[addr] = &slot{addr: a}
		}
	}
	sortTargets(out.Release)
}

func (m *Machine) observe(bound []netip.Addr) {
	m.bound = make(map[netip.Addr]bool, len(bound))
	for _, a := range bound {
		m.bound[a.Unmap()] = true
	}
	for addr, s := range m.slots {
		if s.addr.Mode == ModeL2 && s.state == held && !m.bound[addr] {
			// Someone removed it: bind it again (probing first).
			s.state, s.from = idle, ""
		}
	}
}

func (m *Machine) acquired(rs []Result, now time.Time, out *Output) {
	for _, r := range rs {
		addr := r.Addr.Unmap()
		s, ok := m.slots[addr]
		if !ok || s.state != acquiring {
			if r.Err == nil && r.ConflictMAC == "" {
				// Bound after it stopped being wanted: undo.
				mode := m.known[addr]
				if ok {
					mode = s.addr.Mode
				}
				out.Release = append(out.Release, Target{Addr: addr, Mode: mode})
			}
			continue
		}
		adopting := s.adopting
		s.adopting = false
		if adopting && r.ConflictMAC != "" {
			// Our leftover binding answers next to another holder's.
			out.Release = append(out.Release, Target{Addr: addr, Mode: s.addr.Mode})
			delete(m.bound, addr)
		}
		switch {
		case r.ConflictMAC != "":
			handover := s.from != "" && now.Sub(s.changedAt) < HandoverWait+ConflictGrace ||
				now.Sub(m.started) < StartupWait+ConflictGrace || m.recentJoin(now)
			if handover && s.conflictAt.IsZero() {
				// Most likely the previous holder, about to release.
				s.state, s.retryAt = backoff, now.Add(ProbeRetry)
				continue
			}
			if s.conflictAt.IsZero() || s.conflictMAC != r.ConflictMAC {
				s.conflictAt = now
				out.Conflicts = append(out.Conflicts, Conflict{Addr: addr, MAC: r.ConflictMAC})
			}
			s.conflictMAC = r.ConflictMAC
			s.state, s.retryAt = conflict, now.Add(ConflictRetry)
		case r.Err != nil:
			s.state, s.retryAt = backoff, now.Add(FailRetry)
		default:
			m.hold(s, now, out)
		}
	}
	sortTargets(out.Release)
}

// hold makes s held and starts its announcements.
func (m *Machine) hold(s *slot, now time.Time, out *Output) {
	s.state = held
	s.conflictAt, s.conflictMAC = time.Time{}, ""
	m.bound[s.addr.Addr] = s.addr.Mode == ModeL2
	if s.addr.Mode == ModeL2 {
		out.Announce = append(out.Announce, s.addr.Addr)
		s.burstLeft = Burst - 1
		s.nextAnnounce = now.Add(BurstSpacing)
	}
}

// candidates returns the members that may hold a, sorted.
func (m *Machine) candidates(a Address, now time.Time) []string {
	return m.candidatesOf(a, now, true)
}

// candidatesOf: with settledOnly false, also the members still settling.
func (m *Machine) candidatesOf(a Address, now time.Time, settledOnly bool) []string {
	var c []string
	for _, mb := range m.members {
		if !mb.Suspect && mb.Eligible && mb.Pools && a.Eligible(mb.Name) && (!settledOnly || m.settled(mb.Name, now)) {
			c = append(c, mb.Name)
		}
	}
	slices.Sort(c)
	return c
}

// settled reports whether member counts as a candidate yet: this node
// after its StartupWait; a member already there when this node started at
// once; a member that joined later after JoinSettle.
func (m *Machine) settled(name string, now time.Time) bool {
	if name == m.cfg.Name {
		return now.Sub(m.started) >= StartupWait
	}
	fs := m.firstSeen[name]
	return !fs.After(m.started.Add(StartupWait)) || now.Sub(fs) >= JoinSettle
}

// recentJoin reports whether a member joined the view (after this node's
// start-up) recently enough that an answered probe is most likely its, or
// the hand-over its arrival causes.
func (m *Machine) recentJoin(now time.Time) bool {
	for n, fs := range m.firstSeen {
		if n != m.cfg.Name && fs.After(m.started.Add(StartupWait)) && now.Sub(fs) < JoinSettle+ConflictGrace {
			return true
		}
	}
	return false
}

func (m *Machine) selfEligible() bool {
	s, ok := m.members[m.cfg.Name]
	return ok && s.Eligible && s.Pools && !m.stopping
}

// evaluate recomputes every address.
func (m *Machine) evaluate(now time.Time, out *Output) {
	startup := now.Sub(m.started) < StartupWait
	self := m.selfEligible()
	for _, addr := range m.sortedAddrs() {
		s := m.slots[addr]
		a := s.addr
		var want bool
		if a.Mode == ModeBGP {
			want = self && a.Eligible(m.cfg.Name)
		} else if m.cfg.Leased {
			// The lease is the whole rule: a majority granted it, and the
			// previous holder let go before it began.
			until, ok := m.leases[addr]
			want = self && a.Eligible(m.cfg.Name) && ok && now.Before(until)
			s.winner, s.from = "", ""
			if ok && now.Before(until) {
				s.winner = m.cfg.Name
			}
		} else {
			w := Winner(addr, m.candidates(a, now))
			if w != s.winner {
				if s.winner != "" {
					s.from, s.changedAt = s.winner, now
				}
				s.winner = w
			}
			want = self && w == m.cfg.Name
			if want && s.state != held && s.state != acquiring && Winner(addr, m.candidatesOf(a, now, false)) != m.cfg.Name {
				// A member still settling (it rejoined after a partition,
				// or joined) ranks first: it holds the address, or will.
				// Neither take it nor give anything up meanwhile.
				continue
			}
		}
		switch {
		case !want:
			switch s.state {
			case held, acquiring:
				// acquiring: the result is undone when it arrives
				// (Acquired), the release here covers a bind that
				// already happened.
				out.Release = append(out.Release, Target{Addr: addr, Mode: a.Mode})
				delete(m.bound, addr)
			}
			if a.Mode == ModeL2 && m.bound[addr] && s.state != held && s.state != acquiring && !startup {
				// Left bound by a previous run (or by hand in vipd's
				// form): not ours to hold.
				out.Release = append(out.Release, Target{Addr: addr, Mode: a.Mode})
				delete(m.bound, addr)
			}
			s.state, s.conflictAt, s.conflictMAC = idle, time.Time{}, ""
		case s.state == held:
			if a.Mode == ModeL2 && !now.Before(s.nextAnnounce.Add(-Coalesce)) {
				out.Announce = append(out.Announce, addr)
				if s.burstLeft > 1 {
					s.burstLeft--
					s.nextAnnounce = now.Add(BurstSpacing)
				} else {
					s.burstLeft = 0
					s.nextAnnounce = now.Add(Refresh)
				}
			}
		case s.state == acquiring:
		case (s.state == conflict || s.state == backoff) && now.Before(s.retryAt):
		case startup:
			// Let the view settle before taking anything.
		case a.Mode == ModeL2 && m.bound[addr]:
			// Bound already (a previous run of this node): adopt it
			// after a probe; if another node answers, it took the address
			// while this one was away: drop ours (Acquired).
			s.state, s.adopting = acquiring, true
			out.Acquire = append(out.Acquire, Target{Addr: addr, Mode: a.Mode, Probe: m.cfg.Probe})
		default:
			if a.Mode == ModeL2 && !m.handoverDone(s, now) {
				continue
			}
			s.state = acquiring
			out.Acquire = append(out.Acquire, Target{Addr: addr, Mode: a.Mode, Probe: a.Mode == ModeL2 && m.cfg.Probe})
		}
	}
	if m.stopping {
		// Also what is bound and no longer desired.
		for addr := range m.bound {
			if _, ok := m.slots[addr]; !ok {
				if mode, ok := m.known[addr]; ok {
					out.Release = append(out.Release, Target{Addr: addr, Mode: mode})
				}
			}
		}
		m.bound = map[netip.Addr]bool{}
	} else if !startup {
		for addr := range m.bound {
			if _, ok := m.slots[addr]; !ok {
				if mode, ok := m.known[addr]; ok {
					out.Release = append(out.Release, Target{Addr: addr, Mode: mode})
					delete(m.bound, addr)
				}
			}
		}
	}
	sortTargets(out.Release)
	out.Release = slices.CompactFunc(out.Release, func(a, b Target) bool { return a.Addr == b.Addr })
}

// handoverDone reports whether this node, now the winner of s, may take
// it: the previous holder is gone, not eligible, or had HandoverWait to
// release. A suspect previous holder is waited for until it is declared
// dead (break before make, as for the control-plane VIP).
func (m *Machine) handoverDone(s *slot, now time.Time) bool {
	if s.from == "" || s.from == m.cfg.Name {
		return true
	}
	p, ok := m.members[s.from]
	switch {
	case !ok:
		return true // dead or left
	case p.Suspect:
		return false
	case !p.Eligible || !p.Pools:
		return true // it releases everything when it stops being eligible
	case m.cfg.Probe:
		return true // the probe tells when it has released
	}
	return !now.Before(s.changedAt.Add(HandoverWait))
}

// next returns the earliest deadline.
func (m *Machine) next(now time.Time) time.Time {
	var t time.Time
	add := func(d time.Time) {
		if d.After(now) && (t.IsZero() || d.Before(t)) {
			t = d
		}
	}
	add(m.started.Add(StartupWait))
	for _, fs := range m.firstSeen {
		add(fs.Add(JoinSettle))
	}
	for _, s := range m.slots {
		switch s.state {
		case held, acquiring:
			if s.addr.Mode == ModeL2 && s.state == held {
				add(s.nextAnnounce)
			}
			if u, ok := m.leases[s.addr.Addr]; ok && m.cfg.Leased && s.addr.Mode == ModeL2 {
				add(u) // released at the lease end, renewal or not
			}
		case conflict, backoff:
			add(s.retryAt)
		case idle:
			if s.from != "" && s.winner == m.cfg.Name && !m.cfg.Probe {
				add(s.changedAt.Add(HandoverWait))
			}
		}
	}
	return t
}

func (m *Machine) sortedAddrs() []netip.Addr {
	return slices.SortedFunc(maps.Keys(m.slots), func(a, b netip.Addr) int { return a.Compare(b) })
}

func sortTargets(ts []Target) {
	slices.SortFunc(ts, func(a, b Target) int { return a.Addr.Compare(b.Addr) })
}

// AddressStatus is one address in /status.
type AddressStatus struct {
	Address string `json:"address"`
	Pool    string `json:"pool"`
	Mode    string `json:"mode"`
	Service string `json:"service,omitempty"`
	// Holder is who holds it by this node's view (l2), "" when nobody may.
	Holder string `json:"holder,omitempty"`
	// State is this node's part: idle, acquiring, held, conflict, backoff.
	State string `json:"state"`
	// Conflict is the MAC of another host answering for it.
	Conflict string `json:"conflict,omitempty"`
	Eligible int    `json:"eligible"` // how many members may hold it
}

// Status returns every desired address, sorted.
func (m *Machine) Status(now time.Time) []AddressStatus {
	out := make([]AddressStatus, 0, len(m.slots))
	for _, addr := range m.sortedAddrs() {
		s := m.slots[addr]
		st := AddressStatus{Address: addr.String(), Pool: s.addr.Pool, Mode: s.addr.Mode, Service: s.addr.Service,
			State: s.state.String(), Conflict: s.conflictMAC, Eligible: len(m.candidates(s.addr, now))}
		if s.addr.Mode == ModeL2 {
			st.Holder = s.winner
		} else if st.State == "held" {
			st.Holder = m.cfg.Name
		}
		out = append(out, st)
	}
	return out
}

// Counts summarises the machine for metrics.
type Counts struct {
	Desired, Held, Conflicts int
}

// Counts returns how many addresses are desired, held here, in conflict.
func (m *Machine) Counts() Counts {
	c := Counts{Desired: len(m.slots)}
	for _, s := range m.slots {
		switch s.state {
		case held:
			c.Held++
		case conflict:
			c.Conflicts++
		}
	}
	return c
}

// Held returns the addresses held now.
func (m *Machine) Held() []netip.Addr {
	var out []netip.Addr
	for addr, s := range m.slots {
		if s.state == held {
			out = append(out, addr)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func (s *slot) String() string {
	return fmt.Sprintf("%s %s winner=%s from=%s", s.addr.Addr, s.state, s.winner, s.from)
}

// KnownL2 returns every l2 address this machine has been told about
// (desired now or before): the addresses whose bindings are its to check.
func (m *Machine) KnownL2() []netip.Addr {
	var out []netip.Addr
	for a, mode := range m.known {
		if mode == ModeL2 {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}
