package bgp_test

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestGracefulRestart: with VIPD_BGP_GRACEFUL_RESTART=true (off by
// default) FRR keeps the node's path through a vipd crash and restart
// shorter than the restart time, and drops it once the restart time ends
// when vipd does not come back.
func TestGracefulRestart(t *testing.T) {
	testenvShort(t)
	const restart = 6 * time.Second
	e := newEnv(t, setup{nodes: 1, vipdEnv: []string{"VIPD_BGP_GRACEFUL_RESTART=true", "VIPD_BGP_RESTART_TIME=6s"}})
	n1 := e.nodes[0]
	n1.env = append(n1.env, "VIPD_ADDRESS="+vip4.String())
	e.startVipd(n1)
	e.waitKernel(vip4, 30*time.Second, n1)
	present := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hops, err := e.r.KernelNextHops(ctx, vip4)
		return err == nil && slices.Contains(hops, n1.h.IPv4)
	}

	t.Run("kept-through-a-quick-restart", func(t *testing.T) {
		e.t = t
		n1.vipd.Kill()
		time.Sleep(time.Second)
		e.startVipd(n1)
		// Until the new session is up and the path refreshed, the route
		// must never leave the router's FIB.
		deadline := time.Now().Add(restart + 2*time.Second)
		for time.Now().Before(deadline) {
			if !present() {
				t.Fatalf("the router dropped the restarting node's path (graceful restart on)")
			}
			time.Sleep(100 * time.Millisecond)
		}
		e.waitBGP(vip4, 5*time.Second, n1)
	})

	t.Run("dropped-when-vipd-does-not-return", func(t *testing.T) {
		e.t = t
		start := time.Now()
		n1.vipd.Kill()
		time.Sleep(restart / 2)
		if !present() {
			t.Fatalf("path gone %v after the crash, before the restart time (%v)", time.Since(start).Round(time.Millisecond), restart)
		}
		e.waitKernel(vip4, restart+5*time.Second)
		t.Logf("stale path dropped %v after the crash (restart time %v)", time.Since(start).Round(time.Millisecond), restart)
		if d := time.Since(start); d < restart-time.Second {
			t.Errorf("stale path dropped after %v, before the restart time %v", d, restart)
		}
	})
}
