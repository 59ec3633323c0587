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
	"strings"
	"sync"
	"time"
)

// cloudflare is a small client for the four Cloudflare v4 DNS record calls
// the controllers need (list, create, update, delete) plus the zone lookup by
// name. It is written here rather than importing cloudflare-go: the
// maintained v6 module is generated for the whole Cloudflare API and is very
// large, and v0 (FLIPOP's) is in maintenance mode; this is ~200 lines and is
// tested against internal/fakecf.
type cloudflare struct {
	base  string // e.g. https://api.cloudflare.com/client/v4 (no trailing slash)
	token string
	ua    string
	http  *http.Client

	mu    sync.Mutex
	zones map[string]string // zone name -> zone ID
}

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
		base:  strings.TrimSuffix(apiURL, "/"),
		token: token,
		ua:    userAgent,
		http:  &http.Client{Timeout: timeout},
		zones: map[string]string{},
	}, nil
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
	ID      string `json:"id,omitempty"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	Content string `json:"content"`
	TTL     int    `json:"ttl"`
	Proxied bool   `json:"proxied"`
}

// do sends one request and decodes the envelope's result into out.
func (c *cloudflare) do(ctx context.Context, method, path string, query url.Values, body, out any) (*cfEnvelope, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("cloudflare: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &apiError{Provider: ProviderCloudflare, Message: fmt.Sprintf("%s %s: %v", method, path, err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, &apiError{Provider: ProviderCloudflare, Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: read answer: %v", method, path, err)}
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
			return nil, fmt.Errorf("%w: %w", ErrNotFound, ae)
		}
		return nil, ae
	}
	if out != nil {
		if err := json.Unmarshal(env.Result, out); err != nil {
			return nil, &apiError{Provider: ProviderCloudflare, Status: resp.StatusCode, Message: fmt.Sprintf("%s %s: decode result: %v", method, path, err)}
		}
	}
	return &env, nil
}

var zoneIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// zoneID accepts a zone ID (FLIPOP's meaning of dnsRecordSet.zone) or, as
// an extension, a zone name, which is looked up once with GET /zones?name=.
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
	for _, z := range zs {
		if z.Name == zone {
			c.mu.Lock()
			c.zones[zone] = z.ID
			c.mu.Unlock()
			return z.ID, nil
		}
	}
	return "", fmt.Errorf("look up zone %q: %w", zone, &apiError{Provider: ProviderCloudflare, Message: "no zone of that name (dnsRecordSet.zone takes a zone ID or a zone name)"})
}

// RecordNameAndZoneToFQDN: with Cloudflare, recordName is the FQDN.
func (c *cloudflare) RecordNameAndZoneToFQDN(_, recordName string) string { return recordName }

// EnsureDNSARecordSet makes the A records named recordName (an FQDN) in the
// zone exactly ips. Records are written with proxied=false (FLIPOP never
// sends it and so re-patches proxied records forever). TTL 0 becomes 1,
// Cloudflare's "automatic".
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
			"type": {"A"}, "name": {recordName}, "page": {fmt.Sprint(page)}, "per_page": {"100"},
		}, nil, &recs)
		if err != nil {
			return fmt.Errorf("list A records of %s: %w", recordName, err)
		}
		for _, r := range recs {
			if r.Type == "A" && strings.EqualFold(r.Name, recordName) {
				existing = append(existing, dnsRecord{ID: r.ID, IP: r.Content, TTL: r.TTL, Proxied: r.Proxied})
			}
		}
		if env.ResultInfo == nil || env.ResultInfo.Page >= env.ResultInfo.TotalPages || len(recs) == 0 {
			break
		}
	}
	plan := planRecords(existing, ips, ttl)
	for _, u := range plan.Update {
		rec := cfRecord{Type: "A", Name: recordName, Content: u.IP, TTL: ttl}
		if _, err := c.do(ctx, http.MethodPut, path+"/"+url.PathEscape(u.ID), nil, rec, nil); err != nil {
			return fmt.Errorf("update record %s of %s: %w", u.ID, recordName, err)
		}
	}
	for _, ip := range plan.Create {
		rec := cfRecord{Type: "A", Name: recordName, Content: ip, TTL: ttl}
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
