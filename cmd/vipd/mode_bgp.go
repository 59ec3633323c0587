package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/bfd"
	"github.com/vipd/vipd/bgp"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/vip"
)

// bgpConfig turns the settings into the speaker's configuration. Errors
// are bad settings (exit code 2).
func bgpConfig(c *config.Config) (bgp.Config, error) {
	peers, setting := []bgp.Peer(nil), bgp.PeersEnv
	var vipAttrs map[netip.Prefix]bgp.Attributes
	if c.BGPPeersFile != "" {
		pf, err := bgp.LoadPeersFile(c.BGPPeersFile)
		if err != nil {
			return bgp.Config{}, err
		}
		peers, vipAttrs, setting = pf.Peers, pf.VIPAttributes, bgp.PeersFileEnv
		for v := range vipAttrs {
			if !slices.Contains(c.Addresses, v) {
				return bgp.Config{}, fmt.Errorf("%s: %s: vips: %s is not in VIPD_ADDRESS; want attributes for this node's VIPs only", bgp.PeersFileEnv, c.BGPPeersFile, v)
			}
		}
	} else {
		var err error
		if peers, err = bgp.ParsePeers(c.BGPPeers); err != nil {
			return bgp.Config{}, err
		}
	}
	if err := bgp.ResolvePasswords(peers, setting); err != nil {
		return bgp.Config{}, err
	}
	attrs, err := bgpAttributes(c)
	if err != nil {
		return bgp.Config{}, err
	}
	rid := c.BGPRouterID
	if !rid.IsValid() {
		if rid, err = firstIPv4(c.Addresses); err != nil {
			return bgp.Config{}, fmt.Errorf("VIPD_BGP_ROUTER_ID: not set and %w; want an IPv4 address such as this node's", err)
		}
	}
	cfg := bgp.Config{LocalAS: c.BGPLocalAS, RouterID: rid, Peers: peers, Attributes: attrs, VIPAttributes: vipAttrs,
		GracefulRestart: c.BGPGracefulRestart, RestartTime: c.BGPRestartTime}
	if err := cfg.Validate(); err != nil {
		return bgp.Config{}, err
	}
	if c.BFDEnabled {
		if err := bfdSessionConfig(c).Validate(); err != nil {
			return bgp.Config{}, err
		}
	}
	return cfg, nil
}

// bgpAttributes reads this node's path attributes from the settings.
func bgpAttributes(c *config.Config) (bgp.Attributes, error) {
	var a bgp.Attributes
	var err error
	if a.Communities, err = bgp.ParseCommunities(c.BGPCommunities); err != nil {
		return a, fmt.Errorf("VIPD_BGP_COMMUNITIES: %w; want %s", err, bgp.CommunitiesForm)
	}
	if a.LargeCommunities, err = bgp.ParseLargeCommunities(c.BGPLargeCommunities); err != nil {
		return a, fmt.Errorf("VIPD_BGP_LARGE_COMMUNITIES: %w; want %s", err, bgp.LargeCommunitiesForm)
	}
	if a.LocalPref, err = bgp.ParseUint32(c.BGPLocalPref); err != nil {
		return a, fmt.Errorf("VIPD_BGP_LOCAL_PREF: %q: %w", c.BGPLocalPref, err)
	}
	if a.MED, err = bgp.ParseUint32(c.BGPMED); err != nil {
		return a, fmt.Errorf("VIPD_BGP_MED: %q: %w", c.BGPMED, err)
	}
	a.Prepend = uint8(c.BGPPrepend)
	return a, nil
}

// checkBGPSettings validates the bgp-mode settings the config package
// leaves to the bgp package, for check-config and run alike. A bad value
// is a usageError (exit code 2).
func checkBGPSettings(c *config.Config) error {
	if c.Mode != config.ModeBGP || len(c.Addresses) == 0 && !c.Pools {
		return nil
	}
	if _, err := bgpConfig(c); err != nil {
		return usageError{err}
	}
	return nil
}

func bfdSessionConfig(c *config.Config) bfd.SessionConfig {
	return bfd.SessionConfig{DetectMult: c.BFDDetectMult, DesiredMinTx: c.BFDTxInterval, RequiredMinRx: c.BFDRxInterval}
}

// firstIPv4 returns the first global unicast IPv4 address of an interface
// that is up, not a VIP: the default BGP router ID.
func firstIPv4(vips []netip.Prefix) (netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, err
	}
	isVIP := map[netip.Addr]bool{}
	for _, v := range vips {
		isVIP[v.Addr()] = true
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if ok && ip.Unmap().Is4() && ip.IsGlobalUnicast() && !isVIP[ip.Unmap()] {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, errors.New("this node has no IPv4 address to use")
}

// bgpAnnouncer is the speaker plus the BFD sessions protecting its peers.
type bgpAnnouncer struct {
	*bgp.Speaker
	bfd *bfd.Server
}

// Close stops BFD first (the routers get AdminDown) and then the BGP
// sessions (they get a Cease).
func (a *bgpAnnouncer) Close() error {
	var errs []error
	if a.bfd != nil {
		errs = append(errs, a.bfd.Close())
	}
	errs = append(errs, a.Speaker.Close())
	return errors.Join(errs...)
}

// newBGPAnnouncer builds the bgp-mode announcer: the embedded GoBGP speaker
// and, with VIPD_BFD_ENABLED, one BFD session per peer (multihop, RFC 5883,
// for multihop peers) whose Down hard-resets that BGP session. addStatus registers a /status section.
func newBGPAnnouncer(ctx context.Context, c *config.Config, log *slog.Logger, reg prometheus.Registerer, addStatus func(string, func() any)) (vip.Announcer, error) {
	cfg, err := bgpConfig(c)
	if err != nil {
		return nil, usageError{err}
	}
	sp, err := bgp.Start(ctx, cfg, bgp.Options{Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	a := &bgpAnnouncer{Speaker: sp}
	// A VIP left on lo by a previous run that crashed is not advertised by
	// this fresh speaker; take it off so the driver starts from a clean
	// state (Present needs both the address and the path).
	for _, v := range c.Addresses {
		if err := sp.Release(ctx, v); err != nil {
			log.Warn("bgp: could not clear a VIP left by a previous run", "vip", v.String(), "err", err)
		}
	}
	for _, w := range bgp.ARPWarnings(c.Addresses) {
		log.Warn("bgp: " + w)
	}
	addStatus("bgp", func() any { return sp.Status(context.Background()) })
	if !c.BFDEnabled {
		return a, nil
	}
	link := bgp.NewBFDLink(sp)
	var srv *bfd.Server
	srv, err = bfd.NewServer(bfd.ServerConfig{
		Registerer: reg,
		Logger:     log,
		OnStateChange: func(peer netip.Addr, old, new bfd.State, diag bfd.Diag) {
			ev := bgp.BFDEvent{Peer: peer, State: bgp.BFDDown, Reason: diag.String()}
			switch {
			case new == bfd.StateUp:
				ev.State = bgp.BFDUp
			case new == bfd.StateDown && diag == bfd.DiagNeighborDown && remoteAdminDown(srv, peer):
				ev.State = bgp.BFDRemoteAdminDown
			}
			if err := link.Handle(context.Background(), ev); err != nil {
				log.Warn("bfd: could not act on the BGP session", "peer", peer.String(), "err", err)
			}
		},
	})
	if err != nil {
		_ = sp.Close()
		return nil, err
	}
	a.bfd = srv
	scfg := bfdSessionConfig(c)
	for _, p := range cfg.Peers {
		if p.Multihop > 0 {
			// RFC 5883: UDP 4784, no TTL 255 requirement; packets must
			// arrive with at least VIPD_BFD_MULTIHOP_MIN_TTL.
			if err := srv.AddMultihop(p.Address, netip.Addr{}, scfg, c.BFDMultihopMinTTL); err != nil {
				_ = a.Close()
				return nil, fmt.Errorf("bfd: multihop session to %s: %w", p.Address, err)
			}
			continue
		}
		if err := srv.Add(p.Address, netip.Addr{}, scfg); err != nil {
			_ = a.Close()
			return nil, fmt.Errorf("bfd: session to %s: %w", p.Address, err)
		}
	}
	addStatus("bfd", func() any { return srv.Statuses() })
	return a, nil
}

func remoteAdminDown(srv *bfd.Server, peer netip.Addr) bool {
	if srv == nil {
		return false
	}
	st, ok := srv.Status(peer)
	return ok && st.Session.RemoteState == bfd.StateAdminDown
}
