// Package vip holds vipd's core: a deterministic state machine that decides,
// for every address, whether this node must answer for it, and the driver
// that carries those decisions out for the control-plane VIPs through an
// Announcer. The same Core is the per-address holder machine of the pool
// and egress addresses (package pools drives it in batches): one executor
// for every address, each with its Props.
//
// The Core has no goroutines, sockets or clock. Events go in with the time
// they happened (health changed, election decided, kernel observed, action
// failed, timer, shutdown) and actions come out (acquire, release, announce),
// together with the transitions made and the next time the core wants to be
// woken. Every edge case is therefore a table test.
package vip

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Timing of announcements and retries. Linux ignores neighbour updates that
// arrive within locktime (1 s by default) of the last one, so the burst after
// an acquire is spaced a little over a second.
const (
	BurstSpacing   = 1100 * time.Millisecond
	BurstCount     = 5 // announcements in the burst, the first sent at once
	RefreshEvery   = 30 * time.Second
	RetryMin       = 500 * time.Millisecond
	RetryMax       = 2 * time.Second
	ReconcileEvery = time.Second
	// CheckEvery is how often a held VIP is checked (interface up); a lone
	// holder (no election vouches for it) also probes the segment for
	// another holder every ProbeEvery.
	CheckEvery = time.Second
	ProbeEvery = 2 * time.Second
	// WatchedReconcileEvery and WatchedCheckEvery replace ReconcileEvery and
	// CheckEvery while the announcer's watch (Watcher) is live: the kernel
	// reports every change of the VIP interface and its addresses as it
	// happens, so the polling is only a backstop.
	WatchedReconcileEvery = 10 * time.Second
	WatchedCheckEvery     = 10 * time.Second
	// FirstProbe is how soon after binding a lone holder first probes: two
	// lone nodes that bound in the same probe window find each other then.
	FirstProbe = 250 * time.Millisecond
	// ElectedConflictRetry is how soon a holder the election vouches for
	// (a lease a majority granted) probes again after another host
	// answered its pre-bind probe, for its first ElectedConflictTries
	// tries, instead of backing off from RetryMin to RetryMax. The lease
	// excludes a second vipd holder, so the answer is most likely a stale
	// binding: a vipd killed while holding, whose restart (systemd's
	// RestartSec=1) drops it at start, or a kube-vip or keepalived being
	// migrated from. The VIP is then taken within one retry of that drop
	// rather than up to 2 s later, while the clients still point at the
	// dropped binding. A host that keeps answering (a second cluster
	// configured with the same VIP) is probed at the normal back-off after
	// that: the probe stays the fence between them.
	ElectedConflictRetry = 100 * time.Millisecond
	ElectedConflictTries = 50
)

// Timing of pool addresses (Props.Pool).
const (
	// StartupWait is how long after Options.Start the core leaves pool
	// addresses alone: the health check and the lease election's first
	// grants arrive before it takes or drops anything, including addresses
	// a previous run left bound.
	StartupWait = 2 * time.Second
	// ConflictGrace: an acquire whose probe is answered before
	// StartupWait+ConflictGrace after the start is taken for a previous
	// holder about to release (the previous run of a peer, a lease that
	// just moved) and retried after ProbeRetry without reporting.
	ConflictGrace = 3 * time.Second
	ProbeRetry    = 250 * time.Millisecond
	// ConflictRetry is how often a pool address another host answers for
	// is probed again.
	ConflictRetry = 5 * time.Second
	// FailRetry is the pause after a failed bind or advertisement.
	FailRetry = time.Second
)

// ActionKind is what the driver must do.
type ActionKind int

// Action kinds.
const (
	Acquire ActionKind = iota + 1
	Release
	Announce
	// Check asks whether a held VIP still works (Checker); Probe also
	// looks for another holder on the segment.
	Check
)

func (k ActionKind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Announce:
		return "announce"
	case Check:
		return "check"
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// Action is one thing the driver must do for one VIP.
type Action struct {
	Kind  ActionKind
	VIP   netip.Prefix
	Cause string
	Probe bool // Check: also probe for another holder
	// Lone (Acquire): this node bootstraps alone in a cluster, nobody
	// vouches for it (LoneAcquirer).
	Lone bool
	// Handover (Acquire): the previous holder released the VIP for this
	// node moments ago, so nobody else answers: bind without the conflict
	// probe (HandoverAcquirer).
	Handover bool
}

// Transition records that the core changed its mind about holding a VIP.
type Transition struct {
	VIP   netip.Prefix
	Held  bool
	At    time.Time
	Cause string
	// Failed is set when this node could not acquire the VIP or lost it
	// (interface down, another holder): the election should let another
	// node take it. A failed acquire is reported although it never held.
	Failed bool
}

// Output is what one step asks of the driver.
type Output struct {
	Actions     []Action
	Transitions []Transition
	// Next is when the core next wants a Tick; zero means no timer needed.
	Next time.Time
	// Timelines of failovers and handovers completed in this step (the
	// first announcement made, or the VIP bound in modes without one).
	Timelines []Timeline
	// Conflicts newly found (Props.Pool): another host answers for an
	// address this node should hold. Reported once per episode.
	Conflicts []Conflict
}

// Conflict is another host answering for a pool address this node should
// hold: it is not bound meanwhile, and probed again every ConflictRetry.
type Conflict struct {
	VIP netip.Prefix
	MAC string
}

// Timeline is how one failover or planned handover to this node went.
type Timeline struct {
	VIP netip.Prefix `json:"vip"`
	// Handover: a planned handover; else a failover.
	Handover    bool      `json:"handover"`
	PrevHolder  string    `json:"prev_holder"`
	DecidedAt   time.Time `json:"decided_at"`
	BoundAt     time.Time `json:"bound_at"`
	AnnouncedAt time.Time `json:"announced_at,omitempty"`
}

// Kind is "handover" or "failover".
func (t Timeline) Kind() string {
	if t.Handover {
		return "handover"
	}
	return "failover"
}

// Event is an input to the core.
type Event interface{ isEvent() }

// HealthChanged reports the local apiserver's health (after thresholds).
type HealthChanged struct {
	Healthy bool
	Reason  string
}

// Elected reports the election's decision for one VIP: whether this node is
// the one that should hold it. In modes without election (lone node, bgp)
// the core is built with Elect=false and never needs this event.
type Elected struct {
	VIP    netip.Prefix
	Holder bool
	Reason string
	// Lone is set when this node holds by bootstrapping alone: nobody
	// vouches for it, so it gives the VIP up to another holder it finds
	// on the segment.
	Lone bool
	// Handover: the previous holder released the VIP for this node (a
	// planned handover): acquire without the conflict probe.
	Handover bool
	// PrevHolder is the previous holder, for the failover timeline.
	PrevHolder string
	// Yielding: this node holds the VIP only for a planned transfer's
	// agreed overlap, as the old holder (make-before-break): it stays
	// bound, so that connections on their way still land, but no
	// announcement of its schedule goes out any more: one sent after the
	// successor's would take clients back to this node just before it
	// lets go (a planned stop cost clients 140 ms when it fell on the old
	// holder's burst). If the overlap ends with this node still holding
	// (the transfer called off), it announces again at once.
	Yielding bool
	// Until is the end of the lease a majority granted (the lease
	// election): with Holder set, this node may hold the VIP until then
	// and no longer. The core releases it at Until by itself, whether or
	// not another Elected arrives (the election's goroutine may be stuck;
	// the lease ends anyway). Zero: no end (tests; an election
	// that revokes with Holder false). Until must come from the same monotonic
	// clock as the driver's now (time.Now in one process).
	Until time.Time
}

// Observed reports what the outside world says: whether the VIP is present
// on this node now (kernel address, advertised route, cloud assignment).
type Observed struct {
	VIP     netip.Prefix
	Present bool
}

// Failed reports that an action could not be carried out.
type Failed struct {
	Action Action
	Err    error
}

// Done reports that an action was carried out at the event's time. After
// an Acquire it restarts the announce schedule from the moment the VIP was
// really bound, so the burst spacing is measured between frames sent.
type Done struct{ Action Action }

// Tick is the passing of time; the driver sends it at Output.Next and at
// every reconcile.
type Tick struct{}

// Shutdown asks the core to release everything and stop acquiring.
type Shutdown struct{ Reason string }

// CheckNow asks for a Check of every held VIP at once (without probe): the
// announcer saw its interface or addresses change (Watcher). The next
// periodic check is one interval after it.
type CheckNow struct{}

// CheckInterval sets how often held VIPs are checked from now on (the
// driver sets WatchedCheckEvery while a Watcher is live); zero restores
// CheckEvery. A held VIP whose next check would come later
// than one new interval from now is checked then instead.
type CheckInterval struct{ Every time.Duration }

// Props are how the core holds one address. The control-plane VIPs of
// New take theirs from Options; Desired sets them per address.
type Props struct {
	// Leased: holding needs a grant (Elected, Leases), until its Until.
	// Without it a healthy node holds the address (lone node, bgp).
	Leased bool
	// Announce schedules Announce actions after every acquire (l2).
	Announce bool
	// Check schedules Check actions while held (control-plane l2).
	Check bool
	// Barred: this node may not hold the address (its node restriction:
	// the pool's node selector, a local traffic policy, the
	// EgressPolicy's nodeSelector). Never acquired; released at once.
	Barred bool
	// Pool: the policy of the pool and egress addresses. Nothing is taken
	// or dropped before StartupWait after Options.Start; a binding left by
	// a previous run (Observed) is adopted when the address may be held,
	// released otherwise; a failed acquire is retried after FailRetry,
	// another host's answer after ConflictRetry (reported once in
	// Output.Conflicts) or, within the start-up grace, after ProbeRetry;
	// a failure does not make the node step aside (no Failed transition).
	Pool bool
}

// Address is one address of Desired with its properties.
type Address struct {
	VIP netip.Prefix
	Props
}

// Desired is the complete set of addresses the core holds from now on,
// replacing the last (pool and egress addresses: the feed's view). An
// address dropped is released at once if it is, or may be, bound; the core
// remembers it, and releases it whenever it is Observed present again.
type Desired struct{ Addresses []Address }

// Leases is the lease election's decision for every Leased address at
// once: the addresses this node may hold, each until its lease end; the
// complete set, replacing the last. A Leased address absent here is not
// held; one desired later takes its grant from the last Leases.
//
// Handover lists the addresses granted in a planned transfer's agreed
// overlap (make-before-break: the old holder keeps them for a bounded
// while and answers a probe meanwhile): a new grant of one is acquired
// without the conflict probe (Action.Handover), as an Elected Handover.
type Leases struct {
	Until    map[netip.Prefix]time.Time
	Handover map[netip.Prefix]bool
	// Yielding lists the held addresses this node is handing over in an
	// agreed overlap, as the old holder (see Elected.Yielding).
	Yielding map[netip.Prefix]bool
}

// Batch is events that happened together (the results of one batch of
// actions, the listing of a reconcile): one step, one Next.
type Batch struct{ Events []Event }

func (HealthChanged) isEvent() {}
func (Desired) isEvent()       {}
func (Leases) isEvent()        {}
func (Batch) isEvent()         {}
func (Elected) isEvent()       {}
func (Observed) isEvent()      {}
func (Failed) isEvent()        {}
func (Done) isEvent()          {}
func (Tick) isEvent()          {}
func (Shutdown) isEvent()      {}
func (CheckNow) isEvent()      {}
func (CheckInterval) isEvent() {}

// vipState is the core's view of one VIP.
type vipState struct {
	props        Props
	present      bool // Pool: bound by the last Observed or our own Done, not released since
	conflictMAC  string
	conflictAt   time.Time // Pool: first answer of this conflict episode (zero: none)
	elected      bool
	electReason  string
	until        time.Time // the lease end of elected (zero: none)
	lone         bool      // held without anybody vouching (bootstrap, no election)
	acquiring    bool      // an Acquire is under way (until Done or Failed)
	held         bool      // acquired and not released since
	nextCheck    time.Time // next Check of a held VIP
	nextProbe    time.Time // next Check with Probe of a lone holder
	acquiredAt   time.Time // start of the current announce schedule
	announced    int       // announcements made since acquiredAt (the acquire counts as the first)
	nextAnn      time.Time
	retryAt      time.Time // acquire retry after a failure; zero: none pending
	failures     int
	pendingCause string
	last         Transition
	handover     bool      // the next Acquire is a planned handover's
	yielding     bool      // held for a planned transfer's overlap, as the old holder: no announcements
	tl           *Timeline // the failover under way, until announced
	lastTL       Timeline
}

// Core is the state machine. Use New; the zero value is not usable.
type Core struct {
	jitter   time.Duration
	coalesce time.Duration
	start    time.Time     // Options.Start
	checkGap time.Duration // current check interval (CheckEvery, or a CheckInterval event's)
	healthy  bool
	hReason  string
	stopping bool
	order    []netip.Prefix
	vips     map[netip.Prefix]*vipState
	leases   map[netip.Prefix]time.Time // the last Leases
	handover map[netip.Prefix]bool      // the last Leases' Handover
	retired  map[netip.Prefix]bool      // desired once, not now: ours to release when found bound
}

// Options shape a Core.
type Options struct {
	// Elect makes holding depend on Elected events (l2 and cloud with
	// peers). Without it a healthy node holds every VIP (lone node, bgp).
	Elect bool
	// Announce schedules Announce actions after every acquire (l2).
	Announce bool
	// Check schedules Check actions for held VIPs (l2: interface up,
	// another holder on the segment).
	Check bool
	// Jitter is added to the back-off after a failure, different on each
	// node (e.g. from a hash of its name), so that two lone holders that
	// both gave the VIP up do not retry in step.
	Jitter time.Duration
	// Coalesce: announcements due within this much of a wake-up are sent
	// in it (pool addresses: a thousand held addresses need one timer).
	Coalesce time.Duration
	// Start is when the core started: Pool addresses are left alone until
	// StartupWait after it.
	Start time.Time
}

// New returns a core for the given VIPs, starting unhealthy and holding
// nothing.
func New(vips []netip.Prefix, opts Options) *Core {
	c := &Core{jitter: opts.Jitter, coalesce: opts.Coalesce, start: opts.Start, checkGap: CheckEvery,
		hReason: "no health check yet", vips: map[netip.Prefix]*vipState{},
		retired: map[netip.Prefix]bool{}}
	props := Props{Leased: opts.Elect, Announce: opts.Announce, Check: opts.Check}
	for _, v := range vips {
		if _, dup := c.vips[v]; dup {
			continue
		}
		c.order = append(c.order, v)
		c.vips[v] = &vipState{props: props}
	}
	return c
}

// VIPState is a read-only view of one VIP for status pages.
type VIPState struct {
	VIP       netip.Prefix
	Held      bool
	Acquiring bool
	Barred    bool
	Present   bool // Pool: bound as far as the core knows
	// Conflict is the MAC of another host answering for it (Pool), while
	// the episode lasts.
	Conflict       string
	Elected        bool
	ElectionReason string
	Last           Transition
	RetryAt        time.Time
	// LastFailover is the timeline of the last failover or handover to
	// this node (zero: none since start).
	LastFailover Timeline
}

// State returns the core's view of every VIP, in configuration order.
func (c *Core) State() []VIPState {
	out := make([]VIPState, 0, len(c.order))
	for _, v := range c.order {
		s := c.vips[v]
		out = append(out, VIPState{VIP: v, Held: s.held, Acquiring: s.acquiring, Barred: s.props.Barred, Present: s.present, Conflict: s.conflictMAC,
			Elected: s.elected, ElectionReason: s.electReason, Last: s.last, RetryAt: s.retryAt, LastFailover: s.lastTL})
	}
	return out
}

// Wants reports whether the core wants to hold v at now (false for an
// address it does not have).
func (c *Core) Wants(v netip.Prefix, now time.Time) bool {
	if _, ok := c.vips[v]; !ok {
		return false
	}
	return c.want(v, now)
}

// Healthy reports the last health the core was told.
func (c *Core) Healthy() bool { return c.healthy }

// Step feeds one event that happened at now and returns what to do.
func (c *Core) Step(ev Event, now time.Time) Output {
	var out Output
	c.step(ev, now, &out)
	out.Next = c.next(now)
	return out
}

func (c *Core) step(ev Event, now time.Time, out *Output) {
	switch e := ev.(type) {
	case Batch:
		for _, ev := range e.Events {
			c.step(ev, now, out)
		}
	case Desired:
		c.setAddresses(e.Addresses, now, out)
	case Leases:
		c.setLeases(e.Until, e.Handover, e.Yielding, now, out)
	case HealthChanged:
		c.healthy = e.Healthy
		c.hReason = e.Reason
		for _, v := range c.order {
			c.converge(v, now, out, c.cause(v, now, e.Reason))
		}
	case Elected:
		s, ok := c.vips[e.VIP]
		if !ok {
			break
		}
		if e.Lone && !s.lone && s.held && s.props.Check {
			s.nextProbe = now.Add(FirstProbe)
		}
		if !e.Lone {
			// Vouched for now (the first node's peers joined): no more
			// probes for another holder, and no deadline for them.
			s.nextProbe = time.Time{}
		}
		s.elected, s.electReason, s.lone = e.Holder, e.Reason, e.Lone
		s.until = time.Time{}
		if e.Holder {
			s.until = e.Until
		}
		c.setYielding(e.VIP, e.Holder && e.Yielding, now, out)
		switch {
		case !e.Holder:
			s.handover, s.tl = false, nil
		case !s.held && !s.acquiring:
			s.handover = e.Handover
			s.tl = nil
			if e.PrevHolder != "" {
				s.tl = &Timeline{VIP: e.VIP, Handover: e.Handover, PrevHolder: e.PrevHolder, DecidedAt: now}
			}
		}
		c.converge(e.VIP, now, out, c.cause(e.VIP, now, e.Reason))
	case Observed:
		c.observe(e, now, out)
	case Failed:
		c.failed(e, now, out)
	case Done:
		c.done(e, now, out)
	case Tick:
		for _, v := range c.order {
			c.tick(v, now, out)
		}
	case CheckNow:
		c.checkNow(now, out)
	case CheckInterval:
		c.setCheckInterval(e.Every, now)
	case Shutdown:
		c.stopping = true
		for _, v := range c.order {
			c.converge(v, now, out, "shutdown: "+e.Reason)
		}
	}
}

// setAddresses makes as the addresses of the core (Desired).
func (c *Core) setAddresses(as []Address, now time.Time, out *Output) {
	want := make(map[netip.Prefix]Props, len(as))
	order := make([]netip.Prefix, 0, len(as))
	for _, a := range as {
		if _, dup := want[a.VIP]; dup {
			continue
		}
		want[a.VIP] = a.Props
		order = append(order, a.VIP)
	}
	for _, v := range c.order {
		if _, ok := want[v]; ok {
			continue
		}
		s := c.vips[v]
		if s.held || s.acquiring || s.present {
			// acquiring: a bind that completes later is undone (done).
			out.Actions = append(out.Actions, Action{Kind: Release, VIP: v, Cause: "no longer desired"})
		}
		if s.held {
			c.transition(v, false, now, "no longer desired", out)
		}
		delete(c.vips, v)
		c.retired[v] = true
	}
	c.order = order
	for _, v := range order {
		s, ok := c.vips[v]
		if !ok {
			s = &vipState{}
			c.vips[v] = s
			delete(c.retired, v)
			if u, ok := c.leases[v]; ok {
				s.elected, s.until, s.electReason = true, u, "lease granted"
				s.handover = c.handover[v]
			}
		}
		s.props = want[v]
		if s.props.Leased && !s.elected && s.electReason == "" {
			s.electReason = "no lease"
		}
		if s.props.Pool && !s.held && !s.acquiring && !s.present && s.retryAt.IsZero() && !c.want(v, now) {
			continue // nothing to do: spare the cause
		}
		c.converge(v, now, out, c.cause(v, now, ""))
	}
}

// setLeases applies the lease election's grants to every Leased address.
func (c *Core) setLeases(until map[netip.Prefix]time.Time, handover, yielding map[netip.Prefix]bool, now time.Time, out *Output) {
	c.leases = make(map[netip.Prefix]time.Time, len(until))
	for v, u := range until {
		c.leases[v] = u
	}
	c.handover = handover
	for _, v := range c.order {
		s := c.vips[v]
		if !s.props.Leased {
			continue
		}
		u, ok := c.leases[v]
		c.setYielding(v, ok && yielding[v], now, out)
		if ok == s.elected && u.Equal(s.until) {
			continue // a batch repeats most grants
		}
		switch {
		case !ok:
			s.handover = false
		case !s.elected && !s.held && !s.acquiring:
			// a new grant: a planned transfer's is bound without the probe
			s.handover = handover[v]
		}
		s.elected, s.until, s.lone = ok, u, false
		s.electReason = "no lease"
		if ok {
			s.electReason = "lease granted"
		}
		if s.handover {
			s.electReason = "lease granted: planned transfer (make-before-break)"
		}
		c.converge(v, now, out, c.cause(v, now, ""))
	}
}

// starting reports whether Pool addresses are still left alone.
func (c *Core) starting(now time.Time) bool {
	return !c.start.IsZero() && now.Before(c.start.Add(StartupWait))
}

// want reports whether this node should hold v now.
func (c *Core) want(v netip.Prefix, now time.Time) bool {
	s := c.vips[v]
	if c.stopping || !c.healthy || s.props.Barred || s.props.Pool && c.starting(now) {
		return false
	}
	return !s.props.Leased || (s.elected && !s.leaseOver(now))
}

// leaseOver reports whether the lease of an elected VIP has ended.
func (s *vipState) leaseOver(now time.Time) bool {
	return !s.until.IsZero() && !now.Before(s.until)
}

// cause explains the current wish for v, for logs and /status.
func (c *Core) cause(v netip.Prefix, now time.Time, reason string) string {
	switch {
	case c.stopping:
		return "shutting down"
	case !c.healthy:
		return "apiserver unhealthy: " + c.hReason
	case c.vips[v].props.Barred:
		return "this node may not hold it (node restriction)"
	case c.vips[v].props.Pool && c.starting(now):
		return "starting: addresses left alone until " + c.start.Add(StartupWait).Format(time.RFC3339Nano)
	case c.vips[v].props.Leased && !c.vips[v].elected:
		return "not elected: " + c.vips[v].electReason
	case c.vips[v].props.Leased && c.vips[v].leaseOver(now):
		return "lease ended at " + c.vips[v].until.Format(time.RFC3339Nano) + " without a renewal: " + c.vips[v].electReason
	case c.vips[v].props.Leased:
		return "healthy and elected: " + c.vips[v].electReason
	default:
		if reason == "" {
			reason = c.hReason
		}
		return "apiserver healthy: " + reason
	}
}

// converge moves v towards what want says.
func (c *Core) converge(v netip.Prefix, now time.Time, out *Output, cause string) {
	s := c.vips[v]
	w := c.want(v, now)
	if !w && s.props.Pool && !s.held && !s.acquiring {
		s.retryAt, s.conflictAt, s.conflictMAC = time.Time{}, time.Time{}, ""
		if s.present && (c.stopping || !c.starting(now)) {
			// Bound by a previous run (or by hand): not ours to hold.
			s.present = false
			out.Actions = append(out.Actions, Action{Kind: Release, VIP: v, Cause: "bound but not held: " + cause})
		}
		return
	}
	if w == (s.held || s.acquiring) {
		return
	}
	if w {
		c.acquire(v, now, out, cause)
		return
	}
	wasHeld := s.held
	s.held, s.acquiring = false, false
	s.retryAt, s.failures = time.Time{}, 0
	s.nextAnn, s.nextCheck, s.nextProbe = time.Time{}, time.Time{}, time.Time{}
	s.present, s.conflictAt, s.conflictMAC = false, time.Time{}, ""
	out.Actions = append(out.Actions, Action{Kind: Release, VIP: v, Cause: cause})
	if wasHeld {
		c.transition(v, false, now, cause, out)
	}
}

func (c *Core) acquire(v netip.Prefix, now time.Time, out *Output, cause string) {
	s := c.vips[v]
	if !s.retryAt.IsZero() && now.Before(s.retryAt) {
		return // a failed acquire is retried at retryAt by tick
	}
	s.acquiring = true
	s.retryAt = time.Time{}
	s.pendingCause = cause
	out.Actions = append(out.Actions, Action{Kind: Acquire, VIP: v, Cause: cause, Lone: s.props.Leased && s.lone, Handover: s.handover})
}

// done completes an action: an Acquire makes the VIP held, starts the
// announcements and the checks.
func (c *Core) done(e Done, now time.Time, out *Output) {
	s, ok := c.vips[e.Action.VIP]
	if !ok {
		if e.Action.Kind == Acquire && c.retired[e.Action.VIP] {
			// Bound after it stopped being desired: undo.
			out.Actions = append(out.Actions, Action{Kind: Release, VIP: e.Action.VIP, Cause: "bound after it stopped being desired"})
		}
		return
	}
	switch {
	case e.Action.Kind == Announce && s.held && s.tl != nil && !s.tl.BoundAt.IsZero():
		s.tl.AnnouncedAt = now
		c.completeTimeline(s, out)
		return
	case e.Action.Kind == Acquire && !s.acquiring && !s.held && s.props.Pool:
		// Bound after it stopped being wanted: undo.
		out.Actions = append(out.Actions, Action{Kind: Release, VIP: e.Action.VIP, Cause: "bound after it stopped being wanted: " + c.cause(e.Action.VIP, now, "")})
		return
	case e.Action.Kind != Acquire || !s.acquiring:
		return
	}
	s.acquiring, s.handover = false, false
	s.conflictAt, s.conflictMAC = time.Time{}, ""
	if s.props.Pool {
		s.present = true
	}
	if s.tl != nil {
		s.tl.BoundAt = now
		if !s.props.Announce {
			c.completeTimeline(s, out)
		}
	}
	s.failures = 0
	wasHeld := s.held
	s.held = true
	c.startAnnouncing(e.Action.VIP, now, out)
	if s.props.Check {
		s.nextCheck = now.Add(c.checkGap)
		if c.lone(s) {
			s.nextProbe = now.Add(FirstProbe)
		}
	}
	if !wasHeld {
		c.transition(e.Action.VIP, true, now, s.pendingCause, out)
	}
}

func (c *Core) completeTimeline(s *vipState, out *Output) {
	s.lastTL = *s.tl
	out.Timelines = append(out.Timelines, *s.tl)
	s.tl = nil
}

// lone reports whether s is held without anybody vouching for it.
func (c *Core) lone(s *vipState) bool { return !s.props.Leased || s.lone }

// startAnnouncing begins the burst: the acquire itself is followed at once
// by an announcement, then BurstCount-1 more at BurstSpacing.
func (c *Core) startAnnouncing(v netip.Prefix, now time.Time, out *Output) {
	s := c.vips[v]
	if !s.props.Announce {
		return
	}
	s.acquiredAt = now
	s.announced = 1
	s.nextAnn = now.Add(BurstSpacing)
	out.Actions = append(out.Actions, Action{Kind: Announce, VIP: v, Cause: "acquired"})
}

// YieldResume is how long after a planned transfer's overlap ends a node
// that still holds the address waits before it announces again (a new
// burst): the election's release usually follows the end of the overlap
// within a step or two, and an announcement sent in between took clients
// back to the node about to let go (the lab: 140 ms lost at every
// planned stop). A transfer called off ends with this node the holder,
// and the successor may have announced meanwhile.
const YieldResume = 250 * time.Millisecond

// setYielding marks v as held only for a planned transfer's overlap, as
// the old holder (no announcements), or no longer (announcements again
// from YieldResume on, while still held).
func (c *Core) setYielding(v netip.Prefix, yielding bool, now time.Time, out *Output) {
	s := c.vips[v]
	if s == nil || s.yielding == yielding {
		return
	}
	s.yielding = yielding
	if !yielding && s.held && s.props.Announce {
		s.acquiredAt = now
		s.announced = 0
		s.nextAnn = now.Add(YieldResume)
	}
}

func (c *Core) transition(v netip.Prefix, held bool, now time.Time, cause string, out *Output) {
	t := Transition{VIP: v, Held: held, At: now, Cause: cause}
	c.vips[v].last = t
	out.Transitions = append(out.Transitions, t)
}

func (c *Core) observe(e Observed, now time.Time, out *Output) {
	s, ok := c.vips[e.VIP]
	if !ok {
		if e.Present && c.retired[e.VIP] {
			out.Actions = append(out.Actions, Action{Kind: Release, VIP: e.VIP, Cause: "reconcile: bound and no longer desired"})
		}
		return
	}
	if s.props.Pool {
		s.present = e.Present
	}
	switch {
	case s.acquiring:
		// An acquire is under way: Done or Failed settles it.
	case s.held && !e.Present:
		// Someone removed the VIP while we hold it: put it back and
		// announce again, as after a fresh acquire.
		s.acquiring, s.pendingCause = true, "reconcile: VIP missing while held"
		out.Actions = append(out.Actions, Action{Kind: Acquire, VIP: e.VIP, Cause: s.pendingCause})
	case s.held && e.Present:
	case !s.held && e.Present && s.props.Pool && c.starting(now):
		// Left by a previous run: alone during the start-up.
	case !s.held && e.Present && s.props.Pool && c.want(e.VIP, now):
		// Left by a previous run and this node may hold it: adopt it
		// after a probe (now, or at the retry under way).
		c.acquire(e.VIP, now, out, "adopting a binding left by a previous run: "+c.cause(e.VIP, now, ""))
	case !s.held && e.Present:
		// Present but not ours to hold: a crash left it behind, another
		// tool added it, or an acquire failed half-way. Remove it.
		s.present = false
		out.Actions = append(out.Actions, Action{Kind: Release, VIP: e.VIP, Cause: "reconcile: VIP present but not held (" + c.cause(e.VIP, now, "") + ")"})
	}
}

func (c *Core) failed(e Failed, now time.Time, out *Output) {
	s, ok := c.vips[e.Action.VIP]
	if !ok {
		return
	}
	switch e.Action.Kind {
	case Acquire:
		if !s.acquiring {
			return // released meanwhile
		}
		s.handover, s.tl = false, nil
		if s.props.Pool {
			c.poolFailed(e, now, out)
			return
		}
		// Another host answering for the VIP is no fault of this node:
		// retry after the back-off without stepping aside (every other
		// node would find the same host). Anything else is.
		var conflict *ConflictError
		isConflict := errors.As(e.Err, &conflict)
		if isConflict && c.quickConflictRetry(s, now) {
			c.retryAfter(e.Action.VIP, now, out, "acquire failed", e.Err, ElectedConflictRetry)
			return
		}
		c.giveUp(e.Action.VIP, now, out, "acquire failed", e.Err, !isConflict)
	case Check:
		if !s.held {
			return
		}
		var conflict *ConflictError
		switch {
		case errors.As(e.Err, &conflict) && !c.lone(s):
			// The election vouches for us: the other answerer is the
			// stray one. Win the neighbours' caches back.
			out.Actions = append(out.Actions, Action{Kind: Announce, VIP: e.Action.VIP, Cause: "another holder answers: " + conflict.MAC.String()})
		case errors.As(e.Err, &conflict):
			c.giveUp(e.Action.VIP, now, out, "another holder answers on the segment and nobody vouches for this node", e.Err, false)
		case errors.Is(e.Err, ErrLinkDown):
			c.giveUp(e.Action.VIP, now, out, "VIP interface down", e.Err, true)
		case errors.Is(e.Err, ErrUnverified):
			// Its announcements do not arrive: another node may do better.
			c.giveUp(e.Action.VIP, now, out, "the other nodes cannot reach the VIP through this node", e.Err, true)
		}
	case Release:
		// Try again at the next reconcile: Observed(Present) re-issues it.
	case Announce:
		// Announcements are repeated anyway; nothing to change.
	}
}

// giveUp releases v (whatever may be left of it: nothing half-applied stays
// behind) and backs off before trying again. With stepAside (a fault of
// this node) the transition is Failed, and the election leaves the VIP to
// another node meanwhile; without (another host holds it), it is a plain
// release.
func (c *Core) giveUp(v netip.Prefix, now time.Time, out *Output, what string, err error, stepAside bool) {
	s := c.vips[v]
	backoff := RetryMin << min(s.failures, 8)
	if backoff > RetryMax || backoff <= 0 {
		backoff = RetryMax
	}
	c.release(v, now, out, what, err, stepAside, backoff+c.jitter)
}

// quickConflictRetry reports whether an answered pre-bind probe of s is
// retried after ElectedConflictRetry: a lease a majority granted vouches
// for this node (it rules out another vipd holder: the answer is most
// likely the stale binding of a vipd killed while holding, which its
// restart drops), for the first ElectedConflictTries tries.
func (c *Core) quickConflictRetry(s *vipState, now time.Time) bool {
	return !c.lone(s) && s.elected && !s.leaseOver(now) && s.failures < ElectedConflictTries
}

// retryAfter releases v after a conflicted acquire and tries again after
// d: the election vouches for this node (ElectedConflictRetry).
func (c *Core) retryAfter(v netip.Prefix, now time.Time, out *Output, what string, err error, d time.Duration) {
	c.release(v, now, out, what, err, false, d)
}

// release is giveUp's and retryAfter's common part: whatever may be left of
// v is released, the next try comes after backoff.
func (c *Core) release(v netip.Prefix, now time.Time, out *Output, what string, err error, stepAside bool, backoff time.Duration) {
	s := c.vips[v]
	s.held, s.acquiring = false, false
	s.failures++
	s.retryAt = now.Add(backoff)
	s.nextAnn, s.nextCheck, s.nextProbe = time.Time{}, time.Time{}, time.Time{}
	out.Actions = append(out.Actions, Action{Kind: Release, VIP: v, Cause: what})
	t := Transition{VIP: v, Held: false, At: now, Cause: fmt.Sprintf("%s (retry in %v): %v", what, backoff, err), Failed: stepAside}
	s.last = t
	out.Transitions = append(out.Transitions, t)
}

// poolFailed is a failed acquire of a Pool address (Props.Pool).
func (c *Core) poolFailed(e Failed, now time.Time, out *Output) {
	v := e.Action.VIP
	s := c.vips[v]
	wasHeld := s.held
	s.held, s.acquiring = false, false
	s.nextAnn, s.nextCheck, s.nextProbe = time.Time{}, time.Time{}, time.Time{}
	var conflict *ConflictError
	what := "acquire failed"
	switch {
	case errors.As(e.Err, &conflict) && s.conflictAt.IsZero() && now.Before(c.start.Add(StartupWait+ConflictGrace)):
		// Most likely a previous holder about to release.
		s.retryAt = now.Add(ProbeRetry)
		what = "another host answers during the start-up grace"
	case errors.As(e.Err, &conflict):
		mac := conflict.MAC.String()
		if s.conflictAt.IsZero() || s.conflictMAC != mac {
			s.conflictAt = now
			out.Conflicts = append(out.Conflicts, Conflict{VIP: v, MAC: mac})
		}
		s.conflictMAC = mac
		s.retryAt = now.Add(ConflictRetry)
		what = "another host answers"
		if c.quickConflictRetry(s, now) {
			s.failures++
			s.retryAt = now.Add(ElectedConflictRetry)
		}
	default:
		s.retryAt = now.Add(FailRetry)
	}
	if s.present || wasHeld {
		// Our binding (left by a previous run, or ours until now) would
		// answer next to the other holder's: drop it.
		s.present = false
		out.Actions = append(out.Actions, Action{Kind: Release, VIP: v, Cause: what})
	}
	if wasHeld {
		t := Transition{VIP: v, Held: false, At: now, Cause: fmt.Sprintf("%s (retry at %v): %v", what, s.retryAt.Format(time.RFC3339Nano), e.Err)}
		s.last = t
		out.Transitions = append(out.Transitions, t)
	}
}

func (c *Core) tick(v netip.Prefix, now time.Time, out *Output) {
	s := c.vips[v]
	if s.props.Pool && !s.held && !s.acquiring && s.retryAt.IsZero() && (s.present || c.want(v, now)) {
		// The start-up ended, or a leftover waits: take or drop it.
		c.converge(v, now, out, c.cause(v, now, ""))
		return
	}
	if (s.held || s.acquiring) && s.props.Leased && s.elected && s.leaseOver(now) {
		// The lease ended without a renewal reaching the core: let go now,
		// whatever the election's goroutine is doing.
		c.converge(v, now, out, c.cause(v, now, ""))
		return
	}
	if s.held && s.props.Check {
		probe := c.lone(s) && !s.nextProbe.IsZero() && !now.Before(s.nextProbe)
		if probe || (!s.nextCheck.IsZero() && !now.Before(s.nextCheck)) {
			s.nextCheck = now.Add(c.checkGap)
			if probe {
				s.nextProbe = now.Add(ProbeEvery)
			}
			out.Actions = append(out.Actions, Action{Kind: Check, VIP: v, Probe: probe})
		}
	}
	if !s.held && !s.acquiring && !s.retryAt.IsZero() && !now.Before(s.retryAt) {
		s.retryAt = time.Time{}
		if c.want(v, now) {
			c.acquire(v, now, out, "retry: "+c.cause(v, now, ""))
			return
		}
		s.failures = 0
	}
	if s.held && s.props.Announce && !s.yielding && !s.nextAnn.IsZero() && !now.Before(s.nextAnn.Add(-c.coalesce)) {
		s.announced++
		kind := "burst"
		if s.announced < BurstCount {
			s.nextAnn = now.Add(BurstSpacing)
		} else {
			s.nextAnn = now.Add(RefreshEvery)
		}
		if s.announced > BurstCount {
			kind = "refresh"
		}
		out.Actions = append(out.Actions, Action{Kind: Announce, VIP: v, Cause: kind})
	}
}

// checkNow checks every held VIP at once, without probe (a probe waits
// for answers; the lone holder's probe schedule is left as it is).
func (c *Core) checkNow(now time.Time, out *Output) {
	for _, v := range c.order {
		s := c.vips[v]
		if !s.held || !s.props.Check {
			continue
		}
		s.nextCheck = now.Add(c.checkGap)
		out.Actions = append(out.Actions, Action{Kind: Check, VIP: v, Cause: "interface or addresses changed"})
	}
}

// setCheckInterval changes the check interval; a check due later than one
// new interval from now comes forward.
func (c *Core) setCheckInterval(every time.Duration, now time.Time) {
	if every <= 0 {
		every = CheckEvery
	}
	c.checkGap = every
	for _, v := range c.order {
		s := c.vips[v]
		if s.held && s.props.Check && (s.nextCheck.IsZero() || s.nextCheck.After(now.Add(every))) {
			s.nextCheck = now.Add(every)
		}
	}
}

// next returns the earliest timer the core needs.
func (c *Core) next(now time.Time) time.Time {
	var n time.Time
	add := func(t time.Time) {
		if !t.IsZero() && (n.IsZero() || t.Before(n)) {
			n = t
		}
	}
	starting := c.starting(now)
	for _, v := range c.order {
		s := c.vips[v]
		if s.props.Pool && starting {
			add(c.start.Add(StartupWait))
		}
		if (s.held || s.acquiring) && s.props.Leased && s.elected {
			add(s.until)
		}
		if s.held && s.props.Announce && !s.yielding && !s.nextAnn.IsZero() {
			add(s.nextAnn.Add(-c.coalesce))
		}
		add(s.retryAt)
		add(s.nextCheck)
		if s.held && c.lone(s) {
			// Only a lone holder probes (tick): a probe deadline of a
			// holder no longer lone would come back at once, for ever.
			add(s.nextProbe)
		}
	}
	return n
}
