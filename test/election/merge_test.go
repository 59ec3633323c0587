package election

import (
	"slices"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// loneSettle bounds two holders when two clusters that cannot hear each
// other bind in the same instant: the l2 pre-bind probe is the fence
// between clusters that bootstrapped apart (docs/l2.md, "Bounded
// bootstrap": two lone nodes settle within about 0.3 s).
const loneSettle = 500 * time.Millisecond

// Build 3 of issue 26: two clusters that bootstrapped apart merge without
// two holders. All three nodes get the same VIPD_PEERS, but n1 cannot reach
// n2 or n3 (IP dropped both ways; ARP still flows, so the pre-bind probe
// sees a holder on the other side) when they start: n1 bootstraps alone,
// n2 and n3 together. Until the network heals only one side may hold
// (beyond loneSettle); healed, the two merge into one configuration of
// three with one holder.
func TestSplitBootstrapMerge(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	c.apart = true
	ctx := ctxT(t, 90*time.Second)
	n1, n2, n3 := c.node("n1"), c.node("n2"), c.node("n3")
	for _, pair := range [][2]*lab.Host{{n1, n2}, {n2, n1}, {n1, n3}, {n3, n1}} {
		if err := lab.DropOneWay(ctx, pair[0], pair[1]); err != nil {
			t.Fatal(err)
		}
	}
	all := []string{"n1", "n2", "n3"}
	for _, name := range all {
		c.run(c.bin, name, c.addrs(all...))
	}
	h := c.holder(ctx)
	time.Sleep(hold)
	// Two clusters really formed apart (the lease election shows its
	// configurations; the gossip election has none to show).
	if conf, lease := c.conf(ctx, "n1"); lease {
		other, _ := c.conf(ctx, "n2")
		t.Logf("apart: n1 %s; n2 %s", conf, other)
		if !slices.Equal(conf.Voters, []string{"n1"}) || !slices.Equal(sorted(other.Voters), []string{"n2", "n3"}) {
			t.Fatalf("the nodes did not bootstrap apart (n1 %s, n2 %s): the merge is not tested", conf, other)
		}
	}
	split := c.requireOneHolder(c.origin, time.Now(), loneSettle, maxOutage)
	t.Logf("apart: holder %s; %s", h, split)
	healed := time.Now()
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.formed(ctx, formWithin, all, nil) {
		t.FailNow()
	}
	time.Sleep(3 * time.Second)
	v := c.requireOneHolder(healed, time.Now(), 0, maxOutage)
	t.Logf("merged: %s", v)
	c.settled(ctx)
}
