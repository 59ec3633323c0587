package election

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// previousRelease is main before the consensus election (issue 26): the
// release a rolling upgrade starts from. $VIPD_TEST_PREVIOUS_COMMIT
// overrides it; $VIPD_TEST_PREVIOUS_BINARY skips the build.
const previousRelease = "6e34dcb"

// Build 5 / "Done when" of issue 26: a rolling upgrade of a 3-node cluster
// from the previous release. Each node in turn is stopped (SIGTERM), its
// binary swapped, and started again on the same state directory; the
// holder goes last, as docs/l2.md's upgrade advice says. Mixed versions
// run side by side meanwhile. One holder throughout and the VIP moves at
// most once. Three ways:
//   - keep-settings: the env file stays as it is, so the new binary runs the
//     election its defaults choose;
//   - to-lease: each upgraded node also gets VIPD_ELECTION=lease, the
//     upgrade that ends on the consensus election;
//   - lease-restart: a cluster already on the lease election restarted node
//     by node (the next upgrade), each back on its own state.
func TestRollingUpgradeFromPreviousRelease(t *testing.T) {
	t.Parallel()
	commit := previousRelease
	if v := os.Getenv("VIPD_TEST_PREVIOUS_COMMIT"); v != "" {
		commit = v
	}
	prerequisites(t)
	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	prev, err := lab.VipdAt(bctx, commit)
	cancel()
	if err != nil {
		t.Fatalf("previous release: %v", err)
	}
	for _, tc := range []struct {
		name    string
		from    string   // the binary the cluster starts on ("" is this one)
		fromEnv []string // given to the nodes before their upgrade
		env     []string // given to the upgraded nodes
	}{
		{"keep-settings", prev, nil, nil},
		{"to-lease", prev, nil, electionEnv},
		// The next upgrade: a lease cluster restarted node by node
		// (systemctl restart), each coming back on its own state.
		{"lease-restart", "", electionEnv, electionEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testUpgrade(t, tc.from, tc.fromEnv, tc.env)
		})
	}
	// An upgrade rolled back, then done again: the previous release
	// starts on state directories the lease election wrote, and the
	// second upgrade finds the lease state of the first, which the
	// cluster has moved past.
	t.Run("rollback-and-again", func(t *testing.T) {
		t.Parallel()
		testRollback(t, prev)
	})
}

// testRollback upgrades a cluster of the previous release to this one,
// rolls every node back, and upgrades again, the holder last each time:
// one holder throughout, no outage over maxOutage, the VIP moving at most
// once per pass, and at the end one agreed configuration of all three.
func testRollback(t *testing.T, prev string) {
	c := newCluster(t, 3)
	c.env = testEnv()
	ctx := ctxT(t, 240*time.Second)
	all := []string{"n1", "n2", "n3"}
	for _, name := range all {
		c.run(prev, name, c.addrs(others(all, name)...))
	}
	first := c.holder(ctx)
	start := time.Now()
	c.switchAll(ctx, all, c.bin, nil, "upgraded")
	c.formed(ctx, formWithin, all, nil)
	c.switchAll(ctx, all, prev, nil, "rolled back")
	c.switchAll(ctx, all, c.bin, nil, "upgraded again")
	c.formed(ctx, formWithin, all, nil)
	c.requireMovesAtMost(ctx, first, start, 3)
}

func testUpgrade(t *testing.T, from string, fromEnv, upgradedEnv []string) {
	c := newCluster(t, 3)
	if from == "" {
		from = c.bin
	}
	// The env file as it was before the upgrade.
	c.env = testEnv()
	ctx := ctxT(t, 120*time.Second)
	all := []string{"n1", "n2", "n3"}
	for _, name := range all {
		c.run(from, name, c.addrs(others(all, name)...), fromEnv...)
	}
	if len(fromEnv) > 0 {
		c.formed(ctx, formWithin, all, nil)
	}
	first := c.holder(ctx)
	start := time.Now()
	c.switchAll(ctx, all, c.bin, upgradedEnv, "upgraded")
	if len(upgradedEnv) > 0 {
		c.formed(ctx, formWithin, all, nil)
	}
	c.requireMovesAtMost(ctx, first, start, 1)
}

// requireMovesAtMost lets the cluster settle for 3 s, then asserts one
// holder since start (a planned transfer's overlap allowed), no outage
// over maxOutage, and the VIP moving no more than most times (once per pass of
// switchAll, holder last); first is the holder before start.
func (c *cluster) requireMovesAtMost(ctx context.Context, first string, start time.Time, most int) {
	c.t.Helper()
	time.Sleep(3 * time.Second)
	v := c.requireOneHolder(start, time.Now(), plannedOverlap, maxOutage)
	if len(v.moves)-1 > most {
		c.t.Errorf("the VIP moved %d times (%v), want at most %d (once per pass, the holder last)", len(v.moves)-1, v.moves, most)
	}
	c.settled(ctx)
	c.t.Logf("holder before %s; the VIP moved %d times: %v", first, len(v.moves)-1, v.moves)
}

// switchAll restarts every node in turn on bin with env, as an operator
// upgrades (or rolls back) a cluster: SIGTERM, the binary swapped, started
// again on the same state directory; the nodes that do not hold first, the
// holder last. Mixed versions run side by side meanwhile.
func (c *cluster) switchAll(ctx context.Context, all []string, bin string, env []string, what string) {
	c.t.Helper()
	done := []string{}
	for len(done) < len(all) {
		// Next: a node not yet switched that does not hold, else the holder.
		h := c.mon.Now()
		left := others(all, done...)
		next := left[0]
		if len(h) == 1 && next == h[0] && len(left) > 1 {
			next = left[1]
		}
		c.stop(next)
		c.run(bin, next, c.addrs(others(all, next)...), env...)
		done = append(done, next)
		c.t.Logf("%v: %s %s (holders were %v)", time.Since(c.origin).Round(time.Millisecond), next, what, h)
		c.waitMember(ctx, next, len(all))
		time.Sleep(2 * time.Second)
	}
}

// waitMember waits until the node's memberlist counts n members alive
// (either election: discovery, not the agreed configuration; see formed).
func (c *cluster) waitMember(ctx context.Context, name string, n int) {
	c.t.Helper()
	want := strconv.Itoa(n)
	err := waitFor(ctx, name+" to see "+want+" members alive", func() bool {
		return c.metrics(ctx, name)[`vipd_cluster_members{state="alive"}`] == want
	})
	if err != nil {
		c.t.Fatalf("%v\n%s", err, tail(c.procs[name].Output(), 40))
	}
}
