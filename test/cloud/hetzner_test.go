package cloud

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakehcloud"
	"github.com/vipd/vipd/lab"
)

// The Hetzner Cloud lab: the same nodes and fake apiservers as the
// DigitalOcean one, a fake Hetzner API and metadata service in the client
// namespace, and Hetzner's data plane as a route: the client sends the
// floating IP to whichever node's server the fake says holds it (ip route
// replace FIP/32 via <node>), as Hetzner routes a floating IP to its
// server. A node answers only when it has the address configured, so the
// client's probes see what a user would.
const (
	hzToken      = "hcloud-lab-token"
	floatingIP   = "192.0.2.20"
	fipID        = int64(555)
	serverBase   = int64(8000) // node n<i> is server 8000+i
	hzAssignPath = "/v1/floating_ips/555/actions/assign"
	// hzAction is the assign time of the fake. Hetzner publishes no figure
	// for floating IP assigns (only 40-60 s for Robot failover IPs, another
	// product); its clients poll actions every 500 ms and users report
	// moves "within seconds": 3 s is the figure the docs quote as assumed.
	hzAction  = 3 * time.Second
	hzLatency = 30 * time.Millisecond
)

func server(i int) int64 { return serverBase + int64(i) + 1 }

// hzLab is N nodes and the fake Hetzner Cloud API; a goroutine plays
// Hetzner's network (routeFloatingIP).
type hzLab struct {
	*nodes
	fake *fakehcloud.Server
	stop chan struct{}
	wg   sync.WaitGroup
}

func newHzLab(t *testing.T, n int, fo fakehcloud.Options) *hzLab {
	t.Helper()
	c := &hzLab{nodes: newNodes(t, n), stop: make(chan struct{})}
	fo.Token = hzToken
	fo.Listen = c.Client.Listen
	fo.Addr, fo.MetadataAddr = c.fakeAddr(), c.fakeAddr()
	fake, err := fakehcloud.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	c.OnClose(fake.Close)
	c.fake = fake
	for i, n := range c.Nodes {
		fake.AddServer(server(i), n.Name)
	}
	fake.AddFloatingIP(fakehcloud.FloatingIP{ID: fipID, IP: floatingIP})
	c.wg.Add(1)
	go c.routeFloatingIP()
	c.OnClose(func() { close(c.stop); c.wg.Wait() })
	return c
}

// routeFloatingIP plays Hetzner's network: the client's route for the
// floating IP follows the fake's holder (no holder: no route).
func (c *hzLab) routeFloatingIP() {
	defer c.wg.Done()
	cur := int64(-1)
	for {
		select {
		case <-c.stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		h := c.fake.Holder(floatingIP)
		if h == cur {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		idx := int(h - serverBase - 1)
		var err error
		if idx >= 0 && idx < len(c.Nodes) {
			_, err = c.Client.Output(ctx, "ip", "route", "replace", floatingIP+"/32", "via", c.Nodes[idx].IPv4.String(), "dev", c.Client.Link)
		} else {
			_, err = c.Client.Output(ctx, "ip", "route", "del", floatingIP+"/32")
			if cur <= 0 {
				err = nil // nothing to delete
			}
		}
		cancel()
		if err != nil {
			c.t.Logf("route for the floating IP: %v", err)
			continue
		}
		cur = h
	}
}

func (c *hzLab) env(i int, extra ...string) []string {
	return c.withPeers(i, []string{
		"VIPD_MODE=cloud",
		"VIPD_CLOUD_PROVIDER=hetzner",
		"VIPD_ADDRESS=" + floatingIP + "/32",
		"HCLOUD_TOKEN=" + hzToken,
		"VIPD_HCLOUD_TOKEN_FILE=",
		"VIPD_HCLOUD_API_URL=" + c.fake.URL(),
		"VIPD_HCLOUD_METADATA_URL=" + c.fake.MetadataURL(server(i)),
		"VIPD_HCLOUD_SERVER_ID=",
		"VIPD_CLOUD_BIND_INTERFACE=" + c.Nodes[i].Link,
		"VIPD_HEALTH_INTERVAL=200ms",
		"VIPD_HEALTH_TIMEOUT=500ms",
	}, extra...)
}

func (c *hzLab) start(i int, extra ...string) *lab.Proc {
	c.t.Helper()
	return c.startEnv(i, c.env(i, extra...))
}

func (c *hzLab) dumpAPI() { c.dumpLog("fake Hetzner API", c.fake.Requests()) }

func (c *hzLab) waitServer(ctx context.Context, want int64) time.Time {
	c.t.Helper()
	for {
		if c.fake.Holder(floatingIP) == want {
			return time.Now()
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("floating IP on server %d, want %d", c.fake.Holder(floatingIP), want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// assigns lists the actions the API accepted (POSTs answered 201) since.
func (c *hzLab) assigns(since time.Time) []fakehcloud.Request {
	var out []fakehcloud.Request
	for _, r := range c.fake.Requests() {
		if r.Method == http.MethodPost && r.Status == http.StatusCreated && !r.Time.Before(since) {
			out = append(out, r)
		}
	}
	return out
}

func (c *hzLab) hzMetric(ctx context.Context, i int, call, outcome string) float64 {
	return c.metric(ctx, i, fmt.Sprintf(`vipd_cloud_calls_total{call=%q,outcome=%q,provider="hetzner"}`, call, outcome))
}

func (c *hzLab) bound(ctx context.Context, i int) bool {
	c.t.Helper()
	out, err := c.Nodes[i].Output(ctx, "ip", "-4", "addr", "show", "dev", c.Nodes[i].Link)
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.Contains(string(out), floatingIP+"/32")
}

// One node: a missing and a wrong token stop start-up with one clear line;
// then, with the API down and next rate-limited when the node becomes
// healthy, it retries within the limits and assigns; the floating IP is
// configured on the default-route interface (the default with hetzner)
// and the client reaches the node through it; a restart sends no assign.
func TestHetznerLoneNode(t *testing.T) {
	// Hetzner's default rate limit: 3600 requests per hour, one comes back
	// every second once the bucket is empty.
	c := newHzLab(t, 1, fakehcloud.Options{ActionDuration: 500 * time.Millisecond, Latency: hzLatency})
	defer c.dumpAPI()
	ctx := ctxT(t, 120*time.Second)

	p := c.start(0, "HCLOUD_TOKEN=")
	if code, err := p.Wait(15 * time.Second); err != nil || code != 2 ||
		!strings.Contains(p.Output(), "HCLOUD_TOKEN") || !strings.Contains(p.Output(), "VIPD_HCLOUD_TOKEN_FILE") {
		t.Fatalf("missing token: exit %d, %v:\n%s", code, err, p.Output())
	}
	p = c.start(0, "HCLOUD_TOKEN=wrong-token-value")
	code, err := p.Wait(15 * time.Second)
	out := p.Output()
	if err != nil || code != 1 || !strings.Contains(out, "API token rejected") || !strings.Contains(out, "HTTP 401 unauthorized: unable to authenticate") ||
		!strings.Contains(out, "HCLOUD_TOKEN or VIPD_HCLOUD_TOKEN_FILE") || strings.Contains(out, "wrong-token-value") {
		t.Fatalf("wrong token: exit %d, %v:\n%s", code, err, out)
	}
	if n := len(c.assigns(time.Time{})); n != 0 {
		t.Fatalf("%d assigns with a wrong token", n)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "vipd: ") {
			t.Logf("wrong token, exit 1: %s", l)
		}
	}

	// The default bind interface is the one of the default route.
	if _, err := c.Nodes[0].Output(ctx, "ip", "route", "replace", "default", "dev", c.Nodes[0].Link); err != nil {
		t.Fatal(err)
	}
	if err := c.apis[0].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	prober := c.Client.StartProber(floatingIP+":6443", 20*time.Millisecond, 200*time.Millisecond)
	p = c.start(0, "VIPD_CLOUD_BIND_INTERFACE=")
	waitOutput(t, ctx, p, "cloud mode ready")
	if !strings.Contains(p.Output(), "bind_interface="+c.Nodes[0].Link) {
		t.Fatalf("not binding on the default-route interface %s:\n%s", c.Nodes[0].Link, p.Output())
	}

	// API down when the node becomes healthy.
	c.fake.Down()
	if err := c.apis[0].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	down := c.hzMetric(ctx, 0, "list_floating_ips", "transport_error") + c.hzMetric(ctx, 0, "get_floating_ip", "transport_error") + c.hzMetric(ctx, 0, "assign", "transport_error")
	if down < 2 || down > 6 || p.Exited() {
		t.Fatalf("%v failed attempts in 3 s with the API down (backoff 0.5 s doubling)", down)
	}
	// Back, but the project's rate limit is used up: the bucket is kept
	// empty until vipd's first request meets it.
	limited := time.Now()
	if err := c.fake.Up(); err != nil {
		t.Fatal(err)
	}
	for c.fake.CountSince(limited, "", "/v1/") == 0 {
		c.fake.ExhaustRateLimit()
		select {
		case <-ctx.Done():
			t.Fatal("no request after the API came back")
		case <-time.After(10 * time.Millisecond):
		}
	}
	at := c.waitServer(ctx, server(0))
	reqs := c.fake.CountSince(limited, "", "/v1/")
	rl := c.hzMetric(ctx, 0, "get_floating_ip", "rate_limited") + c.hzMetric(ctx, 0, "assign", "rate_limited") + c.hzMetric(ctx, 0, "list_floating_ips", "rate_limited")
	t.Logf("API down 3 s: %v failed attempts; then an empty rate-limit bucket (1 request / s): %v answers 429, %d requests, assigned %v after the API came back",
		down, rl, reqs, at.Sub(limited).Round(time.Millisecond))
	if rl < 1 {
		t.Fatal("no 429 seen: the rate limit was not exercised")
	}
	// One request per second (the first finds the bucket empty; then vipd
	// paces itself by RateLimit-Remaining): never a storm.
	if limit := int(at.Sub(limited)/time.Second) + 2; reqs > limit || rl > 2 {
		t.Fatalf("%d requests (%v answered 429) while rate-limited, want at most %d", reqs, rl, limit)
	}
	waitOutput(t, ctx, p, "VIP held")
	waitFor(t, ctx, "the floating IP configured on "+c.Nodes[0].Link, func() bool { return c.bound(ctx, 0) })
	waitFor(t, ctx, "the client reaching n1 through the floating IP", func() bool {
		a := prober.Answers()
		return len(a) > 0 && a[len(a)-1].Node == c.Nodes[0].Name
	})
	if got := c.hzMetric(ctx, 0, "assign", "success"); got != 1 {
		t.Fatalf("assign success = %v", got)
	}
	st := c.cloudStatus(ctx, 0)
	if st["provider"] != "hetzner" || st["instance"] != "8001" {
		t.Fatalf("/status cloud = %v", st)
	}

	// A restart: stopping makes no API call and removes the local address;
	// the new process finds the IP on its server and sends no assign.
	before := len(c.fake.Requests())
	stopClean(t, p)
	if n := len(c.fake.Requests()) - before; n != 0 || c.fake.Holder(floatingIP) != server(0) {
		t.Fatalf("stopping made %d API calls; holder %d", n, c.fake.Holder(floatingIP))
	}
	if c.bound(ctx, 0) {
		t.Fatal("the floating IP is still configured after the stop")
	}
	p = c.start(0, "VIPD_CLOUD_BIND_INTERFACE=")
	waitOutput(t, ctx, p, "VIP held")
	waitFor(t, ctx, "the floating IP configured again", func() bool { return c.bound(ctx, 0) })
	if n := len(c.assigns(time.Time{})); n != 1 {
		t.Fatalf("%d assigns in total, want 1", n)
	}
}

// Three nodes with Hetzner-like timing (3 s assign actions, 30 ms API
// latency): a node alone never takes a floating IP another server holds;
// the cluster's holder takes it with one assign; when the holder's
// apiserver fails the floating IP follows the new holder (measured as the
// client sees it); a planned handover is one assign by the successor;
// nothing is ever unassigned.
func TestHetznerClusterFailoverAndHandover(t *testing.T) {
	c := newHzLab(t, 3, fakehcloud.Options{ActionDuration: hzAction, Latency: hzLatency})
	defer c.dumpAPI()
	ctx := ctxT(t, 180*time.Second)
	const elsewhere = int64(9999) // a server outside the cluster holds it
	c.fake.AddServer(elsewhere, "old-lb")
	c.fake.SetHolder(fipID, elsewhere)

	// n1 alone (its peers are not up): past the bootstrap grace it holds
	// alone, but must not pull the floating IP from server 9999.
	for _, a := range c.apis {
		if err := a.SetMode(lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	ps := []*lab.Proc{c.start(0)}
	waitOutput(t, ctx, ps[0], "not taking it")
	time.Sleep(2 * time.Second)
	if n := len(c.assigns(time.Time{})); n != 0 || c.fake.Holder(floatingIP) != elsewhere {
		t.Fatalf("the lone node sent %d assigns; holder %d", n, c.fake.Holder(floatingIP))
	}

	// The cluster forms: its holder takes the floating IP (quorum vouches).
	prober := c.Client.StartProber(floatingIP+":6443", 10*time.Millisecond, 200*time.Millisecond)
	ps = append(ps, c.start(1), c.start(2))
	old := -1
	for old < 0 {
		h := c.fake.Holder(floatingIP)
		if idx := int(h - serverBase - 1); idx >= 0 && idx < 3 && c.holds(ctx, idx) {
			old = idx
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no holder took the floating IP (on %d)", h)
		case <-time.After(50 * time.Millisecond):
		}
	}
	waitFor(t, ctx, "the client reaching the holder", func() bool {
		a := prober.Answers()
		return len(a) > 0 && a[len(a)-1].Node == c.Nodes[old].Name
	})
	settled := len(c.assigns(time.Time{}))
	t.Logf("n%d took the floating IP from server %d with %d assign(s)", old+1, elsewhere, settled)

	// Failover: the holder's apiserver fails.
	fault := time.Now()
	if err := c.apis[old].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	next := -1
	var moved time.Time
	for next < 0 {
		if idx := int(c.fake.Holder(floatingIP) - serverBase - 1); idx >= 0 && idx < 3 && idx != old {
			next, moved = idx, time.Now()
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the floating IP never left the failed holder")
		case <-time.After(5 * time.Millisecond):
		}
	}
	waitFor(t, ctx, "the client reaching the new holder", func() bool {
		a := prober.Answers()
		return len(a) > 0 && a[len(a)-1].Node == c.Nodes[next].Name
	})
	gap, _, _ := lab.Outage(prober.Answers(), fault, time.Now())
	t.Logf("failover n%d -> n%d: floating IP moved %v after the apiserver failed; client-visible outage %v (health 200ms x 3, assign action %v, API latency %v)",
		old+1, next+1, moved.Sub(fault).Round(time.Millisecond), gap.Round(time.Millisecond), hzAction, hzLatency)
	if moved.Sub(fault) > hzAction+8*time.Second {
		t.Fatalf("failover took %v", moved.Sub(fault))
	}
	var fromNext []string
	for _, r := range c.assigns(fault) {
		if r.Remote != c.Nodes[next].IPv4.String() || r.Path != hzAssignPath || !strings.Contains(r.Body, fmt.Sprintf(`"server":%d`, server(next))) {
			t.Fatalf("unexpected action since the fault: %+v", r)
		}
		fromNext = append(fromNext, r.Body)
	}
	if len(fromNext) != 1 {
		t.Fatalf("assigns since the fault: %v, want one by the new holder", fromNext)
	}

	// Planned handover: one assign by the successor, none by the old one.
	if err := c.apis[old].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	// No wait for the cool-off between two assigns: on a loaded machine
	// the failover above can end less than 5 s after the successor's own
	// last assign, and a planned handover is not held back by it.
	from := c.Nodes[next]
	since := time.Now()
	hout, err := from.Output(ctx, c.bin, "handover", "--state-dir", filepath.Join(os.TempDir(), "vipd-lab-"+from.NS))
	if err != nil {
		t.Fatalf("vipd handover: %v: %s", err, hout)
	}
	succ := -1
	for succ < 0 {
		if idx := int(c.fake.Holder(floatingIP) - serverBase - 1); idx >= 0 && idx < 3 && idx != next {
			succ = idx
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("handover did not move the floating IP: %s", hout)
		case <-time.After(5 * time.Millisecond):
		}
	}
	waitFor(t, ctx, "the client reaching the successor", func() bool {
		a := prober.Answers()
		return len(a) > 0 && a[len(a)-1].Node == c.Nodes[succ].Name
	})
	hgap, _, _ := lab.Outage(prober.Answers(), since, time.Now())
	t.Logf("vipd handover n%d -> n%d: %q; moved %v after the command, client-visible outage %v",
		next+1, succ+1, strings.TrimSpace(string(hout)), time.Since(since).Round(time.Millisecond), hgap.Round(time.Millisecond))
	hs := c.assigns(since)
	if len(hs) != 1 || hs[0].Remote != c.Nodes[succ].IPv4.String() {
		t.Fatalf("actions since the handover: %+v, want one assign by n%d", hs, succ+1)
	}
	// The old holder keeps the address until the IP moved, the successor
	// has it before its assign completes: the client sees no gap of the
	// action's length (a probe every 10 ms; a handful may fall in the
	// switch).
	if hgap > time.Second {
		t.Fatalf("client-visible outage %v in a planned handover", hgap)
	}
	waitFor(t, ctx, "the old holder's address removed after the move", func() bool { return !c.bound(ctx, next) })

	// The holder's machine dies without a clean stop (SIGKILL): the
	// others notice over gossip and one of them takes the floating IP.
	killed := time.Now()
	ps[succ].Kill()
	last := -1
	for last < 0 {
		if idx := int(c.fake.Holder(floatingIP) - serverBase - 1); idx >= 0 && idx < 3 && idx != succ {
			last = idx
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the floating IP never left the killed holder")
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Logf("holder n%d killed: floating IP on n%d %v later", succ+1, last+1, time.Since(killed).Round(time.Millisecond))
	if n := len(c.assigns(killed)); n != 1 {
		t.Fatalf("%d assigns after the kill, want 1", n)
	}
	// The killed node comes back: the address its crashed run left on the
	// interface goes (the IP is elsewhere), and it does not take the IP.
	if !c.bound(ctx, succ) {
		t.Fatal("the SIGKILLed holder's address is gone: nothing left to clean up")
	}
	back := c.start(succ)
	waitOutput(t, ctx, back, "local address left from a previous run removed")
	if c.bound(ctx, succ) {
		t.Fatal("the leftover address is still configured")
	}
	time.Sleep(time.Second)
	if h := c.fake.Holder(floatingIP); h != server(last) || len(c.assigns(killed)) != 1 {
		t.Fatalf("after the restart: holder %d, %d assigns", h, len(c.assigns(killed)))
	}
	for _, r := range c.fake.Requests() {
		if strings.Contains(r.Path, "unassign") {
			t.Fatalf("unassign sent: %+v", r)
		}
	}
}
