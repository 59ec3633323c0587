package fakedo

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/godo"
)

type tokenTransport struct{ token string }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return http.DefaultTransport.RoundTrip(r)
}

func newFake(t *testing.T, opts Options) (*Server, *godo.Client) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	tok := opts.Token
	if tok == "" {
		tok = "fake-token"
	}
	c, err := godo.New(&http.Client{Transport: tokenTransport{tok}, Timeout: 5 * time.Second}, godo.SetBaseURL(s.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func statusOf(err error) int {
	var er *godo.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return er.Response.StatusCode
	}
	return 0
}

func TestAuth(t *testing.T) {
	s, _ := newFake(t, Options{Token: "right"})
	c, _ := godo.New(&http.Client{Transport: tokenTransport{"wrong"}}, godo.SetBaseURL(s.URL()))
	_, _, err := c.ReservedIPs.List(context.Background(), nil)
	if statusOf(err) != http.StatusUnauthorized || !strings.Contains(err.Error(), "Unable to authenticate you") {
		t.Fatalf("wrong token: got %v, want 401 Unable to authenticate you", err)
	}
	resp, err := http.Get(s.URL() + "v2/reserved_ips")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(body), `"id":"unauthorized"`) {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
}

func TestReservedIPsListGetCreateDelete(t *testing.T) {
	s, c := newFake(t, Options{})
	ctx := context.Background()
	s.AddDroplet(Droplet{ID: 11, Name: "a", PublicIPv4: "198.51.100.11"})
	for i := 0; i < 5; i++ {
		s.AddReservedIP("192.0.2."+strconv.Itoa(10+i), 0)
	}
	s.AddReservedIP("192.0.2.99", 11)

	var got []string
	opt := &godo.ListOptions{PerPage: 2}
	pages := 0
	for {
		ips, resp, err := c.ReservedIPs.List(ctx, opt)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, ip := range ips {
			got = append(got, ip.IP)
		}
		if resp.Meta == nil || resp.Meta.Total != 6 {
			t.Fatalf("meta = %+v, want total 6", resp.Meta)
		}
		if resp.Links == nil || resp.Links.IsLastPage() {
			break
		}
		p, err := resp.Links.CurrentPage()
		if err != nil {
			t.Fatal(err)
		}
		opt.Page = p + 1
	}
	if len(got) != 6 || pages != 3 {
		t.Fatalf("listed %v in %d pages, want 6 IPs in 3 pages", got, pages)
	}

	rip, _, err := c.ReservedIPs.Get(ctx, "192.0.2.99")
	if err != nil {
		t.Fatal(err)
	}
	if rip.Droplet == nil || rip.Droplet.ID != 11 || rip.Region == nil || rip.Region.Slug != "nyc3" {
		t.Fatalf("get = %+v", rip)
	}
	if pub, _ := rip.Droplet.PublicIPv4(); pub != "198.51.100.11" {
		t.Fatalf("droplet public IPv4 = %q", pub)
	}
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.200"); statusOf(err) != 404 || !strings.Contains(err.Error(), "could not be found") {
		t.Fatalf("missing IP: %v", err)
	}

	created, resp, err := c.ReservedIPs.Create(ctx, &godo.ReservedIPCreateRequest{Region: "nyc3"})
	if err != nil || resp.StatusCode != 202 || created.IP == "" || created.Droplet != nil {
		t.Fatalf("create region: %+v %v", created, err)
	}
	if _, _, err := c.ReservedIPs.Create(ctx, &godo.ReservedIPCreateRequest{DropletID: 11}); statusOf(err) != 422 {
		t.Fatalf("create for a droplet that holds an IP: %v, want 422", err)
	}
	s.AddDroplet(Droplet{ID: 12, Name: "b"})
	withDroplet, resp, err := c.ReservedIPs.Create(ctx, &godo.ReservedIPCreateRequest{DropletID: 12})
	if err != nil || withDroplet.Droplet == nil || withDroplet.Droplet.ID != 12 {
		t.Fatalf("create for droplet 12: %+v %v", withDroplet, err)
	}
	if resp.Links == nil || len(resp.Links.Actions) != 1 || resp.Links.Actions[0].Rel != "assign_ip" {
		t.Fatalf("create links = %+v, want one assign_ip action", resp.Links)
	}
	if _, err := c.ReservedIPs.Delete(ctx, created.IP); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ReservedIPs.Get(ctx, created.IP); statusOf(err) != 404 {
		t.Fatalf("deleted IP still there: %v", err)
	}
}

func TestAssignActionLifecycle(t *testing.T) {
	s, c := newFake(t, Options{ActionDuration: 150 * time.Millisecond})
	ctx := context.Background()
	s.AddDroplet(Droplet{ID: 1, Name: "n1"})
	s.AddDroplet(Droplet{ID: 2, Name: "n2"})
	s.AddReservedIP("192.0.2.10", 1)

	a, resp, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 2)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || a.Status != godo.ActionInProgress || a.Type != "assign_ip" || a.ResourceType != "reserved_ip" || a.StartedAt == nil || a.CompletedAt != nil {
		t.Fatalf("assign = %d %+v", resp.StatusCode, a)
	}
	if want := 192<<24 | 0<<16 | 2<<8 | 10; a.ResourceID != want {
		t.Fatalf("resource_id = %d, want %d", a.ResourceID, want)
	}
	rip, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10")
	if err != nil || !rip.Locked || rip.Droplet.ID != 1 {
		t.Fatalf("during the action: %+v %v, want locked and still on droplet 1", rip, err)
	}
	// A second action while the first runs is refused.
	if _, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 1); statusOf(err) != 422 {
		t.Fatalf("second assign while locked: %v, want 422", err)
	}
	time.Sleep(200 * time.Millisecond)
	got, _, err := c.ReservedIPActions.Get(ctx, "192.0.2.10", a.ID)
	if err != nil || got.Status != godo.ActionCompleted || got.CompletedAt == nil {
		t.Fatalf("after the duration: %+v %v", got, err)
	}
	generic, _, err := c.Actions.Get(ctx, a.ID)
	if err != nil || generic.ID != a.ID || generic.Status != godo.ActionCompleted {
		t.Fatalf("/v2/actions/{id}: %+v %v", generic, err)
	}
	if holder, _ := s.Holder("192.0.2.10"); holder != 2 {
		t.Fatalf("holder = %d, want 2", holder)
	}
	if _, _, err := c.ReservedIPActions.Get(ctx, "192.0.2.11", a.ID); statusOf(err) != 404 {
		t.Fatalf("action of another IP: %v, want 404", err)
	}
	list, _, err := c.ReservedIPActions.List(ctx, "192.0.2.10", nil)
	if err != nil || len(list) != 1 {
		t.Fatalf("list actions = %+v %v", list, err)
	}
	un, _, err := c.ReservedIPActions.Unassign(ctx, "192.0.2.10")
	if err != nil || un.Type != "unassign_ip" {
		t.Fatalf("unassign: %+v %v", un, err)
	}
	time.Sleep(200 * time.Millisecond)
	if holder, _ := s.Holder("192.0.2.10"); holder != 0 {
		t.Fatalf("holder after unassign = %d", holder)
	}
	if _, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 99); statusOf(err) != 422 {
		t.Fatalf("assign to unknown droplet: %v, want 422", err)
	}
	if _, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.77", 1); statusOf(err) != 404 {
		t.Fatalf("assign unknown IP: %v, want 404", err)
	}
}

func TestLockIPAndFailedActions(t *testing.T) {
	s, c := newFake(t, Options{})
	ctx := context.Background()
	s.AddDroplet(Droplet{ID: 1})
	s.AddReservedIP("192.0.2.10", 0)
	if _, err := s.LockIP("192.0.2.10", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 1)
	if statusOf(err) != 422 || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("locked: %v", err)
	}
	time.Sleep(120 * time.Millisecond)
	s.FailActions(1)
	a, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 1)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := c.Actions.Get(ctx, a.ID)
	if err != nil || got.Status != "errored" {
		t.Fatalf("failed action: %+v %v", got, err)
	}
	if holder, _ := s.Holder("192.0.2.10"); holder != 0 {
		t.Fatalf("an errored action took effect: holder %d", holder)
	}
}

func TestDroplets(t *testing.T) {
	s, c := newFake(t, Options{})
	ctx := context.Background()
	s.AddDroplet(Droplet{ID: 1, Name: "a", PublicIPv4: "198.51.100.1", PrivateIPv4: "10.10.0.1", Tags: []string{"k8s"}})
	s.AddDroplet(Droplet{ID: 2, Name: "b", PublicIPv4: "198.51.100.2", Tags: []string{"other"}})
	s.AddReservedIP("192.0.2.10", 1)
	d, _, err := c.Droplets.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := d.PublicIPv4()
	priv, _ := d.PrivateIPv4()
	if pub != "198.51.100.1" || priv != "10.10.0.1" || d.Name != "a" {
		t.Fatalf("droplet = %+v", d)
	}
	var hasRIP bool
	for _, n := range d.Networks.V4 {
		hasRIP = hasRIP || (n.IPAddress == "192.0.2.10" && n.Type == "public")
	}
	if !hasRIP {
		t.Fatalf("droplet networks %+v lack the reserved IP", d.Networks.V4)
	}
	tagged, _, err := c.Droplets.ListByTag(ctx, "k8s", nil)
	if err != nil || len(tagged) != 1 || tagged[0].ID != 1 {
		t.Fatalf("by tag = %+v %v", tagged, err)
	}
	all, _, err := c.Droplets.List(ctx, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("all = %+v %v", all, err)
	}
	if _, _, err := c.Droplets.Get(ctx, 3); statusOf(err) != 404 {
		t.Fatalf("missing droplet: %v", err)
	}
}

func TestDomainRecords(t *testing.T) {
	s, c := newFake(t, Options{})
	ctx := context.Background()
	s.AddDomain("example.com")
	s.AddRecord("example.com", Record{Type: "A", Name: "www", Data: "192.0.2.1", TTL: 60})
	s.AddRecord("example.com", Record{Type: "TXT", Name: "www", Data: "hello", TTL: 60})

	rec, resp, err := c.Domains.CreateRecord(ctx, "example.com", &godo.DomainRecordEditRequest{Type: "A", Name: "www", Data: "192.0.2.2", TTL: 120})
	if err != nil || resp.StatusCode != 201 || rec.ID == 0 || rec.TTL != 120 {
		t.Fatalf("create: %+v %v", rec, err)
	}
	got, _, err := c.Domains.RecordsByTypeAndName(ctx, "example.com", "A", "www.example.com", nil)
	if err != nil || len(got) != 2 {
		t.Fatalf("by type and FQDN name = %+v %v", got, err)
	}
	if got, _, _ := c.Domains.RecordsByTypeAndName(ctx, "example.com", "A", "www", nil); len(got) != 0 {
		t.Fatalf("a relative name filter matched %+v; the API filters on the FQDN", got)
	}
	edited, _, err := c.Domains.EditRecord(ctx, "example.com", rec.ID, &godo.DomainRecordEditRequest{Type: "A", Name: "www", Data: "192.0.2.3", TTL: 30})
	if err != nil || edited.Data != "192.0.2.3" || edited.TTL != 30 {
		t.Fatalf("edit: %+v %v", edited, err)
	}
	if _, err := c.Domains.DeleteRecord(ctx, "example.com", rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Domains.Record(ctx, "example.com", rec.ID); statusOf(err) != 404 {
		t.Fatalf("deleted record: %v", err)
	}
	if _, _, err := c.Domains.CreateRecord(ctx, "example.com", &godo.DomainRecordEditRequest{Type: "A", Name: "x", Data: "nope"}); statusOf(err) != 422 {
		t.Fatalf("bad A data: %v", err)
	}
	if _, _, err := c.Domains.Records(ctx, "nope.example", nil); statusOf(err) != 404 {
		t.Fatalf("unknown domain: %v", err)
	}
	raw := s.Records("example.com")
	if len(raw) != 2 || raw[0].Priority != nil {
		t.Fatalf("records = %+v", raw)
	}
	// The list always carries links, which FLIPOP requires.
	req, _ := http.NewRequest(http.MethodGet, s.URL()+"v2/domains/example.com/records?type=A", nil)
	req.Header.Set("Authorization", "Bearer fake-token")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(body), `"links":{}`) || !strings.Contains(string(body), `"priority":null`) {
		t.Fatalf("list body %s", body)
	}
}

func TestFaults(t *testing.T) {
	s, c := newFake(t, Options{})
	ctx := context.Background()
	s.AddReservedIP("192.0.2.10", 0)

	s.AddFault(Fault{Path: "/v2/reserved_ips", Status: 429, Count: 2, ResetAfter: 3 * time.Second, RetryAfter: true})
	for i := 0; i < 2; i++ {
		_, resp, err := c.ReservedIPs.Get(ctx, "192.0.2.10")
		if statusOf(err) != 429 {
			t.Fatalf("call %d: %v, want 429", i, err)
		}
		reset, _ := strconv.ParseInt(resp.Header.Get("RateLimit-Reset"), 10, 64)
		if d := time.Until(time.Unix(reset, 0)); d < 2*time.Second || d > 5*time.Second {
			t.Fatalf("RateLimit-Reset %v from now, want about 3s", d)
		}
		if resp.Header.Get("RateLimit-Remaining") != "0" || resp.Header.Get("RateLimit-Limit") == "" || resp.Header.Get("Retry-After") != "3" {
			t.Fatalf("429 headers %v", resp.Header)
		}
	}
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err != nil {
		t.Fatalf("after the fault: %v", err)
	}

	s.AddFault(Fault{Method: http.MethodPost, Status: 503, Count: -1})
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err != nil {
		t.Fatalf("GET is not matched by a POST fault: %v", err)
	}
	if _, _, err := c.ReservedIPActions.Assign(ctx, "192.0.2.10", 1); statusOf(err) != 503 {
		t.Fatalf("POST: %v, want 503", err)
	}
	s.ClearFaults()

	s.AddFault(Fault{Drop: true, Count: 1})
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err == nil || statusOf(err) != 0 {
		t.Fatalf("dropped connection: %v, want a transport error", err)
	}

	s.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("latency not applied: %v", d)
	}
	s.SetLatency(0)

	s.Down()
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("down: %v, want connection refused", err)
	}
	if err := s.Up(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.ReservedIPs.Get(ctx, "192.0.2.10"); err != nil {
		t.Fatalf("after up: %v", err)
	}

	log := s.Requests()
	if len(log) == 0 || log[0].Status != 429 || log[0].Path != "/v2/reserved_ips/192.0.2.10" || log[0].Remote != "127.0.0.1" {
		t.Fatalf("log[0] = %+v", log[0])
	}
	if n := s.Count(http.MethodPost, "/v2/reserved_ips/"); n != 1 {
		t.Fatalf("POST count = %d, want 1", n)
	}
}

func TestMetadata(t *testing.T) {
	s, _ := newFake(t, Options{})
	s.AddDroplet(Droplet{ID: 101, Name: "n1", PublicIPv4: "198.51.100.1", AnchorIPv4: "10.20.0.5"})
	s.AddDroplet(Droplet{ID: 102, Name: "n2"})
	s.AddReservedIP("192.0.2.10", 102)
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cases := []struct{ url, want string }{
		{s.MetadataURL(0) + "/id", "101"},
		{s.MetadataURL(102) + "/id", "102"},
		{s.MetadataURL(101) + "/reserved_ip/ipv4/active", "false"},
		{s.MetadataURL(102) + "/reserved_ip/ipv4/active", "true"},
		{s.MetadataURL(102) + "/reserved_ip/ipv4/ip_address", "192.0.2.10"},
		{s.MetadataURL(101) + "/interfaces/public/0/anchor_ipv4/address", "10.20.0.5"},
	}
	for _, tc := range cases {
		if code, body := get(tc.url); code != 200 || body != tc.want {
			t.Errorf("%s = %d %q, want %q", tc.url, code, body, tc.want)
		}
	}
	if code, body := get(s.MetadataURL(102) + ".json"); code != 200 || !strings.Contains(body, `"droplet_id":102`) || !strings.Contains(body, `"ip_address":"192.0.2.10"`) {
		t.Errorf("v1.json = %d %s", code, body)
	}
	if code, _ := get(s.MetadataURL(999) + "/id"); code != 404 {
		t.Errorf("unknown droplet: %d", code)
	}
	s.SetMetadataSource("127.0.0.1", 102)
	if _, body := get(s.MetadataURL(0) + "/id"); body != "102" {
		t.Errorf("by source = %q", body)
	}
	if n := len(s.MetadataRequests()); n != len(cases)+3 {
		t.Errorf("metadata log has %d entries", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	s, c := newFake(t, Options{})
	s.AddDroplet(Droplet{ID: 1})
	s.AddReservedIP("192.0.2.10", 0)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				_, _, _ = c.ReservedIPs.Get(context.Background(), "192.0.2.10")
				_, _, _ = c.ReservedIPActions.Assign(context.Background(), "192.0.2.10", 1)
				_ = s.Requests()
			}
		}()
	}
	wg.Wait()
	if n := s.Count("", "/v2/"); n != 8*20*2 {
		t.Fatalf("logged %d requests, want %d", n, 8*20*2)
	}
}
