package election

import (
	"context"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// fault is a partition of a 3-node cluster, given its holder h and the two
// others x and y. Every fault keeps every node reachable from the client:
// only traffic between nodes is lost.
type fault struct {
	name  string
	apply func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error
	// keep: the holder still reaches a majority both ways, so the VIP
	// has no reason to move or pause.
	keep bool
}

var partitions = []fault{
	// A-B cut, A-C and B-C fine, the holder not involved.
	{"cut-between-others", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error { return l.Cut(ctx, x, y) }, true},
	// A-B cut with A the holder: B hears of A only through C.
	{"cut-holder-from-one", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error { return l.Cut(ctx, h, x) }, false},
	// The holder cut from both others (it still answers clients).
	{"cut-holder-from-all", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error {
		if err := l.Cut(ctx, h, x); err != nil {
			return err
		}
		return l.Cut(ctx, h, y)
	}, false},
	// One-way: what the holder sends to x is lost; x's packets reach it.
	{"one-way-from-holder", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error { return lab.DropOneWay(ctx, h, x) }, false},
	// One-way: what x sends to the holder is lost; the holder's reach x.
	{"one-way-to-holder", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error { return lab.DropOneWay(ctx, x, h) }, false},
	// The holder hears nobody, everybody hears it.
	{"holder-deaf", func(ctx context.Context, l *lab.Lab, h, x, y *lab.Host) error {
		if err := lab.DropOneWay(ctx, x, h); err != nil {
			return err
		}
		return lab.DropOneWay(ctx, y, h)
	}, false},
}

// "Done when" of issue 26: non-transitive partitions with faults on the
// holder. Whatever the fault, never two holders (bound, or answering one ARP
// question from the client) and the client's outage is bounded; healed,
// one holder.
func TestNonTransitivePartitions(t *testing.T) {
	t.Parallel()
	for _, f := range partitions {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, 3)
			ctx := ctxT(t, 90*time.Second)
			all := []string{"n1", "n2", "n3"}
			for _, name := range all {
				c.run(c.bin, name, c.addrs(others(all, name)...))
			}
			h := c.holder(ctx)
			if !c.formed(ctx, formWithin, all, nil) {
				t.FailNow()
			}
			o := others(all, h)
			at := time.Now()
			if err := f.apply(ctx, c.Lab, c.node(h), c.node(o[0]), c.node(o[1])); err != nil {
				t.Fatal(err)
			}
			time.Sleep(hold)
			v := c.requireOneHolder(at, time.Now(), 0, maxOutage)
			t.Logf("holder %s, x=%s y=%s: %s", h, o[0], o[1], v)
			if f.keep && (len(v.moves) != 1 || v.noneBound > 0) {
				t.Errorf("the holder %s kept a majority both ways, yet the VIP moved or paused: %s", h, v)
			}
			healed := time.Now()
			if err := c.Heal(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Second)
			c.requireOneHolder(healed, time.Now(), 0, maxOutage)
			c.settled(ctx)
		})
	}
}
