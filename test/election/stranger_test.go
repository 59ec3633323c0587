package election

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// A stranger: a node with the cluster's VIP and peers but another gossip
// key (a hostile or misconfigured machine, listed in the others'
// VIPD_PEERS as the same env file lists every node). It can join nobody,
// so it is alone; the real cluster must form and hold beside it, and the
// stranger must never hold the VIP, not even when the real cluster holds
// nothing (both of its nodes unhealthy): its own "first node" bootstrap
// would be a second holder the moment the cluster recovers.
func TestStrangerWithAnotherKeyNeverHolds(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	ctx := ctxT(t, 90*time.Second)
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("fedcba9876543210fedcba9876543210"), 0o600); err != nil {
		t.Fatal(err)
	}
	all := []string{"n1", "n2", "n3"}
	for _, name := range all {
		key := good
		if name == "n3" {
			key = bad
		}
		c.run(c.bin, name, c.addrs(others(all, name)...), "VIPD_GOSSIP_KEY_FILE="+key)
	}
	// The real cluster forms beside the stranger as fast as without it.
	first, cancelFirst := context.WithTimeout(ctx, formWithin+5*time.Second)
	h := c.holder(first)
	cancelFirst()
	if h == "n3" {
		t.Fatal("the stranger holds the VIP")
	}
	if !c.formed(ctx, formWithin, []string{"n1", "n2"}, nil) {
		t.FailNow()
	}
	// The real cluster lets go (both apiservers fail); the stranger must
	// still not take the VIP.
	for _, name := range []string{"n1", "n2"} {
		if err := c.apis[name].SetMode(lab.Failing); err != nil {
			t.Fatal(err)
		}
	}
	ctxRelease, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := waitFor(ctxRelease, "the cluster to release the VIP", func() bool { return len(c.mon.Now()) == 0 }); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	time.Sleep(hold)
	if d := c.mon.Longest(released, time.Now(), func(n int) bool { return n > 0 }); d > 0 {
		t.Fatalf("with the cluster unhealthy, the VIP was bound for %v: %v", d.Round(time.Millisecond), c.mon.Samples())
	}
	// Healthy again: the cluster holds, the stranger still does not.
	for _, name := range []string{"n1", "n2"} {
		if err := c.apis[name].SetMode(lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	back := time.Now()
	if h := c.holder(ctx); h == "n3" {
		t.Fatal("the stranger holds the VIP")
	}
	// One holder since (the outage here is the cluster's own, not judged).
	c.requireOneHolder(back, time.Now(), 0, time.Hour)
}
