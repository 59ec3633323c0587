package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vipd/vipd/lab"
)

// cluster is a lab running vipd on every node.
type cluster struct {
	*lab.Lab
	bin  string
	vip  netip.Addr
	env  []string
	apis map[string]*lab.APIServer
	vipd map[string]*lab.Proc
	logs map[string]string // output of replaced (restarted) vipd processes
	mon  *lab.Monitor
}

func newCluster(ctx context.Context, t *tb, nodes int, env ...string) (*cluster, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root for network namespaces (run it through make, which uses sudo)")
	}
	dir, err := os.MkdirTemp("", "vipd-lab-bin")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin, err := lab.VipdBinary(ctx, dir)
	if err != nil {
		return nil, err
	}
	l, err := lab.Create(lab.Options{Nodes: nodes, Client: true})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = l.Close() })
	c := &cluster{Lab: l, bin: bin, vip: l.VIP4(50), env: env, apis: map[string]*lab.APIServer{}, vipd: map[string]*lab.Proc{}, logs: map[string]string{}}
	for _, n := range l.Nodes {
		api, err := n.StartAPIServer("0.0.0.0:6443", lab.OK)
		if err != nil {
			return nil, err
		}
		c.apis[n.Name] = api
	}
	if c.mon, err = l.Monitor(c.vip); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *cluster) node(name string) *lab.Host { return c.Node(name) }

// quit asks every running vipd for a goroutine dump (SIGQUIT), for
// diagnosing a stuck lab.
func (c *cluster) quit() {
	for _, p := range c.vipd {
		if !p.Exited() {
			_ = p.Signal(syscall.SIGQUIT)
			_, _ = p.Wait(2 * time.Second)
		}
	}
}

// dumpLogs writes every vipd's output into dir (for -logs).
func (c *cluster) dumpLogs(dir, prefix string) {
	if dir == "" {
		return
	}
	_ = os.MkdirAll(dir, 0o755)
	for name, p := range c.vipd {
		_ = os.WriteFile(filepath.Join(dir, prefix+"-"+name+".log"), []byte(c.logs[name]+p.Output()), 0o644)
	}
}

func (c *cluster) start(names ...string) error {
	if len(names) == 0 {
		for _, n := range c.Nodes {
			names = append(names, n.Name)
		}
	}
	for _, name := range names {
		n := c.node(name)
		env := append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + c.Peers(n), "VIPD_LOG_LEVEL=info"}, c.env...)
		if old := c.vipd[name]; old != nil {
			c.logs[name] += old.Output()
		}
		p, err := n.StartVipd(c.bin, env...)
		if err != nil {
			return err
		}
		c.vipd[name] = p
	}
	return nil
}

// stableHolder waits until exactly one node has held the VIP for settle.
func (c *cluster) stableHolder(ctx context.Context, settle time.Duration) (string, error) {
	return c.mon.WaitStable(ctx, settle)
}

// releasedAt returns when old first stopped holding the VIP after since.
func (c *cluster) releasedAt(old string, since time.Time) time.Time {
	for _, s := range c.mon.Samples() {
		if s.At.After(since) && !contains(s.Holders, old) {
			return s.At
		}
	}
	return time.Time{}
}

// waitMoved waits until, after since, the VIP was at least once not held
// by old alone.
func (c *cluster) waitMoved(ctx context.Context, old string, since time.Time, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range c.mon.Samples() {
			if s.At.After(since) && !(len(s.Holders) == 1 && s.Holders[0] == old) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("the VIP never left %s", old)
}

// restore undoes every fault: apiservers OK, links up, vipd running.
func (c *cluster) restore(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := c.apis[n.Name].SetMode(lab.OK); err != nil {
			return err
		}
		if err := n.SetLink(ctx, true, false); err != nil {
			return err
		}
		if p := c.vipd[n.Name]; p == nil || p.Exited() {
			if err := c.start(n.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// fault is one failure scenario applied to the holder.
type fault struct {
	name   string
	target string // DESIGN.md target, for the table
	limit  time.Duration
	// handover: the old holder releases by itself (apiserver failure), so
	// the outage splits into its detection and the handover after it;
	// handoverLimit, when set, is the target for the handover part.
	handover      bool
	handoverLimit time.Duration
	env           []string
	apply         func(ctx context.Context, c *cluster, holder string) error
}

var faults = []fault{
	{name: "apiserver-fails", target: "<= detection + 300 ms", limit: 3300 * time.Millisecond, handover: true, handoverLimit: 300 * time.Millisecond,
		apply: func(_ context.Context, c *cluster, h string) error { return c.apis[h].SetMode(lab.Failing) }},
	{name: "apiserver-fails-100ms", target: "<= 600 ms", limit: 600 * time.Millisecond, handover: true,
		env:   []string{"VIPD_HEALTH_INTERVAL=100ms", "VIPD_HEALTH_TIMEOUT=100ms"},
		apply: func(_ context.Context, c *cluster, h string) error { return c.apis[h].SetMode(lab.Failing) }},
	{name: "link-down", target: "<= 1.5 s", limit: 1500 * time.Millisecond,
		apply: func(ctx context.Context, c *cluster, h string) error { return c.node(h).SetLink(ctx, false, false) }},
	{name: "vipd-sigkill", target: "<= 2 s (systemd restarts vipd after 1 s)", limit: 2 * time.Second,
		apply: func(_ context.Context, c *cluster, h string) error {
			// vipd crashes; its VIP stays bound and the apiserver keeps
			// answering. systemd (Restart=always, RestartSec=1) restarts it.
			if err := c.vipd[h].Signal(syscall.SIGKILL); err != nil {
				return err
			}
			time.Sleep(time.Second)
			return c.start(h)
		}},
	{name: "vipd-sigterm", target: "<= 300 ms", limit: 300 * time.Millisecond,
		apply: func(_ context.Context, c *cluster, h string) error {
			if err := c.vipd[h].Signal(syscall.SIGTERM); err != nil {
				return err
			}
			if code, err := c.vipd[h].Wait(3 * time.Second); err != nil || code != 0 {
				return fmt.Errorf("vipd on %s after SIGTERM: exit %d, %v", h, code, err)
			}
			return nil
		}},
}
