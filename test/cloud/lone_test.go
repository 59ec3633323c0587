package cloud

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/lab"
)

// A lone node (no peers) that becomes healthy assigns the reserved IP to
// its droplet, learned from the metadata service; a restart of that holder
// sends no second assign.
func TestLoneHolderAssignsAndRestartMakesNoAssign(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 300 * time.Millisecond, Latency: 20 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 60*time.Second)
	p := c.start(0)
	if _, err := c.waitHolder(ctx, droplet(0)); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, ctx, p, "reserved IP assigned to this instance")
	if n := posts(c.fake); n != 1 {
		t.Fatalf("%d assign requests, want 1", n)
	}
	if got := c.fake.Count("", "/v2/floating_ips"); got != 0 {
		t.Fatalf("%d requests to the deprecated floating_ips endpoints", got)
	}
	var sawID bool
	for _, r := range c.fake.MetadataRequests() {
		sawID = sawID || strings.HasSuffix(r.Path, "/metadata/v1/id")
	}
	if !sawID {
		t.Fatal("the droplet id was not read from the metadata service")
	}
	if got := c.metric(ctx, 0, series("assign", "success")); got != 1 {
		t.Fatalf("assign success metric = %v", got)
	}
	st := c.cloudStatus(ctx, 0)
	if st["instance"] != "1001" {
		t.Fatalf("/status cloud = %v", st)
	}

	// Planned restart: SIGTERM, start again. Release makes no API call
	// and the new process finds the IP already on its droplet.
	before := len(c.fake.Requests())
	stopClean(t, p)
	if got := len(c.fake.Requests()) - before; got != 0 {
		t.Fatalf("stopping the holder made %d API calls (release must not unassign)", got)
	}
	if holder, _ := c.fake.Holder(reservedIP); holder != droplet(0) {
		t.Fatalf("after stop the IP moved to %d", holder)
	}
	p2 := c.start(0)
	waitOutput(t, ctx, p2, "VIP held")
	time.Sleep(500 * time.Millisecond)
	if n := posts(c.fake); n != 1 {
		t.Fatalf("restart: %d assign requests in total, want still 1", n)
	}
	if got := c.fake.Count(http.MethodGet, "/v2/reserved_ips/"+reservedIP); got < 2 {
		t.Fatalf("restart did not check the holder (%d GETs)", got)
	}
}

func TestTokenErrorsStopStartUp(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{})
	defer c.dumpAPI()

	// No token at all: a configuration error, exit 2, one line naming it.
	p := c.start(0, "DIGITALOCEAN_ACCESS_TOKEN=")
	code, err := p.Wait(15 * time.Second)
	if err != nil || code != 2 {
		t.Fatalf("missing token: exit %d, %v; want 2\n%s", code, err, p.Output())
	}
	if !strings.Contains(p.Output(), "DIGITALOCEAN_ACCESS_TOKEN") || !strings.Contains(p.Output(), "VIPD_DO_TOKEN_FILE") {
		t.Fatalf("missing token message:\n%s", p.Output())
	}

	// A token the API rejects: exit 1 at start-up with the API's words.
	p = c.start(0, "DIGITALOCEAN_ACCESS_TOKEN=wrong")
	code, err = p.Wait(15 * time.Second)
	if err != nil || code != 1 {
		t.Fatalf("rejected token: exit %d, %v; want 1\n%s", code, err, p.Output())
	}
	out := p.Output()
	if !strings.Contains(out, "API token rejected") || !strings.Contains(out, "Unable to authenticate you") {
		t.Fatalf("rejected token message:\n%s", out)
	}
	if n := posts(c.fake); n != 0 {
		t.Fatalf("%d assigns with a bad token", n)
	}

	// A VIP that is not a reserved IP of the account: exit 1, says so.
	p = c.start(0, "VIPD_ADDRESS=192.0.2.99/32")
	code, err = p.Wait(15 * time.Second)
	if err != nil || code != 1 || !strings.Contains(p.Output(), "192.0.2.99 is not in this DigitalOcean account") {
		t.Fatalf("unknown IP: exit %d, %v\n%s", code, err, p.Output())
	}
}

// The API is down when the node becomes healthy: vipd retries with backoff
// (bounded requests), logs and counts the failures, and assigns by itself
// once the API is back.
func TestAPIDownThenRecovers(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 200 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 90*time.Second)
	if err := c.apis[0].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	p := c.start(0)
	waitOutput(t, ctx, p, "cloud mode ready")
	c.fake.Down()
	if err := c.apis[0].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	downFor := 8 * time.Second
	time.Sleep(downFor)
	if !strings.Contains(p.Output(), "transport_error") {
		t.Fatalf("no transport_error in the logs while the API is down:\n%s", p.Output())
	}
	failures := c.metric(ctx, 0, series("assign", "transport_error"))
	// Backoff 0.5s doubling to 10s: about 5 attempts in 8s, never a storm.
	if failures < 2 || failures > 10 {
		t.Fatalf("%v assign attempts in %v with the API down", failures, downFor)
	}
	if p.Exited() {
		t.Fatal("vipd exited while the API was down")
	}
	up := time.Now()
	if err := c.fake.Up(); err != nil {
		t.Fatal(err)
	}
	at, err := c.waitHolder(ctx, droplet(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("API down %v: %v assign attempts failed; assigned %v after the API came back", downFor, failures, at.Sub(up).Round(time.Millisecond))
	if at.Sub(up) > 15*time.Second {
		t.Fatalf("recovered %v after the API came back", at.Sub(up))
	}
}

// A 429 storm: every call answers 429 with RateLimit-Reset 2 s ahead. The
// number of requests stays bounded by the reset, and the assign goes
// through once the storm ends.
func TestRateLimitStorm(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 200 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 90*time.Second)
	if err := c.apis[0].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	p := c.start(0)
	waitOutput(t, ctx, p, "cloud mode ready")
	c.fake.ResetLog()
	c.fake.AddFault(fakedo.Fault{Status: http.StatusTooManyRequests, Count: -1, ResetAfter: 2 * time.Second})
	start := time.Now()
	if err := c.apis[0].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	window := 12 * time.Second
	time.Sleep(window)
	n := len(c.fake.Requests())
	t.Logf("429 storm: %d API requests in %v (RateLimit-Reset 2s)", n, time.Since(start).Round(time.Millisecond))
	// One request per reset period (2-3 s with whole-second resets and
	// jitter), plus one.
	if n < 2 || n > int(window/(2*time.Second))+1 {
		t.Fatalf("%d requests during a %v storm", n, window)
	}
	if got := c.metric(ctx, 0, series("assign", "rate_limited")); got < 2 {
		t.Fatalf("rate_limited metric = %v", got)
	}
	c.fake.ClearFaults()
	end := time.Now()
	at, err := c.waitHolder(ctx, droplet(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("assigned %v after the storm ended", at.Sub(end).Round(time.Millisecond))
}

// Another action holds the IP's lock (422) when the node acquires: vipd
// waits for the lock and assigns.
func TestLockedIPIsRetried(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 200 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 60*time.Second)
	if err := c.apis[0].SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	p := c.start(0)
	waitOutput(t, ctx, p, "cloud mode ready")
	if _, err := c.fake.LockIP(reservedIP, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.apis[0].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitHolder(ctx, droplet(0)); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, ctx, p, "locked by another action")
	var statuses []int
	for _, r := range c.fake.Requests() {
		if r.Method == http.MethodPost {
			statuses = append(statuses, r.Status)
		}
	}
	if len(statuses) != 2 || statuses[0] != 422 || statuses[1] != 201 {
		t.Fatalf("assign statuses %v, want [422 201]", statuses)
	}
}

// The API goes down while a node holds the reserved IP: the holder keeps
// the VIP (no release, no re-acquire), logs and counts the failed refresh,
// and notices by itself when the API is back, without any assign.
func TestHolderKeepsStateWhileAPIDown(t *testing.T) {
	c := newCloudLab(t, 1, fakedo.Options{ActionDuration: 100 * time.Millisecond})
	defer c.dumpAPI()
	ctx := ctxT(t, 90*time.Second)
	p := c.start(0)
	if _, err := c.waitHolder(ctx, droplet(0)); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, ctx, p, "VIP held")
	c.fake.Down()
	// The holder refreshes every 10 s; wait for a failed refresh.
	waitOutput(t, ctx, p, "cannot refresh the reserved IP's holder; keeping the last known state")
	time.Sleep(2 * time.Second)
	if !c.holds(ctx, 0) {
		t.Fatal("the holder gave up the VIP while the API was down")
	}
	if n := strings.Count(p.Output(), `msg="VIP released"`); n != 0 {
		t.Fatalf("%d releases while the API was down", n)
	}
	if got := c.metric(ctx, 0, series("get_reserved_ip", "transport_error")); got < 1 {
		t.Fatalf("get_reserved_ip transport_error = %v", got)
	}
	st := c.cloudStatus(ctx, 0)
	vips, _ := st["vips"].([]any)
	if len(vips) != 1 || vips[0].(map[string]any)["api_failing"] != true {
		t.Fatalf("/status cloud = %v, want api_failing", st)
	}
	if err := c.fake.Up(); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, ctx, p, "reserved IP holder check works again")
	if n := posts(c.fake); n != 1 {
		t.Fatalf("%d assigns in total, want 1", n)
	}
	if !c.holds(ctx, 0) {
		t.Fatal("not holding after the API came back")
	}
}
