package pools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/clock"
	"github.com/vipd/vipd/vip"
)

// L2 is what the driver needs of the l2 announcer (vip.L2's batch methods).
type L2 interface {
	ProbeMany(ctx context.Context, addrs []netip.Addr) (map[netip.Addr]string, error)
	BindMany(ctx context.Context, addrs []netip.Addr) map[netip.Addr]error
	ReleaseMany(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error)
	BoundMany(ctx context.Context, addrs []netip.Addr) ([]netip.Addr, error)
	AnnounceMany(ctx context.Context, addrs []netip.Addr) (int, error)
}

// Advertiser is what the driver needs of the bgp speaker.
type Advertiser interface {
	Acquire(ctx context.Context, p netip.Prefix) error
	Release(ctx context.Context, p netip.Prefix) error
}

// DriverConfig shapes a Driver.
type DriverConfig struct {
	Name string
	// L2 announces l2 pools' addresses (nil: this node announces none).
	L2 L2
	// BGP advertises bgp pools' addresses (nil: this node advertises none).
	BGP Advertiser
	// Healthy reports whether this node may hold addresses (its apiserver
	// is healthy). Called every HealthPoll from the driver's goroutine; it
	// must be cheap. Nil: always.
	Healthy func() bool
	// Exclude are addresses never announced as pool addresses (the
	// control-plane VIPs of VIPD_ADDRESS).
	Exclude []netip.Addr
	// Leased: l2 addresses are held as the lease election says (SetLeases)
	// and no longer than each lease's end (l2 in a cluster). Without it
	// this node holds every address it may hold while healthy (l2 without
	// peers; bgp addresses always).
	Leased bool
	// Clock is the driver's time (nil: the process's clock); tests pass
	// a clock.Fake.
	Clock clock.Clock
	// OnBound hears of the l2 addresses this node has just bound (and
	// announces from now on), after each batch; the lease election needs
	// it to end a planned transfer's overlap early (the old holder lets
	// go). Called from the driver's goroutine: it must not block. Nil:
	// nobody.
	OnBound func([]netip.Addr)
}

// Timings of the pool addresses: the holder machine's (vip.Core with
// Props.Pool), and the driver loop's.
const (
	StartupWait   = vip.StartupWait
	ConflictGrace = vip.ConflictGrace
	ProbeRetry    = vip.ProbeRetry
	ConflictRetry = vip.ConflictRetry
	FailRetry     = vip.FailRetry
	// Burst, BurstSpacing and Refresh shape the announcements of a held
	// l2 address, as for the control-plane VIPs.
	Burst        = vip.BurstCount
	BurstSpacing = vip.BurstSpacing
	Refresh      = vip.RefreshEvery
	// Coalesce: announcements due within this much are sent together.
	Coalesce = 100 * time.Millisecond

	HealthPoll     = 100 * time.Millisecond
	ReconcileEvery = 5 * time.Second
	ReleaseTimeout = time.Second
)

// Driver runs the per-address holder machine (a vip.Core whose addresses
// are the pool's, with Props.Pool) and performs its actions in batches from
// one goroutine with one timer.
type Driver struct {
	cfg  DriverConfig
	clk  clock.Clock
	log  *slog.Logger
	wake chan struct{}

	// Run's goroutine only.
	core      *vip.Core
	addrs     map[netip.Addr]Address // desired now (filtered)
	modes     map[netip.Addr]string  // every address ever desired, with its last mode: ours to release
	healthy   bool
	lastBound []netip.Addr               // last Observed listing
	bound     []netip.Addr               // bound in this step, for OnBound once announced
	leased    map[netip.Prefix]time.Time // the last Leases stepped (read only)

	mu      sync.Mutex
	desired []Address
	fresh   bool // desired changed since the machine last saw it
	leases  map[netip.Addr]time.Time
	handov  map[netip.Addr]bool // leases granted in a planned transfer's overlap
	yield   map[netip.Addr]bool // leases held as a planned transfer's old holder (no announcements)
	freshL  bool                // leases changed since the machine last saw them
	status  []AddressStatus
	counts  Counts
	skipped int

	mAddrs     *prometheus.GaugeVec
	mConflicts prometheus.Counter
	mAnnounce  prometheus.Counter
	mSkipped   prometheus.Gauge
}

// NewDriver returns a driver; reg may be nil.
func NewDriver(cfg DriverConfig, log *slog.Logger, reg prometheus.Registerer) (*Driver, error) {
	d := &Driver{cfg: cfg, clk: clock.Or(cfg.Clock), log: log.With("component", "pools"), wake: make(chan struct{}, 1),
		addrs: map[netip.Addr]Address{}, modes: map[netip.Addr]string{},
		mAddrs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vipd_pool_addresses",
			Help: "Pool addresses by state: desired (allocated, announceable by this node's mode), held (announced by this node), conflict (another host answers for one this node should hold)."}, []string{"state"}),
		mConflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_pool_address_conflicts_total",
			Help: "Times another host on the LAN was found answering for a pool address this node should hold (not announced meanwhile)."}),
		mAnnounce: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_pool_announcements_total",
			Help: "Gratuitous ARP and unsolicited neighbour advertisement frames sent for pool addresses."}),
		mSkipped: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vipd_pool_addresses_skipped",
			Help: "Allocated pool addresses this node cannot announce: the pool's mode is not this node's (VIPD_MODE), or the address is one of VIPD_ADDRESS."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{d.mAddrs, d.mConflicts, d.mAnnounce, d.mSkipped} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// SetDesired hands the driver a new desired view (from the feed).
func (d *Driver) SetDesired(addrs []Address) {
	d.mu.Lock()
	d.desired, d.fresh = addrs, true
	d.mu.Unlock()
	d.poke()
}

// SetLeases hands the driver the l2 addresses the lease election lets
// this node hold, with their lease ends (Config.Leased): the complete set.
// handover are those granted in a planned transfer's agreed overlap
// (make-before-break): the old holder still answers for them, so they are
// bound without the conflict probe. yielding are those this node holds as
// such a transfer's old holder: bound, no longer announced
// (vip.Elected.Yielding).
func (d *Driver) SetLeases(until map[netip.Addr]time.Time, handover, yielding map[netip.Addr]bool) {
	d.mu.Lock()
	d.leases, d.handov, d.yield, d.freshL = until, handover, yielding, true
	d.mu.Unlock()
	d.poke()
}

func (d *Driver) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run runs until ctx is done, then releases every pool address (bounded by
// ReleaseTimeout) and returns.
func (d *Driver) Run(ctx context.Context) {
	d.core = vip.New(nil, vip.Options{Coalesce: Coalesce, Start: d.clk.Now()})
	timer := d.clk.NewTimer(time.Hour)
	defer timer.Stop()
	poll := d.clk.NewTimer(HealthPoll)
	defer poll.Stop()
	reconcile := d.clk.NewTimer(ReconcileEvery)
	defer reconcile.Stop()

	d.healthy = d.health()
	d.step(ctx, healthEvent(d.healthy), timer)
	d.pickDesired(ctx, timer)
	d.pickLeases(ctx, timer)
	d.observe(ctx, timer)
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
			d.step(rctx, vip.Shutdown{Reason: "vipd stops"}, nil)
			cancel()
			return
		case <-d.wake:
			d.pickDesired(ctx, timer)
			d.pickLeases(ctx, timer)
		case <-poll.C():
			if h := d.health(); h != d.healthy {
				d.healthy = h
				d.step(ctx, healthEvent(h), timer)
			}
			poll.Reset(HealthPoll)
		case <-reconcile.C():
			d.observe(ctx, timer)
			reconcile.Reset(ReconcileEvery)
		case <-timer.C():
			d.step(ctx, vip.Tick{}, timer)
		}
	}
}

func (d *Driver) health() bool { return d.cfg.Healthy == nil || d.cfg.Healthy() }

func healthEvent(h bool) vip.Event {
	if h {
		return vip.HealthChanged{Healthy: true, Reason: "this node may hold pool addresses"}
	}
	return vip.HealthChanged{Reason: "this node is not eligible (apiserver unhealthy)"}
}

// filter drops the addresses this node cannot announce.
func (d *Driver) filter(addrs []Address) ([]Address, int) {
	out := make([]Address, 0, len(addrs))
	skipped := 0
	for _, a := range addrs {
		if !a.Addr.IsValid() || a.Mode != ModeL2 && a.Mode != ModeBGP {
			continue
		}
		a.Addr = a.Addr.Unmap()
		if slices.Contains(d.cfg.Exclude, a.Addr) ||
			a.Mode == ModeL2 && d.cfg.L2 == nil || a.Mode == ModeBGP && d.cfg.BGP == nil {
			skipped++
			continue
		}
		out = append(out, a)
	}
	return out, skipped
}

// props are how the holder machine holds a.
func (d *Driver) props(a Address) vip.Props {
	l2 := a.Mode == ModeL2
	return vip.Props{Leased: l2 && d.cfg.Leased, Announce: l2, Barred: !a.Eligible(d.cfg.Name), Pool: true}
}

func (d *Driver) pickDesired(ctx context.Context, timer clock.Timer) {
	d.mu.Lock()
	addrs, fresh := d.desired, d.fresh
	d.fresh = false
	d.mu.Unlock()
	if !fresh {
		return
	}
	keep, skipped := d.filter(addrs)
	d.mu.Lock()
	d.skipped = skipped
	d.mu.Unlock()
	d.mSkipped.Set(float64(skipped))
	next := make(map[netip.Addr]Address, len(keep))
	moved := false // an address whose mode changed: released under the old one first
	for _, a := range keep {
		if old, ok := d.addrs[a.Addr]; ok && old.Mode != a.Mode {
			moved = true
			continue
		}
		next[a.Addr] = a
	}
	if moved {
		d.setDesired(ctx, next, timer)
	}
	for _, a := range keep {
		next[a.Addr] = a
	}
	d.setDesired(ctx, next, timer)
}

func (d *Driver) setDesired(ctx context.Context, next map[netip.Addr]Address, timer clock.Timer) {
	d.addrs = next
	var ev vip.Desired
	for _, ip := range slices.SortedFunc(maps.Keys(next), netip.Addr.Compare) {
		a := next[ip]
		d.modes[ip] = a.Mode
		ev.Addresses = append(ev.Addresses, vip.Address{VIP: hostPrefix(ip), Props: d.props(a)})
	}
	d.step(ctx, ev, timer)
}

// pickLeases feeds the last leases to the machine if they changed.
func (d *Driver) pickLeases(ctx context.Context, timer clock.Timer) {
	d.mu.Lock()
	until, handover, yielding, fresh := d.leases, d.handov, d.yield, d.freshL
	d.freshL = false
	d.mu.Unlock()
	if !fresh {
		return
	}
	ev := vip.Leases{Until: make(map[netip.Prefix]time.Time, len(until))}
	for a, y := range yielding {
		if y {
			if ev.Yielding == nil {
				ev.Yielding = map[netip.Prefix]bool{}
			}
			ev.Yielding[hostPrefix(a.Unmap())] = true
		}
	}
	for a, h := range handover {
		if h {
			if ev.Handover == nil {
				ev.Handover = map[netip.Prefix]bool{}
			}
			ev.Handover[hostPrefix(a.Unmap())] = true
		}
	}
	renewal := len(until) == len(d.leased)
	for a, u := range until {
		p := hostPrefix(a.Unmap())
		ev.Until[p] = u
		if _, ok := d.leased[p]; !ok {
			renewal = false
		}
	}
	d.leased = ev.Until
	d.stepStatus(ctx, ev, timer, !renewal)
}

// observe lists the l2 pool addresses bound now, among every one ever
// desired.
func (d *Driver) observe(ctx context.Context, timer clock.Timer) {
	if d.cfg.L2 == nil {
		return
	}
	var known []netip.Addr
	for a, mode := range d.modes {
		if mode == ModeL2 {
			known = append(known, a)
		}
	}
	slices.SortFunc(known, netip.Addr.Compare)
	bound, err := d.cfg.L2.BoundMany(ctx, known)
	if err != nil {
		d.log.Warn("listing bound pool addresses", "err", err)
		return
	}
	slices.SortFunc(bound, netip.Addr.Compare)
	if slices.Equal(bound, d.heldL2()) && slices.Equal(bound, d.lastBound) {
		return // as the machine believes: nothing to tell it
	}
	d.lastBound = bound
	var ev vip.Batch
	for _, a := range known {
		_, present := slices.BinarySearchFunc(bound, a, netip.Addr.Compare)
		ev.Events = append(ev.Events, vip.Observed{VIP: hostPrefix(a), Present: present})
	}
	d.step(ctx, ev, timer)
}

// heldL2 returns the l2 addresses held now, sorted.
func (d *Driver) heldL2() []netip.Addr {
	var out []netip.Addr
	for _, s := range d.core.State() {
		if s.Held && d.modes[s.VIP.Addr()] == ModeL2 {
			out = append(out, s.VIP.Addr())
		}
	}
	return out
}

// step feeds ev and performs the output, feeding the results back, until
// the machine asks for nothing more; then arms timer.
func (d *Driver) step(ctx context.Context, ev vip.Event, timer clock.Timer) {
	_, tick := ev.(vip.Tick)
	d.stepStatus(ctx, ev, timer, !tick)
}

// stepStatus is step; the status is rebuilt when changed or when the step
// asked for anything but announcements. A renewal of the same leases asks
// for nothing: with 1,000 addresses, rebuilding the status at every
// renewal was most of an idle node's work.
func (d *Driver) stepStatus(ctx context.Context, ev vip.Event, timer clock.Timer, changed bool) {
	for ev != nil {
		out := d.core.Step(ev, d.clk.Now())
		changed = changed || len(out.Conflicts) > 0 || slices.ContainsFunc(out.Actions, func(a vip.Action) bool { return a.Kind != vip.Announce })
		ev = d.perform(ctx, out)
		if ev == nil && timer != nil {
			if out.Next.IsZero() {
				timer.Stop()
			} else {
				timer.Reset(max(out.Next.Sub(d.clk.Now()), 0))
			}
		}
	}
	if len(d.bound) > 0 {
		// bound, and the first announcement sent (the step after a bind)
		if d.cfg.OnBound != nil {
			d.cfg.OnBound(d.bound)
		}
		d.bound = nil
	}
	if !changed {
		return // announcements only: the status is the same
	}
	st, c := d.statusNow()
	d.mu.Lock()
	d.status, d.counts = st, c
	d.mu.Unlock()
	d.mAddrs.WithLabelValues("desired").Set(float64(c.Desired))
	d.mAddrs.WithLabelValues("held").Set(float64(c.Held))
	d.mAddrs.WithLabelValues("conflict").Set(float64(c.Conflicts))
}

// perform carries out one output in batches (releases first, then one
// probe and one bind for every acquire, then one announcement); it returns
// the results of the acquires to feed back, nil when there were none.
func (d *Driver) perform(ctx context.Context, out vip.Output) vip.Event {
	var rel, acq, ann []netip.Addr
	seen := map[netip.Addr]bool{}
	handover := map[netip.Addr]bool{}
	for _, a := range out.Actions {
		ip := a.VIP.Addr()
		switch a.Kind {
		case vip.Release:
			if !seen[ip] {
				seen[ip] = true
				rel = append(rel, ip)
			}
		case vip.Acquire:
			acq = append(acq, ip)
			if a.Handover {
				handover[ip] = true
			}
		case vip.Announce:
			ann = append(ann, ip)
		}
	}
	var rel2 []netip.Addr
	for _, ip := range rel {
		if d.modes[ip] == ModeBGP {
			if d.cfg.BGP != nil {
				if err := d.cfg.BGP.Release(ctx, hostPrefix(ip)); err != nil {
					d.log.Warn("withdrawing a pool address", "address", ip, "err", err)
				}
			}
			continue
		}
		rel2 = append(rel2, ip)
	}
	if len(rel2) > 0 && d.cfg.L2 != nil {
		left, err := d.cfg.L2.ReleaseMany(ctx, rel2)
		if err != nil {
			d.log.Warn("releasing pool addresses", "count", len(rel2), "left", len(left), "err", err)
		}
		d.log.Info("released pool addresses", "count", len(rel2), "first", rel2[0])
	}
	for _, c := range out.Conflicts {
		d.mConflicts.Inc()
		d.log.Warn("pool address conflict: another host answers for it; not announcing it (retrying every 5s)", "address", c.VIP.Addr(), "mac", c.MAC)
	}
	var results []vip.Event
	done := func(ip netip.Addr, err error) {
		a := vip.Action{Kind: vip.Acquire, VIP: hostPrefix(ip)}
		if err != nil {
			results = append(results, vip.Failed{Action: a, Err: err})
		} else {
			results = append(results, vip.Done{Action: a})
		}
	}
	var probe, bind []netip.Addr
	for _, ip := range acq {
		switch {
		case d.modes[ip] == ModeBGP && d.cfg.BGP == nil:
			done(ip, errors.New("no bgp speaker"))
		case d.modes[ip] == ModeBGP:
			done(ip, d.cfg.BGP.Acquire(ctx, hostPrefix(ip)))
		case d.cfg.L2 == nil:
			done(ip, errors.New("no l2 announcer"))
		case handover[ip]:
			// a planned transfer's successor: the old holder answers
			// until it lets go, which this bind tells it to do (OnBound)
			bind = append(bind, ip)
		default:
			probe = append(probe, ip) // l2: probe for another holder first
		}
	}
	if len(probe) > 0 {
		answered, err := d.cfg.L2.ProbeMany(ctx, probe)
		for _, ip := range probe {
			mac, ok := answered[ip]
			switch {
			case err != nil:
				done(ip, fmt.Errorf("probing: %w", err))
			case ok:
				hw, _ := net.ParseMAC(mac)
				done(ip, &vip.ConflictError{VIP: ip, MAC: hw})
			default:
				bind = append(bind, ip)
			}
		}
	}
	if len(bind) > 0 {
		errs := d.cfg.L2.BindMany(ctx, bind)
		for _, ip := range bind {
			done(ip, errs[ip])
			if errs[ip] == nil {
				d.bound = append(d.bound, ip)
			}
		}
		d.log.Info("bound pool addresses", "count", len(bind)-len(errs), "failed", len(errs), "handovers", len(handover), "first", bind[0])
	}
	if len(ann) > 0 && d.cfg.L2 != nil {
		n, err := d.cfg.L2.AnnounceMany(ctx, ann)
		d.mAnnounce.Add(float64(n))
		if err != nil {
			d.log.Warn("announcing pool addresses", "err", err)
		}
	}
	if len(results) == 0 {
		return nil
	}
	return vip.Batch{Events: results}
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// AddressStatus is one address in /status.
type AddressStatus struct {
	Address string `json:"address"`
	Pool    string `json:"pool"`
	Mode    string `json:"mode"`
	Service string `json:"service,omitempty"`
	// Holder is who holds it by this node's view: this node when it may
	// and should (l2: its lease, or no cluster; bgp: advertised), ""
	// otherwise (another node, or nobody).
	Holder string `json:"holder,omitempty"`
	// State is this node's part: idle, acquiring, held, conflict, backoff.
	State string `json:"state"`
	// Conflict is the MAC of another host answering for it.
	Conflict string `json:"conflict,omitempty"`
	Eligible int    `json:"eligible"` // how many members may hold it by this node's view: this node or none
}

// Counts summarises the addresses for metrics.
type Counts struct {
	Desired, Held, Conflicts int
}

// statusNow reads the machine's view of every address.
func (d *Driver) statusNow() ([]AddressStatus, Counts) {
	now := d.clk.Now()
	states := d.core.State()
	out := make([]AddressStatus, 0, len(states))
	c := Counts{Desired: len(states)}
	for _, s := range states {
		ip := s.VIP.Addr()
		a := d.addrs[ip]
		st := AddressStatus{Address: ip.String(), Pool: a.Pool, Mode: a.Mode, Service: a.Service, Conflict: s.Conflict, State: "idle"}
		switch {
		case s.Held:
			st.State = "held"
			c.Held++
		case s.Acquiring:
			st.State = "acquiring"
		case s.Conflict != "" && !s.RetryAt.IsZero():
			st.State = "conflict"
			c.Conflicts++
		case !s.RetryAt.IsZero():
			st.State = "backoff"
		}
		if d.healthy && !s.Barred {
			st.Eligible = 1
		}
		if a.Mode == ModeL2 && d.core.Wants(s.VIP, now) || a.Mode == ModeBGP && s.Held {
			st.Holder = d.cfg.Name
		}
		out = append(out, st)
	}
	return out, c
}

// Status is the pools' section of /status.
type Status struct {
	Desired   int             `json:"desired"`
	Held      int             `json:"held"`
	Conflicts int             `json:"conflicts"`
	Skipped   int             `json:"skipped,omitempty"`
	Addresses []AddressStatus `json:"addresses"`
}

// Status returns the last computed status.
func (d *Driver) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Status{Desired: d.counts.Desired, Held: d.counts.Held, Conflicts: d.counts.Conflicts, Skipped: d.skipped,
		Addresses: slices.Clone(d.status)}
}
