package cloud

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/lab"
)

// VIPD_CLOUD_BIND_INTERFACE=lo binds the reserved IP locally while this
// node holds it and removes it on release; the assignment itself stays.
func TestLocalBinding(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 100 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 60*time.Second)
	c.start(0, "VIPD_CLOUD_BIND_INTERFACE=lo", "VIPD_FAIL_THRESHOLD=2")
	if _, err := c.waitHolder(ctx, droplet(0)); err != nil {
		t.Fatal(err)
	}
	onLo := func() bool {
		out, err := c.Nodes[0].Output(ctx, "ip", "-4", "addr", "show", "dev", "lo")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(out), reservedIP+"/32")
	}
	waitFor(t, ctx, "the reserved IP bound on lo", onLo)
	if err := c.apis[0].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the reserved IP removed from lo after release", func() bool { return !onLo() })
	if holder, _ := c.fake.Holder(reservedIP); holder != droplet(0) {
		t.Fatalf("release moved the IP to %d: it must never unassign", holder)
	}
}

func TestLocalBindingBadInterface(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{})
	p := c.start(0, "VIPD_CLOUD_BIND_INTERFACE=nope0")
	code, err := p.Wait(15 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if out := p.Output(); code != 2 || !strings.Contains(out, `invalid VIPD_CLOUD_BIND_INTERFACE="nope0"`) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
