package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/internal/clock"
)

// Clock is the lease runtime's time, the drivers' clock (internal/clock):
// Now must be monotonic (time.Now's reading carries the monotonic clock,
// so a step of the wall clock moves no lease end), and timers fire after
// durations of it. Tests use clock.Fake.
type (
	Clock     = clock.Clock
	Timer     = clock.Timer
	RealClock = clock.Real
)

// leaseMachine is what the runtime needs of lease.Machine.
type leaseMachine interface {
	Step(now time.Time, ev lease.Event) lease.Output
	Status() lease.Status
}

// peerSender hands a machine's message to the transport. It must not
// block for long: the loop waits for it.
type peerSender interface {
	Send(to string, data []byte) error
}

// stateSaver persists Output.Persist durably before anything is sent.
type stateSaver interface {
	Save(data []byte) error
}

// LeaseDecision is one address's holder decision for the executors (the
// vip core, the pools): Holder with the lease end Until, or not holder
// (release now).
type LeaseDecision struct {
	Address lease.Address
	Holder  bool
	Until   time.Time
	Leader  string // the leader when decided ("" unknown)
	Reason  string
	// Prev is, for a new hold, the node this one last knew as the
	// holder ("" unknown); Handover: Prev let it go for this node (a
	// planned move: handover, preemption, graceful stop), not a failure.
	Prev     string
	Handover bool
	// Lone: this node holds as the only voter of its cluster while it
	// expects peers (a kubeadm first node, or one cut off from the others
	// at its first start): the l2 probe keeps looking for another holder
	// and cloud mode does not take an address another instance holds.
	Lone bool
	// Node is the node that holds the address as this node knows it:
	// this node's name while Holder, another's when the leader told who
	// holds it, "" when none is known.
	Node string
	// OverlapWith: a planned transfer's successor takes the address while
	// this old holder still holds it for a bounded, agreed while
	// (make-before-break): bind without the conflict probe.
	OverlapWith string
	// Yielding: this node is the old holder of a planned transfer's
	// overlap: it keeps the address bound (connections on their way
	// still land) but announces it no more, so that no announcement of
	// its own, due meanwhile, takes clients back from the successor.
	Yielding bool
}

// idleWake bounds the timer when the machine asks for no tick.
const idleWake = time.Second

// failedPause is how long this node counts as unhealthy after the core
// could not hold an address (interface down, acquire failed): the lease
// goes to another node meanwhile.
const failedPause = 2 * time.Second

const (
	// KeyVeto is how long after a gossip key mismatch a node that knows no
	// other member refuses to hold alone.
	KeyVeto = time.Minute
	// ConflictHold is how long after the last sign of another node with
	// this node's name this node stays ineligible.
	ConflictHold = 30 * time.Second
)

// leaseLoop drives a lease machine: one goroutine (run) owns the machine,
// steps it with every event and at its deadline, persists before sending,
// and turns Holds into decisions. It is the lease runtime without
// memberlist, so that tests run it with a fake clock and network.
type leaseLoop struct {
	m      leaseMachine
	clock  Clock
	net    peerSender
	store  stateSaver
	log    *slog.Logger
	decide func([]LeaseDecision) // the changes of one step, in address order
	meta   func([]byte)          // publish this node's metadata (nil: none)
	// witness: never send Health (a witness has no apiserver).
	witness bool
	// expectPeers: VIPD_PEERS is set. A hold while this node is the only
	// voter is then Lone (nobody vouches for it: it may be cut off from a
	// cluster that holds the address).
	expectPeers bool

	events chan lease.Event
	// stopped is closed when run returns (waiters stop waiting).
	stopped chan struct{}

	// Run's goroutine only.
	held        map[string]time.Time
	yielding    map[string]bool   // held addresses handed over in an overlap (Yielding)
	elsewhere   map[string]string // not held here: the reason last given
	lastOther   map[string]string // the other node last known to hold each address
	kinds       map[string]lease.Kind
	healthy     bool
	failedUntil time.Time
	vetoUntil   time.Time // a lone node counts as unhealthy until then (keyEvent, conflictEvent)
	machineNext time.Time // the machine's last Output.Next
	sentHealth  *bool
	ovt         *overlapTracker          // planned transfers' overlaps (leaseoverlap.go); nil: not followed
	ovs         map[string]lease.Overlap // the last Output's overlaps
	late        lateness                 // wake-ups past the deadline and long steps (zero: not watched)

	mu       sync.Mutex
	status   lease.Status
	holds    map[string]time.Time // copy of held for readers
	sendErrs uint64
	stepped  chan struct{} // closed and replaced after every step (waiters)
}

func newLeaseLoop(m leaseMachine, clock Clock, net peerSender, store stateSaver, log *slog.Logger) *leaseLoop {
	return &leaseLoop{
		m: m, clock: clock, net: net, store: store, log: log,
		events:    make(chan lease.Event, 256),
		held:      map[string]time.Time{},
		yielding:  map[string]bool{},
		elsewhere: map[string]string{},
		lastOther: map[string]string{},
		kinds:     map[string]lease.Kind{},
		holds:     map[string]time.Time{},
		stepped:   make(chan struct{}),
		stopped:   make(chan struct{}),
	}
}

// post queues an event for the loop without blocking. Every input is a
// level that a later one repeats (health, want, view) except Receive
// (the protocol retries) and Transfer, Leave and Forget (their callers
// wait for a result and time out): a full queue drops the event with a
// warning.
func (l *leaseLoop) post(ev lease.Event) bool {
	select {
	case l.events <- ev:
		return true
	default:
		l.log.Warn("lease election queue full: event dropped", "event", fmt.Sprintf("%T", ev))
		return false
	}
}

// run steps the machine until ctx is done. It returns an error only when
// the state cannot be persisted: the node must then stop (releasing its
// addresses), because a node that sends what it has not stored may vote
// twice in a term.
func (l *leaseLoop) run(ctx context.Context) error {
	defer close(l.stopped)
	timer := l.clock.NewTimer(0)
	defer timer.Stop()
	if err := l.step(timer, lease.Tick{}); err != nil {
		return err
	}
	for {
		var ev lease.Event = lease.Tick{}
		select {
		case <-ctx.Done():
			l.releaseAll("election stopped")
			return ctx.Err()
		case ev = <-l.events:
		case <-timer.C():
			l.late.woke(l.clock.Now(), l.log)
		}
		if err := l.step(timer, ev); err != nil {
			return err
		}
		for more := true; more; {
			select {
			case ev := <-l.events:
				if err := l.step(timer, ev); err != nil {
					return err
				}
			default:
				more = false
			}
		}
	}
}

// step feeds one event, then a health change if one is due, and carries
// out the outputs.
func (l *leaseLoop) step(timer Timer, ev lease.Event) error {
	now := l.clock.Now()
	defer func(ev lease.Event) { l.late.stepped(now, l.clock.Now(), ev, l.log) }(ev)
	switch e := ev.(type) {
	case lease.Health:
		l.healthy = e.Healthy
		ev = l.health(now)
	case lease.Want:
		l.kinds = map[string]lease.Kind{}
		for _, a := range e.Addresses {
			l.kinds[a.Key] = a.Kind
		}
	case failedEvent:
		l.failedUntil = now.Add(failedPause)
		ev = l.health(now)
	case keyEvent:
		l.veto(now.Add(KeyVeto))
		ev = l.health(now)
	case conflictEvent:
		l.veto(now.Add(ConflictHold))
		ev = l.health(now)
	}
	var outs []lease.Output
	if ev != nil {
		outs = append(outs, l.m.Step(now, ev))
	}
	if h := l.health(now); h != nil {
		outs = append(outs, l.m.Step(now, h))
	}
	if len(outs) > 0 {
		l.machineNext = time.Time{}
	}
	// One Status for the step: it is the machine's state after the
	// steps above, which applying their outputs does not change (it
	// builds maps: twice a step was a seventh of a leader's garbage).
	st := l.m.Status()
	for _, out := range outs {
		if err := l.apply(now, out, st); err != nil {
			return err
		}
		if !out.Next.IsZero() && (l.machineNext.IsZero() || out.Next.Before(l.machineNext)) {
			l.machineNext = out.Next
		}
	}
	// A step that fed the machine nothing (a veto or pause that changed
	// no health) keeps the machine's last deadline.
	next := l.machineNext
	for _, t := range []time.Time{l.failedUntil, l.vetoUntil} {
		if !t.IsZero() && now.Before(t) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	wait := idleWake
	if !next.IsZero() {
		wait = max(next.Sub(now), 0)
	}
	timer.Reset(wait)
	l.late.due = now.Add(wait)
	for k, h := range st.Holders {
		if h != "" && h != st.Name && l.kinds[k] != lease.Pool {
			l.lastOther[k] = h // the holder a handover would come from
		}
	}
	l.mu.Lock()
	l.status = st
	l.holds = maps.Clone(l.held)
	close(l.stepped)
	l.stepped = make(chan struct{})
	l.mu.Unlock()
	return nil
}

// failedEvent is SetFailed, turned by step into a pause of health.
type failedEvent struct{ lease.Event }

// keyEvent reports gossip rejected for another key (either side's):
// while it is recent, a node that is alone in its configuration counts
// as unhealthy, so that a node with the wrong key, which bootstraps a
// cluster of its own, never holds the VIP beside the real cluster.
type keyEvent struct{ lease.Event }

// conflictEvent reports another node gossiping under this node's name
// (a cloned VM): the same veto as keyEvent, for ConflictHold. The
// cluster's member keeps what it holds (the machine refuses the clone at
// join); the clone, alone in a cluster of its own, holds nothing.
type conflictEvent struct{ lease.Event }

// veto extends the lone node's veto to at least until.
func (l *leaseLoop) veto(until time.Time) {
	if until.After(l.vetoUntil) {
		l.vetoUntil = until
	}
}

// lone reports whether this node is the only voter of its cluster (it
// bootstrapped alone). A node still looking for a cluster is not (it must
// stay able to bootstrap the real one), nor a learner of a one-voter
// cluster (it is joining the real one).
func (l *leaseLoop) lone() bool {
	st := l.m.Status()
	return len(st.Voters) == 1 && st.Voters[0] == st.Name
}

// health returns the Health event to send when the effective health
// (healthy and not paused after a failure) differs from what the machine
// was last told, else nil.
func (l *leaseLoop) health(now time.Time) lease.Event {
	if l.witness {
		return nil
	}
	h := l.healthy && (l.failedUntil.IsZero() || !now.Before(l.failedUntil))
	if now.Before(l.vetoUntil) && l.lone() {
		h = false
	}
	if !l.failedUntil.IsZero() && !now.Before(l.failedUntil) {
		l.failedUntil = time.Time{}
	}
	if l.sentHealth != nil && *l.sentHealth == h {
		return nil
	}
	l.sentHealth = &h
	return lease.Health{Healthy: h}
}

// apply carries out one output: persist, then send, then metadata and
// decisions.
func (l *leaseLoop) apply(now time.Time, out lease.Output, st lease.Status) error {
	if out.Persist != nil {
		if err := l.store.Save(out.Persist); err != nil {
			// Nothing of this output is sent: the machine's promises
			// (votes, acks) are not on disk.
			l.releaseAll("lease state cannot be saved")
			return fmt.Errorf("lease election: %w", err)
		}
	}
	for _, m := range out.Send {
		if err := l.net.Send(m.To, m.Data); err != nil {
			l.mu.Lock()
			l.sendErrs++
			l.mu.Unlock()
			l.log.Debug("lease message not sent", "to", m.To, "bytes", len(m.Data), "err", err)
		}
	}
	if out.Meta != nil && l.meta != nil {
		l.meta(out.Meta)
	}
	for _, n := range out.Notes {
		l.log.Info(n.Msg, n.Attrs...)
	}
	if out.Holds != nil {
		l.ovs = out.Overlaps
		l.ovt.observe(now, out)
		l.holdsChanged(out.Holds, st)
	}
	return nil
}

// holdsChanged hands every new or renewed hold to decide, and a release
// for every address no longer held. An end already past is passed on as
// it is: the executor does not act on it.
func (l *leaseLoop) holdsChanged(holds map[string]time.Time, st lease.Status) {
	leader := st.Leader
	var ds []LeaseDecision
	for _, k := range sortedKeys(holds) {
		until := holds[k]
		o, inOv := l.ovs[k]
		yielding := inOv && o.Old
		if old, ok := l.held[k]; ok && old.Equal(until) && yielding == l.yielding[k] {
			continue
		}
		_, renewed := l.held[k]
		l.held[k] = until
		if yielding {
			l.yielding[k] = true
		} else {
			delete(l.yielding, k)
		}
		reason := "lease granted by a majority"
		prev, handover := "", false
		if renewed {
			reason = "lease renewed by a majority"
		} else if prev = l.lastOther[k]; prev != "" && st.From[k] == prev {
			// the node this one last knew as the holder let it go for it
			handover = true
			reason = "lease granted by a majority: " + prev + " handed it over"
		}
		d := LeaseDecision{Address: l.addr(k), Holder: true, Until: until, Leader: leader, Reason: reason, Node: st.Name,
			Prev: prev, Handover: handover, Lone: l.expectPeers && len(st.Voters) == 1 && st.Voters[0] == st.Name}
		if inOv && !o.Old && !renewed {
			// a planned transfer's successor beside the old holder
			d.OverlapWith, d.Prev, d.Handover = o.With, o.With, true
			d.Reason = "lease granted by a majority: planned transfer from " + o.With + " (make-before-break)"
		}
		if yielding {
			d.Yielding = true
			d.Reason = "held until " + o.With + " holds it (make-before-break): no more announcements"
		}
		ds = append(ds, d)
	}
	for _, k := range sortedKeys(l.held) {
		if _, ok := holds[k]; ok {
			continue
		}
		delete(l.held, k)
		delete(l.yielding, k)
		reason := "lease not renewed"
		if leader != "" {
			reason = "lease not renewed (leader " + leader + ")"
		}
		ds = append(ds, LeaseDecision{Address: l.addr(k), Reason: reason, Leader: leader})
	}
	// Who holds the others, for /status and logs (control-plane and
	// egress addresses: the pools have their own status).
	for _, k := range sortedKeys(l.kinds) {
		if _, mine := holds[k]; mine || l.kinds[k] == lease.Pool {
			delete(l.elsewhere, k)
			continue
		}
		reason, node := "no holder yet: no leader", ""
		switch h := st.Holders[k]; {
		case h != "" && h != st.Name:
			reason, node = h+" holds it", h
		case leader != "" && leader != st.Name:
			reason = "placed by the leader, " + leader
		case leader != "":
			reason = "not placed on this node"
		}
		if l.elsewhere[k] == reason {
			continue
		}
		l.elsewhere[k] = reason
		ds = append(ds, LeaseDecision{Address: l.addr(k), Reason: reason, Leader: leader, Node: node})
	}
	if len(ds) > 0 {
		l.decide(ds)
	}
}

// releaseAll releases every held address (the loop stops).
func (l *leaseLoop) releaseAll(reason string) {
	var ds []LeaseDecision
	for _, k := range sortedKeys(l.held) {
		delete(l.held, k)
		ds = append(ds, LeaseDecision{Address: l.addr(k), Reason: reason})
	}
	if len(ds) > 0 {
		l.decide(ds)
	}
	l.mu.Lock()
	l.holds = map[string]time.Time{}
	l.mu.Unlock()
}

func (l *leaseLoop) addr(key string) lease.Address {
	return lease.Address{Key: key, Kind: l.kinds[key]}
}

// snapshot returns the machine's last status, this node's holds and a
// channel closed after the next step.
func (l *leaseLoop) snapshot() (lease.Status, map[string]time.Time, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status, maps.Clone(l.holds), l.stepped
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
