package election

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// restartAfter is systemd's RestartSec in packaging/vipd.service: a vipd
// that crashed is running again this much later.
const restartAfter = time.Second

// staleWithin bounds how long a restarted vipd may leave the copy of the VIP
// its crashed predecessor left bound (it holds no lease for it).
const staleWithin = time.Second

// The holder's vipd crashes (SIGKILL: the VIP stays bound in the kernel,
// nobody releases it) and systemd starts it again a second later, with its
// state directory as it was or wiped (a rebuilt machine that kept its
// name). A crashed process cannot release anything, so until it is back
// two nodes may answer for the VIP; from staleWithin after the restart
// there is one holder again, the client's outage is bounded, and the node
// is a voter again.
func TestHolderCrashRestart(t *testing.T) {
	t.Parallel()
	for _, wipe := range []bool{false, true} {
		name := "keep-state"
		if wipe {
			name = "wiped-state"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, 3)
			ctx := ctxT(t, 90*time.Second)
			all := []string{"n1", "n2", "n3"}
			for _, n := range all {
				c.run(c.bin, n, c.addrs(others(all, n)...))
			}
			h := c.holder(ctx)
			if !c.formed(ctx, formWithin, all, nil) {
				t.FailNow()
			}
			crash := time.Now()
			c.procs[h].Kill()
			time.Sleep(restartAfter)
			if wipe {
				dir := c.node(h).StateDir()
				entries, err := os.ReadDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}
			restart := time.Now()
			c.run(c.bin, h, c.addrs(others(all, h)...))
			time.Sleep(hold)
			before := c.observe(crash, restart.Add(staleWithin))
			t.Logf("crash of %s to %v after its restart: %s", h, staleWithin, before)
			c.requireOneHolder(restart.Add(staleWithin), time.Now(), 0, maxOutage)
			if v := c.observe(crash, time.Now()); v.outage > maxOutage {
				t.Errorf("client outage %v after the crash (limit %v)", v.outage.Round(time.Millisecond), maxOutage)
			}
			c.settled(ctx)
			c.formed(ctx, formWithin, all, nil)
		})
	}
}

// A node's state directory goes back in time: its machine is reverted to
// a snapshot taken before a member joined (a hypervisor snapshot, a
// restored backup), and vipd starts from that older state. The leader
// then counts entries as the node's that the node no longer has; raft
// would panic on them, and vipd did, on every start, until an operator
// deleted the state. Now the node drops its state, rejoins under a new
// incarnation and keeps running, and from staleWithin after the restart
// there is one holder again.
func TestRevertedStateRejoins(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4)
	ctx := ctxT(t, 120*time.Second)
	three := []string{"n1", "n2", "n3"}
	all := []string{"n1", "n2", "n3", "n4"}
	for _, n := range three {
		c.run(c.bin, n, c.addrs(others(all, n)...))
	}
	h := c.holder(ctx)
	if !c.formed(ctx, formWithin, three, nil) {
		t.FailNow()
	}
	// the snapshot: a follower's state directory as it is now
	x := others(three, h)[0]
	dir := c.node(x).StateDir()
	snap := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "vipd.lock" {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			snap[e.Name()] = b
		}
	}
	if len(snap) == 0 {
		t.Fatalf("no state in %s", dir)
	}
	// a member joins: the configuration moves past the snapshot
	c.run(c.bin, "n4", c.addrs(others(all, "n4")...))
	if !c.formed(ctx, formWithin, all, nil) {
		t.FailNow()
	}
	// the machine is reverted: vipd dies with it and starts from the old state
	c.procs[x].Kill()
	for name, b := range snap {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(restartAfter)
	restart := time.Now()
	p := c.run(c.bin, x, c.addrs(others(all, x)...))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.WaitOutput(wctx, "state went back in time"); err != nil {
		t.Fatalf("%s never said its state went back in time: %v\n%s", x, err, tail(p.Output(), 3000))
	}
	time.Sleep(hold)
	if p.Exited() {
		t.Fatalf("%s exited after the revert:\n%s", x, tail(p.Output(), 3000))
	}
	c.requireOneHolder(restart.Add(staleWithin), time.Now(), 0, maxOutage)
	c.settled(ctx)
	if !c.formed(ctx, formWithin, all, nil) {
		t.Errorf("%s is not a voter again", x)
	}
	if p.Exited() {
		t.Errorf("%s exited:\n%s", x, tail(p.Output(), 3000))
	}
}
