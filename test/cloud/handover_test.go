package cloud

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
)

// TestPlannedHandoverOneAssign: `vipd handover` in cloud mode moves the
// reserved IP with exactly one assign, sent by the successor; the old
// holder makes no API call and nothing is unassigned.
func TestPlannedHandoverOneAssign(t *testing.T) {
	c := newCloudLab(t, 3, fakedo.Options{ActionDuration: 100 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 90*time.Second)
	c.startAll(ctx)
	old := c.stableHolder(ctx)
	before := len(c.fake.Requests())
	start := time.Now()
	n := c.Nodes[old]
	out, err := n.Output(ctx, c.bin, "handover", "--state-dir", filepath.Join(os.TempDir(), "vipd-lab-"+n.NS))
	if err != nil {
		t.Fatalf("vipd handover: %v", err)
	}
	next, at := c.waitOther(ctx, old)
	t.Logf("vipd handover n%d -> n%d: %q; reserved IP moved %v after the command", old+1, next+1, strings.TrimSpace(string(out)), at.Sub(start).Round(time.Millisecond))
	if !strings.Contains(string(out), "handed over to "+c.Nodes[next].Name) {
		t.Errorf("vipd handover said %q, the IP went to %s", out, c.Nodes[next].Name)
	}
	if got := c.stableHolder(ctx); got != next {
		t.Fatalf("holder n%d after the handover, the IP went to n%d", got+1, next+1)
	}
	var assigns []string
	for _, r := range c.fake.Requests()[before:] {
		if r.Remote == n.IPv4.String() {
			t.Errorf("the old holder called the API: %s %s %s", r.Method, r.Path, r.Body)
		}
		if r.Method == http.MethodPost && r.Path == actionsPath {
			if strings.Contains(r.Body, "unassign") {
				t.Errorf("unassign sent: %+v", r)
			}
			assigns = append(assigns, fmt.Sprintf("%s from %s", r.Body, r.Remote))
		}
	}
	if len(assigns) != 1 || !strings.Contains(assigns[0], fmt.Sprintf(`"droplet_id":%d`, droplet(next))) {
		t.Fatalf("assigns since the handover: %v, want one for droplet %d", assigns, droplet(next))
	}

	// Back and forth again at once: the third move comes back to a node
	// that assigned the IP about a second before, inside its 5 s cool-off
	// between assigns. A planned handover is not held back by it: before
	// 2026-12-02 the successor refused to assign, the old holder let go
	// at the end of the make-before-break overlap, and the IP stayed on
	// an instance that no longer answered for it for up to 5 s.
	firstAssign := at
	for i, to := range []int{old, next} {
		from := next
		if to == next {
			from = old
		}
		// The handover is asked of the holder: wait until its /status
		// says so (the IP moved to it a moment ago).
		for deadline := time.Now().Add(10 * time.Second); !c.holds(ctx, from); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("move %d: n%d does not report holding the VIP", i+2, from+1)
			}
		}
		f := c.Nodes[from]
		start := time.Now()
		out, err := f.Output(ctx, c.bin, "handover", "--to", c.Nodes[to].Name, "--state-dir", filepath.Join(os.TempDir(), "vipd-lab-"+f.NS))
		if err != nil {
			t.Fatalf("move %d: vipd handover --to %s: %v: %s", i+2, c.Nodes[to].Name, err, out)
		}
		got, at := c.waitOther(ctx, from)
		took := at.Sub(start)
		t.Logf("move %d: vipd handover n%d -> n%d: %q; reserved IP moved %v after the command", i+2, from+1, to+1, strings.TrimSpace(string(out)), took.Round(time.Millisecond))
		if got != to {
			t.Fatalf("move %d: the IP went to n%d, want n%d", i+2, got+1, to+1)
		}
		if took > 2*time.Second {
			t.Errorf("move %d took %v", i+2, took.Round(time.Millisecond))
		}
		if to == next && start.Sub(firstAssign) >= 5*time.Second {
			t.Fatalf("the third move started %v after n%d's assign: too late to meet the cool-off", start.Sub(firstAssign).Round(time.Millisecond), next+1)
		}
	}
	if got := c.stableHolder(ctx); got != next {
		t.Fatalf("holder n%d after the moves back and forth, want n%d", got+1, next+1)
	}
}
