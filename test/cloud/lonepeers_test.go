package cloud

import (
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
)

// A node with peers that reaches none of them holds alone after the
// bootstrap grace, but in cloud mode it has no data-plane probe to see
// another holder: it must not take a reserved IP that another instance
// holds (an isolated node would otherwise pull the VIP away from a healthy
// cluster it cannot see). Once the IP is free, it takes it.
func TestLoneNodeWithPeersLeavesIPHeldElsewhere(t *testing.T) {
	c := newCloudLab(t, 2, fakedo.Options{ActionDuration: 100 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 60*time.Second)
	const other = 4242 // a droplet outside the lab: the rest of the cluster
	c.fake.AddReservedIP(reservedIP, other)

	p := c.start(0) // n2, its only peer, never starts
	waitOutput(t, ctx, p, "not taking it")
	// Well past the bootstrap grace and a few retries: still no assign.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if n := posts(c.fake); n != 0 {
			t.Fatalf("the lone node sent %d assign requests for a reserved IP held by droplet %d", n, other)
		}
		if h, _ := c.fake.Holder(reservedIP); h != other {
			t.Fatalf("the reserved IP moved to droplet %d", h)
		}
		if c.holds(ctx, 0) {
			t.Fatal("the lone node reports holding a VIP it did not take")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The other instance lets it go: the lone node may now take it.
	c.fake.AddReservedIP(reservedIP, 0)
	for {
		if h, _ := c.fake.Holder(reservedIP); h == droplet(0) {
			break
		}
		select {
		case <-ctx.Done():
			h, _ := c.fake.Holder(reservedIP)
			t.Fatalf("the free reserved IP was not taken by the lone node (on droplet %d)", h)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := posts(c.fake); n != 1 {
		t.Fatalf("%d assign requests, want 1", n)
	}
}
