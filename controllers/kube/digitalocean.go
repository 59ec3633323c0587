package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/godo"
)

// DigitalOcean provides reserved IPs (the /v2/reserved_ips endpoints, not
// the deprecated /v2/floating_ips that FLIPOP calls) and domain records.
type digitalOcean struct {
	client *godo.Client

	mu      sync.Mutex
	actions map[string]pendingAction // reserved IP -> assign action still running
}

type pendingAction struct {
	id      int
	started time.Time
}

// actionTTL bounds how long an assign action is polled before it is
// forgotten and the reserved IP is read directly.
const actionTTL = time.Hour

// doDefaultTTL is the TTL DigitalOcean gives a record created without one.
const doDefaultTTL = 1800

// DefaultDOAPIURL is DigitalOcean's API base URL.
const DefaultDOAPIURL = "https://api.digitalocean.com/"

// newDigitalOcean builds the provider. apiURL "" means DefaultDOAPIURL.
func newDigitalOcean(token, apiURL, userAgent string, timeout time.Duration) (*digitalOcean, error) {
	if token == "" {
		return nil, errors.New("digitalocean: no API token")
	}
	if apiURL == "" {
		apiURL = DefaultDOAPIURL
	}
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	hc := &http.Client{
		Timeout:   timeout,
		Transport: bearerTransport{token: token, base: http.DefaultTransport.(*http.Transport).Clone()},
	}
	c, err := godo.New(hc, godo.SetBaseURL(apiURL), godo.SetUserAgent(userAgent))
	if err != nil {
		return nil, fmt.Errorf("digitalocean client for %q: %w", apiURL, err)
	}
	return &digitalOcean{client: c, actions: map[string]pendingAction{}}, nil
}

// bearerTransport adds the API token to each request.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (t bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}

// doError turns a godo error into an apiError (keeping ErrNotFound for 404).
func doError(what string, resp *godo.Response, err error) error {
	status := 0
	if resp != nil && resp.Response != nil {
		status = resp.StatusCode
	}
	msg := err.Error()
	var er *godo.ErrorResponse
	if errors.As(err, &er) && er.Message != "" {
		msg = er.Message
	}
	ae := &apiError{Provider: ProviderDigitalOcean, Status: status, Message: what + ": " + msg}
	if status == http.StatusNotFound {
		return fmt.Errorf("%w: %w", ErrNotFound, ae)
	}
	return ae
}

func dropletProviderID(id int) string { return "digitalocean://" + strconv.Itoa(id) }

func dropletID(providerID string) (int, error) {
	s, ok := strings.CutPrefix(providerID, "digitalocean://")
	if !ok {
		return 0, fmt.Errorf("provider ID %q is not a DigitalOcean droplet (want digitalocean://<id>)", providerID)
	}
	id, err := strconv.Atoi(s)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("provider ID %q has no droplet number", providerID)
	}
	return id, nil
}

func (d *digitalOcean) pending(ip string) (pendingAction, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.actions[ip]
	if ok && time.Since(a.started) > actionTTL {
		delete(d.actions, ip)
		return a, false
	}
	return a, ok
}

func (d *digitalOcean) setPending(ip string, a *pendingAction) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a == nil {
		delete(d.actions, ip)
		return
	}
	d.actions[ip] = *a
}

// IPToProviderID reads who holds the reserved IP. While an assign action
// this provider started is in progress it returns ErrInProgress.
func (d *digitalOcean) IPToProviderID(ctx context.Context, ip string) (string, error) {
	if a, ok := d.pending(ip); ok {
		act, resp, err := d.client.ReservedIPActions.Get(ctx, ip, a.id)
		switch {
		case err != nil && resp != nil && resp.StatusCode == http.StatusNotFound:
			d.setPending(ip, nil)
		case err != nil:
			return "", doError(fmt.Sprintf("get action %d of reserved IP %s", a.id, ip), resp, err)
		case act.Status == godo.ActionInProgress:
			return "", fmt.Errorf("reserved IP %s: action %d: %w", ip, a.id, ErrInProgress)
		default:
			d.setPending(ip, nil)
			if act.Status != godo.ActionCompleted {
				return "", &apiError{Provider: ProviderDigitalOcean,
					Message: fmt.Sprintf("reserved IP %s: assign action %d ended %q", ip, a.id, act.Status)}
			}
		}
	}
	rip, resp, err := d.client.ReservedIPs.Get(ctx, ip)
	if err != nil {
		return "", doError("get reserved IP "+ip, resp, err)
	}
	if rip.Droplet == nil || rip.Droplet.ID == 0 {
		return "", nil
	}
	return dropletProviderID(rip.Droplet.ID), nil
}

// AssignIP assigns the reserved IP to the droplet, moving it if another
// droplet holds it. It never unassigns.
func (d *digitalOcean) AssignIP(ctx context.Context, ip, providerID string) error {
	id, err := dropletID(providerID)
	if err != nil {
		return err
	}
	if _, busy := d.pending(ip); busy {
		// Finish (or fail) the running action first.
		if _, err := d.IPToProviderID(ctx, ip); err != nil {
			return err
		}
	}
	act, resp, err := d.client.ReservedIPActions.Assign(ctx, ip, id)
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnprocessableEntity {
			// Either the IP is already there, or the droplet holds another one.
			owner, oerr := d.IPToProviderID(ctx, ip)
			if oerr == nil && owner == providerID {
				return nil
			}
			return fmt.Errorf("%w: %w", ErrNodeInUse, doError(fmt.Sprintf("assign reserved IP %s to droplet %d", ip, id), resp, err))
		}
		return doError(fmt.Sprintf("assign reserved IP %s to droplet %d", ip, id), resp, err)
	}
	if act != nil && act.ID != 0 && act.Status != godo.ActionCompleted {
		d.setPending(ip, &pendingAction{id: act.ID, started: time.Now()})
		return fmt.Errorf("assign reserved IP %s to droplet %d: action %d: %w", ip, id, act.ID, ErrInProgress)
	}
	return nil
}

// CreateIP creates a reserved IP in the region.
func (d *digitalOcean) CreateIP(ctx context.Context, region string) (string, error) {
	if region == "" {
		return "", errors.New("digitalocean: creating a reserved IP needs spec.region")
	}
	rip, resp, err := d.client.ReservedIPs.Create(ctx, &godo.ReservedIPCreateRequest{Region: region})
	if err != nil {
		return "", doError("create reserved IP in "+region, resp, err)
	}
	if rip == nil || rip.IP == "" {
		return "", &apiError{Provider: ProviderDigitalOcean, Status: resp.StatusCode, Message: "create reserved IP: empty answer"}
	}
	return rip.IP, nil
}

// RecordNameAndZoneToFQDN: DigitalOcean record names are relative to the
// domain ("www", "@" for the apex).
func (d *digitalOcean) RecordNameAndZoneToFQDN(zone, recordName string) string {
	if recordName == "@" || recordName == "" {
		return zone
	}
	return recordName + "." + zone
}

// EnsureDNSARecordSet makes the A records named recordName (relative, as
// DigitalOcean stores them) in the domain zone exactly ips.
func (d *digitalOcean) EnsureDNSARecordSet(ctx context.Context, zone, recordName string, ips []string, ttl int) error {
	if ttl <= 0 {
		// DigitalOcean stores an omitted TTL as 1800; compare with that,
		// or every pass would "fix" the TTL.
		ttl = doDefaultTTL
	}
	fqdn := d.RecordNameAndZoneToFQDN(zone, recordName)
	var existing []dnsRecord
	opt := &godo.ListOptions{Page: 1, PerPage: 200}
	for {
		recs, resp, err := d.client.Domains.RecordsByTypeAndName(ctx, zone, "A", fqdn, opt)
		if err != nil {
			return doError("list A records of "+fqdn, resp, err)
		}
		for _, r := range recs {
			// The name filter is applied again here: the records carry the
			// relative name.
			if r.Type == "A" && (r.Name == recordName || (recordName == "" && r.Name == "@")) {
				existing = append(existing, dnsRecord{ID: strconv.Itoa(r.ID), IP: r.Data, TTL: r.TTL})
			}
		}
		if resp == nil || resp.Links == nil || resp.Links.IsLastPage() || len(recs) == 0 {
			break
		}
		opt.Page++
	}
	plan := planRecords(existing, ips, ttl)
	name := recordName
	if name == "" {
		name = "@"
	}
	for _, u := range plan.Update {
		id, _ := strconv.Atoi(u.ID)
		_, resp, err := d.client.Domains.EditRecord(ctx, zone, id, &godo.DomainRecordEditRequest{Type: "A", Name: name, Data: u.IP, TTL: ttl})
		if err != nil {
			return doError(fmt.Sprintf("update record %d of %s", id, fqdn), resp, err)
		}
	}
	for _, ip := range plan.Create {
		_, resp, err := d.client.Domains.CreateRecord(ctx, zone, &godo.DomainRecordEditRequest{Type: "A", Name: name, Data: ip, TTL: ttl})
		if err != nil {
			return doError(fmt.Sprintf("create record %s %s", fqdn, ip), resp, err)
		}
	}
	for _, rid := range plan.Delete {
		id, _ := strconv.Atoi(rid)
		resp, err := d.client.Domains.DeleteRecord(ctx, zone, id)
		if err != nil && (resp == nil || resp.StatusCode != http.StatusNotFound) {
			return doError(fmt.Sprintf("delete record %d of %s", id, fqdn), resp, err)
		}
	}
	return nil
}
