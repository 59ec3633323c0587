package main

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/manifest"
	"github.com/vipd/vipd/migrate"
	"github.com/vipd/vipd/vip"
)

// extraCommands are subcommands added by other parts (manifest, migrate,
// forget), each in its own file.
func extraCommands() []*cobra.Command {
	return []*cobra.Command{newForgetCmd(), newCleanupCmd(), migrate.Command(), manifest.Command(version, manifestFlags)}
}

// manifestFlags gives `vipd manifest` the same settings flags as `vipd run`.
func manifestFlags(fs *pflag.FlagSet) config.Source {
	v := settingsFlags(fs)
	return func(s *config.Setting) (string, bool) {
		if !v.IsSet(s.Env) {
			return "", false
		}
		return v.GetString(s.Env), true
	}
}

// checkModeSettings validates settings that other packages parse (BGP
// peers, controllers) so that check-config and run fail the same way.
func checkModeSettings(c *config.Config) error {
	if c.ProviderControllers() && c.DOToken == "" && c.DOTokenFile == "" && c.CloudflareToken == "" {
		return &config.Error{Name: "DIGITALOCEAN_ACCESS_TOKEN", Value: "",
			Accepted: "a provider token for VIPD_CONTROLLERS: DIGITALOCEAN_ACCESS_TOKEN or VIPD_DO_TOKEN_FILE, and/or CLOUDFLARE_API_TOKEN"}
	}
	if c.Mode == config.ModeBGP && (len(c.Addresses) > 0 || c.Pools) {
		if err := checkBGPSettings(c); err != nil {
			return err
		}
	}
	return nil
}

// newElector creates this node's part of the election (cluster package):
// the lease election, the only one.
func newElector(c *config.Config, log *slog.Logger, reg prometheus.Registerer) (elector, error) {
	return newLeaseElector(c, log, reg)
}

// newLeaseElector creates this node's part of the lease election.
func newLeaseElector(c *config.Config, log *slog.Logger, reg prometheus.Registerer) (elector, error) {
	timings := cluster.TimingsFor(c.Profile)
	mc := lease.ProfileConfig(c.Profile)
	mc.Priority, mc.PreemptDelay = c.Priority, c.PreemptDelay
	if c.VerifyInterval > 0 {
		// Reports that name no holder stand this long before they count
		// (cluster/lease/unverified.go): two verification rounds and a
		// half, the time a reporter needs to verify a new holder.
		mc.VerifySettle = 2*c.VerifyInterval + c.VerifyInterval/2
	}
	if c.Witness() {
		mc.Role = lease.Witness
	}
	var addrs []lease.Address
	core := map[string]bool{}
	if !c.Witness() {
		// Every VIPD_ADDRESS address, a static VIPD_EGRESS one included,
		// follows the control-plane rule: held together, the incumbent
		// keeps them (one gateway for all static egress IPs, which a
		// joining node does not take: egress connections survive it).
		// EgressPolicy addresses are spread.
		for _, a := range c.Addresses {
			addrs = append(addrs, lease.Address{Key: a.String(), Kind: lease.ControlPlane})
			core[a.String()] = true
		}
	}
	n, err := cluster.NewLease(cluster.LeaseConfig{
		Cluster: cluster.Config{Name: c.NodeName, Bind: c.GossipBind, Peers: c.Peers, KeyFile: c.GossipKeyFile, Keys: c.GossipKeys,
			Insecure: c.GossipInsecure, StateDir: c.StateDir, Timings: timings},
		Machine:   mc,
		Addresses: addrs,
	}, log, reg)
	if err != nil {
		return nil, err
	}
	return &leaseElector{LeaseNode: n, log: log, core: core, self: c.NodeName}, nil
}

// leaseElector adapts cluster.LeaseNode to the daemon's elector: holds of
// control-plane VIPs go to the vip core with their lease end; pool holds
// to onHold, EgressPolicy holds to onEgress.
type leaseElector struct {
	*cluster.LeaseNode
	log      *slog.Logger
	self     string                        // this node's name
	core     map[string]bool               // the addresses the vip core holds (VIPD_ADDRESS, VIPD_EGRESS)
	onHold   func([]cluster.LeaseDecision) // pool addresses (nil: none); set before Run
	onEgress func([]cluster.LeaseDecision) // EgressPolicy addresses (nil: none); set before Run
	// decided, when set, learns who holds each core address (the l2
	// verification and conflict guard): this node, the other node the
	// election names, or nobody (""). Set before Run.
	decided func(vip netip.Prefix, holder string, self bool)
}

func (e *leaseElector) Run(ctx context.Context, send func(vip.Event)) error {
	return e.LeaseNode.Run(ctx, func(ds []cluster.LeaseDecision) {
		var poolDs, egressDs []cluster.LeaseDecision
		for _, d := range ds {
			switch {
			case e.core[d.Address.Key]:
				e.toCore(d, send)
			case d.Address.Kind == lease.Egress:
				egressDs = append(egressDs, d)
			default:
				poolDs = append(poolDs, d)
			}
		}
		if len(poolDs) > 0 && e.onHold != nil {
			e.onHold(poolDs)
		}
		if len(egressDs) > 0 && e.onEgress != nil {
			e.onEgress(egressDs)
		}
	})
}

// toCore hands a decision on a VIPD_ADDRESS or VIPD_EGRESS address to the
// vip core, with its lease end.
func (e *leaseElector) toCore(d cluster.LeaseDecision, send func(vip.Event)) {
	p, err := netip.ParsePrefix(d.Address.Key)
	if err != nil {
		e.log.Error("lease election decided an address that is not a prefix", "address", d.Address.Key)
		return
	}
	if send == nil { // a witness: it must never be granted a hold
		if d.Holder {
			e.log.Error("a witness was granted a hold: ignored", "address", d.Address.Key)
		}
		return
	}
	// A planned transfer's successor binds beside the old holder (agreed
	// make-before-break, OverlapWith) without the conflict probe, which the
	// old holder would answer.
	send(vip.Elected{VIP: p, Holder: d.Holder, Until: d.Until, Reason: d.Reason, Handover: d.Handover || d.OverlapWith != "", PrevHolder: d.Prev, Lone: d.Lone, Yielding: d.Yielding})
	if e.decided != nil {
		e.decided(p, leaseHolder(d, e.self), d.Holder)
	}
}

// bound tells the lease election which pool or egress addresses this
// node has just bound and announced: a planned transfer's successor then
// tells the old holder to let go (make-before-break), as SetHolding does
// for the core's addresses.
func (e *leaseElector) bound(addrs []netip.Addr) {
	keys := make([]string, len(addrs))
	for i, a := range addrs {
		keys[i] = netip.PrefixFrom(a, a.BitLen()).String()
	}
	e.Bound(keys)
}

// leaseHolder names the holder of a decided core address: this node when
// it holds it, else the node the leader's placement names; without one,
// for a control-plane address the leader (they follow the leader; a
// leader that does not hold them is handing them over: nobody known until
// it is done), for a static egress address a node not named here
// (vip.UnknownHolder) once there is a leader.
func leaseHolder(d cluster.LeaseDecision, self string) string {
	switch {
	case d.Node != "":
		return d.Node
	case d.Holder:
		return self
	case d.Address.Kind == lease.ControlPlane && d.Leader != self:
		return d.Leader
	case d.Address.Kind == lease.Egress && d.Leader != "":
		return vip.UnknownHolder
	}
	return ""
}
