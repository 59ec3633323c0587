package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/internal/fakecf"
	"github.com/vipd/vipd/internal/fakedo"
)

func newFakeDO(t *testing.T, actionDur time.Duration) (*fakedo.Server, *digitalOcean) {
	t.Helper()
	fake, err := fakedo.New(fakedo.Options{Token: "tok", ActionDuration: actionDur})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	do, err := newDigitalOcean("tok", fake.URL(), "vipd-test", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return fake, do
}

func TestDigitalOceanReservedIPs(t *testing.T) {
	ctx := context.Background()
	fake, do := newFakeDO(t, 300*time.Millisecond)
	fake.AddDroplet(fakedo.Droplet{ID: 11, Name: "a"})
	fake.AddDroplet(fakedo.Droplet{ID: 12, Name: "b"})
	fake.AddReservedIP("192.0.2.1", 0)

	if owner, err := do.IPToProviderID(ctx, "192.0.2.1"); err != nil || owner != "" {
		t.Fatalf("unassigned IP: %q, %v", owner, err)
	}
	if _, err := do.IPToProviderID(ctx, "192.0.2.200"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing IP: %v, want ErrNotFound", err)
	}
	// Assign: the action runs for 300ms; reads say in progress meanwhile.
	if err := do.AssignIP(ctx, "192.0.2.1", "digitalocean://11"); !errors.Is(err, ErrInProgress) {
		t.Fatalf("assign: %v, want ErrInProgress", err)
	}
	if _, err := do.IPToProviderID(ctx, "192.0.2.1"); !errors.Is(err, ErrInProgress) {
		t.Fatalf("read during action: %v, want ErrInProgress", err)
	}
	time.Sleep(400 * time.Millisecond)
	if owner, err := do.IPToProviderID(ctx, "192.0.2.1"); err != nil || owner != "digitalocean://11" {
		t.Fatalf("after action: %q, %v", owner, err)
	}
	// Moving is an assign to the new droplet; never an unassign.
	if err := do.AssignIP(ctx, "192.0.2.1", "digitalocean://12"); !errors.Is(err, ErrInProgress) {
		t.Fatalf("move: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	if owner, _ := do.IPToProviderID(ctx, "192.0.2.1"); owner != "digitalocean://12" {
		t.Fatalf("after move owner %q", owner)
	}
	for _, a := range fake.Actions() {
		if a.Type != "assign_ip" {
			t.Fatalf("action %+v: only assigns expected", a)
		}
	}
	// A droplet already holding another reserved IP: ErrNodeInUse.
	fake.AddReservedIP("192.0.2.2", 0)
	if err := do.AssignIP(ctx, "192.0.2.2", "digitalocean://12"); !errors.Is(err, ErrNodeInUse) {
		t.Fatalf("assign to busy droplet: %v, want ErrNodeInUse", err)
	}
	if err := do.AssignIP(ctx, "192.0.2.2", "aws://i-123"); err == nil {
		t.Fatal("foreign provider ID accepted")
	}
	// The legacy floating_ips endpoints are never used.
	for _, r := range fake.Requests() {
		if slices.Contains([]string{"/v2/floating_ips"}, r.Path[:min(len(r.Path), 16)]) {
			t.Fatalf("legacy endpoint used: %s %s", r.Method, r.Path)
		}
	}
	ip, err := do.CreateIP(ctx, "nyc3")
	if err != nil || !isIPv4(ip) {
		t.Fatalf("create: %q, %v", ip, err)
	}
	if _, ok := fake.Holder(ip); !ok {
		t.Fatalf("created IP %s unknown to the fake", ip)
	}
}

func TestDigitalOceanRecords(t *testing.T) {
	ctx := context.Background()
	fake, do := newFakeDO(t, 0)
	fake.AddDomain("example.com")
	stale := fake.AddRecord("example.com", fakedo.Record{Type: "A", Name: "www", Data: "192.0.2.9", TTL: 60})
	fake.AddRecord("example.com", fakedo.Record{Type: "A", Name: "other", Data: "192.0.2.8", TTL: 60})
	fake.AddRecord("example.com", fakedo.Record{Type: "CNAME", Name: "www", Data: "x.example.com.", TTL: 60})

	if err := do.EnsureDNSARecordSet(ctx, "example.com", "www", []string{"192.0.2.1", "192.0.2.2"}, 120); err != nil {
		t.Fatal(err)
	}
	var www []string
	reused := false
	for _, r := range fake.Records("example.com") {
		if r.Type == "A" && r.Name == "www" {
			www = append(www, fmt.Sprintf("%s/%d", r.Data, r.TTL))
			reused = reused || r.ID == stale
		}
	}
	slices.Sort(www)
	if !slices.Equal(www, []string{"192.0.2.1/120", "192.0.2.2/120"}) || !reused {
		t.Fatalf("www records %v (stale record reused: %v)", www, reused)
	}
	if n := len(fake.Records("example.com")); n != 4 {
		t.Fatalf("%d records, other records must be untouched", n)
	}
	// Idempotent: a second call only lists.
	before := len(fake.Requests())
	if err := do.EnsureDNSARecordSet(ctx, "example.com", "www", []string{"192.0.2.2", "192.0.2.1"}, 120); err != nil {
		t.Fatal(err)
	}
	for _, r := range fake.Requests()[before:] {
		if r.Method != http.MethodGet {
			t.Fatalf("unneeded write %s %s", r.Method, r.Path)
		}
	}
	if err := do.EnsureDNSARecordSet(ctx, "example.com", "www", nil, 120); err != nil {
		t.Fatal(err)
	}
	for _, r := range fake.Records("example.com") {
		if r.Type == "A" && r.Name == "www" {
			t.Fatalf("record left after an empty set: %+v", r)
		}
	}
	if got := do.RecordNameAndZoneToFQDN("example.com", "@"); got != "example.com" {
		t.Fatalf("apex fqdn %q", got)
	}
}

func TestCloudflareRecords(t *testing.T) {
	ctx := context.Background()
	fake := fakecf.New("cftok")
	t.Cleanup(fake.Close)
	zid := fake.AddZone("example.com")
	// More than a page of unrelated records, plus stale ones for the name.
	for i := range 150 {
		fake.AddRecord(zid, fakecf.Record{Type: "A", Name: fmt.Sprintf("h%d.example.com", i), Content: "192.0.2.200", TTL: 60})
	}
	for i := range 120 {
		fake.AddRecord(zid, fakecf.Record{Type: "A", Name: "lb.example.com", Content: fmt.Sprintf("198.51.100.%d", i), TTL: 60})
	}
	cf, err := newCloudflare("cftok", fake.URL(), "vipd-test", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cf.pace.every = 0                                   // over a hundred writes; the pace has its own test
	for _, zone := range []string{"example.com", zid} { // by name (extension) and by ID (FLIPOP)
		if err := cf.EnsureDNSARecordSet(ctx, zone, "lb.example.com", []string{"192.0.2.1", "192.0.2.2"}, 0); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range fake.Records(zid) {
			if r.Name == "lb.example.com" {
				if r.TTL != 1 || r.Proxied {
					t.Fatalf("record %+v: want ttl 1 (auto), not proxied", r)
				}
				got = append(got, r.Content)
			}
		}
		if !slices.Equal(got, []string{"192.0.2.1", "192.0.2.2"}) {
			t.Fatalf("zone %s: lb records %v (pagination must find all 120 stale ones)", zone, got)
		}
	}
	if n := fake.Count(http.MethodGet, "/zones"); n < 1 {
		t.Fatal("zone name not looked up")
	}
	if n := len(fake.Records(zid)); n != 152 {
		t.Fatalf("%d records, want 150 untouched + 2", n)
	}
	// Errors carry Cloudflare's envelope message and classify for retry
	// once the client's own retries (3) are used up.
	cf.backoff = 10 * time.Millisecond
	fake.AddFault(fakecf.Fault{Method: http.MethodGet, Path: "/zones/", Status: 429, Count: 4})
	err = cf.EnsureDNSARecordSet(ctx, zid, "lb.example.com", []string{"192.0.2.1"}, 60)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != 429 || retrySchedule(err) != retryFast {
		t.Fatalf("429: %v", err)
	}
	// Neither a zone ID nor a zone name: used as an ID, as FLIPOP does.
	if err := cf.EnsureDNSARecordSet(ctx, "nosuch.example", "x.nosuch.example", nil, 60); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown zone: %v", err)
	}
	bad, _ := newCloudflare("wrong", fake.URL(), "", time.Second)
	if err := bad.EnsureDNSARecordSet(ctx, zid, "lb.example.com", nil, 60); err == nil {
		t.Fatal("bad token accepted")
	}
}

func TestProviderCallsInstrumented(t *testing.T) {
	fake, do := newFakeDO(t, 0)
	fake.AddReservedIP("192.0.2.1", 0)
	pm := newProviderMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(pm)
	p := instrumentedIP{name: ProviderDigitalOcean, inner: do, metrics: pm}
	ctx := withObject(context.Background(), objectRef{kind: "FloatingIPPool", namespace: "ns", name: "pool"})
	_, _ = p.IPToProviderID(ctx, "192.0.2.1")
	_, _ = p.IPToProviderID(ctx, "192.0.2.99")
	if got := testutil.ToFloat64(pm.calls.WithLabelValues("digitalocean", "IPToProviderID", "success", "FloatingIPPool", "ns", "pool")); got != 1 {
		t.Fatalf("success calls %v", got)
	}
	if got := testutil.ToFloat64(pm.calls.WithLabelValues("digitalocean", "IPToProviderID", "error", "FloatingIPPool", "ns", "pool")); got != 1 {
		t.Fatalf("error calls %v", got)
	}
	if n := testutil.CollectAndCount(pm.duration, "flipop_providers_call_duration_seconds"); n != 1 {
		t.Fatalf("duration series %d", n)
	}
}

// FLIPOP's own Cloudflare cases (pkg/provider/cloudflare_test.go): zone
// "ZONE" used as given, TTL 30, records rewritten in place with PATCH
// bodies that carry type, name, content and ttl and never "proxied"; PUT
// is never used.
func TestCloudflareFLIPOPCases(t *testing.T) {
	tests := []struct {
		name    string
		list    []string // existing contents, IDs "1", "2", ... in order
		set     []string
		patches map[string]string // record index -> new content
		creates []string
		deletes []int
	}{
		{name: "already set", list: []string{"10.0.1.0", "10.0.1.255"}, set: []string{"10.0.1.0", "10.0.1.255"}},
		{name: "update", list: []string{"10.0.1.0", "10.0.1.255"}, set: []string{"10.0.1.0", "10.0.0.1"}, patches: map[string]string{"1": "10.0.0.1"}},
		{name: "create", list: []string{"10.0.1.0", "10.0.0.1"}, set: []string{"10.0.1.0", "10.0.0.1", "10.0.0.2"}, creates: []string{"10.0.0.2"}},
		{name: "delete", list: []string{"10.0.1.0", "10.0.0.1"}, set: []string{"10.0.1.0"}, deletes: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakecf.New("test123")
			t.Cleanup(fake.Close)
			fake.AddZoneWithID("ZONE", "example.com", true)
			var ids []string
			for _, ip := range tt.list {
				ids = append(ids, fake.AddRecord("ZONE", fakecf.Record{Type: "A", Name: "name", Content: ip, TTL: 30}))
			}
			cf, err := newCloudflare("test123", fake.URL(), "", 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := cf.EnsureDNSARecordSet(context.Background(), "ZONE", "name", tt.set, 30); err != nil {
				t.Fatal(err)
			}
			var patches, creates, deletes []string
			for _, r := range fake.Requests() {
				switch {
				case r.Method == http.MethodPut:
					t.Errorf("PUT %s: FLIPOP updates with PATCH", r.Path)
				case r.Method == http.MethodPatch:
					if strings.Contains(r.Body, "proxied") {
						t.Errorf("PATCH body %s carries proxied", r.Body)
					}
					patches = append(patches, r.Path+" "+r.Body)
				case r.Method == http.MethodPost:
					creates = append(creates, r.Body)
				case r.Method == http.MethodDelete:
					deletes = append(deletes, r.Path)
				}
			}
			var wantPatches, wantCreates, wantDeletes []string
			for idx, ip := range tt.patches {
				i, _ := strconv.Atoi(idx)
				wantPatches = append(wantPatches, "/zones/ZONE/dns_records/"+ids[i]+` {"type":"A","name":"name","content":"`+ip+`","ttl":30}`)
			}
			for _, ip := range tt.creates {
				wantCreates = append(wantCreates, `{"type":"A","name":"name","content":"`+ip+`","ttl":30}`)
			}
			for _, i := range tt.deletes {
				wantDeletes = append(wantDeletes, "/zones/ZONE/dns_records/"+ids[i])
			}
			if !slices.Equal(patches, wantPatches) || !slices.Equal(creates, wantCreates) || !slices.Equal(deletes, wantDeletes) {
				t.Fatalf("patches %q creates %q deletes %q; want %q %q %q", patches, creates, deletes, wantPatches, wantCreates, wantDeletes)
			}
			var got []string
			for _, r := range fake.Records("ZONE") {
				got = append(got, r.Content)
			}
			want := slices.Clone(tt.set)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("records %v, want %v", got, want)
			}
		})
	}
}

// A record the user proxies stays proxied: kept when it holds a wanted IP
// (no write at all), and still proxied when reused for another IP (PATCH
// leaves "proxied" alone, where PUT would have turned it off).
func TestCloudflareKeepsProxying(t *testing.T) {
	fake := fakecf.New("tok")
	t.Cleanup(fake.Close)
	zid := fake.AddZone("example.com")
	keep := fake.AddRecord(zid, fakecf.Record{Type: "A", Name: "lb.example.com", Content: "192.0.2.1", TTL: 300, Proxied: true})
	reuse := fake.AddRecord(zid, fakecf.Record{Type: "A", Name: "lb.example.com", Content: "192.0.2.9", Proxied: true})
	cf, err := newCloudflare("tok", fake.URL(), "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run finds everything right: no write
		if err := cf.EnsureDNSARecordSet(context.Background(), zid, "lb.example.com", []string{"192.0.2.1", "192.0.2.2"}, 120); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]fakecf.Record{}
	for _, r := range fake.Records(zid) {
		got[r.ID] = r
	}
	if r := got[keep]; !r.Proxied || r.Content != "192.0.2.1" {
		t.Fatalf("kept record %+v", r)
	}
	if r := got[reuse]; !r.Proxied || r.Content != "192.0.2.2" {
		t.Fatalf("reused record %+v: must stay proxied", r)
	}
	writes := 0
	for _, r := range fake.Requests() {
		if r.Method != http.MethodGet {
			writes++
		}
	}
	if writes != 1 {
		t.Fatalf("%d writes, want 1 (the reuse), none for the proxied record of a wanted IP", writes)
	}
}

// Pagination past the server's page cap, Retry-After obeyed, and the
// client-side pace (4 requests a second) measured.
func TestCloudflarePagesRetryAfterAndPace(t *testing.T) {
	fake := fakecf.New("tok")
	t.Cleanup(fake.Close)
	zid := fake.AddZone("example.com")
	fake.SetMaxPerPage(20)
	for i := range 45 {
		fake.AddRecord(zid, fakecf.Record{Type: "A", Name: "lb.example.com", Content: fmt.Sprintf("198.51.100.%d", i), TTL: 60})
	}
	cf, err := newCloudflare("tok", fake.URL(), "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cf.pace.every = 0 // pace measured below on its own
	if err := cf.EnsureDNSARecordSet(context.Background(), zid, "lb.example.com", []string{"198.51.100.0"}, 60); err != nil {
		t.Fatal(err)
	}
	if n := len(fake.Records(zid)); n != 1 {
		t.Fatalf("%d records left, want 1 (all 3 pages read)", n)
	}
	if n := fake.Count(http.MethodGet, "/zones/"+zid+"/dns_records"); n != 3 {
		t.Fatalf("%d list pages read, want 3", n)
	}

	// 429 with Retry-After: 1 is retried after a second, not before.
	fake.AddFault(fakecf.Fault{Method: http.MethodGet, Path: "/zones/", Status: 429, Count: 1, RetryAfter: "1"})
	start := time.Now()
	if err := cf.EnsureDNSARecordSet(context.Background(), zid, "lb.example.com", []string{"198.51.100.0"}, 60); err != nil {
		t.Fatalf("not retried after Retry-After: %v", err)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("retried after %v, Retry-After asked 1s", d)
	}
	// The server's rate limit (429 + Retry-After) is waited out too.
	fake.SetRateLimit(2, time.Second)
	for range 4 {
		if err := cf.EnsureDNSARecordSet(context.Background(), zid, "lb.example.com", []string{"198.51.100.0"}, 60); err != nil {
			t.Fatalf("rate limited call failed: %v", err)
		}
	}
	fake.SetRateLimit(0, 0)

	// Client-side pace: 9 requests at 4 a second take at least 2s.
	cf.pace.every = time.Second / cfRequestsPerSecond
	start = time.Now()
	for range 9 {
		if _, err := cf.do(context.Background(), http.MethodGet, "/zones", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("9 requests took %v: no client-side rate limit", d)
	}
}
