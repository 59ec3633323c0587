package pools

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// The simulation runs N machines over a fake clock, a fake membership with
// detection delays (memberlist: suspect after suspectAfter, gone after
// detection; a joining node is seen by each other node after a random
// delay) and a fake LAN where a probe sees every other node's bindings.
// An acquire completes probeTime after it was issued: two nodes probing in
// the same window both bind, as on a real LAN.

const (
	simTick      = 10 * time.Millisecond
	suspectAfter = 300 * time.Millisecond
	detection    = 800 * time.Millisecond // dead: gone from the views
	probeTime    = 50 * time.Millisecond
)

type simNode struct {
	name     string
	m        *Machine
	up       bool
	eligOK   bool
	upAt     time.Time
	downAt   time.Time
	seenBy   map[string]time.Time // when each other node first sees this one (join)
	next     time.Time
	pending  []pendingAcq
	bound    map[netip.Addr]bool
	lastView []Member
}

type pendingAcq struct {
	t  Target
	at time.Time
}

type sim struct {
	t     *testing.T
	rng   *rand.Rand
	now   time.Time
	nodes []*simNode
	addrs []Address
	// twoSince: when each address got a second holder.
	twoSince   map[netip.Addr]time.Time
	worstTwo   time.Duration
	noneSince  map[netip.Addr]time.Time
	worstNone  time.Duration
	graceUntil time.Time               // no-holder is allowed before this (startup, just after a fault)
	cut        map[[2]string]time.Time // pairs that cannot reach each other, since
}

func (s *sim) cutSince(a, b string) (time.Time, bool) {
	if a > b {
		a, b = b, a
	}
	t, ok := s.cut[[2]string{a, b}]
	return t, ok
}

// partition cuts every node in side from every node outside it.
func (s *sim) partition(side ...string) {
	in := map[string]bool{}
	for _, n := range side {
		in[n] = true
	}
	for _, a := range s.nodes {
		for _, b := range s.nodes {
			if a.name < b.name && in[a.name] != in[b.name] {
				s.cut[[2]string{a.name, b.name}] = s.now
			}
		}
	}
}

func (s *sim) heal() { s.cut = map[[2]string]time.Time{} }

func newSim(t *testing.T, seed int64, n, addrCount int) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewSource(seed)), now: t0, twoSince: map[netip.Addr]time.Time{}, noneSince: map[netip.Addr]time.Time{},
		cut: map[[2]string]time.Time{}}
	for i := range addrCount {
		s.addrs = append(s.addrs, Address{Addr: addrN(netip.MustParseAddr("10.20.0.0"), i), Pool: "p", Mode: ModeL2, All: true})
	}
	for i := range n {
		s.add(fmt.Sprintf("node-%d", i))
	}
	s.graceUntil = s.now.Add(StartupWait + 2*time.Second)
	return s
}

func (s *sim) add(name string) *simNode {
	nd := &simNode{name: name, m: NewMachine(Config{Name: name, Probe: true}, s.now), up: true, eligOK: true, upAt: s.now,
		seenBy: map[string]time.Time{}, bound: map[netip.Addr]bool{}}
	for _, o := range s.nodes {
		nd.seenBy[o.name] = s.now.Add(time.Duration(s.rng.Intn(300)) * time.Millisecond)
	}
	s.nodes = append(s.nodes, nd)
	s.deliver(nd, Desired{Addresses: s.addrs})
	return nd
}

// view is what observer's memberlist shows now. A member is eligible
// when its own flag says so and it has quorum: it sees (alive or suspect)
// a majority of the nodes, as the election rules.
func (s *sim) view(obs *simNode) View {
	var v View
	for _, o := range s.nodes {
		mb := Member{Name: o.name, Eligible: o.eligOK && s.quorum(o), Pools: true}
		if o != obs {
			if at, ok := o.seenBy[obs.name]; ok && s.now.Before(at) {
				continue // not joined yet in obs's view
			}
			downAt, down := o.downAt, !o.up
			if t, ok := s.cutSince(o.name, obs.name); ok && (!down || t.Before(downAt)) {
				downAt, down = t, true
			}
			if down {
				d := s.now.Sub(downAt)
				if d >= detection {
					continue
				}
				mb.Suspect = d >= suspectAfter
			}
		}
		v.Members = append(v.Members, mb)
	}
	return v
}

// quorum: o sees a majority of the live-or-recently-dead nodes.
func (s *sim) quorum(o *simNode) bool {
	seen := 0
	for _, x := range s.nodes {
		if x == o {
			seen++
			continue
		}
		downAt, down := x.downAt, !x.up
		if t, ok := s.cutSince(o.name, x.name); ok && (!down || t.Before(downAt)) {
			downAt, down = t, true
		}
		if !down || s.now.Sub(downAt) < detection {
			seen++
		}
	}
	return seen >= len(s.nodes)/2+1
}

func (s *sim) deliver(nd *simNode, ev Event) {
	out := nd.m.Step(ev, s.now)
	for _, r := range out.Release {
		delete(nd.bound, r.Addr)
	}
	for _, a := range out.Acquire {
		nd.pending = append(nd.pending, pendingAcq{t: a, at: s.now.Add(probeTime)})
	}
	nd.next = out.Next
}

func (s *sim) step() {
	s.now = s.now.Add(simTick)
	for _, nd := range s.nodes {
		if !nd.up {
			continue
		}
		if v := s.view(nd); !slices.Equal(v.Members, nd.lastView) {
			nd.lastView = v.Members
			s.deliver(nd, v)
		}
		var rs []Result
		keep := nd.pending[:0]
		for _, p := range nd.pending {
			if s.now.Before(p.at) {
				keep = append(keep, p)
				continue
			}
			r := Result{Addr: p.t.Addr}
			for _, o := range s.nodes {
				if o != nd && o.bound[p.t.Addr] {
					r.ConflictMAC = "mac-" + o.name
				}
			}
			if r.ConflictMAC == "" {
				nd.bound[p.t.Addr] = true
			}
			rs = append(rs, r)
		}
		nd.pending = keep
		if len(rs) > 0 {
			s.deliver(nd, Acquired{Results: rs})
		}
		if !nd.next.IsZero() && !s.now.Before(nd.next) {
			s.deliver(nd, Tick{})
		}
	}
	s.check()
}

// check measures double holders and unheld addresses.
func (s *sim) check() {
	anyEligible := false
	for _, nd := range s.nodes {
		anyEligible = anyEligible || nd.up && nd.eligOK
	}
	for _, a := range s.addrs {
		n := 0
		for _, nd := range s.nodes {
			if nd.bound[a.Addr] {
				n++
			}
		}
		if n > 1 {
			if _, ok := s.twoSince[a.Addr]; !ok {
				s.twoSince[a.Addr] = s.now
			}
			s.worstTwo = max(s.worstTwo, s.now.Sub(s.twoSince[a.Addr]))
		} else {
			delete(s.twoSince, a.Addr)
		}
		if n == 0 && anyEligible && s.now.After(s.graceUntil) {
			if _, ok := s.noneSince[a.Addr]; !ok {
				s.noneSince[a.Addr] = s.now
			}
			s.worstNone = max(s.worstNone, s.now.Sub(s.noneSince[a.Addr]))
		} else {
			delete(s.noneSince, a.Addr)
		}
	}
}

func (s *sim) run(d time.Duration) {
	for end := s.now.Add(d); s.now.Before(end); {
		s.step()
	}
}

func (s *sim) holders() map[netip.Addr]string {
	h := map[netip.Addr]string{}
	for _, nd := range s.nodes {
		for a := range nd.bound {
			h[a] = nd.name
		}
	}
	return h
}

func (s *sim) shares() map[string]int {
	c := map[string]int{}
	for _, nd := range s.nodes {
		c[nd.name] = len(nd.bound)
	}
	return c
}

// crash stops a node: its machine stops and its bindings vanish (a host
// or link failure; a vipd restart with bindings left is TestMachine's).
func (s *sim) crash(nd *simNode) {
	nd.up, nd.downAt, nd.bound, nd.pending = false, s.now, map[netip.Addr]bool{}, nil
}

func TestSimulation(t *testing.T) {
	const addrCount = 1000
	for _, seed := range []int64{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			s := newSim(t, seed, 3, addrCount)
			s.run(5 * time.Second)
			if len(s.holders()) != addrCount {
				t.Fatalf("%d of %d addresses held after start-up", len(s.holders()), addrCount)
			}
			sh := s.shares()
			lo, hi := addrCount, 0
			for _, c := range sh {
				lo, hi = min(lo, c), max(hi, c)
			}
			if float64(hi) > 1.25*float64(lo) {
				t.Fatalf("unbalanced spread: %v", sh)
			}
			t.Logf("spread over 3 nodes: %v", sh)

			// A fourth node joins: it takes about a quarter, and only
			// addresses move to it (minimal movement).
			before := s.holders()
			s.add("node-3")
			s.run(6 * time.Second)
			after := s.holders()
			moved, movedElsewhere := 0, 0
			for a, h := range before {
				if after[a] != h {
					moved++
					if after[a] != "node-3" {
						movedElsewhere++
					}
				}
			}
			if movedElsewhere != 0 || moved < addrCount/6 || moved > addrCount/3 {
				t.Fatalf("join moved %d addresses (%d not to the new node): want about a quarter, all to the new node", moved, movedElsewhere)
			}
			if len(after) != addrCount {
				t.Fatalf("%d of %d held after the join", len(after), addrCount)
			}

			// A node crashes: its share moves within detection + 1 s, the
			// others' addresses stay.
			victim := s.nodes[s.rng.Intn(len(s.nodes))]
			before = s.holders()
			s.crash(victim)
			crashAt := s.now
			for len(s.holders()) != addrCount && s.now.Sub(crashAt) < 5*time.Second {
				s.step()
			}
			took := s.now.Sub(crashAt)
			if took > detection+time.Second {
				t.Fatalf("failover of %s's share took %v, want <= detection (%v) + 1 s", victim.name, took, detection)
			}
			t.Logf("failover of %s's share: %v", victim.name, took)
			after = s.holders()
			for a, h := range before {
				if h != victim.name && after[a] != h {
					t.Fatalf("%s moved from %s to %s though its holder stayed", a, h, after[a])
				}
			}
			// A node becomes ineligible (unhealthy, label change) then
			// eligible again.
			var live []*simNode
			for _, nd := range s.nodes {
				if nd.up {
					live = append(live, nd)
				}
			}
			live[0].eligOK = false
			s.run(3 * time.Second)
			if n := len(live[0].bound); n != 0 {
				t.Fatalf("ineligible node still holds %d", n)
			}
			if len(s.holders()) != addrCount {
				t.Fatalf("%d held after a node became ineligible", len(s.holders()))
			}
			live[0].eligOK = true
			s.run(5 * time.Second)
			if len(s.holders()) != addrCount || len(live[0].bound) == 0 {
				t.Fatalf("after eligible again: %d held, %d by %s", len(s.holders()), len(live[0].bound), live[0].name)
			}
			// Restarted crashed node (new machine, same name) rejoins.
			victim.up, victim.eligOK = true, true
			victim.m = NewMachine(Config{Name: victim.name, Probe: true}, s.now)
			victim.lastView = nil
			for _, o := range s.nodes {
				if o != victim {
					victim.seenBy[o.name] = s.now.Add(time.Duration(s.rng.Intn(300)) * time.Millisecond)
				}
			}
			s.deliver(victim, Desired{Addresses: s.addrs})
			s.run(6 * time.Second)
			if len(s.holders()) != addrCount {
				t.Fatalf("%d held after the rejoin", len(s.holders()))
			}
			if s.worstTwo > detection {
				t.Fatalf("an address had two holders for %v (allowed: detection %v)", s.worstTwo, detection)
			}
			if s.worstNone > detection+time.Second {
				t.Fatalf("an address was unheld for %v with eligible nodes up (allowed: detection + 1 s)", s.worstNone)
			}
			t.Logf("worst double holding %v, worst unheld %v", s.worstTwo, s.worstNone)
		})
	}
}

// TestSimulationPartition: one node is cut off from the two others. It
// loses quorum at detection and releases; the majority takes its share
// once it is declared dead; after the heal it gets its share back.
func TestSimulationPartition(t *testing.T) {
	const addrCount = 300
	s := newSim(t, 7, 3, addrCount)
	s.run(5 * time.Second)
	if len(s.holders()) != addrCount {
		t.Fatalf("%d held after start-up", len(s.holders()))
	}
	minority := s.nodes[0]
	s.partition(minority.name)
	s.run(detection + 2*time.Second)
	if n := len(minority.bound); n != 0 {
		t.Fatalf("the minority node still holds %d addresses", n)
	}
	if len(s.holders()) != addrCount {
		t.Fatalf("%d of %d held by the majority", len(s.holders()), addrCount)
	}
	s.heal()
	s.run(8 * time.Second)
	if len(s.holders()) != addrCount || len(minority.bound) == 0 {
		t.Fatalf("after the heal: %d held, %d by %s", len(s.holders()), len(minority.bound), minority.name)
	}
	if s.worstTwo > detection {
		t.Fatalf("two holders for %v (allowed: detection %v)", s.worstTwo, detection)
	}
	if s.worstNone > detection+time.Second {
		t.Fatalf("an address unheld for %v (allowed: detection + 1 s)", s.worstNone)
	}
	t.Logf("worst double holding %v, worst unheld %v", s.worstTwo, s.worstNone)
}
