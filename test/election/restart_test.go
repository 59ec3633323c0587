package election

import (
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
