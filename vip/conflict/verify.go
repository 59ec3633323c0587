package conflict

import (
	"net/netip"
	"slices"
	"time"
)

// Verification of announcements by the other nodes. Every node that does
// not hold an address resolves it now and then as any client would (one
// batched round of ARP / neighbour probes for every such address); when
// Misses rounds in a row go unanswered, it reports the address unreachable
// (gossiped to the cluster). The holder reads those reports: when most of
// the other members cannot reach an address it holds, for longer than the
// others need to notice a new holder, its announcements do not arrive and
// it gives the address up so that the election moves it.
const (
	VerifyEvery = time.Second
	// VerifyMisses unanswered rounds in a row make an address unreachable.
	VerifyMisses = 2
	// ReportsEvery is how often the holder reads the others' reports: a
	// multiple of both profiles' lease renewal intervals (350 and 50
	// ms), so that the reads fall on the leader's renewals (gridAfter).
	ReportsEvery = 700 * time.Millisecond
	// VerifyMaxRound bounds one round: with more addresses than this to
	// verify, rounds take turns (1,000 pool addresses never cost 1,000
	// probes a second).
	VerifyMaxRound = 64
)

// Holder tells the verifier who holds Addr: Name ("" nobody), Self when
// it is this node.
type Holder struct {
	Addr netip.Addr
	Name string
	Self bool
}

// Probed carries the results of the round the verifier asked for: the
// addresses that someone other than this host answered for.
type Probed struct {
	Addrs    []netip.Addr
	Answered map[netip.Addr]bool
}

// Reports carries, for an address this node holds, the other members
// that report they cannot reach it and how many other members there are.
type Reports struct {
	Addr      netip.Addr
	Reporters []string
	Others    int
}

func (Holder) isEvent()  {}
func (Probed) isEvent()  {}
func (Reports) isEvent() {}

// VerifyOutput is what one step of the verifier asks for.
type VerifyOutput struct {
	// Probe: resolve these addresses now and feed the answers back (Probed).
	Probe []netip.Addr
	// ReadReports: feed the others' reports on the addresses this node
	// holds (Reports), one event per address.
	ReadReports []netip.Addr
	// Verdicts that changed.
	Verdicts []Verdict
	Next     time.Time
}

// Verdict is a change of what is known about an address.
type Verdict struct {
	Addr   netip.Addr
	Holder string
	// Self: a verdict on this node's own announcement (it holds Addr):
	// Unreachable means most others cannot reach it, so give it up.
	// Otherwise: this node cannot (Unreachable) or can again reach Addr
	// through Holder; publish it.
	Self        bool
	Unreachable bool
	Reporters   []string
}

type verifyState struct {
	holder      string
	self        bool
	since       time.Time // holder known since
	missed      int
	unreachable bool
	lastOK      time.Time
	lastProbe   time.Time
	reporters   []string
}

// VerifyStatus is what /status shows of one address.
type VerifyStatus struct {
	Addr   netip.Addr `json:"address"`
	Holder string     `json:"holder"`
	// Self: this node holds it; Unreachable then means most others cannot
	// reach it (Reporters).
	Self        bool      `json:"self,omitempty"`
	Unreachable bool      `json:"unreachable"`
	Missed      int       `json:"missed,omitempty"`
	LastOK      time.Time `json:"last_ok,omitzero"`
	Reporters   []string  `json:"reporters,omitempty"`
}

// Verifier is the pure state of the verification on one node.
type Verifier struct {
	every     time.Duration
	misses    int
	addrs     map[netip.Addr]*verifyState
	nextRound time.Time
	nextRead  time.Time
	turn      int // where the next round starts when rounds take turns
	inFlight  bool
}

// NewVerifier returns a verifier probing every every (zero: VerifyEvery).
func NewVerifier(every time.Duration) *Verifier {
	if every <= 0 {
		every = VerifyEvery
	}
	return &Verifier{every: every, misses: VerifyMisses, addrs: map[netip.Addr]*verifyState{}}
}

// settle is how long a new holder ignores the others' reports: what they
// reported was about the previous holder until they verified again.
func (v *Verifier) settle() time.Duration { return time.Duration(v.misses+1) * v.every }

// Step feeds one event at now.
func (v *Verifier) Step(ev Event, now time.Time) VerifyOutput {
	var out VerifyOutput
	switch e := ev.(type) {
	case Holder:
		v.holder(e, now, &out)
	case Probed:
		v.inFlight = false
		for _, a := range e.Addrs {
			s := v.addrs[a]
			if s == nil || s.self || s.holder == "" {
				continue // changed meanwhile
			}
			if e.Answered[a] {
				s.missed, s.lastOK = 0, now
				if s.unreachable {
					s.unreachable = false
					out.Verdicts = append(out.Verdicts, Verdict{Addr: a, Holder: s.holder})
				}
				continue
			}
			s.missed++
			if s.missed >= v.misses && !s.unreachable {
				s.unreachable = true
				out.Verdicts = append(out.Verdicts, Verdict{Addr: a, Holder: s.holder, Unreachable: true})
			}
		}
	case Reports:
		s := v.addrs[e.Addr]
		if s == nil || !s.self {
			break
		}
		s.reporters = slices.Clone(e.Reporters)
		bad := e.Others > 0 && 2*len(e.Reporters) > e.Others && now.Sub(s.since) >= v.settle()
		if bad != s.unreachable {
			s.unreachable = bad
			out.Verdicts = append(out.Verdicts, Verdict{Addr: e.Addr, Holder: s.holder, Self: true, Unreachable: bad, Reporters: s.reporters})
		}
	case Tick:
	}
	if !v.inFlight && !now.Before(v.nextRound) {
		if round := v.round(); len(round) > 0 {
			v.inFlight = true
			out.Probe = round
			for _, a := range round {
				v.addrs[a].lastProbe = now
			}
		}
		v.nextRound = gridAfter(now, v.every)
	}
	if !now.Before(v.nextRead) {
		for _, a := range v.sorted() {
			if v.addrs[a].self {
				out.ReadReports = append(out.ReadReports, a)
			}
		}
		v.nextRead = gridAfter(now, ReportsEvery)
	}
	out.Next = v.next()
	return out
}

func (v *Verifier) holder(e Holder, now time.Time, out *VerifyOutput) {
	s := v.addrs[e.Addr]
	if s == nil {
		s = &verifyState{}
		v.addrs[e.Addr] = s
	}
	if s.holder == e.Name && s.self == e.Self {
		return
	}
	// A new holder: nothing is known about its announcements yet. A
	// verdict published about the previous one is withdrawn.
	if s.unreachable {
		out.Verdicts = append(out.Verdicts, Verdict{Addr: e.Addr, Holder: e.Name, Self: s.self})
	}
	*s = verifyState{holder: e.Name, self: e.Self, since: now}
	if e.Name == "" {
		delete(v.addrs, e.Addr)
	}
}

// round returns the addresses to resolve now: those another node holds,
// at most VerifyMaxRound, taking turns.
func (v *Verifier) round() []netip.Addr {
	var all []netip.Addr
	for _, a := range v.sorted() {
		if s := v.addrs[a]; !s.self && s.holder != "" {
			all = append(all, a)
		}
	}
	if len(all) <= VerifyMaxRound {
		return all
	}
	start := v.turn % len(all)
	v.turn = start + VerifyMaxRound
	out := append([]netip.Addr(nil), all[start:min(start+VerifyMaxRound, len(all))]...)
	if n := VerifyMaxRound - len(out); n > 0 {
		out = append(out, all[:n]...)
	}
	return out
}

func (v *Verifier) next() time.Time {
	var n time.Time
	probe := false
	for _, s := range v.addrs {
		if s.self && (n.IsZero() || v.nextRead.Before(n)) {
			n = v.nextRead
		}
		probe = probe || (!s.self && s.holder != "")
	}
	// A round only when there is something to probe: a node that holds
	// every address it knows (the holder of a cluster's one VIP) wakes
	// for the reports alone.
	if probe && !v.inFlight && (n.IsZero() || v.nextRound.Before(n)) {
		n = v.nextRound
	}
	return n
}

// gridAfter is the first multiple of iv on the wall clock after now
// (keeping now's monotonic reading): rounds and reads fall on the
// instants of the health probes and the lease renewals (gridclock, and
// the lease machine's tick grid), so one wake-up of the process serves
// them all.
func gridAfter(now time.Time, iv time.Duration) time.Time {
	return now.Add(iv - now.Sub(now.Truncate(iv)))
}

func (v *Verifier) sorted() []netip.Addr {
	out := make([]netip.Addr, 0, len(v.addrs))
	for a := range v.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// Status lists every address with a holder, in address order.
func (v *Verifier) Status() []VerifyStatus {
	out := []VerifyStatus{}
	for _, a := range v.sorted() {
		s := v.addrs[a]
		out = append(out, VerifyStatus{Addr: a, Holder: s.holder, Self: s.self, Unreachable: s.unreachable,
			Missed: s.missed, LastOK: s.lastOK, Reporters: slices.Clone(s.reporters)})
	}
	return out
}
