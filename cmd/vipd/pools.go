package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/pools"
	"github.com/vipd/vipd/vip"
)

// poolsPart announces IPPool addresses (VIPD_POOLS=on): the feed child
// (vipd-controllers pools-feed) tells what is allocated, the pools driver
// holds each address as the lease election places it (vip.Core, the one
// per-address holder machine) and announces through this mode's announcer.
type poolsPart struct {
	feed *pools.Feed
	drv  *pools.Driver
	// want tells the lease election which l2 pool addresses to place
	// (l2 in a cluster; nil otherwise).
	want func([]pools.Address)
}

// PoolsStatus is the pools' section of /status.
type PoolsStatus struct {
	Feed pools.FeedStatus `json:"feed"`
	pools.Status
}

// The l2 announcer announces pool and egress addresses in batches.
var _ pools.L2 = (*vip.L2)(nil)

// kindVerifier is what the pool and egress addresses need of the l2
// verification by the other nodes (issue 27): which addresses of a kind
// exist, and which this node holds. The l2 announcer is one; without the
// verification its calls do nothing.
type kindVerifier interface {
	SetKindAddresses(kind string, all []netip.Addr)
	SetKindHeld(kind string, held []netip.Addr)
}

var _ kindVerifier = (*vip.L2)(nil)

func newPools(c *config.Config, d *daemon, log *slog.Logger, reg prometheus.Registerer) (*poolsPart, error) {
	bin, err := controllersBinary()
	if err != nil {
		return nil, usageError{fmt.Errorf("VIPD_POOLS=on needs vipd-controllers for its pools-feed: %w", err)}
	}
	feed, err := pools.NewFeed(pools.FeedConfig{
		Command:  []string{bin, "pools-feed"},
		Env:      append(os.Environ(), c.Environ()...),
		StateDir: c.StateDir,
	}, log, reg)
	if err != nil {
		return nil, err
	}
	dc := pools.DriverConfig{Name: c.NodeName}
	for _, a := range c.Addresses {
		dc.Exclude = append(dc.Exclude, a.Addr())
	}
	var vl2 kindVerifier // l2 mode: the verification checks the pool addresses too
	switch c.Mode {
	case config.ModeL2:
		l2, ok := d.ann.(pools.L2)
		if !ok {
			return nil, fmt.Errorf("pools: the l2 announcer (%T) cannot announce addresses in batches", d.ann)
		}
		dc.L2 = l2
		vl2, _ = l2.(kindVerifier)
	case config.ModeBGP:
		dc.BGP = d.ann
	}
	// This node may hold pool addresses while its apiserver is healthy.
	dc.Healthy = func() bool { return d.checker.Status().Healthy }
	le, leased := d.elector.(*leaseElector)
	if leased {
		// The lease election places the l2 pool addresses (its leader's
		// placement is the one ranking): this node holds what its leases
		// say. No cluster (l2 without peers, bgp): every address it may.
		dc.Leased = true
		dc.OnBound = le.bound
	}
	drv, err := pools.NewDriver(dc, log, reg)
	if err != nil {
		return nil, err
	}
	saved, fromDisk := feed.Load()
	if fromDisk {
		log.Info("pools: starting from the addresses saved by the previous run", "addresses", len(saved.Addresses), "generation", saved.Generation)
		drv.SetDesired(saved.Addresses)
	}
	p := &poolsPart{feed: feed, drv: drv}
	if leased {
		exclude := map[netip.Addr]bool{}
		for _, a := range dc.Exclude {
			exclude[a] = true
		}
		p.want = func(as []pools.Address) {
			la := leaseAddrs(as, exclude)
			le.SetAddresses(lease.Pool, la)
			if vl2 != nil {
				// The l2 verification checks the ones held elsewhere.
				all := make([]netip.Addr, 0, len(la))
				for _, a := range la {
					all = append(all, netip.MustParsePrefix(a.Key).Addr())
				}
				vl2.SetKindAddresses("pool", all)
			}
		}
		le.onHold = poolLeases(drv, vl2, "pool")
		if fromDisk {
			p.want(saved.Addresses)
		}
	}
	d.addStatus("pools", func() any { return PoolsStatus{Feed: feed.Status(), Status: drv.Status()} })
	return p, nil
}

// run runs the feed and the driver until ctx is done, and returns once
// the driver has released every pool address and the feed child stopped.
func (p *poolsPart) run(ctx context.Context) {
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		p.feed.Run(ctx, func(s pools.Snapshot) {
			p.drv.SetDesired(s.Addresses)
			if p.want != nil {
				p.want(s.Addresses)
			}
		})
	}()
	p.drv.Run(ctx)
	<-feedDone
}

// printPools prints the pools' /status section for `vipd status`.
func printPools(w io.Writer, v any) error {
	var s PoolsStatus
	if err := remarshal(v, &s); err != nil {
		return err
	}
	f := s.Feed
	feed := "down"
	if f.Running {
		feed = "running"
	}
	fmt.Fprintf(w, "\npools:\tfeed %s, %d snapshots, %d restarts", feed, f.Snapshots, f.Restarts)
	if f.BadLines > 0 {
		fmt.Fprintf(w, ", %d unreadable lines skipped", f.BadLines)
	}
	if f.FromDisk {
		fmt.Fprintf(w, ", addresses saved by the previous run")
	}
	if f.LastError != "" {
		fmt.Fprintf(w, ", last error: %s", f.LastError)
	}
	fmt.Fprintf(w, "\n\t%d addresses, %d held here, %d in conflict", s.Desired, s.Held, s.Conflicts)
	if s.Skipped > 0 {
		fmt.Fprintf(w, ", %d skipped (another mode, or in VIPD_ADDRESS)", s.Skipped)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "\nPOOL ADDRESS\tPOOL\tMODE\tHOLDER\tHERE\tSERVICE")
	for _, a := range s.Addresses {
		here := a.State
		if a.Conflict != "" {
			here += " (answered by " + a.Conflict + ")"
		}
		holder := a.Holder
		if holder == "" {
			holder = "-"
			if a.Mode == pools.ModeBGP {
				holder = fmt.Sprintf("every eligible node (%d)", a.Eligible)
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Address, a.Pool, a.Mode, holder, here, strings.TrimSpace(a.Service))
	}
	return nil
}

// remarshal converts a /status section (a map after JSON) into its type.
func remarshal(v, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// leaseAddrs are the l2 addresses of as (but excluded ones) for the lease
// election to place, each with the nodes that may hold it (the pool's node
// selector, the Service's local traffic policy, the EgressPolicy's
// nodeSelector): the leader grants an address only to one of them.
func leaseAddrs(as []pools.Address, exclude map[netip.Addr]bool) []lease.Address {
	var out []lease.Address
	for _, a := range as {
		ip := a.Addr.Unmap()
		if a.Mode != pools.ModeL2 || exclude[ip] {
			continue
		}
		out = append(out, lease.Address{Key: netip.PrefixFrom(ip, ip.BitLen()).String(), Restricted: !a.All, Nodes: slices.Clone(a.Nodes)})
	}
	return out
}

// poolLeases keeps this node's pool leases from the lease election's
// decisions and hands the complete set to the pools driver after each
// batch, with those granted in a planned transfer's overlap (bound
// without the probe: the old holder answers until this node's bind tells
// it to let go).
func poolLeases(drv *pools.Driver, l2 kindVerifier, kind string) func([]cluster.LeaseDecision) {
	held := map[netip.Addr]time.Time{}
	handover := map[netip.Addr]bool{}
	yielding := map[netip.Addr]bool{}
	return func(ds []cluster.LeaseDecision) { // the election's goroutine only
		for _, d := range ds {
			p, err := netip.ParsePrefix(d.Address.Key)
			if err != nil {
				continue
			}
			delete(yielding, p.Addr())
			switch {
			case !d.Holder:
				delete(held, p.Addr())
				delete(handover, p.Addr())
			case d.OverlapWith != "":
				handover[p.Addr()] = true
				held[p.Addr()] = d.Until
			default:
				held[p.Addr()] = d.Until
				if d.Yielding {
					yielding[p.Addr()] = true
				}
			}
		}
		drv.SetLeases(maps.Clone(held), maps.Clone(handover), maps.Clone(yielding))
		if l2 != nil {
			l2.SetKindHeld(kind, slices.Collect(maps.Keys(held)))
		}
	}
}
