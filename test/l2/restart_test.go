package l2

import (
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
// (not yet forgotten), the holder restarts. The survivor, left counting
// itself and the dead node, has no quorum while the restarted node is
// away; it must count it again when it is back, so the two (a majority of
// the three) hold the VIP again. Before, the survivor could never admit it
// (no quorum) and the restarted node had no quorum without it: the VIP was
// gone for good (found by the simulator, seed 141).
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
	if err := c.vipd[survivor].WaitOutput(ctx, "member left gracefully"); err != nil {
		t.Fatal(err)
	}
	c.start(h)
	back := time.Now()
	got := c.holder(ctx)
	if got == dead {
		t.Fatalf("the cut-off node %s holds the VIP", dead)
	}
	t.Logf("VIP held by %s %v after %s restarted", got, time.Since(back).Round(time.Millisecond), h)
	if err := c.vipd[survivor].WaitOutput(ctx, "member that left gracefully is back"); err != nil {
		t.Fatal(err)
	}
}
