package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/retryafter"
)

// cloudflare is a small client for the four Cloudflare v4 DNS record calls
// the controllers need (list, create, update, delete) plus the zone lookup by
// name. It is written here rather than importing cloudflare-go: the
// maintained v6 module is generated for the whole Cloudflare API and is very
// large, and v0 (FLIPOP's) is in maintenance mode; this is ~300 lines and is
// tested against internal/fakecf. It behaves like FLIPOP's cloudflare-go
// v0 client where users can see it: updates are PATCHes without "proxied"
// (a proxied record stays proxied), lists follow every page, requests are
// paced client-side (4 per second) and 429/5xx answers are retried (3
// times), waiting as long as Retry-After asks.
type cloudflare struct {
	base  string // e.g. https://api.cloudflare.com/client/v4 (no trailing slash)
	token string
	ua    string
	http  *http.Client
	pace  *pacer
	// retries after a 429 or 5xx; backoff is the wait before retry n
	// (doubling) when the answer has no Retry-After.
	retries int
	backoff time.Duration

	mu    sync.Mutex
	zones map[string]string // dnsRecordSet.zone -> zone ID
}

// Cloudflare client defaults, cloudflare-go v0's (FLIPOP's client).
const (
	cfRequestsPerSecond = 4
	cfRetries           = 3
	cfRetryBackoff      = time.Second
	cfMaxRetryAfter     = 5 * time.Minute
	cfPageSize          = 100
)

// DefaultCloudflareAPIURL is Cloudflare's v4 API base URL.
const DefaultCloudflareAPIURL = "https://api.cloudflare.com/client/v4"

func newCloudflare(token, apiURL, userAgent string, timeout time.Duration) (*cloudflare, error) {
	if token == "" {
		return nil, errors.New("cloudflare: no API token")
	}
	if apiURL == "" {
		apiURL = DefaultCloudflareAPIURL
	}
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("cloudflare API URL %q: want an http(s) URL such as %s", apiURL, DefaultCloudflareAPIURL)
	}
	return &cloudflare{
		base:    strings.TrimSuffix(apiURL, "/"),
		token:   token,
		ua:      userAgent,
		http:    &http.Client{Timeout: timeout},
		pace:    &pacer{every: time.Second / cfRequestsPerSecond},
		retries: cfRetries,
		backoff: cfRetryBackoff,
		zones:   map[string]string{},
	}, nil
}

// pacer spaces requests every interval (a client-side rate limit shared by
// every call of the client) and lets a Retry-After push everyone back.
type pacer struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

// wait blocks until the caller may send, or ctx ends.
func (p *pacer) wait(ctx context.Context) error {
	p.mu.Lock()
	now := time.Now()
	at := p.next
	if at.Before(now) {
		at = now
	}
	p.next = at.Add(p.every)
	p.mu.Unlock()
	return sleepCtx(ctx, time.Until(at))
}

// holdUntil delays every request until t.
func (p *pacer) holdUntil(t time.Time) {
	p.mu.Lock()
	if t.After(p.next) {
		p.next = t
	}
	p.mu.Unlock()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryAfter parses a Retry-After header (seconds or an HTTP date),
// capped at cfMaxRetryAfter.
func retryAfter(h string, now time.Time) (time.Duration, bool) {
	d, ok := retryafter.Parse(h, now)
	return min(d, cfMaxRetryAfter), ok
}

type cfEnvelope struct {
	Success    bool            `json:"success"`
	Errors     []cfMessage     `json:"errors"`
	Result     json.RawMessage `json:"result"`
	ResultInfo *struct {
		Page       int `json:"page"`
		TotalPages int `json:"total_pages"`
	} `json:"result_info"`
}

type cfMessage struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type cfRecord struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	Content string `json:"content"`
	TTL     int    `json:"ttl"`
	Proxied *bool  `json:"proxied"`
}

// cfWrite is the body of a create or update: FLIPOP's fields, "proxied"
// never sent, so Cloudflare keeps (PATCH) or defaults (POST) it.
type cfWrite struct {
	Type    string `json:"type"`
	Name    string `json:"name"`
	Content string `json:"content"`
	TTL     int    `json:"ttl"`
}

// do sends one request, retrying 429 and 5xx answers (POST only on 429,
// which Cloudflare did not act on), and decodes the envelope's result into
// out.
func (c *cloudflare) do(ctx context.Context, method, path string, query url.Values, body, out any) (*cfEnvelope, error) {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("cloudflare: encode request: %w", err)
		}
		payload = b
	}
	for attempt := 0; ; attempt++ {
		env, wait, err := c.once(ctx, method, path, query, payload, out)
		var ae *apiError
		if err == nil || attempt >= c.retries || !errors.As(err, &ae) {
			return env, err
		}
		retriable := ae.Status == http.StatusTooManyRequests || (ae.Status >= 500 && method != http.MethodPost)
		if !retriable {
			return env, err
		}
		if wait < 0 {
			wait = c.backoff << attempt
		}
		c.pace.holdUntil(time.Now().Add(wait))
		if serr := sleepCtx(ctx, wait); serr != nil {
			return nil, err
		}
	}
}

// once sends one request. wait is the Retry-After of a failed answer, -1
// when it had none.
func (c *cloudflare) once(ctx context.Context, method, path string, query url.Values, payload []byte, out any) (*cfEnvelope, time.Duration, error) {
	if err := c.pace.wait(ctx); err != nil {
		return nil, -1, err
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, -1, fmt.Errorf("cloudflare: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, -1, &apiError{Provider: ProviderCloudflare, Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	defer resp.Body.Close()
	wait := time.Duration(-1)
	if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		wait = d
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, wait, &apiError{Provider: ProviderCloudflare, Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: read answer: %v", method, path, err)}
	}
	var env cfEnvelope
	if jerr := json.Unmarshal(data, &env); jerr != nil || resp.StatusCode >= 300 || !env.Success {
		msg := strings.TrimSpace(string(data))
		if jerr == nil && len(env.Errors) > 0 {
			parts := make([]string, 0, len(env.Errors))
			for _, e := range env.Errors {
				parts = append(parts, fmt.Sprintf("%d %s", e.Code, e.Message))
			}
			msg = strings.Join(parts, "; ")
		}
		if len(msg) > 300 {
			msg = msg[:300]
		}
		ae := &apiError{Provider: ProviderCloudflare, Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: %s", method, path, msg)}
		if resp.StatusCode == http.StatusNotFound {
			return nil, wait, fmt.Errorf("%w: %w", ErrNotFound, ae)
		}
		return nil, wait, ae
	}
	if out != nil {
		if err := json.Unmarshal(env.Result, out); err != nil {
			return nil, wait, &apiError{Provider: ProviderCloudflare, Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: decode result: %v", method, path, err)}
		}
	}
	return &env, wait, nil
}

var zoneIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// zoneID resolves dnsRecordSet.zone. FLIPOP passes it to Cloudflare as a
// zone ID; vipd also accepts a zone name: a value that is not 32 hex digits
// is looked up once with GET /zones?name=, and used as a zone ID as it is
// when no zone has that name (FLIPOP's meaning).
func (c *cloudflare) zoneID(ctx context.Context, zone string) (string, error) {
	if zoneIDPattern.MatchString(zone) {
		return zone, nil
	}
	c.mu.Lock()
	id, ok := c.zones[zone]
	c.mu.Unlock()
	if ok {
		return id, nil
	}
	var zs []struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/zones", url.Values{"name": {zone}}, nil, &zs); err != nil {
		return "", fmt.Errorf("look up zone %q: %w", zone, err)
	}
	id = zone
	for _, z := range zs {
		if strings.EqualFold(z.Name, zone) {
			id = z.ID
			break
		}
	}
	c.mu.Lock()
	c.zones[zone] = id
	c.mu.Unlock()
	return id, nil
}

// RecordNameAndZoneToFQDN: with Cloudflare, recordName is the FQDN.
func (c *cloudflare) RecordNameAndZoneToFQDN(_, recordName string) string { return recordName }

// EnsureDNSARecordSet makes the A records named recordName (an FQDN) in the
// zone exactly ips. Records are changed with PATCH and never told whether
// to be proxied: a record the user proxies stays proxied (and, its TTL
// being Cloudflare's "automatic" then, is left alone when it holds a wanted
// IP). TTL 0 becomes 1, Cloudflare's "automatic".
func (c *cloudflare) EnsureDNSARecordSet(ctx context.Context, zone, recordName string, ips []string, ttl int) error {
	if ttl <= 0 {
		ttl = 1
	}
	zid, err := c.zoneID(ctx, zone)
	if err != nil {
		return err
	}
	path := "/zones/" + url.PathEscape(zid) + "/dns_records"
	var existing []dnsRecord
	for page := 1; ; page++ {
		var recs []cfRecord
		env, err := c.do(ctx, http.MethodGet, path, url.Values{
			"type": {"A"}, "name": {recordName}, "page": {strconv.Itoa(page)}, "per_page": {strconv.Itoa(cfPageSize)},
		}, nil, &recs)
		if err != nil {
			return fmt.Errorf("list A records of %s: %w", recordName, err)
		}
		for _, r := range recs {
			if r.Type == "A" && strings.EqualFold(r.Name, recordName) {
				existing = append(existing, dnsRecord{ID: r.ID, IP: r.Content, TTL: r.TTL, Proxied: r.Proxied != nil && *r.Proxied})
			}
		}
		if env.ResultInfo == nil || env.ResultInfo.Page >= env.ResultInfo.TotalPages || len(recs) == 0 {
			break
		}
	}
	plan := planRecords(existing, ips, ttl)
	for _, u := range plan.Update {
		rec := cfWrite{Type: "A", Name: recordName, Content: u.IP, TTL: ttl}
		if _, err := c.do(ctx, http.MethodPatch, path+"/"+url.PathEscape(u.ID), nil, rec, nil); err != nil {
			return fmt.Errorf("update record %s of %s: %w", u.ID, recordName, err)
		}
	}
	for _, ip := range plan.Create {
		rec := cfWrite{Type: "A", Name: recordName, Content: ip, TTL: ttl}
		if _, err := c.do(ctx, http.MethodPost, path, nil, rec, nil); err != nil {
			return fmt.Errorf("create record %s %s: %w", recordName, ip, err)
		}
	}
	for _, id := range plan.Delete {
		if _, err := c.do(ctx, http.MethodDelete, path+"/"+url.PathEscape(id), nil, nil, nil); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("delete record %s of %s: %w", id, recordName, err)
		}
	}
	return nil
}
