package election

import (
	"context"
	"testing"
	"time"
)

// witnessEnv makes a node a witness: it votes and never holds. It runs no
// apiserver (newCluster starts none for it) and names a VIP interface that
// does not exist (it needs none); it gets the same env file as the others
// otherwise (VIPD_ADDRESS included).
var witnessEnv = []string{"VIPD_ROLE=witness", "VIPD_INTERFACE=novip0"}

// hold is how long a test watches after a fault: several lease lengths and
// failure-detection times, so a holder that would lose its lease (or a
// second node that would take the VIP) has done so by then.
const hold = 6 * time.Second

// witnessCluster starts two control-plane nodes (n1, n2) and a witness (n3)
// and returns the holder once it is stable.
func witnessCluster(t *testing.T) (*cluster, context.Context, string) {
	c := newCluster(t, 3, "n3")
	ctx := ctxT(t, 90*time.Second)
	all := []string{"n1", "n2", "n3"}
	c.run(c.bin, "n1", c.addrs(others(all, "n1")...))
	c.run(c.bin, "n2", c.addrs(others(all, "n2")...))
	c.run(c.bin, "n3", c.addrs(others(all, "n3")...), witnessEnv...)
	h := c.holder(ctx)
	if h == "n3" {
		t.Fatal("the witness holds the VIP")
	}
	if !c.formed(ctx, formWithin, []string{"n1", "n2"}, []string{"n3"}) {
		t.FailNow()
	}
	return c, ctx, h
}

// Build 4 of issue 26: two control-plane nodes and a witness survive the
// loss of any one of the three (the machine goes: vipd killed, link gone),
// with a bounded outage, and the witness never holds.
func TestWitnessLoseAnyOne(t *testing.T) {
	t.Parallel()
	for _, lose := range []string{"holder", "other", "witness"} {
		t.Run(lose, func(t *testing.T) {
			t.Parallel()
			c, ctx, h := witnessCluster(t)
			other := others([]string{"n1", "n2"}, h)[0]
			victim := map[string]string{"holder": h, "other": other, "witness": "n3"}[lose]
			at := time.Now()
			c.powerOff(ctx, victim)
			time.Sleep(hold)
			c.requireOneHolder(at, time.Now(), 0, maxOutage)
			want := h
			if lose == "holder" {
				want = other
			}
			if now := c.settled(ctx); now != want {
				t.Fatalf("after losing %s (%s) the VIP is held by %s, want %s", lose, victim, now, want)
			}
			if lose != "holder" {
				// Losing a node that does not hold must not move or interrupt the VIP.
				if v := c.observe(at, time.Now()); len(v.moves) != 1 || v.noneBound > 0 {
					t.Errorf("losing %s disturbed the VIP: %s", victim, v)
				}
			}
		})
	}
}

// Build 4 of issue 26: a partition between the two control-plane nodes (all
// IP traffic between them dropped, both still reach the witness and the
// clients) gives exactly one holder; healed, still one.
func TestWitnessPartitionBetweenControlPlanes(t *testing.T) {
	t.Parallel()
	c, ctx, h := witnessCluster(t)
	at := time.Now()
	if err := c.Cut(ctx, c.node("n1"), c.node("n2")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(hold)
	c.requireOneHolder(at, time.Now(), 0, maxOutage)
	healed := time.Now()
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	c.requireOneHolder(healed, time.Now(), 0, maxOutage)
	t.Logf("holder before the partition %s, now %s", h, c.settled(ctx))
}
