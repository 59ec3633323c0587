package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/egress"
	"github.com/vipd/vipd/pools"
)

// feedRule and feedDoc are the NDJSON lines `vipd-controllers egressfeed`
// prints (cmd/vipd-controllers/egressfeed.go): one complete rule set each.
type feedRule struct {
	Policy   string   `json:"policy"`
	EgressIP string   `json:"egressIP"`
	From     []string `json:"from"`
	To       []string `json:"to"`
}

// feedAddress is an egress IP the nodes do not elect (not in VIPD_ADDRESS
// or VIPD_EGRESS): held at run time through the pools machine by one of
// Nodes (the nodes matching the policy's spec.nodeSelector).
type feedAddress struct {
	Policy   string   `json:"policy"`
	EgressIP string   `json:"egressIP"`
	Nodes    []string `json:"nodes"`
}

type feedDoc struct {
	Rules     []feedRule    `json:"rules"`
	Addresses []feedAddress `json:"addresses,omitempty"`
}

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

// Run keeps the child running until ctx is done.
func (f *egressFeed) Run(ctx context.Context) {
	backoff := time.Second
	for {
		start := time.Now()
		err := f.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		f.log.Error("the egress policy feed stopped; restarting (the last rules stay programmed)", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if backoff < 30*time.Second {
			backoff *= 2
		}
	}
}

func (f *egressFeed) runOnce(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, f.bin, "egressfeed")
	cmd.Env = append(os.Environ(), f.cfg.Environ()...)
	cmd.Stderr = os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	f.log.Info("starting the egress policy feed", "binary", f.bin)
	if err := cmd.Start(); err != nil {
		return err
	}
	readErr := f.read(out)
	err = cmd.Wait()
	if err == nil {
		err = readErr
	}
	if err == nil {
		err = fmt.Errorf("exited")
	}
	return err
}

// read applies every line of the feed until it ends.
func (f *egressFeed) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		rules, addrs, skipped, err := f.parse(sc.Bytes())
		if err != nil {
			f.log.Error("unreadable egress feed line: ignored, the last rules stay", "err", err, "bytes", len(sc.Bytes()))
			continue
		}
		for _, s := range skipped {
			f.log.Warn("egress policy rule skipped", "reason", s)
		}
		if f.addrs != nil {
			f.addrs(addrs)
		}
		f.set(rules)
	}
	return sc.Err()
}

// maxNodeName bounds a node name of the feed (a DNS subdomain).
const maxNodeName = 253

// parse converts one feed line into rules for the egress IPs this node
// elects or holds at run time (the line's addresses), and the runtime
// addresses for the pools machine; anything malformed is reported and
// left out.
func (f *egressFeed) parse(line []byte) ([]egress.Rule, []pools.Address, []string, error) {
	var doc feedDoc
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
