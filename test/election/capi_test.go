package election

import (
	"fmt"
	"testing"
	"time"
)

// replacement is one way of replacing a 3-node control plane.
type replacement struct {
	name      string
	blueGreen bool          // all three new nodes join first
	graceful  bool          // old nodes are stopped (SIGTERM) before their machine goes
	interval  time.Duration // between a join and the next deletion, and between deletions
}

// The promise is for deletions 30 s apart ("Done when": rolling and
// blue/green replacement with hard deletions 30 s apart and with graceful
// stops). Hard deletions are tested at exactly that spacing: a shorter one
// would test a promise nobody made (a dead member is removed only after it
// has been silent a while). Graceful stops leave the configuration at once,
// so they need no spacing beyond the new node's join: 5 s keeps CI lean.
var replacements = []replacement{
	{name: "rolling-hard-30s", interval: 30 * time.Second},
	{name: "bluegreen-hard-30s", blueGreen: true, interval: 30 * time.Second},
	{name: "rolling-graceful-5s", graceful: true, interval: 5 * time.Second},
	{name: "bluegreen-graceful-5s", blueGreen: true, graceful: true, interval: 5 * time.Second},
}

// Found 1 of issue 26: a Cluster API style replacement of all three
// control-plane machines, each old machine deleted without a clean stop
// (vipd killed, link gone) or stopped gracefully. Exactly one holder
// throughout, never a client outage over 3 s, and the VIP ends on a new
// node.
func TestReplacement(t *testing.T) {
	t.Parallel()
	for _, r := range replacements {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			testReplacement(t, r)
		})
	}
}

func testReplacement(t *testing.T, r replacement) {
	c := newCluster(t, 6)
	ctx := ctxT(t, 4*r.interval+90*time.Second)
	old, green := []string{"n1", "n2", "n3"}, []string{"n4", "n5", "n6"}
	for _, name := range old {
		c.run(c.bin, name, c.addrs(others(old, name)...))
	}
	first := c.holder(ctx)
	if !c.formed(ctx, formWithin, old, nil) {
		t.FailNow()
	}
	start := time.Now()
	t.Logf("holder %s at %v; replacing %v by %v", first, start.Sub(c.origin).Round(time.Millisecond), old, green)
	alive := append([]string(nil), old...)
	join := func(name string) {
		// The new machine's env names every machine alive when it was made.
		c.run(c.bin, name, c.addrs(alive...))
		alive = append(alive, name)
		t.Logf("%v: %s joins", time.Since(c.origin).Round(time.Millisecond), name)
	}
	remove := func(name string) {
		// Membership follows the machines: by now every machine alive is
		// a voter (joined and promoted) and every one deleted is gone
		// from the configuration (left, or removed once dead long enough).
		c.formed(ctx, 2*time.Second, alive, nil)
		if r.graceful {
			c.stop(name)
		}
		c.powerOff(ctx, name)
		alive = others(alive, name)
		t.Logf("%v: %s deleted", time.Since(c.origin).Round(time.Millisecond), name)
	}
	wait := func() {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(r.interval):
		}
	}
	if r.blueGreen {
		for _, name := range green {
			join(name)
		}
		for _, name := range old {
			wait()
			remove(name)
		}
	} else {
		for i := range old {
			join(green[i])
			wait()
			remove(old[i])
		}
	}
	// The last deletion has to be survived too: watch for a while.
	time.Sleep(hold)
	if r.graceful {
		c.formed(ctx, 2*time.Second, green, nil)
	}
	overlap := time.Duration(0)
	if r.graceful {
		overlap = plannedOverlap
	}
	v := c.requireOneHolder(start, time.Now(), overlap, maxOutage)
	if h := c.settled(ctx); !contains(green, h) {
		t.Errorf("after the replacement the VIP is bound on %s, want one of %v", h, green)
	}
	t.Logf("VIP moved %d times: %s", len(v.moves)-1, fmt.Sprint(v.moves))
}
