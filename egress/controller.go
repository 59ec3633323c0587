package egress

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Lookup reports what this node knows about the gateway of an egress IP
// (the consumer connects it to the election).
type Lookup func(ip netip.Addr) Gateway

// Options configure a Controller.
type Options struct {
	Rules []Rule // static rules (VIPD_EGRESS); SetRules adds more
	// Order fixes each egress IP's slot (mark and table), see Input.Order.
	Order    []netip.Addr
	Settings Settings
	Lookup   Lookup
	// Interval between full comparisons with the kernel (default 1 s).
	Interval time.Duration
	// Poll is how often Lookup is asked for a new gateway (default 50 ms).
	Poll time.Duration
}

// Controller keeps the kernel at the plan: it re-plans when the gateway
// of an egress IP changes, compares the kernel with the plan every
// Interval and repairs it, and removes everything when it stops.
type Controller struct {
	opts Options
	k    *Kernel
	log  *slog.Logger

	wake chan struct{}

	mu      sync.Mutex
	left    <-chan struct{} // closed once the node left the cluster (SetLeft)
	dynamic []Rule          // from SetRules
	order   []netip.Addr    // slots: Options.Order, then runtime egress IPs (ExtendOrder)
	held    map[netip.Addr]bool
	applied Input // last input the kernel was brought to
	roles   map[netip.Addr]Role
	gws     map[netip.Addr]Gateway
	lastErr string
	since   map[netip.Addr]time.Time // when the gateway last changed
	// lastGateway is the last time this node was the gateway of an
	// egress IP (a reconcile with or leaving the gateway role).
	lastGateway time.Time

	mGateway *prometheus.GaugeVec
	mRepairs *prometheus.CounterVec
	mErrors  prometheus.Counter
	mChanges prometheus.Counter
}

// NewController returns a controller; Run starts it.
func NewController(opts Options, k *Kernel, log *slog.Logger, reg prometheus.Registerer) *Controller {
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Poll <= 0 {
		opts.Poll = 50 * time.Millisecond
	}
	c := &Controller{opts: opts, k: k, log: log, wake: make(chan struct{}, 1), held: map[netip.Addr]bool{}, since: map[netip.Addr]time.Time{},
		order: slices.Clone(opts.Order),
		mGateway: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vipd_egress_gateway",
			Help: "1 while this node is the egress gateway of egress_ip (SNAT), 0 while it is a director."}, []string{"egress_ip"}),
		mRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vipd_egress_repairs_total",
			Help: "Egress kernel state found different from the plan and repaired, by what (table, rule, route)."}, []string{"what"}),
		mErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_egress_errors_total",
			Help: "Failed attempts to read or program the egress kernel state."}),
		mChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_egress_changes_total",
			Help: "Egress kernel updates after a change of role or gateway."}),
	}
	if reg != nil {
		reg.MustRegister(c.mGateway, c.mRepairs, c.mErrors, c.mChanges)
	}
	return c
}

// SetHeld tells the controller whether this node holds ip (its VIP
// transitions): the holder is the gateway.
func (c *Controller) SetHeld(ip netip.Addr, held bool) {
	c.mu.Lock()
	c.held[ip] = held
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// SetRules replaces the rules that came from outside the configuration
// (EgressPolicy objects); they add to the static ones.
func (c *Controller) SetRules(rules []Rule) {
	c.mu.Lock()
	c.dynamic = slices.Clone(rules)
	if len(c.opts.Order) > 0 {
		c.order = ExtendOrder(c.order, len(c.opts.Order), IPs(append(slices.Clone(c.opts.Rules), rules...)))
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// ExtendOrder gives every egress IP of used that has no slot in order one:
// the first slot at or after fixed (the configured addresses keep theirs)
// whose IP no rule uses any more, else a new one at the end. IPs that keep
// being used keep their slot, so policies coming and going renumber
// nothing else. It returns a new slice.
func ExtendOrder(order []netip.Addr, fixed int, used []netip.Addr) []netip.Addr {
	out := slices.Clone(order)
	for _, ip := range used {
		if slices.Contains(out, ip) {
			continue
		}
		free := -1
		for i := fixed; i < len(out); i++ {
			if !slices.Contains(used, out[i]) {
				free = i
				break
			}
		}
		if free >= 0 {
			out[free] = ip
		} else {
			out = append(out, ip)
		}
	}
	return out
}

func (c *Controller) rules() []Rule {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(slices.Clone(c.opts.Rules), c.dynamic...)
}

func (c *Controller) input() Input {
	rules := c.rules()
	in := Input{Rules: rules, Settings: c.opts.Settings, Gateways: map[netip.Addr]Gateway{}}
	c.mu.Lock()
	in.Order = slices.Clone(c.order)
	held := maps.Clone(c.held)
	c.mu.Unlock()
	for _, ip := range IPs(rules) {
		var g Gateway
		if c.opts.Lookup != nil {
			g = c.opts.Lookup(ip)
		}
		if held[ip] {
			g.Self = true
		}
		if g.Self {
			g.Addr = netip.Addr{}
		}
		in.Gateways[ip] = g
	}
	return in
}

// Run programs the kernel until ctx is done, then removes what it
// programmed (bounded by the kernel calls, no network I/O).
func (c *Controller) Run(ctx context.Context) {
	// What a crash left behind (other tables, rules of another role) is
	// replaced or removed by the first reconcile.
	poll := time.NewTicker(c.opts.Poll)
	defer poll.Stop()
	var last time.Time
	var prev Input
	first := true
	for {
		in := c.input()
		changed := !maps.Equal(in.Gateways, prev.Gateways) || !rulesEqual(in.Rules, prev.Rules)
		if first || changed || time.Since(last) >= c.opts.Interval {
			c.reconcile(in, first || changed)
			prev, last, first = in, time.Now(), false
		}
		select {
		case <-ctx.Done():
			c.drain()
			c.stop()
			return
		case <-poll.C:
		case <-c.wake:
		}
	}
}

// SetLeft gives the controller a channel closed once the node has left
// the cluster at shutdown (see drain). Without one, a stopping gateway
// waits for the release of its egress IPs only.
func (c *Controller) SetLeft(left <-chan struct{}) {
	c.mu.Lock()
	c.left = left
	c.mu.Unlock()
}

// drain keeps a stopping node that was a gateway from leaking the
// directors' traffic still on its way to it (see Drain, which decides
// each step): it keeps its state until it released the egress IPs and
// left the cluster, then holds the stopping state (the guard drops the
// selected flows instead of letting the CNI masquerade them) until no such
// packet came from another node for DrainQuiet, at most DrainMax in all.
// Before, only a node that was still the gateway when the stop began
// drained: a hand-over at stop had already made it a director, so it
// removed everything at once and the CNI sent the directors' packets out
// with its address (CI failure, test/egress planned-stop).
func (c *Controller) drain() {
	c.mu.Lock()
	in := DrainInput{Start: time.Now(), LastGateway: c.lastGateway}
	left := c.left
	c.mu.Unlock()
	var arrivals uint64
	for {
		in.Now = time.Now()
		c.mu.Lock()
		in.Held = false
		for _, h := range c.held {
			in.Held = in.Held || h
		}
		c.mu.Unlock()
		in.Left = left == nil // no cluster, or seen closed below on an earlier round
		if left != nil {
			select {
			case <-left:
				in.Left, left = true, nil // a nil channel: the select below no longer wakes on it
			default:
			}
		}
		if !in.Guarded.IsZero() {
			n, err := c.k.Arrivals()
			if err != nil {
				c.fail(err)
			} else if n != arrivals {
				arrivals, in.LastArrival = n, in.Now
			}
		}
		step, next := Drain(in)
		switch step {
		case DrainRemove:
			if in.Now.Sub(in.Start) >= DrainMax && !in.LastGateway.IsZero() {
				c.log.Warn("egress: stop: drain bound reached", "held", in.Held, "left", in.Left, "arrivals_dropped", arrivals)
			} else if !in.Guarded.IsZero() {
				c.log.Info("egress: stop: no more traffic from other nodes", "drained", in.Now.Sub(in.Start).Round(time.Millisecond),
					"arrivals_dropped", arrivals)
			}
			return
		case DrainGuard:
			c.applyStopping()
			in.Guarded = time.Now()
			continue
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-c.wake:
		case <-left:
		case <-t.C:
		}
		t.Stop()
	}
}

// applyStopping puts in the stopping state (PlanStopping).
func (c *Controller) applyStopping() {
	// No gateways: the stopping state needs none, and the cluster is left.
	in := Input{Rules: c.rules(), Settings: c.opts.Settings}
	c.mu.Lock()
	in.Order = slices.Clone(c.order)
	c.mu.Unlock()
	want := PlanStopping(in)
	obs, err := c.k.Observe(in.Settings)
	if err != nil {
		c.fail(err)
		return
	}
	ch := Diff(want, obs)
	c.log.Info("egress: stop: dropping the selected flows until the directors route elsewhere", "changes", ch.Summary())
	if err := c.k.Apply(want, ch); err != nil {
		c.fail(err)
	}
}

func (c *Controller) stop() {
	ch, err := c.k.Remove(c.opts.Settings)
	if err != nil {
		c.mErrors.Inc()
		c.log.Error("egress: removing the kernel state at stop", "err", err)
		return
	}
	c.log.Info("egress: kernel state removed", "changes", ch.Summary())
}

// Reconcile compares the kernel with the plan for the current input and
// repairs it once (tests call it directly).
func (c *Controller) Reconcile() { c.reconcile(c.input(), false) }

func (c *Controller) reconcile(in Input, changed bool) {
	want := Plan(in)
	c.mu.Lock()
	for ip, g := range in.Gateways {
		if old, ok := c.gws[ip]; !ok || old != g {
			c.since[ip] = time.Now()
		}
	}
	if hasGateway(c.roles) || hasGateway(want.Roles) { // is, or was until now
		c.lastGateway = time.Now()
	}
	c.gws, c.roles = in.Gateways, want.Roles
	for ip, r := range want.Roles {
		v := 0.0
		if r == RoleGateway {
			v = 1
		}
		c.mGateway.WithLabelValues(ip.String()).Set(v)
	}
	appliedBefore := maps.Equal(c.applied.Gateways, in.Gateways) && c.applied.Gateways != nil && rulesEqual(c.applied.Rules, in.Rules)
	c.mu.Unlock()

	obs, err := c.k.Observe(in.Settings)
	if err != nil {
		c.fail(err)
		return
	}
	ch := Diff(want, obs)
	if ch.Empty() {
		c.ok(in)
		return
	}
	if appliedBefore && !changed {
		// The kernel drifted from a plan applied before: someone removed
		// or changed vipd's rules, routes or table.
		c.log.Warn("egress: kernel state differs from the plan: repairing", "changes", ch.Summary())
		if ch.ReplaceTable || ch.DeleteTable {
			c.mRepairs.WithLabelValues("table").Inc()
		}
		if n := len(ch.AddRules) + len(ch.DelRules); n > 0 {
			c.mRepairs.WithLabelValues("rule").Add(float64(n))
		}
		if n := len(ch.AddRoutes) + len(ch.DelRoutes); n > 0 {
			c.mRepairs.WithLabelValues("route").Add(float64(n))
		}
	} else {
		c.mChanges.Inc()
		c.log.Info("egress: programming", "roles", want.Roles, "changes", ch.Summary())
	}
	if err := c.k.Apply(want, ch); err != nil {
		c.fail(err)
		return
	}
	c.ok(in)
}

func hasGateway(roles map[netip.Addr]Role) bool {
	for _, r := range roles {
		if r == RoleGateway {
			return true
		}
	}
	return false
}

func (c *Controller) fail(err error) {
	c.mErrors.Inc()
	c.log.Error("egress: kernel state", "err", err)
	c.mu.Lock()
	c.lastErr = err.Error()
	c.mu.Unlock()
}

func (c *Controller) ok(in Input) {
	c.mu.Lock()
	c.applied, c.lastErr = in, ""
	c.mu.Unlock()
}

// StatusDoc is the egress section of /status.
type StatusDoc struct {
	EgressIPs    []IPStatus `json:"egress_ips"`
	Table        string     `json:"nftables_table"`
	RoutingTable int        `json:"routing_table"`
	RulePriority int        `json:"rule_priority"`
	MarkMask     string     `json:"mark_mask"`
	LastError    string     `json:"last_error,omitempty"`
}

// Gateways returns the egress IPs this node is the gateway of now.
func (c *Controller) Gateways() []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []netip.Addr
	for ip, r := range c.roles {
		if r == RoleGateway {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// IPStatus is one egress IP in /status.
type IPStatus struct {
	IP          string    `json:"egress_ip"`
	Role        Role      `json:"role"`
	GatewayNode string    `json:"gateway_node,omitempty"`
	GatewayAddr string    `json:"gateway_address,omitempty"`
	Since       time.Time `json:"since"`
	Rules       []string  `json:"rules"`
}

// Status is the controller's section of /status.
func (c *Controller) Status() any {
	c.mu.Lock()
	defer c.mu.Unlock()
	doc := StatusDoc{Table: "inet " + TableName, RoutingTable: c.opts.Settings.Table, RulePriority: c.opts.Settings.RulePriority,
		MarkMask: fmt.Sprintf("%#08x", c.opts.Settings.MarkMask), LastError: c.lastErr}
	rules := append(slices.Clone(c.opts.Rules), c.dynamic...)
	for _, ip := range IPs(rules) {
		g := c.gws[ip]
		s := IPStatus{IP: ip.String(), Role: c.roles[ip], GatewayNode: g.Node, Since: c.since[ip]}
		if g.Addr.IsValid() {
			s.GatewayAddr = g.Addr.String()
		}
		if s.Role == RoleDirector && !g.Addr.IsValid() {
			s.GatewayNode = "(none known: traffic rejected)"
		}
		for _, r := range rules {
			if r.IP == ip {
				s.Rules = append(s.Rules, ruleText(r))
			}
		}
		doc.EgressIPs = append(doc.EgressIPs, s)
	}
	return doc
}

func ruleText(r Rule) string {
	s := "from "
	for i, p := range r.From {
		if i > 0 {
			s += ","
		}
		s += p.String()
	}
	s += " to "
	for i, p := range r.To {
		if i > 0 {
			s += ","
		}
		s += p.String()
	}
	return s
}

func rulesEqual(a, b []Rule) bool {
	return slices.EqualFunc(a, b, func(x, y Rule) bool {
		return x.IP == y.IP && slices.Equal(x.From, y.From) && slices.Equal(x.To, y.To)
	})
}
