package main

import (
	"context"
	"encoding/json"
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
	// impl is what holds the VIP: vipd (in a profile) or keepalived.
	impl impl
	tmp  string // the lab's temporary directory (keepalived's files)
	vrid int    // keepalived's virtual router id
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
	c := &cluster{Lab: l, bin: bin, vip: l.VIP4(50), env: env, apis: map[string]*lab.APIServer{}, vipd: map[string]*lab.Proc{}, logs: map[string]string{},
		tmp: dir, vrid: 1 + int(l.Prefix4.Addr().As4()[2])%254}
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
		// The product's scheduling priority (the lab's default is 0).
		env := append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + c.Peers(n), "VIPD_LOG_LEVEL=info", "VIPD_NICE=-10"}, c.env...)
		if old := c.vipd[name]; old != nil {
			c.logs[name] += old.Output()
		}
		var p *lab.Proc
		var err error
		if c.impl.keepalived() {
			p, err = c.startKeepalived(n)
		} else {
			p, err = n.StartVipd(c.bin, env...)
		}
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
	name string
	what string
	// handover: the old holder releases by itself (apiserver failure), so
	// the outage splits into its detection and the handover after it.
	handover bool
	// targets per contender (DESIGN.md, issue 16); none for keepalived.
	targets map[string]target
	apply   func(ctx context.Context, c *cluster, holder string) error
}

// target is what one contender must reach in one scenario: at most limit
// (max of the runs), and, when beat is set, a median below that contender's.
type target struct {
	limit time.Duration
	beat  string
	text  string
}

var faults = []fault{
	{name: "api", what: "the holder's apiserver fails (500)", handover: true,
		targets: map[string]target{
			"vipd-default": {limit: 3300 * time.Millisecond, text: "<= detection (3 x 1 s) + 300 ms"},
			"vipd-fast":    {limit: 450 * time.Millisecond, text: "<= 450 ms (VIPD_HEALTH_INTERVAL=100ms)"},
		},
		apply: func(_ context.Context, c *cluster, h string) error { return c.apis[h].SetMode(lab.Failing) }},
	{name: "link", what: "the holder's link goes down (at the switch)",
		targets: map[string]target{
			"vipd-default": {limit: time.Second, text: "<= 1.0 s (the lease's failover budget, docs/lease.md)"},
			"vipd-fast":    {limit: 250 * time.Millisecond, beat: "keepalived-fast", text: "<= 250 ms and below keepalived-fast"},
		},
		apply: func(ctx context.Context, c *cluster, h string) error { return c.node(h).SetLink(ctx, false, false) }},
	{name: "stop", what: "planned stop (SIGTERM)",
		targets: map[string]target{
			"vipd-default": {limit: 300 * time.Millisecond, text: "<= 300 ms"},
			"vipd-fast":    {limit: 100 * time.Millisecond, beat: "keepalived-fast", text: "<= 100 ms and below keepalived-fast"},
		},
		apply: func(_ context.Context, c *cluster, h string) error {
			if err := c.vipd[h].Signal(syscall.SIGTERM); err != nil {
				return err
			}
			if code, err := c.vipd[h].Wait(3 * time.Second); err != nil || code != 0 {
				return fmt.Errorf("%s after SIGTERM: exit %d, %v", c.vipd[h].Name, code, err)
			}
			return nil
		}},
	{name: "kill", what: "the daemon is killed (SIGKILL, restarted 1 s later like systemd's RestartSec=1)",
		targets: map[string]target{
			"vipd-default": {limit: 2 * time.Second, text: "<= 2 s"},
			"vipd-fast":    {limit: 2 * time.Second, text: "<= 2 s"},
		},
		apply: func(_ context.Context, c *cluster, h string) error {
			// The daemon crashes; its VIP stays bound and the apiserver
			// keeps answering.
			c.vipd[h].Kill()
			time.Sleep(time.Second)
			return c.start(h)
		}},
}

// waitConverged waits until every running vipd sees all the lab's nodes
// as alive members (its /status): a run must start from a cluster that
// has healed from the previous one, not while the last run's cut-off node
// still counts the holder as dead (it then claims the VIP as soon as the
// fault hits, meets the holder's answer to its probe, and backs off).
// keepalived has no such view: nothing to wait for.
func (c *cluster) waitConverged(ctx context.Context, timeout time.Duration) error {
	if c.impl.keepalived() {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		ok, last := true, ""
		for _, n := range c.Nodes {
			if p := c.vipd[n.Name]; p == nil || p.Exited() {
				continue
			}
			alive, err := c.aliveMembers(ctx, n)
			if err != nil || alive < len(c.Nodes) {
				ok, last = false, fmt.Sprintf("%s sees %d of %d formed and alive (err %v)", n.Name, alive, len(c.Nodes), err)
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the nodes did not all see each other alive within %v: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// aliveMembers reads how many members n's vipd sees alive, counting them
// only once the lease election has formed around them: every member a
// voter (or witness) and a majority reachable (/status, cluster section).
func (c *cluster) aliveMembers(ctx context.Context, n *lab.Host) (int, error) {
	out, err := n.Output(ctx, "curl", "-sf", "--max-time", "1", "http://127.0.0.1:9469/status")
	if err != nil {
		return 0, err
	}
	return formedAlive(out)
}

// formedAlive reads a vipd /status document: how many nodes it sees alive
// (itself included), counted only while the lease election has a majority
// and at most as many as are voters or witnesses.
func formedAlive(status []byte) (int, error) {
	var st struct {
		Node       string `json:"node"`
		Components struct {
			Cluster struct {
				Quorum    bool     `json:"quorum_ok"`
				Voters    []string `json:"voters"`
				Witnesses []string `json:"witnesses"`
				Members   []struct {
					Name  string `json:"name"`
					Alive bool   `json:"alive"`
				} `json:"members"`
			} `json:"cluster"`
		} `json:"components"`
	}
	if err := json.Unmarshal(status, &st); err != nil {
		return 0, err
	}
	cl := st.Components.Cluster
	if !cl.Quorum {
		return 0, nil
	}
	alive := 1 // this node; the members listed are the others
	for _, m := range cl.Members {
		if m.Alive && m.Name != st.Node {
			alive++
		}
	}
	return min(alive, len(cl.Voters)+len(cl.Witnesses)), nil
}
