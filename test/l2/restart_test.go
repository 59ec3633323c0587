package l2

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A node stopped with SIGTERM and started again rejoins and can hold again.
func TestClusterStopAndRejoin(t *testing.T) {
	c := newClusterLab(t, 3)
	ctx := ctxT(t, 60*time.Second)
	c.start()
	for i := 0; i < 3; i++ {
		h := c.holder(ctx)
		_ = c.vipd[h].Signal(syscall.SIGTERM)
		if code, err := c.vipd[h].Wait(3 * time.Second); err != nil || code != 0 {
			t.Fatalf("exit %d %v", code, err)
		}
		c.holder(ctx)
		c.start(h)
		if err := c.vipd[h].WaitOutput(ctx, "vipd started"); err != nil {
			t.Fatal(err)
		}
		if err := c.vipd[h].WaitOutput(ctx, "member joined"); err != nil {
			t.Fatal(err)
		}
	}
}

// A graceful restart beside a dead node: with one of three machines gone
// (not yet removed), the holder stops with SIGTERM and starts again. Its
// leave must not shrink the configuration to the survivor and the dead
// node (no majority, no holder, forever, the restarted node a learner no
// leader promotes): the leader declines the leave, the node stops as a
// voter with its state, and restarted it and the survivor (a majority of
// the three) hold the VIP again (Consul's leave_on_terminate=false; the
// simulator's TestLeaveBesideDeadNode).
func TestClusterRestartBesideDeadNode(t *testing.T) {
	c := newClusterLab(t, 3)
	ctx := ctxT(t, 60*time.Second)
	c.start()
	h := c.holder(ctx)
	var dead, survivor string
	for _, n := range c.Nodes {
		switch {
		case n.Name == h:
		case dead == "":
			dead = n.Name
		default:
			survivor = n.Name
		}
	}
	if err := c.node(dead).SetLink(ctx, false, false); err != nil {
		t.Fatal(err)
	}
	if err := c.vipd[survivor].WaitOutput(ctx, "member declared dead"); err != nil {
		t.Fatalf("%s never saw %s die: %v", survivor, dead, err)
	}
	_ = c.vipd[h].Signal(syscall.SIGTERM)
	if code, err := c.vipd[h].Wait(3 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit %d %v", code, err)
	}
	if err := c.vipd[survivor].WaitOutput(ctx, "leave declined"); err != nil {
		t.Fatalf("the leader did not decline %s's leave beside dead %s: %v", h, dead, err)
	}
	c.start(h)
	back := time.Now()
	got := c.holder(ctx)
	if got == dead {
		t.Fatalf("the cut-off node %s holds the VIP", dead)
	}
	t.Logf("VIP held by %s %v after %s restarted", got, time.Since(back).Round(time.Millisecond), h)
	if strings.Contains(c.vipd[h].Output(), "joining again as a new member") {
		t.Fatalf("%s rejoined as a new member instead of resuming as a voter:\n%s", h, c.vipd[h].Output())
	}
}
