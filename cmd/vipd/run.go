package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/health"
	"github.com/vipd/vipd/internal/lifecycle"
	"github.com/vipd/vipd/vip"
)

// releaseTimeout bounds the release of every VIP at shutdown.
const releaseTimeout = time.Second

// probeTimeout is how long the l2 conflict probe waits for an answer.
const probeTimeout = 50 * time.Millisecond

func newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "run the daemon",
		Long: `run health-checks the local kube-apiserver and, while it is healthy, announces
the VIPs in the configured mode. SIGTERM or SIGINT releases every VIP within
a second and exits 0; a second signal exits at once.

When the local apiserver starts a graceful shutdown (its /readyz fails the
"shutdown" check while /livez still passes, VIPD_HEALTH_READYZ_URL) or its
port is refused right after a good probe, the VIPs are handed over to
another node at once, as with "vipd handover".

An invalid setting stops start-up with exit code 2 and one line naming the
variable, the value and the accepted form; nothing is bound. So does a state
directory (VIPD_STATE_DIR) that cannot be written, with exit code 1.

A fatal error while running (the gossip cluster fails, vipd-controllers
rejects its configuration) releases every VIP, leaves the cluster and exits
non-zero within about a second, so that systemd sees the failure.`,
		Args: cobra.NoArgs,
	}
	v := settingsFlags(cmd.Flags())
	settingsUsage(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := loadConfig(v)
		if err != nil {
			return err
		}
		return runDaemon(c)
	}
	return cmd
}

// runDaemon runs until a signal arrives, then releases and returns.
func runDaemon(c *config.Config) error {
	leanRuntime()
	log := newLogger(c)
	for _, w := range warnUnknownEnv() {
		log.Warn(w)
	}
	for _, w := range c.Ignored() {
		log.Warn(w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if usesStateDir(c) {
		if err := checkStateDir(c.StateDir); err != nil {
			return err
		}
	}
	// Held until exit: vipd cleanup refuses while it is (a lone node may
	// have no state directory, and runs without it).
	if release, err := holdRunLock(c.StateDir); err == nil {
		defer release()
	} else if usesStateDir(c) {
		log.Warn("running without the run lock: vipd cleanup cannot tell that this vipd runs", "err", err)
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	// The daemon, once built: a stop first hands its VIPs over.
	var mu sync.Mutex
	var running *daemon
	stopped := make(chan struct{}) // closed when the daemon has returned
	watched := make(chan struct{}) // closed when the signal watch has
	go func() {
		defer close(watched)
		stopOnSignal(sigs, stopped, cancel, log, len(c.Addresses) > 0, func() {
			mu.Lock()
			d := running
			mu.Unlock()
			if d != nil {
				d.handOverAtStop(ctx)
			}
		})
	}()
	defer func() {
		close(stopped)
		<-watched
	}()

	d, err := newDaemon(ctx, c, log)
	if err != nil {
		return err
	}
	mu.Lock()
	running = d
	mu.Unlock()
	return d.run(ctx)
}

// stopOnSignal waits for SIGTERM or SIGINT, then hands the VIPs over
// (handOver) and cancels the daemon; a second signal exits at once. It
// returns once stopped is closed (the daemon returned), after the handover.
func stopOnSignal(sigs <-chan os.Signal, stopped <-chan struct{}, cancel context.CancelFunc, log *slog.Logger, vips bool, handOver func()) {
	var s os.Signal
	select {
	case s = <-sigs:
	case <-stopped:
		return
	}
	if vips {
		log.Info("stopping: handing over and releasing VIPs", "signal", s.String())
	} else {
		log.Info("stopping", "signal", s.String())
	}
	notify("STOPPING=1")
	handed := make(chan struct{})
	go func() {
		defer close(handed)
		handOver()
		cancel()
	}()
	select {
	case s := <-sigs:
		log.Warn("second signal: exiting at once", "signal", s.String())
		os.Exit(exitFailure)
	case <-stopped:
		<-handed
	}
}

// stopHandoverWait bounds the planned handover at a stop: after it the
// VIPs are released (and the cluster left) as without a handover.
const stopHandoverWait = 2 * time.Second

// handOverAtStop hands every VIP this node holds to a successor before the
// daemon stops (SIGTERM): the successor is ready before this node lets go,
// and binds within milliseconds of the release.
func (d *daemon) handOverAtStop(ctx context.Context) {
	if d.elector == nil {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, stopHandoverWait)
	defer cancel()
	rs, err := d.elector.HandOver(hctx, nil, "", true)
	if err != nil {
		d.log.Warn("handover at stop did not finish: releasing", "err", err)
		return
	}
	for _, r := range rs {
		if r.OK {
			d.log.Info("handed over at stop", "vip", r.VIP, "to", r.To, "took", r.Took)
		} else if r.VIP != "" {
			d.log.Warn("no handover at stop: releasing", "vip", r.VIP, "reason", r.Reason)
		}
	}
}

// eligibility is what this node last told the election and the core
// about its health: the checker's Eligible (Healthy, except after a drain
// handed the VIPs over: the apiserver is going away). Both the checker's
// reports and a finished drain handover set it.
type eligibility struct {
	d        *daemon
	mu       sync.Mutex
	eligible bool
}

// sync passes the checker's latest status on when its eligibility
// changed. It reads the status itself, so a report and a finished
// handover racing each other cannot pass on a stale value.
func (e *eligibility) sync() {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.d.checker.Status()
	if st.Eligible == e.eligible {
		return
	}
	e.eligible = st.Eligible
	if e.d.elector != nil {
		e.d.elector.SetHealthy(st.Eligible)
	}
	reason := st.Reason
	if st.Healthy && !st.Eligible {
		reason = st.DrainReason
	}
	e.d.driver.Send(vip.HealthChanged{Healthy: st.Eligible, Reason: reason})
}

// drainHandOver makes the planned transfer a drain asked for (the local
// apiserver reports its graceful shutdown, or stopped listening): every
// VIP held here goes to the best successor now, while the apiserver still
// serves, instead of after the fail threshold. The outcome goes back to
// the checker: once nothing is held here the node reports itself
// ineligible until the apiserver is back; otherwise the next probe asks
// again. Without an election (a lone node) there is nobody to hand over
// to: the VIP stays until the fail threshold. In bgp mode every healthy
// node announces, so the drain withdraws at once.
func (d *daemon) drainHandOver(ctx context.Context, s health.Status, el *eligibility) {
	if d.elector == nil {
		if d.cfg.Mode == config.ModeBGP {
			d.log.Info("apiserver going away: withdrawing", "reason", s.DrainReason)
			d.checker.HandedOver(true)
			el.sync()
			return
		}
		d.log.Debug("apiserver going away, but no other node to hand over to", "reason", s.DrainReason)
		d.checker.HandedOver(false)
		return
	}
	hctx, cancel := context.WithTimeout(ctx, cluster.HandoverWait())
	defer cancel()
	start := time.Now()
	rs, err := d.elector.HandOver(hctx, nil, "", false)
	if err != nil {
		d.log.Warn("apiserver going away: handover did not finish", "reason", s.DrainReason, "err", err)
		d.checker.HandedOver(false)
		return
	}
	done := true
	for _, r := range rs {
		switch {
		case r.OK:
			d.log.Info("apiserver going away: handed over", "reason", s.DrainReason, "vip", r.VIP, "to", r.To,
				"took", r.Took, "since_probe", time.Since(s.Checked).Round(time.Millisecond))
		case r.VIP == "":
			// Nothing held here: nothing to do.
			d.log.Debug("apiserver going away: nothing to hand over", "reason", s.DrainReason, "why", r.Reason)
		default:
			done = false
			d.log.Warn("apiserver going away: no handover, retrying after the next probe", "reason", s.DrainReason,
				"vip", r.VIP, "why", r.Reason)
		}
	}
	d.log.Debug("drain handover finished", "done", done, "took", time.Since(start))
	// At once, not at the next probe: pool addresses (and the election's
	// view of this node) follow the node's eligibility.
	d.checker.HandedOver(done)
	el.sync()
}

// handoverSummary is one line per result, for `vipd handover`.
func handoverSummary(rs []cluster.HandoverResult) (string, bool) {
	var b strings.Builder
	ok := len(rs) > 0
	for _, r := range rs {
		switch {
		case r.OK:
			fmt.Fprintf(&b, "%s: handed over to %s in %v\n", r.VIP, r.To, r.Took.Round(time.Millisecond))
		case r.VIP == "":
			ok = false
			fmt.Fprintf(&b, "cannot hand over: %s\n", r.Reason)
		default:
			ok = false
			fmt.Fprintf(&b, "cannot hand over %s: %s\n", r.VIP, r.Reason)
		}
	}
	return b.String(), ok
}

func newLogger(c *config.Config) *slog.Logger {
	return c.NewLogger(os.Stderr).With("node", c.NodeName)
}

// daemon is one running vipd: its parts and how they are wired.
type daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	reg     *prometheus.Registry
	checker *health.Checker
	driver  *vip.Driver
	ann     vip.Announcer
	iface   string
	started time.Time
	status  *statusServer
	elector elector
	ctrl    *controllers          // the vipd-controllers child, when VIPD_CONTROLLERS is set
	pools   *poolsPart            // pool addresses, when VIPD_POOLS=on
	extra   map[string]func() any // more /status sections, by name
	egress  *egress.Controller    // VIPD_EGRESS (cmd/vipd/egress.go)

	egressFeed *egressFeed // VIPD_EGRESS_POLICIES (cmd/vipd/egressfeed.go)
}

// elector is a running election (cluster mode) as the daemon needs it.
type elector interface {
	// SetHealthy publishes this node's health to the cluster.
	SetHealthy(healthy bool)
	// SetHolding publishes whether this node holds vip.
	SetHolding(vip string, holding bool)
	// SetFailed reports that this node could not acquire vip or lost it.
	SetFailed(vip, reason string)
	// Run feeds election decisions into send until ctx is done, then
	// leaves the cluster.
	Run(ctx context.Context, send func(vip.Event)) error
	// HandOver hands VIPs this node holds to another node (all held
	// when vips is empty; the best successor when to is "") and waits
	// for the results.
	HandOver(ctx context.Context, vips []string, to string, stopping bool) ([]cluster.HandoverResult, error)
	// Status is the cluster's section of /status.
	Status() any
	// Close leaves the cluster.
	Close() error
}

func newDaemon(ctx context.Context, c *config.Config, log *slog.Logger) (*daemon, error) {
	d := &daemon{cfg: c, log: log, reg: prometheus.NewRegistry(), started: time.Now(), extra: map[string]func() any{}}
	var err error
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vipd_build_info", Help: "Build information; always 1."}, []string{"version", "mode"})
	build.WithLabelValues(version, c.Mode).Set(1)
	d.reg.MustRegister(build)

	if c.Controllers != "" {
		if d.ctrl, err = newControllers(c, log); err != nil {
			return nil, err
		}
	}
	if c.Witness() {
		// A witness only votes: no health check, announcer or core.
		if d.elector, err = newElector(c, log, d.reg); err != nil {
			return nil, err
		}
		return d, nil
	}
	if len(c.Addresses) == 0 && !c.Pools {
		return d, nil // controllers only
	}
	checker, err := health.NewChecker(health.Config{
		URL: c.HealthURL, ReadyzURL: c.HealthReadyzURL, Interval: c.HealthInterval, Timeout: c.HealthTimeout,
		FailThreshold: c.FailThreshold, RiseThreshold: c.RiseThreshold,
		TokenPath: c.SATokenPath, CAFile: c.HealthCAFile,
		ClientCert: c.HealthClientCert, ClientKey: c.HealthClientKey,
	}, log, d.reg)
	if err != nil {
		return nil, usageError{err}
	}
	d.checker = checker

	switch c.Mode {
	case config.ModeL2:
		iface := c.Interface
		if iface == "" {
			if iface, err = vip.DefaultInterface(); err != nil {
				return nil, err
			}
		}
		d.iface = iface
		d.ann, err = vip.NewL2(vip.L2Options{Interface: iface, ProbeTimeout: probeWait(c.Profile)}, log, d.reg)
		if err != nil {
			return nil, usageError{err}
		}
		for _, w := range l2HostWarnings(c) {
			log.Warn(w)
		}
		l2 := d.ann.(*vip.L2)
		// Foreign hosts claiming an address this node holds (the
		// conflict guard), now and recently.
		d.addStatus("conflicts", func() any { return l2.Conflicts() })
	case config.ModeBGP:
		d.ann, err = newBGPAnnouncer(ctx, c, log, d.reg, d.addStatus)
	case config.ModeCloud:
		d.ann, err = newCloudAnnouncer(ctx, c, log, d.reg, d.addStatus)
	}
	if err != nil {
		return nil, err
	}
	elect := c.Elects()
	if elect {
		if d.elector, err = newElector(c, log, d.reg); err != nil {
			_ = d.ann.Close()
			return nil, err
		}
	}
	if err := d.setupVerify(); err != nil {
		_ = d.ann.Close()
		return nil, err
	}
	core := vip.New(c.Addresses, vip.Options{Elect: elect, Announce: c.Mode == config.ModeL2, Check: c.Mode == config.ModeL2, Jitter: vip.NodeJitter(c.NodeName)})
	d.driver, err = vip.NewDriver(core, d.ann, log, d.reg, vip.DriverOptions{
		Mode: c.Mode, OnTransition: d.onTransition, // the action timeout: the announcer's (vip.SlowActions)
	})
	if err != nil {
		_ = d.ann.Close()
		return nil, err
	}
	if err := d.setupEgress(); err != nil {
		_ = d.ann.Close()
		return nil, err
	}
	if c.Pools {
		if d.pools, err = newPools(c, d, log, d.reg); err != nil {
			_ = d.ann.Close()
			return nil, err
		}
	}
	return d, nil
}

// setupVerify turns on the verification of the holders' announcements by
// the other nodes (l2 mode in a cluster, VIPD_VERIFY_INTERVAL not off):
// the election tells it who holds each VIP, the gossip carries its verdicts.
func (d *daemon) setupVerify() error {
	l2, ok := d.ann.(*vip.L2)
	if !ok || d.elector == nil {
		return nil
	}
	if le, leased := d.elector.(*leaseElector); leased {
		// The l2 wire checks learn who holds each VIP and when this node
		// does (conflict detection), with or without the verification.
		le.decided = l2.SetHolder
		le.OnOverlap(overlapToGuard(l2))
	}
	if d.cfg.VerifyInterval <= 0 {
		return nil
	}
	opts := vip.VerifyOptions{Every: d.cfg.VerifyInterval, Port: uint16(d.cfg.VerifyPort)}
	e, ok := d.elector.(*leaseElector)
	if !ok {
		return nil
	}
	lv := cluster.NewLeaseVerify(e.LeaseNode)
	opts.Peers, opts.ElectionMoves = lv, true
	d.addStatus("unverified", func() any { return lv.Exclusions() })
	if err := l2.EnableVerify(opts, d.reg); err != nil {
		return err
	}
	d.addStatus("verification", func() any { return l2.Verification() })
	return nil
}

// overlapToGuard tells the l2 conflict guard of every planned transfer's
// agreed overlap of an address (a core, pool or egress one: the other
// holder's claims are no conflict meanwhile); when the successor's window
// ends it announces the address once more, for a client the old holder
// answered in between.
func overlapToGuard(l2 *vip.L2) func(string, lease.Overlap, bool) {
	return func(key string, o lease.Overlap, on bool) {
		p, err := netip.ParsePrefix(key)
		if err != nil {
			return
		}
		if on {
			l2.SetOverlap(context.Background(), p, o.Until)
			return
		}
		l2.SetOverlap(context.Background(), p, time.Time{})
		if !o.Old {
			_ = l2.Announce(context.Background(), p)
		}
	}
}

func (d *daemon) addStatus(name string, fn func() any) { d.extra[name] = fn }

func (d *daemon) onTransition(t vip.Transition) {
	if d.egress != nil {
		d.egress.SetHeld(t.VIP.Addr(), t.Held && !t.Failed)
	}
	if d.elector == nil {
		return
	}
	if t.Failed {
		d.elector.SetFailed(t.VIP.String(), t.Cause)
		return
	}
	d.elector.SetHolding(t.VIP.String(), t.Held)
}

// stopTimeout bounds the whole stop of the daemon's parts. It stays below
// the packaged unit's TimeoutStopSec and the static pod's grace period
// (both 5 s), so that vipd always ends its stop itself: it kills its own
// child if it must, logs "vipd stopped" and exits. A stop that systemd
// has to kill instead fails the unit (and starts vipd-cleanup.service) on
// an ordinary `systemctl stop`. The VIPs are released (at most
// releaseTimeout) and the cluster left before the controllers child is
// stopped (controllersStopTimeout); normally the whole stop takes well
// under a second.
const stopTimeout = 4 * time.Second

// controllersStopTimeout is the controllers child's time between SIGTERM
// and SIGKILL: its leader releases its Kubernetes lease, one API call. If
// the API does not answer in time the lease runs out at the other nodes
// instead (15 s).
const controllersStopTimeout = 2 * time.Second

// run runs every part until ctx is done or one of them fails for good (a
// fatal error), then stops them in the reverse of the order parts lists
// them, and returns once every part has: a fatal error is returned, so
// vipd exits non-zero (1, restarted by systemd; 2 when vipd-controllers
// rejected the configuration, which a restart cannot fix).
func (d *daemon) run(ctx context.Context) error {
	// Registered first, so logged last: after every part has stopped
	// (VIPs released, cluster left, egress state removed).
	defer d.log.Info("vipd stopped")
	raisePriority(d.cfg.Nice, d.log)
	return d.parts().Run(ctx, stopTimeout)
}

// parts are the daemon's long-running parts in start order
// (internal/lifecycle); they stop in reverse: the pool addresses
// (released), the health checker, the VIPs (released), the election (the
// node leaves the cluster: nobody else holds meanwhile), the egress
// controller (drains and removes its kernel state once the node has
// left), the controllers child, the control socket, the status server,
// the announcer. docs/architecture.md "One lifecycle" has the table.
func (d *daemon) parts() *lifecycle.Parts {
	parts := lifecycle.New(d.log)
	parts.Stopping = func(fatal error) {
		if fatal == nil {
			return
		}
		if len(d.cfg.Addresses) > 0 {
			d.log.Error("stopping after a fatal error: releasing VIPs", "err", fatal)
		} else {
			d.log.Error("stopping after a fatal error", "err", fatal)
		}
		notify("STOPPING=1")
	}
	if d.ann != nil {
		parts.Add(lifecycle.Part{Name: "announcer", Stop: func(context.Context) error { return d.ann.Close() }})
	}
	if d.cfg.MetricsAddress != "" {
		parts.Add(lifecycle.Part{Name: "status server",
			Start: func() (err error) { d.status, err = startStatusServer(d.cfg.MetricsAddress, d); return err },
			Stop:  func(context.Context) error { d.status.Close(); return nil }})
	}
	if d.elector != nil {
		var cs *controlServer
		parts.Add(lifecycle.Part{Name: "control socket",
			Start: func() (err error) { cs, err = startControlServer(d.cfg.StateDir, d, d.log); return err },
			Stop:  func(context.Context) error { cs.Close(); return nil }})
	}
	lock := d.cfg.MemoryLock == "on"
	parts.Add(lifecycle.Part{Name: "memory trim", Run: func(ctx context.Context) error { trimAfter(ctx, trimDelay, lock, d.log); return nil }})
	// The controllers child stops after the VIPs are released: its cordon
	// watch may ask for a handover until then.
	if d.ctrl != nil {
		parts.Add(lifecycle.Part{Name: "controllers", Run: d.ctrl.Run})
	}
	// The egress controller keeps a gateway's state until the node has
	// left the cluster (the directors route elsewhere): left is closed by
	// the election's stop, which comes first.
	left := make(chan struct{})
	if d.egress != nil {
		parts.Add(lifecycle.Part{Name: "egress", Run: func(ctx context.Context) error { d.runEgress(ctx, left); return nil }})
	}
	if d.elector == nil {
		close(left)
	} else {
		var send func(vip.Event)
		if d.driver != nil {
			send = d.driver.Send
		}
		parts.Add(lifecycle.Part{Name: "cluster",
			Run: func(ctx context.Context) error {
				if err := d.elector.Run(ctx, send); err != nil && !errors.Is(err, context.Canceled) {
					return err
				}
				return nil
			},
			Stop: func(context.Context) error {
				defer close(left)
				if err := d.elector.Close(); err != nil {
					return fmt.Errorf("leaving the cluster: %w", err)
				}
				return nil
			}})
	}
	switch {
	case d.driver != nil:
		parts.Add(lifecycle.Part{Name: "VIP driver",
			Start: func() error {
				d.log.Info("vipd started", "version", version, "mode", d.cfg.Mode, "profile", d.cfg.Profile, "vips", d.cfg.Addresses,
					"interface", d.iface, "peers", d.cfg.Peers, "health_url", d.cfg.HealthURL)
				return nil
			},
			Run: func(ctx context.Context) error { d.driver.Run(ctx, releaseTimeout); return nil }})
		parts.Add(lifecycle.Part{Name: "health checker", Run: d.runHealth})
	case d.elector != nil:
		parts.Add(lifecycle.Part{Name: "witness", Start: func() error {
			d.log.Info("vipd started as a witness", "version", version, "mode", d.cfg.Mode, "profile", d.cfg.Profile, "peers", d.cfg.Peers)
			notify("READY=1")
			return nil
		}})
	default:
		parts.Add(lifecycle.Part{Name: "ready", Start: func() error { notify("READY=1"); return nil }})
	}
	if d.pools != nil {
		parts.Add(lifecycle.Part{Name: "pools", Run: func(ctx context.Context) error { d.pools.run(ctx); return nil }})
	}
	return parts
}

// runHealth runs the health checker until ctx is done: it passes the
// node's eligibility on, and runs the drain handovers the checker asks for
// on goroutines it waits for.
func (d *daemon) runHealth(ctx context.Context) error {
	var once sync.Once
	var drains sync.WaitGroup
	defer drains.Wait()
	el := &eligibility{d: d}
	d.checker.Run(ctx, func(s health.Status) {
		once.Do(func() { notify("READY=1") })
		if s.HandOver {
			drains.Go(func() { d.drainHandOver(ctx, s, el) })
		}
		el.sync()
	})
	return nil
}
