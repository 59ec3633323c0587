package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/pools"
	"github.com/vishvananda/netlink"
)

// egressSettings maps the configuration to the egress package's settings.
func egressSettings(c *config.Config, link int) egress.Settings {
	return egress.Settings{Table: c.EgressTable, RulePriority: c.EgressRulePriority, MarkMask: c.EgressMarkMask,
		Link: link, ClusterCIDRs: c.EgressClusterCIDRs}
}

// holderLookup is the part of the election the egress controller needs.
type holderLookup interface {
	Holder(vip string) (name string, addr netip.Addr)
}

// gateways answers the egress controller's question "which node is the
// gateway of this egress IP": the runtime egress addresses' own machine
// for theirs (VIPD_EGRESS_POLICIES), the election's holder for the
// elected addresses, and this node when it elects nobody (a lone node is
// the gateway while it holds the egress IP).
type gateways struct {
	self    string
	elected holderLookup // nil: no election
	runtime *egressAddrs // nil: no runtime egress addresses
}

// Gateway is an egress.Lookup.
func (g gateways) Gateway(ip netip.Addr) egress.Gateway {
	switch {
	case g.runtime != nil && g.runtime.Has(ip):
		return g.runtime.Gateway(ip)
	case g.elected != nil:
		name, addr := g.elected.Holder(netip.PrefixFrom(ip, ip.BitLen()).String())
		return egress.Gateway{Self: name == g.self, Node: name, Addr: addr}
	default:
		return egress.Gateway{Node: g.self}
	}
}

// setupEgress creates the egress controller when VIPD_EGRESS is set (l2
// mode). Without it, a vipd egress table, rules or routes left by an
// earlier run (a crash, or egress removed from the configuration) are
// removed.
func (d *daemon) setupEgress() error {
	c := d.cfg
	if c.Mode != config.ModeL2 {
		return nil
	}
	k, err := egress.NewKernel()
	if err != nil {
		if len(c.Egress) > 0 {
			return fmt.Errorf("egress: %w", err)
		}
		d.log.Debug("egress: no kernel access to check for stale state", "err", err)
		return nil
	}
	if len(c.Egress) == 0 && !c.EgressPolicies {
		defer k.Close()
		ch, err := k.Remove(egressSettings(c, 0))
		if err != nil {
			d.log.Debug("egress: checking for stale state", "err", err)
		} else if !ch.Empty() {
			d.log.Warn("egress: removed the egress state an earlier run left behind", "changes", ch.Summary())
		}
		return nil
	}
	l, err := netlink.LinkByName(d.iface)
	if err != nil {
		k.Close()
		return fmt.Errorf("egress: interface %s: %w", d.iface, err)
	}
	rules := make([]egress.Rule, len(c.Egress))
	v6 := false
	for i, r := range c.Egress {
		rules[i] = egress.Rule{IP: r.IP, From: r.From, To: r.To}
		v6 = v6 || r.IP.Is6()
	}
	var ea *egressAddrs
	if c.EgressPolicies {
		// Egress IPs of policies that are not among the elected addresses
		// are held at run time through a pools driver.
		if ea, err = newEgressAddrs(c, d, d.log); err != nil {
			k.Close()
			return err
		}
	}
	gw := gateways{self: c.NodeName, runtime: ea}
	if hl, ok := d.elector.(holderLookup); ok {
		gw.elected = hl
	}
	opts := egress.Options{Rules: rules, Settings: egressSettings(c, l.Attrs().Index), Lookup: gw.Gateway}
	if c.EgressPolicies {
		// Policies come and go: every elected address keeps its slot (mark
		// and routing table), the static egress IPs first.
		opts.Order = c.EgressIPs()
		for _, p := range c.Addresses {
			if !slices.Contains(opts.Order, p.Addr()) {
				opts.Order = append(opts.Order, p.Addr())
			}
		}
		v6 = true
	}
	warnForwarding(d.log, v6)
	d.egress = egress.NewController(opts, k, d.log, d.reg)
	if c.EgressPolicies {
		if d.egressFeed, err = newEgressFeed(c, d.log, d.egress.SetRules); err != nil {
			k.Close()
			return err
		}
		d.egressFeed.addrs = func(a []pools.Address) { ea.set(a, true) }
		d.egressFeed.runtime = ea
		d.addStatus("egress_addresses", ea.Status)
	}
	d.addStatus("egress", d.egress.Status)
	return nil
}

// egressGateways are the egress IPs this node is the gateway of: what the
// egressfeed child asks at wire.EgressGatewaysPath to write the policies'
// status.
func (d *daemon) egressGateways() []netip.Addr {
	if d.egress == nil {
		return nil
	}
	out := d.egress.Gateways()
	if d.egressFeed != nil && d.egressFeed.runtime != nil {
		for _, ip := range d.egressFeed.runtime.held() {
			if !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	return out
}

// runEgress runs the egress controller (and the policy feed) until ctx is
// done; the controller then removes what it programmed (a gateway once
// left is closed: the node has left the cluster).
func (d *daemon) runEgress(ctx context.Context, left <-chan struct{}) {
	d.egress.SetLeft(left)
	if d.egressFeed != nil && d.egressFeed.runtime != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.egressFeed.runtime.Run(ctx) // releases the addresses when ctx is done
		}()
		defer func() { <-done }()
	}
	if d.egressFeed != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.egressFeed.Run(ctx)
		}()
		defer func() { <-done }()
	}
	d.egress.Run(ctx)
}

// warnForwarding logs when the node does not forward packets: a gateway
// must forward the directors' traffic, and a director its pods'.
func warnForwarding(log *slog.Logger, v6 bool) {
	check := func(path string) {
		b, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(b)) == "0" {
			log.Warn("egress: IP forwarding is off on this node; egress traffic will not pass", "sysctl", path)
		}
	}
	check("/proc/sys/net/ipv4/ip_forward")
	if v6 {
		check("/proc/sys/net/ipv6/conf/all/forwarding")
	}
}
