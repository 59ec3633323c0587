package pools

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/clock"
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
	// Members returns the cluster view, this node included. Called every
	// MembersPoll from the driver's goroutine; it must be cheap.
	Members func() []Member
	// Exclude are addresses never announced as pool addresses (the
	// control-plane VIPs of VIPD_ADDRESS).
	Exclude []netip.Addr
	// Leased: l2 addresses are held as the lease election says (SetLeases),
	// not by rendezvous over Members (l2 in a cluster).
	Leased bool
	// Clock is the driver's time (nil: the process's clock); tests pass
	// a clock.Fake.
	Clock clock.Clock
}

// Timings of the driver loop.
const (
	MembersPoll    = 100 * time.Millisecond
	ReconcileEvery = 5 * time.Second
	ReleaseTimeout = time.Second
)

// Driver runs a Machine and performs its actions in batches from one
// goroutine with one timer.
type Driver struct {
	cfg  DriverConfig
	clk  clock.Clock
	log  *slog.Logger
	wake chan struct{}

	lastBound []netip.Addr // last Observed (Run's goroutine only)

	mu      sync.Mutex
	desired []Address
	fresh   bool // desired changed since the machine last saw it
	leases  map[netip.Addr]time.Time
	freshL  bool // leases changed since the machine last saw them
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
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// SetLeases hands the driver the l2 addresses the lease election lets
// this node hold, with their lease ends (Config.Leased): the complete set.
func (d *Driver) SetLeases(until map[netip.Addr]time.Time) {
	d.mu.Lock()
	d.leases, d.freshL = until, true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// pickLeases feeds the last leases to the machine if they changed.
func (d *Driver) pickLeases(ctx context.Context, m *Machine, timer clock.Timer) {
	d.mu.Lock()
	until, fresh := d.leases, d.freshL
	d.freshL = false
	d.mu.Unlock()
	if fresh {
		d.step(ctx, m, Leases{Until: until}, timer)
	}
}

// filter drops the addresses this node cannot announce.
func (d *Driver) filter(addrs []Address) ([]Address, int) {
	out := make([]Address, 0, len(addrs))
	skipped := 0
	for _, a := range addrs {
		if slices.Contains(d.cfg.Exclude, a.Addr.Unmap()) ||
			a.Mode == ModeL2 && d.cfg.L2 == nil || a.Mode == ModeBGP && d.cfg.BGP == nil {
			skipped++
			continue
		}
		out = append(out, a)
	}
	return out, skipped
}

// Run runs until ctx is done, then releases every pool address (bounded by
// ReleaseTimeout) and returns.
func (d *Driver) Run(ctx context.Context) {
	m := NewMachine(Config{Name: d.cfg.Name, Probe: true, Leased: d.cfg.Leased}, d.clk.Now())
	timer := d.clk.NewTimer(time.Hour)
	defer timer.Stop()
	poll := d.clk.NewTimer(MembersPoll)
	defer poll.Stop()
	reconcile := d.clk.NewTimer(ReconcileEvery)
	defer reconcile.Stop()

	var lastView []Member
	d.step(ctx, m, View{Members: d.cfg.Members()}, timer)
	d.pickDesired(ctx, m, timer)
	d.observe(ctx, m, timer)
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
			d.step(rctx, m, Shutdown{}, nil)
			cancel()
			return
		case <-d.wake:
			d.pickDesired(ctx, m, timer)
			d.pickLeases(ctx, m, timer)
		case <-poll.C():
			v := d.cfg.Members()
			if !slices.Equal(v, lastView) {
				lastView = v
				d.step(ctx, m, View{Members: v}, timer)
			}
			poll.Reset(MembersPoll)
		case <-reconcile.C():
			d.observe(ctx, m, timer)
			reconcile.Reset(ReconcileEvery)
		case <-timer.C():
			d.step(ctx, m, Tick{}, timer)
		}
	}
}

func (d *Driver) pickDesired(ctx context.Context, m *Machine, timer clock.Timer) {
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
	d.step(ctx, m, Desired{Addresses: keep}, timer)
}

// observe lists the l2 pool addresses bound now.
func (d *Driver) observe(ctx context.Context, m *Machine, timer clock.Timer) {
	if d.cfg.L2 == nil {
		return
	}
	known := m.KnownL2()
	bound, err := d.cfg.L2.BoundMany(ctx, known)
	if err != nil {
		d.log.Warn("listing bound pool addresses", "err", err)
		return
	}
	slices.SortFunc(bound, func(a, b netip.Addr) int { return a.Compare(b) })
	if slices.Equal(bound, m.Held()) && slices.Equal(bound, d.lastBound) {
		return // as the machine believes: nothing to tell it
	}
	d.lastBound = bound
	d.step(ctx, m, Observed{Bound: bound}, timer)
}

// step feeds ev and performs the output, feeding acquire results back,
// until the machine asks for nothing more; then arms timer.
func (d *Driver) step(ctx context.Context, m *Machine, ev Event, timer clock.Timer) {
	_, tick := ev.(Tick)
	changed := !tick
	for ev != nil {
		out := m.Step(ev, d.clk.Now())
		changed = changed || len(out.Release) > 0 || len(out.Acquire) > 0 || len(out.Conflicts) > 0
		ev = d.perform(ctx, out)
		if ev == nil && timer != nil {
			if out.Next.IsZero() {
				timer.Stop()
			} else {
				timer.Reset(max(out.Next.Sub(d.clk.Now()), 0))
			}
		}
	}
	if !changed {
		return // announcements only: the status is the same
	}
	st, c := m.Status(d.clk.Now()), m.Counts()
	d.mu.Lock()
	d.status, d.counts = st, c
	d.mu.Unlock()
	d.mAddrs.WithLabelValues("desired").Set(float64(c.Desired))
	d.mAddrs.WithLabelValues("held").Set(float64(c.Held))
	d.mAddrs.WithLabelValues("conflict").Set(float64(c.Conflicts))
}

// perform carries out one output; it returns the Acquired event to feed
// back, nil when nothing was acquired.
func (d *Driver) perform(ctx context.Context, out Output) Event {
	var rel4 []netip.Addr
	for _, t := range out.Release {
		if t.Mode == ModeBGP {
			if d.cfg.BGP != nil {
				if err := d.cfg.BGP.Release(ctx, hostPrefix(t.Addr)); err != nil {
					d.log.Warn("withdrawing a pool address", "address", t.Addr, "err", err)
				}
			}
			continue
		}
		rel4 = append(rel4, t.Addr)
	}
	if len(rel4) > 0 && d.cfg.L2 != nil {
		left, err := d.cfg.L2.ReleaseMany(ctx, rel4)
		if err != nil {
			d.log.Warn("releasing pool addresses", "count", len(rel4), "left", len(left), "err", err)
		}
		d.log.Info("released pool addresses", "count", len(rel4), "first", rel4[0])
	}
	for _, c := range out.Conflicts {
		d.mConflicts.Inc()
		d.log.Warn("pool address conflict: another host answers for it; not announcing it (retrying every 5s)", "address", c.Addr, "mac", c.MAC)
	}
	var results []Result
	var probe, bind []netip.Addr
	for _, t := range out.Acquire {
		switch {
		case t.Mode == ModeBGP:
			r := Result{Addr: t.Addr}
			if d.cfg.BGP == nil {
				r.Err = fmt.Errorf("no bgp speaker")
			} else {
				r.Err = d.cfg.BGP.Acquire(ctx, hostPrefix(t.Addr))
			}
			results = append(results, r)
		case t.Probe:
			probe = append(probe, t.Addr)
		default:
			bind = append(bind, t.Addr)
		}
	}
	if len(probe) > 0 {
		answered, err := d.cfg.L2.ProbeMany(ctx, probe)
		if err != nil {
			for _, a := range probe {
				results = append(results, Result{Addr: a, Err: err})
			}
		} else {
			for _, a := range probe {
				if mac, ok := answered[a]; ok {
					results = append(results, Result{Addr: a, ConflictMAC: mac})
				} else {
					bind = append(bind, a)
				}
			}
		}
	}
	if len(bind) > 0 {
		errs := d.cfg.L2.BindMany(ctx, bind)
		for _, a := range bind {
			results = append(results, Result{Addr: a, Err: errs[a]})
		}
		d.log.Info("bound pool addresses", "count", len(bind)-len(errs), "failed", len(errs), "first", bind[0])
	}
	if len(out.Announce) > 0 && d.cfg.L2 != nil {
		n, err := d.cfg.L2.AnnounceMany(ctx, out.Announce)
		d.mAnnounce.Add(float64(n))
		if err != nil {
			d.log.Warn("announcing pool addresses", "err", err)
		}
	}
	if len(results) == 0 {
		return nil
	}
	return Acquired{Results: results}
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

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
