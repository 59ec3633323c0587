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
}
