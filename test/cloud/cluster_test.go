package cloud

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/lab"
)

// stableHolder waits until exactly one node says (in /status) that it
// holds the VIP, the reserved IP sits on that node's droplet, and both stay
// so for 2 s; it returns the node index.
func (c *cloudLab) stableHolder(ctx context.Context) int {
	c.t.Helper()
	last, since := -1, time.Now()
	for {
		idx := -1
		var holders []int
		for i := range c.Nodes {
			if c.holds(ctx, i) {
				holders = append(holders, i)
			}
		}
		h, _ := c.fake.Holder(reservedIP)
		if len(holders) == 1 && h == droplet(holders[0]) {
			idx = holders[0]
		}
		if idx != last {
			last, since = idx, time.Now()
		}
		if idx >= 0 && time.Since(since) > 2*time.Second {
			return idx
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("no stable holder: nodes holding %v, reserved IP on droplet %d", holders, h)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// holds reports whether node i's /status says it holds the VIP.
func (c *nodes) holds(ctx context.Context, i int) bool {
	c.t.Helper()
	out, err := c.Nodes[i].Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/status")
	if err != nil {
		return false // not up yet
	}
	var st struct {
		VIPs []struct {
			Held bool `json:"held"`
		} `json:"vips"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		c.t.Fatalf("status of n%d: %v: %s", i+1, err, out)
	}
	return len(st.VIPs) == 1 && st.VIPs[0].Held
}

// waitOther waits until the reserved IP is on a lab droplet other than
// node old's and returns that node and when it happened.
func (c *cloudLab) waitOther(ctx context.Context, old int) (int, time.Time) {
	c.t.Helper()
	for {
		h, _ := c.fake.Holder(reservedIP)
		if idx := h - dropletBase - 1; idx >= 0 && idx < len(c.Nodes) && idx != old {
			return idx, time.Now()
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("the reserved IP never left n%d (on droplet %d)", old+1, h)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// postsFrom lists the assign requests sent from node i's address.
func (c *cloudLab) postsFrom(i int) []fakedo.Request {
	var out []fakedo.Request
	for _, r := range c.fake.Requests() {
		if r.Method == http.MethodPost && r.Path == actionsPath && r.Remote == c.Nodes[i].IPv4.String() {
			out = append(out, r)
		}
	}
	return out
}

// startAll starts every node with its apiserver failing, waits until the
// gossip cluster has formed, then lets all apiservers answer: the election
// then starts from a complete membership view.
func (c *cloudLab) startAll(ctx context.Context) []*lab.Proc {
	c.t.Helper()
	for _, a := range c.apis {
		if err := a.SetMode(lab.Failing); err != nil {
			c.t.Fatal(err)
		}
	}
	var ps []*lab.Proc
	for i := range c.Nodes {
		ps = append(ps, c.start(i))
	}
	for _, p := range ps {
		for _, n := range c.Nodes {
			waitOutput(c.t, ctx, p, "member="+n.Name+" ")
		}
	}
	for _, a := range c.apis {
		if err := a.SetMode(lab.OK); err != nil {
			c.t.Fatal(err)
		}
	}
	return ps
}

// The elected node assigns the reserved IP to its droplet (and no other
// node sends an assign); when its apiserver fails, the new holder assigns
// within detection + API time, and the old holder makes no API call.
func TestFailoverToNewHolder(t *testing.T) {
	// DigitalOcean reserved-IP assigns complete in about a second.
	const action = time.Second
	const latency = 50 * time.Millisecond
	c := newCloudLab(t, 3, fakedo.Options{ActionDuration: action, Latency: latency})
	defer c.dumpAPI()
	ctx := ctxT(t, 120*time.Second)
	ps := c.startAll(ctx)
	old := c.stableHolder(ctx)
	settled := posts(c.fake)
	t.Logf("%d assign requests until the first holder n%d settled", settled, old+1)
	if got := len(c.postsFrom(old)); got < 1 {
		t.Fatalf("the holder n%d never sent an assign", old+1)
	}
	// A settled cluster sends no more assigns, and at most the holder's
	// background refresh (one GET per 10 s) reaches the API, even if the
	// election re-decides (each re-acquire asks the metadata service).
	quiet := time.Now()
	flips := func() int {
		n := 0
		for _, p := range ps {
			n += strings.Count(p.Output(), `msg="VIP held"`) + strings.Count(p.Output(), `msg="VIP released"`)
		}
		return n
	}
	flipsBefore := flips()
	time.Sleep(3 * time.Second)
	t.Logf("holder transitions logged by all nodes in 3 s of a settled cluster: %d", flips()-flipsBefore)
	if n := posts(c.fake); n != settled {
		t.Fatalf("%d more assign requests in a settled cluster", n-settled)
	}
	if n := c.fake.CountSince(quiet, "", "/v2/"); n > 1 {
		t.Fatalf("%d API requests in 3 s of a settled cluster", n)
	}

	before := len(c.fake.Requests())
	fault := time.Now()
	if err := c.apis[old].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	next, at := c.waitOther(ctx, old)
	took := at.Sub(fault)
	// Detection: 3 x 200 ms plus a probe timeout; then gossip, one POST,
	// the action (1 s) and polls, each answer 50 ms late.
	t.Logf("failover n%d -> n%d: %v after the apiserver failed (health 200ms x 3, fake action %v, latency %v)",
		old+1, next+1, took.Round(time.Millisecond), action, latency)
	if took > 8*time.Second {
		t.Fatalf("failover took %v", took)
	}
	var moved []fakedo.Request
	for _, r := range c.postsFrom(next) {
		if !r.Time.Before(fault) {
			moved = append(moved, r)
		}
	}
	if len(moved) != 1 || !strings.Contains(moved[0].Body, fmt.Sprintf(`"droplet_id":%d`, droplet(next))) {
		t.Fatalf("assigns from the new holder since the fault: %+v", moved)
	}
	time.Sleep(time.Second)
	oldIP := c.Nodes[old].IPv4.String()
	for _, r := range c.fake.Requests()[before:] {
		if r.Remote == oldIP {
			t.Fatalf("the old holder called the API after its apiserver failed: %s %s", r.Method, r.Path)
		}
		if r.Method == http.MethodPost && r.Body != "" && strings.Contains(r.Body, "unassign") {
			t.Fatalf("unassign sent: %+v", r)
		}
	}
	// The old holder recovers: no preemption, the IP stays.
	if err := c.apis[old].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if h, _ := c.fake.Holder(reservedIP); h != droplet(next) {
		t.Fatalf("the IP moved back to droplet %d after the old holder recovered", h)
	}
	if n := posts(c.fake); n != settled+1 {
		t.Fatalf("%d assigns after the failover, want 1", n-settled)
	}
}

// The API is down when the holder fails: the new holder keeps trying with
// backoff, says so in its logs and metrics, and assigns by itself once the
// API is back. The old holder keeps its state meanwhile (nothing unassigns).
func TestFailoverWhileAPIDown(t *testing.T) {
	c := newCloudLab(t, 3, fakedo.Options{ActionDuration: 300 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 120*time.Second)
	ps := c.startAll(ctx)
	old := c.stableHolder(ctx)

	c.fake.Down()
	if err := c.apis[old].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	downFor := 8 * time.Second
	time.Sleep(downFor)
	if h, _ := c.fake.Holder(reservedIP); h != droplet(old) {
		t.Fatalf("the IP moved while the API was down: droplet %d", h)
	}
	// Exactly one other node is elected and retrying.
	var trying []int
	for i, p := range ps {
		if i != old && strings.Contains(p.Output(), "outcome=transport_error") {
			trying = append(trying, i)
		}
	}
	if len(trying) != 1 {
		t.Fatalf("nodes retrying the assign: %v, want exactly one", trying)
	}
	fails := c.metric(ctx, trying[0], series("assign", "transport_error"))
	if fails < 2 || fails > 10 {
		t.Fatalf("%v failed assign attempts in %v", fails, downFor)
	}
	up := time.Now()
	if err := c.fake.Up(); err != nil {
		t.Fatal(err)
	}
	next, at := c.waitOther(ctx, old)
	t.Logf("API down %v during failover: n%d failed %v times, then assigned %v after the API came back",
		downFor, next+1, fails, at.Sub(up).Round(time.Millisecond))
	if next != trying[0] {
		t.Fatalf("n%d assigned, but n%d was the one retrying", next+1, trying[0]+1)
	}
	if at.Sub(up) > 15*time.Second {
		t.Fatalf("recovered %v after the API came back", at.Sub(up))
	}
}
