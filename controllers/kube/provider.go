package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Provider errors the controllers act on. Providers wrap them.
var (
	// ErrNotFound: the reserved IP (or the record) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInProgress: an assignment was accepted and has not completed yet.
	ErrInProgress = errors.New("in progress")
	// ErrNodeInUse: the target droplet already holds another reserved IP.
	ErrNodeInUse = errors.New("droplet already has a reserved IP")
)

// IPProvider moves reserved IPs between nodes. Provider IDs are the nodes'
// spec.providerID values ("digitalocean://123").
type IPProvider interface {
	// IPToProviderID returns the provider ID the IP is assigned to, "" when
	// it is unassigned, ErrNotFound, or ErrInProgress while an assignment
	// this provider started is still running.
	IPToProviderID(ctx context.Context, ip string) (string, error)
	// AssignIP assigns (or moves) the IP to the node. It may return
	// ErrInProgress, which is success still to be verified.
	AssignIP(ctx context.Context, ip, providerID string) error
	// CreateIP creates a new reserved IP in the region.
	CreateIP(ctx context.Context, region string) (string, error)
}

// DNSProvider keeps A record sets.
type DNSProvider interface {
	// EnsureDNSARecordSet makes the A records of recordName in zone exactly
	// ips (none left when ips is empty), with the TTL.
	EnsureDNSARecordSet(ctx context.Context, zone, recordName string, ips []string, ttl int) error
	// RecordNameAndZoneToFQDN names the record set for logs and the "dns"
	// metric label.
	RecordNameAndZoneToFQDN(zone, recordName string) string
}

// Provider names accepted in the CRDs.
const (
	ProviderDigitalOcean = "digitalocean"
	ProviderCloudflare   = "cloudflare"
)

// providers holds the configured providers by name.
type providers struct {
	ip  map[string]IPProvider
	dns map[string]DNSProvider
}

func (p providers) known(name string) bool {
	_, ip := p.ip[name]
	_, dns := p.dns[name]
	return ip || dns
}

func (p providers) names() []string {
	seen := map[string]bool{}
	for n := range p.ip {
		seen[n] = true
	}
	for n := range p.dns {
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// apiError is a failed provider HTTP call.
type apiError struct {
	Provider string
	Status   int // 0 when the request did not get an answer
	Message  string
}

func (e *apiError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s: %s", e.Provider, e.Message)
	}
	return fmt.Sprintf("%s: HTTP %d: %s", e.Provider, e.Status, e.Message)
}

// retrySchedule picks the backoff ladder for an error: things expected to
// clear by themselves (in progress, 408/429/5xx, network errors) retry fast,
// the rest (not found, bad requests, permissions) slowly.
func retrySchedule(err error) schedule {
	if errors.Is(err, ErrInProgress) {
		return retryFast
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNodeInUse) {
		return retrySlow
	}
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.Status == 0 || ae.Status == http.StatusRequestTimeout ||
			ae.Status == http.StatusTooManyRequests || ae.Status >= 500 {
			return retryFast
		}
		return retrySlow
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return retryFast
	}
	return retrySlow
}

// objectRef names the custom resource a provider call is made for; it labels
// the provider call metrics like FLIPOP's metacontext does.
type objectRef struct{ kind, namespace, name string }

type objectRefKey struct{}

func withObject(ctx context.Context, ref objectRef) context.Context {
	return context.WithValue(ctx, objectRefKey{}, ref)
}

func objectFrom(ctx context.Context) objectRef {
	ref, _ := ctx.Value(objectRefKey{}).(objectRef)
	return ref
}

// providerMetrics are FLIPOP's provider call metrics (which FLIPOP forgets
// to wire for DigitalOcean): flipop_providers_calls_total and
// flipop_providers_call_duration_seconds.
type providerMetrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newProviderMetrics() *providerMetrics {
	return &providerMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "flipop", Subsystem: "providers", Name: "calls_total",
			Help: "Provider API calls by provider, call and outcome (success or error).",
		}, []string{"provider", "call", "outcome", "kind", "namespace", "name"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "flipop", Subsystem: "providers", Name: "call_duration_seconds",
			Help:    "Provider API call latency.",
			Buckets: prometheus.DefBuckets,
		}, []string{"provider", "call", "kind", "namespace", "name"}),
	}
}

func (m *providerMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.calls.Describe(ch)
	m.duration.Describe(ch)
}

func (m *providerMetrics) Collect(ch chan<- prometheus.Metric) {
	m.calls.Collect(ch)
	m.duration.Collect(ch)
}

func (m *providerMetrics) observe(ctx context.Context, provider, call string, start time.Time, err error) {
	ref := objectFrom(ctx)
	outcome := "success"
	if err != nil && !errors.Is(err, ErrInProgress) {
		outcome = "error"
	}
	m.calls.WithLabelValues(provider, call, outcome, ref.kind, ref.namespace, ref.name).Inc()
	m.duration.WithLabelValues(provider, call, ref.kind, ref.namespace, ref.name).Observe(time.Since(start).Seconds())
}

// instrumentedIP records every call of an IPProvider.
type instrumentedIP struct {
	name    string
	inner   IPProvider
	metrics *providerMetrics
}

func (p instrumentedIP) IPToProviderID(ctx context.Context, ip string) (string, error) {
	start := time.Now()
	id, err := p.inner.IPToProviderID(ctx, ip)
	p.metrics.observe(ctx, p.name, "IPToProviderID", start, err)
	return id, err
}

func (p instrumentedIP) AssignIP(ctx context.Context, ip, providerID string) error {
	start := time.Now()
	err := p.inner.AssignIP(ctx, ip, providerID)
	p.metrics.observe(ctx, p.name, "AssignIP", start, err)
	return err
}

func (p instrumentedIP) CreateIP(ctx context.Context, region string) (string, error) {
	start := time.Now()
	ip, err := p.inner.CreateIP(ctx, region)
	p.metrics.observe(ctx, p.name, "CreateIP", start, err)
	return ip, err
}

// instrumentedDNS records every call of a DNSProvider.
type instrumentedDNS struct {
	name    string
	inner   DNSProvider
	metrics *providerMetrics
}

func (p instrumentedDNS) EnsureDNSARecordSet(ctx context.Context, zone, recordName string, ips []string, ttl int) error {
	start := time.Now()
	err := p.inner.EnsureDNSARecordSet(ctx, zone, recordName, ips, ttl)
	p.metrics.observe(ctx, p.name, "EnsureDNSARecordSet", start, err)
	return err
}

func (p instrumentedDNS) RecordNameAndZoneToFQDN(zone, recordName string) string {
	return p.inner.RecordNameAndZoneToFQDN(zone, recordName)
}

// dnsRecord is one existing A record at a provider.
type dnsRecord struct {
	ID      string
	IP      string
	TTL     int
	Proxied bool // Cloudflare only: left as it is
}

// recordPlan is what EnsureDNSARecordSet must do to turn existing records
// into the wanted set.
type recordPlan struct {
	Update []dnsRecord // records to overwrite (ID kept, IP and TTL wanted)
	Create []string    // IPs to create records for
	Delete []string    // record IDs to delete
}

// planRecords compares existing records with the wanted IPs. A record for a
// wanted IP is kept when its TTL is right or it is proxied (Cloudflare's TTL
// of a proxied record is "automatic"; its proxying is the user's choice),
// otherwise updated; duplicates and records of unwanted IPs are reused for missing IPs
// (one update instead of a delete and a create) and deleted when left over.
func planRecords(existing []dnsRecord, want []string, ttl int) recordPlan {
	wanted := map[string]bool{}
	for _, ip := range want {
		wanted[ip] = true
	}
	covered := map[string]bool{}
	var spare []dnsRecord
	var plan recordPlan
	for _, r := range existing {
		if !wanted[r.IP] || covered[r.IP] {
			spare = append(spare, r)
			continue
		}
		covered[r.IP] = true
		if r.TTL != ttl && !r.Proxied {
			plan.Update = append(plan.Update, dnsRecord{ID: r.ID, IP: r.IP, TTL: ttl})
		}
	}
	for _, ip := range want {
		if covered[ip] {
			continue
		}
		covered[ip] = true
		if len(spare) > 0 {
			plan.Update = append(plan.Update, dnsRecord{ID: spare[0].ID, IP: ip, TTL: ttl})
			spare = spare[1:]
			continue
		}
		plan.Create = append(plan.Create, ip)
	}
	for _, r := range spare {
		plan.Delete = append(plan.Delete, r.ID)
	}
	return plan
}
