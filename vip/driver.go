package vip

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/clock"
	"github.com/vipd/vipd/internal/gridclock"
)

// Watcher is implemented by announcers that can report changes of the
// outside world as they happen (l2: netlink link and address updates of the
// VIP interface). While its watch is live the driver reconciles and checks
// the held VIPs on every change, and polls only every WatchedReconcileEvery
// and WatchedCheckEvery; while it is not, it polls as for any announcer.
type Watcher interface {
	// Watch watches until ctx is done. Each value received means "look
	// now": something that may affect a VIP changed, or the watch was lost
	// (Live false: changes may go unseen until it is back) or established
	// (Live true). Values are coalesced: at most one waits, the latest.
	// The channel is closed once every goroutine of the watch has stopped,
	// after ctx is done.
	Watch(ctx context.Context) <-chan WatchEvent
}

// WatchEvent is what a Watcher reports.
type WatchEvent struct {
	// Live: the watch is established, every change will be reported.
	Live bool
}

// watchGap is the least time between two reconciles a watch asks for:
// another program that removes the VIP as soon as vipd binds it is fought
// at most this often.
const watchGap = 100 * time.Millisecond

// Driver runs a Core: it feeds it events and time, performs the actions it
// asks for through an Announcer, and reconciles against the outside world
// every ReconcileEvery (WatchedReconcileEvery and on every change while a
// Watcher's watch is live). It is the only goroutine that touches the Core.
type Driver struct {
	core *Core
	ann  Announcer
	clk  clock.Clock
	// deadlines makes the timer of the core's next deadline: a timerfd
	// with the process's clock (gridclock.Precise), clk under test. On
	// the holder that deadline moves at every lease renewal, five times a
	// second; a Go timer moved that often left the runtime's sysmon thread
	// and the poller to wake at each deadline it had passed (they sleep
	// until the earliest timer and are not told when it moves later),
	// about two wake-ups a second for nothing.
	deadlines clock.Clock
	mode      string
	log       *slog.Logger
	events    chan Event
	stopped   chan struct{} // closed when Run has returned
	timeout   time.Duration
	onTrans   func(Transition)

	mu    sync.Mutex
	state []VIPState

	// reconciles counts reconcile passes (for tests).
	reconciles atomic.Int64

	held  *prometheus.GaugeVec
	trans *prometheus.CounterVec
	// Failover timeline histograms, by VIP and kind (failover, handover).
	toBound, toAnnounce *prometheus.HistogramVec
}

// DriverOptions shape a Driver.
type DriverOptions struct {
	Mode string // label for metrics: l2, bgp, cloud
	// ActionTimeout bounds one action (zero: the announcer's
	// ActionTimeout if it has SlowActions, else DefaultActionTimeout).
	ActionTimeout time.Duration
	// OnTransition is called (on the driver goroutine) after each transition
	// has been carried out, e.g. to publish holding state to the cluster.
	OnTransition func(Transition)
	// Clock is the driver's time (nil: the process's clock); tests pass
	// a clock.Fake.
	Clock clock.Clock
}

// NewDriver wires a core to an announcer.
func NewDriver(core *Core, ann Announcer, log *slog.Logger, reg prometheus.Registerer, opts DriverOptions) (*Driver, error) {
	if opts.ActionTimeout <= 0 {
		opts.ActionTimeout = DefaultActionTimeout
		if s, ok := ann.(SlowActions); ok {
			opts.ActionTimeout = s.ActionTimeout()
		}
	}
	d := &Driver{
		core: core, ann: ann, clk: clock.Or(opts.Clock), deadlines: opts.Clock, mode: opts.Mode, log: log, timeout: opts.ActionTimeout, onTrans: opts.OnTransition,
		events: make(chan Event, 256),
		state:  core.State(),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_vip_held", Help: "1 while this node holds the VIP.",
		}, []string{"vip", "mode"}),
		trans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_transitions_total", Help: "Changes of holding state, by VIP and new state (held or released).",
		}, []string{"vip", "to"}),
	}
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"vip", "kind"})
	}
	d.toBound = hist("vipd_failover_decision_to_bound_seconds", "On the new holder: from the decision to take the VIP to the VIP bound (l2: after the conflict probe; cloud: assigned).")
	d.toAnnounce = hist("vipd_failover_bound_to_announce_seconds", "On the new holder: from the VIP bound to the first gratuitous ARP / unsolicited NA sent (l2).")
	if d.deadlines == nil {
		d.deadlines = gridclock.Precise{}
	}
	d.stopped = make(chan struct{})
	for _, s := range d.state {
		d.held.WithLabelValues(s.VIP.String(), d.mode).Set(0)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{d.held, d.trans, d.toBound, d.toAnnounce} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// Send queues an event for the core. It never blocks for long: the queue
// is large and events are small; if it is full the caller waits, but never
// past the end of Run: once Run has returned, events are dropped (nothing
// would apply them) and Send returns at once.
func (d *Driver) Send(ev Event) {
	select {
	case d.events <- ev:
	case <-d.stopped:
	}
}

// State returns the last published view of every VIP.
func (d *Driver) State() []VIPState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]VIPState(nil), d.state...)
}

// Run drives the core until ctx is cancelled, then releases every VIP
// (bounded by releaseTimeout) and returns. It runs once per Driver.
func (d *Driver) Run(ctx context.Context, releaseTimeout time.Duration) {
	defer close(d.stopped)
	timer := d.deadlines.NewTimer(time.Hour)
	defer timer.Stop()
	every := ReconcileEvery // the polling period, shorter without a live watch
	reconcile := d.clk.NewTimer(every)
	defer reconcile.Stop()
	var watch <-chan WatchEvent
	if w, ok := d.ann.(Watcher); ok {
		watch = w.Watch(ctx)
	}
	// A change seen within watchGap of the last reconcile it caused waits
	// on this timer (settling: one is waiting).
	settle := d.clk.NewTimer(time.Hour)
	settle.Stop()
	settling := false
	var lastWatch time.Time
	live := false
	defer func() {
		settle.Stop()
		// Every goroutine of the watch has stopped once it closes its channel.
		if watch != nil {
			for range watch {
			}
		}
	}()
	changed := func() {
		lastWatch = d.clk.Now()
		d.reconcile(ctx)
		d.apply(ctx, CheckNow{}, timer)
	}
	// Reconcile at once: a VIP left behind by a crash goes away before the
	// first health check has even finished.
	d.reconcile(ctx)
	d.arm(timer, time.Time{})
	for {
		select {
		case <-ctx.Done():
			d.shutdown(releaseTimeout)
			return
		case ev, ok := <-watch:
			if !ok {
				watch = nil
				continue
			}
			if ev.Live != live {
				live = ev.Live
				every = d.watching(ctx, live, timer)
				reconcile.Reset(every)
			}
			switch wait := watchGap - d.clk.Now().Sub(lastWatch); {
			case settling:
				// Already waiting: that reconcile sees this change too.
			case wait > 0:
				settle.Reset(wait)
				settling = true
			default:
				changed()
			}
		case <-settle.C():
			changed()
			settling = false
			// Handled: a no-op for a timer that fired, and what tells a
			// fake clock's Step that this tick is done.
			settle.Stop()
		case ev := <-d.events:
			for _, e := range coalesce(ev, d.events) {
				d.apply(ctx, e, timer)
			}
		case <-timer.C():
			d.apply(ctx, Tick{}, timer)
		case <-reconcile.C():
			d.reconcile(ctx)
			d.apply(ctx, Tick{}, timer)
			reconcile.Reset(every)
		}
	}
}

// coalesce returns first plus every event already queued, keeping only
// the last HealthChanged and the last Elected per VIP: the core keeps the
// latest values anyway, and replaying stale decisions one by one after a
// slow action (a cloud assign) made holding flip back and forth.
func coalesce(first Event, queue <-chan Event) []Event {
	evs := []Event{first}
	for more := true; more; {
		select {
		case e := <-queue:
			evs = append(evs, e)
		default:
			more = false
		}
	}
	if len(evs) == 1 {
		return evs
	}
	lastHealth := -1
	lastElected := map[netip.Prefix]int{}
	for i, e := range evs {
		switch e := e.(type) {
		case HealthChanged:
			lastHealth = i
		case Elected:
			lastElected[e.VIP] = i
		}
	}
	out := evs[:0:0]
	for i, e := range evs {
		switch e := e.(type) {
		case HealthChanged:
			if i != lastHealth {
				continue
			}
		case Elected:
			if i != lastElected[e.VIP] {
				continue
			}
		}
		out = append(out, e)
	}
	return out
}

// watching switches the polling between the backstop of a live watch and
// the full rate without one, and returns the reconcile period.
func (d *Driver) watching(ctx context.Context, live bool, timer clock.Timer) time.Duration {
	every, check := ReconcileEvery, time.Duration(0)
	if live {
		every, check = WatchedReconcileEvery, WatchedCheckEvery
	}
	d.apply(ctx, CheckInterval{Every: check}, timer)
	d.log.Debug("announcer watch", "live", live, "reconcile_every", every)
	return every
}

func (d *Driver) reconcile(ctx context.Context) {
	d.reconciles.Add(1)
	for _, s := range d.core.State() {
		cctx, cancel := context.WithTimeout(ctx, d.timeout)
		present, err := d.ann.Present(cctx, s.VIP)
		cancel()
		if err != nil {
			d.log.Warn("reconcile: cannot read VIP state", "vip", s.VIP, "err", err)
			continue
		}
		d.perform(ctx, d.core.Step(Observed{VIP: s.VIP, Present: present}, d.clk.Now()))
	}
	d.publish()
}

func (d *Driver) apply(ctx context.Context, ev Event, timer clock.Timer) {
	out := d.core.Step(ev, d.clk.Now())
	next := d.perform(ctx, out)
	d.arm(timer, next)
	d.publish()
}

// perform carries out the actions of one step, feeding each result back
// to the core (Done or Failed) and carrying out what that asks in turn, and
// returns the core's next deadline.
//
// What the steps report (transitions, prepared, timelines) is published
// once their actions are done: a release is reported to the election (which
// may tell a handover's successor to bind) only after the VIP is unbound.
func (d *Driver) perform(ctx context.Context, out Output) time.Time {
	queue := out.Actions
	next := out.Next
	outs := []Output{out}
	defer func() {
		for _, o := range outs {
			d.results(o)
		}
	}()
	for len(queue) > 0 {
		a := queue[0]
		queue = queue[1:]
		var o Output
		if err := d.do(ctx, a); err != nil {
			o = d.core.Step(Failed{Action: a, Err: err}, d.clk.Now())
		} else {
			o = d.core.Step(Done{Action: a}, d.clk.Now())
		}
		queue = append(queue, o.Actions...)
		outs = append(outs, o)
		next = o.Next
	}
	return next
}

// results publishes what one step reports besides its actions.
func (d *Driver) results(o Output) {
	for _, t := range o.Transitions {
		d.transition(t)
	}
	for _, t := range o.Timelines {
		d.timeline(t)
	}
}

func (d *Driver) timeline(t Timeline) {
	v, k := t.VIP.String(), t.Kind()
	args := []any{"vip", t.VIP, "kind", k, "from", t.PrevHolder}
	d.toBound.WithLabelValues(v, k).Observe(t.BoundAt.Sub(t.DecidedAt).Seconds())
	args = append(args, "decision_to_bound", t.BoundAt.Sub(t.DecidedAt))
	if !t.AnnouncedAt.IsZero() {
		d.toAnnounce.WithLabelValues(v, k).Observe(t.AnnouncedAt.Sub(t.BoundAt).Seconds())
		args = append(args, "bound_to_announce", t.AnnouncedAt.Sub(t.BoundAt))
	}
	d.log.Info("took the VIP over", args...)
}

func (d *Driver) do(ctx context.Context, a Action) error {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var err error
	switch a.Kind {
	case Acquire:
		ha, handover := d.ann.(HandoverAcquirer)
		if la, ok := d.ann.(LoneAcquirer); ok && a.Lone {
			err = la.AcquireLone(cctx, a.VIP)
		} else if handover && a.Handover {
			err = ha.AcquireHandover(cctx, a.VIP)
		} else {
			err = d.ann.Acquire(cctx, a.VIP)
		}
	case Release:
		err = d.ann.Release(cctx, a.VIP)
	case Announce:
		err = d.ann.Announce(cctx, a.VIP)
	case Check:
		if c, ok := d.ann.(Checker); ok {
			err = c.Check(cctx, a.VIP, a.Probe)
		}
	}
	if err != nil {
		d.log.Warn("action failed", "action", a.Kind.String(), "vip", a.VIP, "cause", a.Cause, "err", err)
		return err
	}
	switch {
	case a.Kind == Announce:
		d.log.Debug("announced", "vip", a.VIP, "cause", a.Cause)
	case a.Kind == Check:
	case strings.HasPrefix(a.Cause, "reconcile:"):
		d.log.Info("reconciled", "action", a.Kind.String(), "vip", a.VIP, "cause", a.Cause)
	}
	return nil
}

func (d *Driver) transition(t Transition) {
	to, v := "released", 0.0
	if t.Held {
		to, v = "held", 1
	}
	if t.Failed && d.core != nil {
		to = "failed"
	}
	d.held.WithLabelValues(t.VIP.String(), d.mode).Set(v)
	d.trans.WithLabelValues(t.VIP.String(), to).Inc()
	d.log.Info("VIP "+to, "vip", t.VIP, "mode", d.mode, "cause", t.Cause)
	if d.onTrans != nil {
		d.onTrans(t)
	}
}

func (d *Driver) publish() {
	s := d.core.State()
	d.mu.Lock()
	d.state = s
	d.mu.Unlock()
}

func (d *Driver) arm(timer clock.Timer, next time.Time) {
	wait := time.Hour
	if !next.IsZero() {
		wait = max(next.Sub(d.clk.Now()), 0)
	}
	timer.Reset(wait)
}

// shutdown releases every VIP within timeout. It uses a fresh context: the
// run context is already cancelled.
func (d *Driver) shutdown(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := d.core.Step(Shutdown{Reason: "stop requested"}, d.clk.Now())
	d.perform(ctx, out)
	// Make sure: anything still present (a failed release) gets one more try.
	for _, s := range d.core.State() {
		if ok, err := d.ann.Present(ctx, s.VIP); err == nil && ok {
			if err := d.ann.Release(ctx, s.VIP); err != nil {
				d.log.Error("VIP left behind at shutdown", "vip", s.VIP, "err", err)
			}
		}
	}
	d.publish()
}

// VIPs returns the configured VIPs in order.
func (d *Driver) VIPs() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range d.State() {
		out = append(out, s.VIP)
	}
	return out
}
