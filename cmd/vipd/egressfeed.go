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
)

// feedRule and feedDoc are the NDJSON lines `vipd-controllers egressfeed`
// prints (cmd/vipd-controllers/egressfeed.go): one complete rule set each.
type feedRule struct {
	Policy   string   `json:"policy"`
	EgressIP string   `json:"egressIP"`
	From     []string `json:"from"`
	To       []string `json:"to"`
}

type feedDoc struct {
	Rules []feedRule `json:"rules"`
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
		rules, skipped, err := f.parse(sc.Bytes())
		if err != nil {
			f.log.Error("unreadable egress feed line", "err", err)
			continue
		}
		for _, s := range skipped {
			f.log.Warn("egress policy rule skipped", "reason", s)
		}
		f.set(rules)
	}
	return sc.Err()
}

// parse converts one feed line into rules for the egress IPs this node
// elects; the others are reported (the feed already gives such policies
// Ready=False).
func (f *egressFeed) parse(line []byte) ([]egress.Rule, []string, error) {
	var doc feedDoc
	if err := json.Unmarshal(line, &doc); err != nil {
		return nil, nil, err
	}
	var rules []egress.Rule
	var skipped []string
	for _, fr := range doc.Rules {
		ip, err := netip.ParseAddr(fr.EgressIP)
		if err != nil || !f.elected[ip] {
			skipped = append(skipped, fmt.Sprintf("%s: egress IP %q is not elected by this node", fr.Policy, fr.EgressIP))
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
	return rules, skipped, nil
}
