package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"
)

// AnnouncerOptions configure an Announcer.
type AnnouncerOptions struct {
	// Refresh is how old the cached "who holds the IP" answer may get
	// before Present asks the API again, in the background (default 10s).
	// Only a node that wants the IP (Acquire called, no Release since)
	// asks, so the API sees one GET per Refresh per VIP, not per node.
	Refresh time.Duration
	// RefreshTimeout bounds one background refresh, retries included
	// (default 3s); a failed refresh is tried again after Refresh.
	RefreshTimeout time.Duration
	// CoolOff is the least time between two assigns by this node (default
	// 5s; negative disables). An Acquire that would assign sooner fails at
	// once without an API call, and the driver retries it. This bounds a
	// ping-pong of assigns between nodes when the election or the health
	// check flaps, like FLIPOP's assignmentCoolOffSeconds. A planned
	// handover to this node (AcquireHandover) is not held back.
	CoolOff time.Duration
	// Binder, when set, also binds the VIP locally on Acquire and removes
	// it on Release (see docs/cloud.md). With a provider that delivers the
	// IP's packets to the address itself (AddressDeliverer), the address
	// is removed only once the provider reports another instance holding
	// the IP (checked every MovedCheck, default 1s, for at most MovedWait,
	// default 60s) or at Close: until the successor's assign completes the
	// IP still routes here, and a missing address would drop that traffic.
	Binder                LocalBinder
	MovedCheck, MovedWait time.Duration
	Logger                *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Announcer is the vip.Announcer of cloud mode. Acquire moves the reserved
// IP to this instance (and waits for the move); Release makes no API call:
// the IP stays where it is until the next holder assigns it to itself;
// Present answers from a cache refreshed in the background at most every
// Refresh; Announce does nothing.
type Announcer struct {
	p       Provider
	opts    AnnouncerOptions
	log     *slog.Logger
	now     func() time.Time
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	checker LocalChecker

	linger bool   // keep the address after Release until the IP moved
	noun   string // "reserved IP", "floating IP": the provider's word in logs and errors

	// bindMu orders a bind by Acquire and a deferred unbind after Release
	// (each checks gen under mu first), so a late unbind never removes the
	// address of a new acquire.
	bindMu sync.Mutex
	mu     sync.Mutex
	state  map[netip.Addr]*ipState
}

// AddressDeliverer is implemented by providers whose network delivers the
// IP's packets addressed to the IP itself (Hetzner floating IPs), so the
// holder must have the address configured, as opposed to a provider that
// delivers them to an address the instance has anyway (DigitalOcean's
// anchor IP).
type AddressDeliverer interface {
	DeliversToAddress() bool
}

// DeliversToAddress reports whether p is an AddressDeliverer that says so.
func DeliversToAddress(p Provider) bool {
	d, ok := p.(AddressDeliverer)
	return ok && d.DeliversToAddress()
}

type ipState struct {
	wanted     bool      // Acquire succeeded and no Release since
	known      bool      // held is an answer from the provider
	held       bool      // this instance holds the IP per the last answer
	checked    time.Time // when held was last learned
	refreshing bool
	failing    bool      // the last refresh failed (log once per outage)
	assigned   time.Time // when this node's last successful assign ended
	gen        int       // bumped by Acquire and Release: stale refreshes are dropped
}

// NewAnnouncer returns an Announcer for p. Call Close when done.
func NewAnnouncer(p Provider, opts AnnouncerOptions) *Announcer {
	if opts.Refresh <= 0 {
		opts.Refresh = 10 * time.Second
	}
	if opts.RefreshTimeout <= 0 {
		opts.RefreshTimeout = 3 * time.Second
	}
	if opts.CoolOff == 0 {
		opts.CoolOff = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MovedCheck <= 0 {
		opts.MovedCheck = time.Second
	}
	if opts.MovedWait <= 0 {
		opts.MovedWait = time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &Announcer{
		p: p, opts: opts, now: opts.Now, ctx: ctx, cancel: cancel,
		log:   opts.Logger.With("provider", p.Name(), "instance", p.Instance()),
		state: map[netip.Addr]*ipState{},
	}
	a.checker, _ = p.(LocalChecker)
	a.noun = "reserved IP"
	if n, ok := p.(interface{ IPNoun() string }); ok {
		a.noun = n.IPNoun()
	}
	a.linger = opts.Binder != nil && DeliversToAddress(p)
	return a
}

// addrOf accepts an IPv4 /32 (reserved IPs are single IPv4 addresses).
func addrOf(vip netip.Prefix) (netip.Addr, error) {
	if !vip.Addr().Is4() || vip.Bits() != 32 {
		return netip.Addr{}, fmt.Errorf("VIP %s: cloud mode takes single IPv4 addresses (a.b.c.d/32)", vip)
	}
	return vip.Addr(), nil
}

func (a *Announcer) st(ip netip.Addr) *ipState {
	s, ok := a.state[ip]
	if !ok {
		s = &ipState{}
		a.state[ip] = s
	}
	return s
}

// Prime asks the provider once who holds each VIP, so that a node that
// already holds one makes no assign call when elected. A rejected token
// (ErrUnauthorized) or an IP the account does not have (ErrNotFound) is
// returned: the daemon should not start. Other failures (API down,
// rate-limited) are logged and ignored: they do not stop start-up.
func (a *Announcer) Prime(ctx context.Context, vips []netip.Prefix) error {
	for _, v := range vips {
		ip, err := addrOf(v)
		if err != nil {
			return err
		}
		h, err := a.p.Holder(ctx, ip)
		if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrNotFound) {
			return err
		}
		known := err == nil
		if !known {
			a.log.Warn("cannot check the "+a.noun+" at start-up; will retry when needed", "ip", ip, "err", err)
		} else {
			a.mu.Lock()
			s := a.st(ip)
			s.known, s.held, s.checked = true, h.Self, a.now()
			a.mu.Unlock()
			a.log.Info(a.noun+" checked", "ip", ip, "holder", h.Holder, "held_here", h.Self, "locked", h.Locked)
		}
		a.leftover(ctx, v, known && !h.Self)
	}
	return nil
}

// leftover handles a local address found at start-up, left by a previous
// run that did not stop cleanly (a crash, SIGKILL, a power cut). Nothing
// wants it yet. If the IP is elsewhere, or the provider does not deliver
// to the address, it goes at once; if the IP may still route here, it
// stays until the IP has moved (as after a Release), so a restarting
// holder drops no traffic.
func (a *Announcer) leftover(ctx context.Context, vip netip.Prefix, elsewhere bool) {
	b := a.opts.Binder
	if b == nil {
		return
	}
	if ok, err := b.Bound(vip); err != nil || !ok {
		return
	}
	if a.linger && !elsewhere && a.ctx.Err() == nil {
		a.mu.Lock()
		gen := a.st(vip.Addr()).gen
		a.mu.Unlock()
		a.log.Info("local address left from a previous run; kept until the IP is elsewhere", "ip", vip.Addr())
		a.wg.Add(1)
		go a.unbindWhenMoved(vip, gen)
		return
	}
	a.bindMu.Lock()
	defer a.bindMu.Unlock()
	if err := b.Unbind(ctx, vip); err != nil {
		a.log.Warn("cannot remove a local address left from a previous run", "ip", vip.Addr(), "err", err)
		return
	}
	a.log.Info("local address left from a previous run removed", "ip", vip.Addr(), "held_elsewhere", elsewhere)
}

// Acquire implements vip.Announcer: make this instance hold the VIP,
// blocking until the provider reports the move complete or ctx ends. No
// assign is sent when this instance is known to hold it already, nor
// within CoolOff of this node's last assign (ErrCoolOff).
func (a *Announcer) Acquire(ctx context.Context, vip netip.Prefix) error {
	return a.acquire(ctx, vip, false)
}

// AcquireHandover implements vip.HandoverAcquirer: Acquire for a planned
// handover to this node (`vipd handover`, a drain, a cordon), which the
// cool-off does not hold back. The cool-off damps a flapping election or
// health check; a planned handover is neither, and the previous holder has
// already let the VIP go for this node: refusing it would leave the IP on
// an instance that no longer answers for it until the cool-off ends (up
// to CoolOff without the VIP, when the handover came back to a node that
// assigned it moments before).
func (a *Announcer) AcquireHandover(ctx context.Context, vip netip.Prefix) error {
	return a.acquire(ctx, vip, true)
}

func (a *Announcer) acquire(ctx context.Context, vip netip.Prefix, planned bool) error {
	ip, err := addrOf(vip)
	if err != nil {
		return err
	}
	a.mu.Lock()
	s := a.st(ip)
	fresh := s.known && a.now().Sub(s.checked) < a.opts.Refresh
	heldFresh, otherFresh := fresh && s.held, fresh && !s.held
	a.mu.Unlock()

	if !heldFresh && !otherFresh {
		heldFresh = a.check(ctx, ip)
	}
	if !heldFresh {
		start := a.now()
		a.mu.Lock()
		since := start.Sub(s.assigned)
		cool := !planned && a.opts.CoolOff > 0 && !s.assigned.IsZero() && since < a.opts.CoolOff
		a.mu.Unlock()
		if cool {
			a.setWanted(ip, false)
			return fmt.Errorf("%s %s: this node assigned it %v ago; waiting %v between assigns so a flapping election cannot bounce the IP: %w", a.noun,
				ip, since.Round(time.Millisecond), a.opts.CoolOff, ErrCoolOff)
		}
		// Where the provider delivers to the address, configure it before
		// the assign: the IP routes here the moment the action completes,
		// which this node learns only at its next poll. Harmless before:
		// the provider's routing, not the address, picks the instance.
		gen, err := a.bindEarly(ctx, vip)
		if err != nil {
			a.setWanted(ip, false)
			return err
		}
		if err := a.p.Assign(ctx, ip); err != nil {
			a.setWanted(ip, false)
			a.unbindIfCurrent(vip, gen)
			return fmt.Errorf("assign %s %s to this instance (%s %s): %w", a.noun, ip, a.p.Name(), a.p.Instance(), err)
		}
		a.log.Info(a.noun+" assigned to this instance", "ip", ip, "took", a.now().Sub(start).Round(time.Millisecond))
	}
	a.mu.Lock()
	if !heldFresh {
		s.assigned = a.now()
	}
	s.gen++
	s.known, s.held, s.checked, s.wanted = true, true, a.now(), true
	a.mu.Unlock()
	if b := a.opts.Binder; b != nil {
		a.bindMu.Lock()
		err := b.Bind(ctx, vip)
		a.bindMu.Unlock()
		if err != nil {
			return fmt.Errorf("bind %s %s locally: %w", a.noun, vip, err)
		}
	}
	return nil
}

// bindEarly binds vip ahead of an assign when the provider delivers to
// the address (a no-op otherwise) and returns the generation it bound in;
// the bump makes any deferred unbind of an earlier release stale.
func (a *Announcer) bindEarly(ctx context.Context, vip netip.Prefix) (int, error) {
	if !a.linger {
		return 0, nil
	}
	a.mu.Lock()
	s := a.st(vip.Addr())
	s.gen++
	gen := s.gen
	a.mu.Unlock()
	a.bindMu.Lock()
	defer a.bindMu.Unlock()
	if err := a.opts.Binder.Bind(ctx, vip); err != nil {
		return 0, fmt.Errorf("bind %s %s locally: %w", a.noun, vip, err)
	}
	return gen, nil
}

// unbindIfCurrent undoes bindEarly after a failed assign, unless an
// Acquire or Release came in between.
func (a *Announcer) unbindIfCurrent(vip netip.Prefix, gen int) {
	if !a.linger {
		return
	}
	a.bindMu.Lock()
	defer a.bindMu.Unlock()
	if a.stale(vip.Addr(), gen) {
		return
	}
	if err := a.opts.Binder.Unbind(context.Background(), vip); err != nil {
		a.log.Warn("cannot remove the local address after a failed assign", "ip", vip.Addr(), "err", err)
	}
}

// ErrHeldElsewhere is returned by AcquireLone when another instance holds
// the reserved IP.
var ErrHeldElsewhere = errors.New("held by another instance")

// AcquireLone implements vip.LoneAcquirer: a node that holds alone (it
// reaches none of its configured peers, and nobody vouches for it) takes
// the reserved IP only when no other instance holds it. Cloud mode has no
// data-plane probe; this is its guard against two isolated nodes moving the
// IP back and forth.
func (a *Announcer) AcquireLone(ctx context.Context, vip netip.Prefix) error {
	ip, err := addrOf(vip)
	if err != nil {
		return err
	}
	h, err := a.p.Holder(ctx, ip)
	if err != nil {
		return fmt.Errorf("%s %s: cannot tell which instance holds it, and no cluster member vouches for this node: not taking it: %w", a.noun, ip, err)
	}
	if h.Holder != "" && !h.Self {
		return fmt.Errorf("%s %s is assigned to instance %s, and no cluster member vouches for this node (it reaches none of VIPD_PEERS): not taking it: %w", a.noun, ip, h.Holder, ErrHeldElsewhere)
	}
	return a.Acquire(ctx, vip)
}

// check reports whether this instance holds ip, asking the metadata
// service first (free) and the API only when that is unavailable. Unknown
// counts as not held: an extra assign of an IP we hold is harmless.
func (a *Announcer) check(ctx context.Context, ip netip.Addr) bool {
	if a.checker != nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		held, err := a.checker.HeldLocally(cctx, ip)
		cancel()
		if err == nil {
			return held
		}
		a.log.Debug("metadata check failed; asking the API", "ip", ip, "err", err)
	}
	h, err := a.p.Holder(ctx, ip)
	if err != nil {
		a.log.Debug("holder check failed; assigning anyway", "ip", ip, "err", err)
		return false
	}
	return h.Self
}

func (a *Announcer) setWanted(ip netip.Addr, w bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st(ip).wanted = w
}

// ActionTimeout bounds one action of the driver (vip.SlowActions): an
// assign includes polling the provider's action. It resumes its pending
// action on the next attempt, so the bound only keeps the driver
// responsive (a 429 wait can be long).
func (a *Announcer) ActionTimeout() time.Duration { return 15 * time.Second }

// Release implements vip.Announcer. It makes no API call: the reserved IP
// keeps pointing here until the next holder assigns it to itself (never
// unassign: an unassigned IP reaches nobody). Only the optional local
// binding is removed.
func (a *Announcer) Release(ctx context.Context, vip netip.Prefix) error {
	ip, err := addrOf(vip)
	if err != nil {
		return err
	}
	a.mu.Lock()
	s := a.st(ip)
	// Once released, another node may take the IP at any moment: forget
	// the cached answer so a later Acquire checks again.
	s.wanted, s.known = false, false
	s.gen++
	gen := s.gen
	a.mu.Unlock()
	a.log.Info("released: the "+a.noun+" stays assigned until another node assigns it to itself", "ip", ip)
	b := a.opts.Binder
	if b == nil {
		return nil
	}
	if a.linger && a.ctx.Err() == nil {
		a.wg.Add(1)
		go a.unbindWhenMoved(vip, gen)
		return nil
	}
	if err := b.Unbind(ctx, vip); err != nil {
		return fmt.Errorf("unbind %s %s locally: %w", a.noun, vip, err)
	}
	return nil
}

// unbindWhenMoved removes the local address of a released VIP once the
// provider says another instance holds the IP, after MovedWait, or at
// Close, unless the VIP was acquired (or released) again meanwhile.
func (a *Announcer) unbindWhenMoved(vip netip.Prefix, gen int) {
	defer a.wg.Done()
	ip := vip.Addr()
	deadline := time.Now().Add(a.opts.MovedWait)
	why := "closing"
	for a.ctx.Err() == nil {
		t := time.NewTimer(a.opts.MovedCheck)
		select {
		case <-a.ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if a.stale(ip, gen) {
			return
		}
		if a.ctx.Err() != nil {
			break
		}
		ctx, cancel := context.WithTimeout(a.ctx, a.opts.RefreshTimeout)
		h, err := a.p.Holder(ctx, ip)
		cancel()
		if err == nil && !h.Self {
			why = "another instance holds it now"
			break
		}
		if time.Now().After(deadline) {
			why = "it did not move within " + a.opts.MovedWait.String()
			break
		}
	}
	a.bindMu.Lock()
	defer a.bindMu.Unlock()
	if a.stale(ip, gen) {
		return
	}
	if err := a.opts.Binder.Unbind(context.Background(), vip); err != nil {
		a.log.Warn("cannot remove the released IP's local address", "ip", ip, "err", err)
		return
	}
	a.log.Info("released IP's local address removed", "ip", ip, "reason", why)
}

// stale reports whether an Acquire or Release changed ip since gen.
func (a *Announcer) stale(ip netip.Addr, gen int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st(ip).gen != gen
}

// Announce implements vip.Announcer: there is nothing to repeat.
func (a *Announcer) Announce(context.Context, netip.Prefix) error { return nil }

// Present implements vip.Announcer from the cache: true while this node
// wants the VIP and the provider's last answer says this instance holds it
// (and, with a Binder, the local binding exists). A stale cache starts one
// background refresh; a refresh that fails keeps the last answer, so an
// API outage never makes the holder give up.
func (a *Announcer) Present(_ context.Context, vip netip.Prefix) (bool, error) {
	ip, err := addrOf(vip)
	if err != nil {
		return false, err
	}
	a.mu.Lock()
	s := a.st(ip)
	if !s.wanted {
		a.mu.Unlock()
		return false, nil
	}
	if !s.refreshing && a.now().Sub(s.checked) >= a.opts.Refresh && a.ctx.Err() == nil {
		s.refreshing = true
		a.wg.Add(1)
		go a.refresh(ip, s.gen)
	}
	held := s.held
	a.mu.Unlock()
	if held && a.opts.Binder != nil {
		return a.opts.Binder.Bound(vip)
	}
	return held, nil
}

// refresh asks the provider who holds ip and updates the cache, unless an
// Acquire or Release (gen changed) made the answer stale meanwhile.
func (a *Announcer) refresh(ip netip.Addr, gen int) {
	defer a.wg.Done()
	ctx, cancel := context.WithTimeout(a.ctx, a.opts.RefreshTimeout)
	defer cancel()
	h, err := a.p.Holder(ctx, ip)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.st(ip)
	s.refreshing = false
	if s.gen != gen {
		return
	}
	s.checked = a.now()
	if err != nil {
		if !s.failing {
			a.log.Warn("cannot refresh the "+a.noun+"'s holder; keeping the last known state", "ip", ip, "held_here", s.held, "err", err)
		}
		s.failing = true
		return
	}
	if s.failing {
		a.log.Info(a.noun+" holder check works again", "ip", ip)
		s.failing = false
	}
	if s.wanted && s.held && !h.Self {
		a.log.Warn(a.noun+" is no longer assigned to this instance", "ip", ip, "holder", h.Holder)
	}
	s.known, s.held = true, h.Self
}

// VIPStatus is one reserved IP in the /status JSON.
type VIPStatus struct {
	IP         string `json:"ip"`
	Wanted     bool   `json:"wanted"`
	HeldHere   bool   `json:"held_here"`
	Known      bool   `json:"known"`
	CheckedAt  string `json:"checked_at,omitempty"`
	APIFailing bool   `json:"api_failing"`
}

// Status is the cloud section of /status.
type Status struct {
	Provider string      `json:"provider"`
	Instance string      `json:"instance"`
	VIPs     []VIPStatus `json:"vips"`
}

// Status reports the cached view (no API call).
func (a *Announcer) Status() any {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := Status{Provider: a.p.Name(), Instance: a.p.Instance(), VIPs: []VIPStatus{}}
	for ip, s := range a.state {
		v := VIPStatus{IP: ip.String(), Wanted: s.wanted, HeldHere: s.known && s.held, Known: s.known, APIFailing: s.failing}
		if !s.checked.IsZero() {
			v.CheckedAt = s.checked.UTC().Format(time.RFC3339)
		}
		st.VIPs = append(st.VIPs, v)
	}
	sort.Slice(st.VIPs, func(i, j int) bool { return st.VIPs[i].IP < st.VIPs[j].IP })
	return st
}

// Close stops background refreshes and closes the binder. It does not
// release anything.
func (a *Announcer) Close() error {
	a.cancel()
	a.wg.Wait()
	if b := a.opts.Binder; b != nil {
		return b.Close()
	}
	return nil
}
