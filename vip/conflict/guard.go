// Package conflict decides what a node does about other hosts claiming an
// address it answers for, RFC 5227 style: it is fed what the wire shows
// (ARP packets and neighbour advertisements naming an address from a MAC
// that is not this host's) and the addresses this node binds, together with
// the time, and returns when to defend an address (announce it again) and
// which conflicts began or ended. It has no sockets, goroutines or clock:
// the l2 announcer carries its decisions out (vip/l2guard.go).
//
// A holder defends at once and then at most once per DefendGap while the
// claims go on: every claim is answered within DefendGap, so the
// neighbours that followed the foreign host come back to this node at most
// DefendGap after it stops claiming, and a host that keeps claiming is not
// answered with a storm. A conflict ends after Quiet without a claim.
package conflict

import (
	"net"
	"net/netip"
	"slices"
	"time"
)

// Defaults.
const (
	// DefendGap is the least time between two defending announcements
	// of one address. Linux takes a gratuitous ARP or an unsolicited NA
	// with Override at once (no locktime), so one a second is enough.
	DefendGap = time.Second
	// Quiet is how long after the last foreign claim a conflict is over.
	Quiet = 10 * time.Second
)

// Event is what the guard is fed.
type Event interface{ isEvent() }

// Bound: this node answers for Addr from now on (it bound it).
type Bound struct{ Addr netip.Addr }

// Unbound: this node no longer answers for Addr (released).
type Unbound struct{ Addr netip.Addr }

// Claim: a frame from MAC, which is not one of this host's, claimed Addr
// (an ARP packet with Addr as its sender address, a neighbour
// advertisement for Addr).
type Claim struct {
	Addr netip.Addr
	MAC  net.HardwareAddr
}

// Overlap: another holder of Addr is agreed until Until (a
// make-before-break transfer: the old and the new holder both answer for
// a bounded time). Claims from MACs (any MAC when empty) are then no
// conflict: not reported, not defended. A later Overlap replaces it; a
// zero Until ends it.
type Overlap struct {
	Addr  netip.Addr
	MACs  []string
	Until time.Time
}

// Tick: time passed.
type Tick struct{}

func (Overlap) isEvent() {}
func (Bound) isEvent()   {}
func (Unbound) isEvent() {}
func (Claim) isEvent()   {}
func (Tick) isEvent()    {}

// Output is what one step asks for.
type Output struct {
	// Defend: announce these addresses now.
	Defend []netip.Addr
	// Reports: conflicts that began (with the first claim) or ended.
	Reports []Report
	// Next is when the guard wants a Tick; zero: never.
	Next time.Time
}

// Report says a conflict began or ended.
type Report struct {
	Conflict
	Ended bool
}

// Conflict is a foreign host claiming an address this node answers for.
type Conflict struct {
	Addr netip.Addr `json:"address"`
	MAC  string     `json:"mac"`
	// First and Last claim seen, how many claims, and how many times
	// this node defended the address meanwhile.
	First    time.Time `json:"first"`
	Last     time.Time `json:"last"`
	Claims   int       `json:"claims"`
	Defended int       `json:"defended"`
}

type addrState struct {
	lastDefend time.Time
	pending    time.Time  // a defence due then (zero: none)
	conflict   *Conflict  // the current conflict, nil when none
	ended      []Conflict // conflicts over, newest last (bounded)
}

// keepEnded is how many finished conflicts are remembered per address.
const keepEnded = 4

// Guard holds the state of every address this node answers for; claims
// for other addresses are ignored, so its size is bounded by them.
type Guard struct {
	gap, quiet time.Duration
	addrs      map[netip.Addr]*addrState
	// overlaps: agreed second holders, bound here or not yet (the new
	// holder of a make-before-break binds during the overlap).
	overlaps map[netip.Addr]Overlap
}

// New returns a guard; zero durations take the defaults.
func New(gap, quiet time.Duration) *Guard {
	if gap <= 0 {
		gap = DefendGap
	}
	if quiet <= 0 {
		quiet = Quiet
	}
	return &Guard{gap: gap, quiet: quiet, addrs: map[netip.Addr]*addrState{}, overlaps: map[netip.Addr]Overlap{}}
}

// Bound reports whether the guard watches addr.
func (g *Guard) Bound(addr netip.Addr) bool { return g.addrs[addr] != nil }

// Step feeds one event at now.
func (g *Guard) Step(ev Event, now time.Time) Output {
	var out Output
	switch e := ev.(type) {
	case Bound:
		if g.addrs[e.Addr] == nil {
			g.addrs[e.Addr] = &addrState{}
		}
	case Unbound:
		if s := g.addrs[e.Addr]; s != nil {
			if s.conflict != nil {
				out.Reports = append(out.Reports, Report{Conflict: *s.conflict, Ended: true})
			}
			delete(g.addrs, e.Addr)
		}
	case Claim:
		g.claim(e, now, &out)
	case Overlap:
		delete(g.overlaps, e.Addr)
		if e.Until.After(now) {
			g.overlaps[e.Addr] = e
		}
	case Tick:
	}
	g.tick(now, &out)
	out.Next = g.next()
	return out
}

func (g *Guard) claim(e Claim, now time.Time, out *Output) {
	s := g.addrs[e.Addr]
	if s == nil {
		return // not ours: whoever holds it defends it
	}
	mac := e.MAC.String()
	if o, ok := g.overlaps[e.Addr]; ok {
		if !now.Before(o.Until) {
			delete(g.overlaps, e.Addr)
		} else if len(o.MACs) == 0 || slices.Contains(o.MACs, mac) {
			return // the agreed other holder
		}
	}
	if c := s.conflict; c == nil || c.MAC != mac {
		if c != nil {
			g.end(s, out)
		}
		s.conflict = &Conflict{Addr: e.Addr, MAC: mac, First: now}
		out.Reports = append(out.Reports, Report{Conflict: *s.conflict})
	}
	s.conflict.Last = now
	s.conflict.Claims++
	switch {
	case s.lastDefend.IsZero() || now.Sub(s.lastDefend) >= g.gap:
		g.defend(e.Addr, s, now, out)
	case s.pending.IsZero():
		s.pending = s.lastDefend.Add(g.gap)
	}
}

func (g *Guard) defend(addr netip.Addr, s *addrState, now time.Time, out *Output) {
	s.lastDefend, s.pending = now, time.Time{}
	if s.conflict != nil {
		s.conflict.Defended++
	}
	out.Defend = append(out.Defend, addr)
}

func (g *Guard) end(s *addrState, out *Output) {
	out.Reports = append(out.Reports, Report{Conflict: *s.conflict, Ended: true})
	s.ended = append(s.ended, *s.conflict)
	if len(s.ended) > keepEnded {
		s.ended = s.ended[len(s.ended)-keepEnded:]
	}
	s.conflict = nil
}

func (g *Guard) tick(now time.Time, out *Output) {
	for a, o := range g.overlaps {
		if !now.Before(o.Until) {
			delete(g.overlaps, a)
		}
	}
	for _, a := range g.sorted() {
		s := g.addrs[a]
		if !s.pending.IsZero() && !now.Before(s.pending) {
			g.defend(a, s, now, out)
		}
		if s.conflict != nil && now.Sub(s.conflict.Last) >= g.quiet {
			g.end(s, out)
		}
	}
}

func (g *Guard) next() time.Time {
	var n time.Time
	for _, s := range g.addrs {
		for _, t := range []time.Time{s.pending, quietEnd(s, g.quiet)} {
			if !t.IsZero() && (n.IsZero() || t.Before(n)) {
				n = t
			}
		}
	}
	return n
}

func quietEnd(s *addrState, quiet time.Duration) time.Time {
	if s.conflict == nil {
		return time.Time{}
	}
	return s.conflict.Last.Add(quiet)
}

func (g *Guard) sorted() []netip.Addr {
	out := make([]netip.Addr, 0, len(g.addrs))
	for a := range g.addrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// Status is what /status shows of one address with a conflict now or
// recently.
type Status struct {
	Addr netip.Addr `json:"address"`
	// Current is the conflict going on, nil when none.
	Current *Conflict `json:"current,omitempty"`
	// Recent conflicts that ended, oldest first.
	Recent []Conflict `json:"recent,omitempty"`
}

// Status lists the addresses with a conflict now or recently, in address
// order.
func (g *Guard) Status() []Status {
	var out []Status
	for _, a := range g.sorted() {
		s := g.addrs[a]
		if s.conflict == nil && len(s.ended) == 0 {
			continue
		}
		st := Status{Addr: a, Recent: slices.Clone(s.ended)}
		if s.conflict != nil {
			c := *s.conflict
			st.Current = &c
		}
		out = append(out, st)
	}
	return out
}
