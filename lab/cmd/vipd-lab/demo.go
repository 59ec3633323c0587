package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/vipd/vipd/lab"
)

func demo(ctx context.Context, args []string) (err error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	t := &tb{}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
		say("cleaning up: stopping vipd and deleting the lab's namespaces")
		t.close()
	}()
	start := time.Now()
	say("building a lab: 3 nodes and a client on a bridge, each node with a fake kube-apiserver on :6443")
	c, err := newCluster(ctx, t, 3)
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		say("  %s  %-15s netns %s", n.Name, n.IPv4, n.NS)
	}
	say("  c   %-15s netns %s (the client)", c.Client.IPv4, c.Client.NS)
	say("starting vipd on every node: VIP %s, gossip between the nodes, default health check (1 s x 3)", c.vip)
	if err := c.start(); err != nil {
		return err
	}
	holder, err := c.stableHolder(ctx, 500*time.Millisecond)
	if err != nil {
		return err
	}
	say("elected holder: %s has %s bound (%.1fs after start)", holder, c.vip, time.Since(start).Seconds())
	name, err := c.Client.Probe(ctx, c.vip.String()+":6443", time.Second)
	if err != nil {
		return fmt.Errorf("client probe through the VIP: %w", err)
	}
	say("client: https://%s:6443/ answered by %s", c.vip, name)
	status, err := c.node(holder).Output(ctx, c.bin, "status")
	if err == nil {
		say("vipd status on %s:\n%s", holder, indent(string(status)))
	}

	prober := c.Client.StartProber(c.vip.String()+":6443", 10*time.Millisecond, 500*time.Millisecond)
	time.Sleep(time.Second)
	say("failing %s's apiserver (it now answers 500) while the client probes the VIP every 10 ms", holder)
	faultAt := time.Now()
	if err := c.apis[holder].SetMode(lab.Failing); err != nil {
		return err
	}
	newHolder := ""
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if h := c.mon.Now(); len(h) == 1 && h[0] != holder {
			newHolder = h[0]
			break
		}
	}
	if newHolder == "" {
		return fmt.Errorf("no new holder after the fault; holders now %v", c.mon.Now())
	}
	say("new holder: %s (%.2fs after the fault: 3 failed checks at 1 s, then the handover)", newHolder, time.Since(faultAt).Seconds())
	time.Sleep(time.Second)
	prober.Stop()
	gap, before, after := lab.Outage(prober.Answers(), faultAt.Add(-time.Second), time.Now())
	say("client-visible outage: %v (last answer from %s, next from %s)", gap.Round(time.Millisecond), before, after)
	say("holder timeline:\n%s", indent(c.mon.String()))

	say("planned handover: SIGTERM to vipd on %s (releases and leaves the cluster)", newHolder)
	prober = c.Client.StartProber(c.vip.String()+":6443", 10*time.Millisecond, 500*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	stopAt := time.Now()
	if err := c.vipd[newHolder].Signal(15); err != nil {
		return err
	}
	third := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if h := c.mon.Now(); len(h) == 1 && h[0] != newHolder {
			third = h[0]
			break
		}
	}
	time.Sleep(time.Second)
	prober.Stop()
	gap, _, _ = lab.Outage(prober.Answers(), stopAt.Add(-200*time.Millisecond), time.Now())
	say("new holder: %s; client-visible outage of the planned handover: %v", third, gap.Round(time.Millisecond))
	say("demo done in %.1fs", time.Since(start).Seconds())
	return nil
}

func say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
