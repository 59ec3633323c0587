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
