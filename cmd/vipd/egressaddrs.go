package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/internal/atomicfile"
	"github.com/vipd/vipd/pools"
)

// EgressAddrsFile is the last set of runtime egress addresses in
// VIPD_STATE_DIR: after a crash or restart, vipd knows which addresses it
// may have left bound and releases those no policy wants any more.
const EgressAddrsFile = "egress-addresses.json"

// egressPool is the pool name the runtime egress addresses carry in the
// pools driver (status, logs).
const egressPool = "egress"

// egressAddrs holds the egress IPs of EgressPolicy objects that are not
// among the node's elected addresses (VIPD_ADDRESS, VIPD_EGRESS): each is
// an l2 address of a pools driver (package pools) with its own eligible
// nodes (the nodes matching the policy's spec.nodeSelector, as the feed
// resolved them), held by the node the lease election's leader places it
// on (without a cluster: this node, when eligible and healthy). It runs
// without VIPD_POOLS=on: a separate driver with its own addresses, sharing
// the l2 announcer.
type egressAddrs struct {
	drv      *pools.Driver
	self     string
	log      *slog.Logger
	state    string                       // file of the last addresses ("": not kept)
	nodeAddr func(name string) netip.Addr // a member's node (gossip) address

	// lease: the lease election places the addresses (nil: no cluster,
	// this node alone); exclude are the addresses the vip core holds.
	lease   *leaseElector
	exclude map[netip.Addr]bool
	verify  kindVerifier // the verification of the addresses held elsewhere (nil: none)

	mu    sync.Mutex
	addrs map[netip.Addr]bool // desired now
}

func newEgressAddrs(c *config.Config, d *daemon, log *slog.Logger) (*egressAddrs, error) {
	l2, ok := d.ann.(pools.L2)
	if !ok {
		return nil, fmt.Errorf("egress: the l2 announcer (%T) cannot announce addresses in batches", d.ann)
	}
	dc := pools.DriverConfig{Name: c.NodeName, L2: l2}
	for _, a := range c.Addresses {
		dc.Exclude = append(dc.Exclude, a.Addr())
	}
	vf, _ := l2.(kindVerifier)
	e := &egressAddrs{self: c.NodeName, verify: vf, log: log.With("component", "egress-addresses"), addrs: map[netip.Addr]bool{}}
	if c.StateDir != "" {
		e.state = filepath.Join(c.StateDir, EgressAddrsFile)
	}
	dc.Healthy = func() bool { return d.checker != nil && d.checker.Status().Healthy }
	if le, ok := d.elector.(*leaseElector); ok {
		// The lease election places the runtime egress addresses like
		// the pool addresses: holds come from the leases, the gateway of
		// the others from the leader's placement.
		dc.Leased = true
		dc.OnBound = le.bound
		e.lease = le
		e.exclude = map[netip.Addr]bool{}
		for _, a := range dc.Exclude {
			e.exclude[a] = true
		}
		e.nodeAddr = func(name string) netip.Addr { return netip.Addr{} } // Gateway asks the lease
	} else {
		e.nodeAddr = func(string) netip.Addr { return netip.Addr{} }
	}
	// A separate registry: the pools metrics names are the pools part's.
	drv, err := pools.NewDriver(dc, log, nil)
	if err != nil {
		return nil, err
	}
	e.drv = drv
	if e.lease != nil {
		e.lease.onEgress = poolLeases(drv, vf, "egress") // the l2 verification checks the ones held elsewhere
	}
	if saved := e.load(); len(saved) > 0 {
		e.log.Info("egress: starting from the runtime egress addresses saved by the previous run", "addresses", len(saved))
		e.set(saved, false)
	}
	return e, nil
}

// set hands the driver the addresses (from the feed, or saved).
func (e *egressAddrs) set(addrs []pools.Address, save bool) {
	m := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		m[a.Addr] = true
	}
	e.mu.Lock()
	e.addrs = m
	e.mu.Unlock()
	e.drv.SetDesired(addrs)
	if e.lease != nil {
		la := leaseAddrs(addrs, e.exclude)
		e.lease.SetAddresses(lease.Egress, la)
		all := make([]netip.Addr, 0, len(la))
		for _, a := range la {
			all = append(all, netip.MustParsePrefix(a.Key).Addr())
		}
		if e.verify != nil {
			e.verify.SetKindAddresses("egress", all) // a no-op without the verification
		}
	}
	if save {
		e.save(addrs)
	}
}

// Has reports whether ip is one of the runtime egress addresses.
func (e *egressAddrs) Has(ip netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addrs[ip]
}

// Gateway is the gateway of a runtime egress IP by this node's view: the
// lease election's holder (without a cluster: this node when it holds it).
func (e *egressAddrs) Gateway(ip netip.Addr) egress.Gateway {
	if e.lease != nil {
		name, addr := e.lease.Holder(netip.PrefixFrom(ip, ip.BitLen()).String())
		if name == e.self {
			return egress.Gateway{Self: true, Node: name}
		}
		return egress.Gateway{Node: name, Addr: addr}
	}
	for _, s := range e.drv.Status().Addresses {
		if s.Address != ip.String() {
			continue
		}
		if s.Holder == "" {
			return egress.Gateway{}
		}
		if s.Holder == e.self {
			return egress.Gateway{Self: true, Node: e.self}
		}
		return egress.Gateway{Node: s.Holder, Addr: e.nodeAddr(s.Holder)}
	}
	return egress.Gateway{}
}

// Run runs the driver until ctx is done; it has released every address
// when it returns.
func (e *egressAddrs) Run(ctx context.Context) {
	e.drv.Run(ctx)
}

// Status is the egress addresses' part of /status.
func (e *egressAddrs) Status() any { return e.drv.Status() }

// held returns the runtime egress addresses this node holds now.
func (e *egressAddrs) held() []netip.Addr {
	var out []netip.Addr
	for _, a := range e.drv.Status().Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.State == "held" {
			out = append(out, ip)
		}
	}
	return out
}

func (e *egressAddrs) load() []pools.Address {
	if e.state == "" {
		return nil
	}
	b, err := os.ReadFile(e.state)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			e.log.Warn("egress: cannot read the saved runtime egress addresses", "file", e.state, "err", err)
		}
		return nil
	}
	var addrs []pools.Address
	if err := json.Unmarshal(b, &addrs); err != nil {
		e.log.Warn("egress: ignoring unreadable saved runtime egress addresses", "file", e.state, "err", err)
		return nil
	}
	return slices.DeleteFunc(addrs, func(a pools.Address) bool { return !a.Addr.IsValid() || a.Mode != pools.ModeL2 })
}

func (e *egressAddrs) save(addrs []pools.Address) {
	if e.state == "" {
		return
	}
	b, err := json.Marshal(addrs)
	if err != nil {
		return
	}
	if err := atomicfile.Write(e.state, b, 0o600); err != nil {
		e.log.Warn("egress: cannot save the runtime egress addresses", "err", err)
	}
}
