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
	upgraded := []string{}
	for len(upgraded) < len(all) {
		// Next: a node not yet upgraded that does not hold, else the holder.
		h := c.mon.Now()
		left := others(all, upgraded...)
		next := left[0]
		if len(h) == 1 && next == h[0] && len(left) > 1 {
			next = left[1]
		}
		c.stop(next)
		c.run(c.bin, next, c.addrs(others(all, next)...), upgradedEnv...)
		upgraded = append(upgraded, next)
		t.Logf("%v: %s upgraded (holders were %v)", time.Since(c.origin).Round(time.Millisecond), next, h)
		c.waitMember(ctx, next, 3)
		time.Sleep(2 * time.Second)
	}
	if len(upgradedEnv) > 0 {
		c.formed(ctx, formWithin, all, nil)
	}
	time.Sleep(3 * time.Second)
	v := c.requireOneHolder(start, time.Now(), plannedOverlap, maxOutage)
	if len(v.moves)-1 > 1 {
		t.Errorf("the VIP moved %d times during the upgrade (%v), want at most once", len(v.moves)-1, v.moves)
	}
	c.settled(ctx)
	t.Logf("holder before %s; the VIP moved %d times: %v", first, len(v.moves)-1, v.moves)
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
