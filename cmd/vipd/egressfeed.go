package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/internal/child"
	"github.com/vipd/vipd/internal/wire"
	"github.com/vipd/vipd/pools"
)

// egressFeed supervises the egressfeed child (VIPD_EGRESS_POLICIES=on) and
// hands its rules to the egress controller. The rules of the last line
// stay programmed while the child restarts.
type egressFeed struct {
	bin     string
	cfg     *config.Config
	log     *slog.Logger
	set     func([]egress.Rule)
	elected map[netip.Addr]bool
	// addrs receives the runtime egress addresses of every line (nil:
	// rules for elected addresses only).
	addrs func([]pools.Address)
	// runtime holds those addresses (cmd/vipd/egressaddrs.go).
	runtime *egressAddrs
}

func newEgressFeed(c *config.Config, log *slog.Logger, set func([]egress.Rule)) (*egressFeed, error) {
	bin, err := controllersBinary()
	if err != nil {
		return nil, usageError{fmt.Errorf("VIPD_EGRESS_POLICIES=on: %w", err)}
	}
	el := map[netip.Addr]bool{}
	for _, p := range c.Addresses {
		el[p.Addr()] = true
	}
	return &egressFeed{bin: bin, cfg: c, log: log.With("component", "egressfeed"), set: set, elected: el}, nil
}

// Run keeps the child running until ctx is done (internal/child: a bad
// line is counted, logged and skipped; the last rules stay programmed
// while the child restarts).
func (f *egressFeed) Run(ctx context.Context) {
	sup := child.New(child.Config{Name: "egress policy feed", Path: f.bin, Args: []string{"egressfeed"},
		Env: append(os.Environ(), f.cfg.Environ()...), Line: f.line,
		Stderr: os.Stderr, // the child writes vipd's own log records
	}, f.log)
	_ = sup.Run(ctx) // no Final: it only ends with ctx
}

// line applies one line of the feed; an error leaves the rules as they are.
func (f *egressFeed) line(b []byte) error {
	rules, addrs, skipped, err := f.parse(b)
	if err != nil {
		return err
	}
	for _, s := range skipped {
		f.log.Warn("egress policy rule skipped", "reason", s)
	}
	if f.addrs != nil {
		f.addrs(addrs)
	}
	f.set(rules)
	return nil
}

// maxNodeName bounds a node name of the feed (a DNS subdomain).
const maxNodeName = 253

// parse converts one feed line into rules for the egress IPs this node
// elects or holds at run time (the line's addresses), and the runtime
// addresses for the pools driver; anything malformed is reported and
// left out.
func (f *egressFeed) parse(line []byte) ([]egress.Rule, []pools.Address, []string, error) {
	var doc wire.EgressDoc
	if err := json.Unmarshal(line, &doc); err != nil {
		return nil, nil, nil, err
	}
	var skipped []string
	var addrs []pools.Address
	runtime := map[netip.Addr]bool{}
	for _, fa := range doc.Addresses {
		ip, err := netip.ParseAddr(fa.EgressIP)
		switch {
		case err != nil || ip.Zone() != "" || ip.Is4In6() || !ip.IsGlobalUnicast():
			skipped = append(skipped, fmt.Sprintf("%s: egress IP %q is not a unicast address", fa.Policy, fa.EgressIP))
			continue
		case f.elected[ip]:
			continue // elected by the node's own election already
		case runtime[ip]:
			skipped = append(skipped, fmt.Sprintf("%s: egress IP %s listed twice", fa.Policy, ip))
			continue
		}
		var nodes []string
		for _, n := range fa.Nodes {
			if n != "" && len(n) <= maxNodeName {
				nodes = append(nodes, n)
			}
		}
		runtime[ip] = true
		addrs = append(addrs, pools.Address{Addr: ip, Pool: egressPool, Mode: pools.ModeL2, Nodes: nodes, Service: fa.Policy})
	}
	var rules []egress.Rule
	for _, fr := range doc.Rules {
		ip, err := netip.ParseAddr(fr.EgressIP)
		if err != nil || !f.elected[ip] && !runtime[ip] {
			skipped = append(skipped, fmt.Sprintf("%s: egress IP %q is neither elected by this node nor one of the feed's addresses", fr.Policy, fr.EgressIP))
			continue
		}
		r := egress.Rule{IP: ip}
		ok := true
		for _, side := range []struct {
			in  []string
			out *[]netip.Prefix
		}{{fr.From, &r.From}, {fr.To, &r.To}} {
			for _, s := range side.in {
				p, err := netip.ParsePrefix(s)
				if err != nil || p.Addr().Is4() != ip.Is4() {
					ok = false
					break
				}
				*side.out = append(*side.out, p.Masked())
			}
		}
		if !ok || len(r.From) == 0 || len(r.To) == 0 {
			skipped = append(skipped, fmt.Sprintf("%s: malformed rule", fr.Policy))
			continue
		}
		rules = append(rules, r)
	}
	return rules, addrs, skipped, nil
}
