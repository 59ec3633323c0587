// Package vip holds vipd's core: a deterministic state machine that decides,
// for every VIP, whether this node must answer for it, and the driver that
// carries those decisions out through an Announcer.
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

func (HealthChanged) isEvent() {}
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
	tl           *Timeline // the failover under way, until announced
	lastTL       Timeline
}

// Core is the state machine. Use New; the zero value is not usable.
type Core struct {
	elect    bool // holding needs an Elected{Holder:true}
	announce bool // schedule Announce actions (l2)
	check    bool // schedule Check actions (l2)
	jitter   time.Duration
	checkGap time.Duration // current check interval (CheckEvery, or a CheckInterval event's)
	healthy  bool
	hReason  string
	stopping bool
	order    []netip.Prefix
	vips     map[netip.Prefix]*vipState
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
}

// New returns a core for the given VIPs, starting unhealthy and holding
// nothing.
func New(vips []netip.Prefix, opts Options) *Core {
	c := &Core{elect: opts.Elect, announce: opts.Announce, check: opts.Check, jitter: opts.Jitter, checkGap: CheckEvery,
		hReason: "no health check yet", vips: map[netip.Prefix]*vipState{}}
	for _, v := range vips {
		if _, dup := c.vips[v]; dup {
			continue
		}
		c.order = append(c.order, v)
		c.vips[v] = &vipState{}
	}
	return c
}

// VIPState is a read-only view of one VIP for status pages.
type VIPState struct {
	VIP            netip.Prefix
	Held           bool
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
		out = append(out, VIPState{VIP: v, Held: s.held, Elected: s.elected, ElectionReason: s.electReason, Last: s.last, RetryAt: s.retryAt, LastFailover: s.lastTL})
	}
	return out
}

// Healthy reports the last health the core was told.
func (c *Core) Healthy() bool { return c.healthy }

// Step feeds one event that happened at now and returns what to do.
func (c *Core) Step(ev Event, now time.Time) Output {
	var out Output
	switch e := ev.(type) {
	case HealthChanged:
		c.healthy = e.Healthy
		c.hReason = e.Reason
		for _, v := range c.order {
			c.converge(v, now, &out, c.cause(v, now, e.Reason))
		}
	case Elected:
		s, ok := c.vips[e.VIP]
		if !ok {
			break
		}
		if e.Lone && !s.lone && s.held && c.check {
			s.nextProbe = now.Add(FirstProbe)
		}
		s.elected, s.electReason, s.lone = e.Holder, e.Reason, e.Lone
		s.until = time.Time{}
		if e.Holder {
			s.until = e.Until
		}
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
		c.converge(e.VIP, now, &out, c.cause(e.VIP, now, e.Reason))
	case Observed:
		c.observe(e, now, &out)
	case Failed:
		c.failed(e, now, &out)
	case Done:
		c.done(e, now, &out)
	case Tick:
		for _, v := range c.order {
			c.tick(v, now, &out)
		}
	case CheckNow:
		c.checkNow(now, &out)
	case CheckInterval:
		c.setCheckInterval(e.Every, now)
	case Shutdown:
		c.stopping = true
		for _, v := range c.order {
			c.converge(v, now, &out, "shutdown: "+e.Reason)
		}
	}
	out.Next = c.next()
	return out
}

// want reports whether this node should hold v now.
func (c *Core) want(v netip.Prefix, now time.Time) bool {
	if c.stopping || !c.healthy {
		return false
	}
	s := c.vips[v]
	return !c.elect || (s.elected && !s.leaseOver(now))
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
	case c.elect && !c.vips[v].elected:
		return "not elected: " + c.vips[v].electReason
	case c.elect && c.vips[v].leaseOver(now):
		return "lease ended at " + c.vips[v].until.Format(time.RFC3339Nano) + " without a renewal: " + c.vips[v].electReason
	case c.elect:
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
	out.Actions = append(out.Actions, Action{Kind: Acquire, VIP: v, Cause: cause, Lone: c.elect && s.lone, Handover: s.handover})
}

// done completes an action: an Acquire makes the VIP held, starts the
// announcements and the checks.
func (c *Core) done(e Done, now time.Time, out *Output) {
	s, ok := c.vips[e.Action.VIP]
	if !ok {
		return
	}
	switch {
	case e.Action.Kind == Announce && s.held && s.tl != nil && !s.tl.BoundAt.IsZero():
		s.tl.AnnouncedAt = now
		c.completeTimeline(s, out)
		return
	case e.Action.Kind != Acquire || !s.acquiring:
		return
	}
	s.acquiring, s.handover = false, false
	if s.tl != nil {
		s.tl.BoundAt = now
		if !c.announce {
			c.completeTimeline(s, out)
		}
	}
	s.failures = 0
	wasHeld := s.held
	s.held = true
	c.startAnnouncing(e.Action.VIP, now, out)
	if c.check {
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
func (c *Core) lone(s *vipState) bool { return !c.elect || s.lone }

// startAnnouncing begins the burst: the acquire itself is followed at once
// by an announcement, then BurstCount-1 more at BurstSpacing.
func (c *Core) startAnnouncing(v netip.Prefix, now time.Time, out *Output) {
	s := c.vips[v]
	if !c.announce {
		return
	}
	s.acquiredAt = now
	s.announced = 1
	s.nextAnn = now.Add(BurstSpacing)
	out.Actions = append(out.Actions, Action{Kind: Announce, VIP: v, Cause: "acquired"})
}

func (c *Core) transition(v netip.Prefix, held bool, now time.Time, cause string, out *Output) {
	t := Transition{VIP: v, Held: held, At: now, Cause: cause}
	c.vips[v].last = t
	out.Transitions = append(out.Transitions, t)
}

func (c *Core) observe(e Observed, now time.Time, out *Output) {
	s, ok := c.vips[e.VIP]
	if !ok {
		return
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
	case !s.held && e.Present:
		// Present but not ours to hold: a crash left it behind, another
		// tool added it, or an acquire failed half-way. Remove it.
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
		// Another host answering for the VIP is no fault of this node:
		// retry after the back-off without stepping aside (every other
		// node would find the same host). Anything else is.
		var conflict *ConflictError
		isConflict := errors.As(e.Err, &conflict)
		if isConflict && c.elect && s.elected && !s.lone && s.failures < ElectedConflictTries {
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

func (c *Core) tick(v netip.Prefix, now time.Time, out *Output) {
	s := c.vips[v]
	if (s.held || s.acquiring) && c.elect && s.elected && s.leaseOver(now) {
		// The lease ended without a renewal reaching the core: let go now,
		// whatever the election's goroutine is doing.
		c.converge(v, now, out, c.cause(v, now, ""))
		return
	}
	if s.held && c.check {
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
	if s.held && c.announce && !s.nextAnn.IsZero() && !now.Before(s.nextAnn) {
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
	if !c.check {
		return
	}
	for _, v := range c.order {
		s := c.vips[v]
		if !s.held {
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
		if s.held && c.check && (s.nextCheck.IsZero() || s.nextCheck.After(now.Add(every))) {
			s.nextCheck = now.Add(every)
		}
	}
}

// next returns the earliest timer the core needs.
func (c *Core) next() time.Time {
	var n time.Time
	for _, v := range c.order {
		s := c.vips[v]
		var until time.Time
		if (s.held || s.acquiring) && c.elect && s.elected {
			until = s.until
		}
		for _, t := range []time.Time{s.nextAnn, s.retryAt, s.nextCheck, s.nextProbe, until} {
			if !t.IsZero() && (n.IsZero() || t.Before(n)) {
				n = t
			}
		}
	}
	return n
}
