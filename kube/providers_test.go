package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
	// Errors carry Cloudflare's envelope message and classify for retry.
	fake.AddFault(fakecf.Fault{Method: http.MethodGet, Path: "/zones/", Status: 429, Count: 1})
	err = cf.EnsureDNSARecordSet(ctx, zid, "lb.example.com", []string{"192.0.2.1"}, 60)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != 429 || retrySchedule(err) != retryFast {
		t.Fatalf("429: %v", err)
	}
	if err := cf.EnsureDNSARecordSet(ctx, "nosuch.example", "x.nosuch.example", nil, 60); err == nil {
		t.Fatal("unknown zone name accepted")
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
