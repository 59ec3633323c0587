package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/godo"
)

// ProviderDigitalOcean is the provider label.
const ProviderDigitalOcean = "digitalocean"

// Defaults of DOConfig.
const (
	DefaultDOAPIURL      = "https://api.digitalocean.com/"
	DefaultDOMetadataURL = "http://169.254.169.254/metadata/v1"
)

// Call labels of the DigitalOcean backend (the call label of the metrics).
const (
	CallGetReservedIP      = "get_reserved_ip"
	CallAssign             = "assign"
	CallGetAction          = "get_action"
	CallMetadataID         = "metadata_id"
	CallMetadataReservedIP = "metadata_reserved_ip"
)

// DOConfig configures the DigitalOcean backend.
type DOConfig struct {
	// Token is the API token (DIGITALOCEAN_ACCESS_TOKEN). When empty it is
	// read from TokenFile (VIPD_DO_TOKEN_FILE), which is read again once
	// when the API answers 401, so a rotated token is picked up.
	Token, TokenFile string
	// APIURL is the API base URL (VIPD_DO_API_URL, default
	// https://api.digitalocean.com/).
	APIURL string
	// MetadataURL is the metadata service base (VIPD_DO_METADATA_URL,
	// default http://169.254.169.254/metadata/v1). Empty string plus a
	// DropletID disables metadata use entirely.
	MetadataURL string
	// DropletID is this droplet (VIPD_DO_DROPLET_ID); 0 reads
	// MetadataURL/id at start-up.
	DropletID int
	// Client: PollInterval is the wait between polls of an in-progress
	// action (default 250ms); LockWait the wait between checks while the IP
	// is locked by an action someone else started.
	Client
}

// DigitalOcean is the reserved-IP backend for DigitalOcean droplets.
type DigitalOcean struct {
	cfg      DOConfig
	client   *godo.Client
	meta     *http.Client
	droplet  int
	api      *caller
	assigner *assigner
	log      *slog.Logger
	now      func() time.Time
}

// NewDigitalOcean reads the token, learns this droplet's id (from the
// metadata service unless cfg.DropletID is set) and returns the backend.
// It makes no API call: use Holder (or Announcer.Prime) to validate the
// token. A missing token is a *SettingError.
func NewDigitalOcean(ctx context.Context, cfg DOConfig) (*DigitalOcean, error) {
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultDOAPIURL
	}
	if !strings.HasSuffix(cfg.APIURL, "/") {
		cfg.APIURL += "/"
	}
	if cfg.MetadataURL == "" && cfg.DropletID == 0 {
		cfg.MetadataURL = DefaultDOMetadataURL
	}
	cfg.MetadataURL = strings.TrimSuffix(cfg.MetadataURL, "/")
	cfg.Client.defaults(250 * time.Millisecond)
	token := &tokenSource{
		token: cfg.Token, file: cfg.TokenFile, envName: "DIGITALOCEAN_ACCESS_TOKEN", fileName: "VIPD_DO_TOKEN_FILE",
		what:  "a DigitalOcean API token",
		needs: "scopes reserved_ip:read, reserved_ip:update, droplet:read, actions:read",
		log:   cfg.Logger.With("provider", ProviderDigitalOcean),
	}
	d := &DigitalOcean{
		cfg:  cfg,
		meta: &http.Client{Transport: cfg.Transport, Timeout: 2 * time.Second},
		log:  cfg.Logger.With("provider", ProviderDigitalOcean),
		now:  cfg.Now,
	}
	api, httpClient, err := newCaller(caller{
		provider: ProviderDigitalOcean, title: "DigitalOcean", metrics: cfg.Metrics, log: d.log, now: cfg.Now,
		describe:         describe,
		unauthorizedHint: "check DIGITALOCEAN_ACCESS_TOKEN or VIPD_DO_TOKEN_FILE",
		forbiddenHint:    "the token lacks a scope vipd needs (reserved_ip:read, reserved_ip:update, droplet:read, actions:read)",
	}, token, cfg.Backoff, cfg.Transport, cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	d.api = api
	d.client, err = godo.New(httpClient, godo.SetBaseURL(cfg.APIURL), godo.SetUserAgent(cfg.UserAgent))
	if err != nil {
		return nil, &SettingError{Name: "VIPD_DO_API_URL", Value: cfg.APIURL, Accepted: "an http(s) URL such as https://api.digitalocean.com/", Err: err}
	}
	cfg.Metrics.init(ProviderDigitalOcean, CallGetReservedIP, CallAssign, CallGetAction, CallMetadataID, CallMetadataReservedIP)
	d.droplet = cfg.DropletID
	if d.droplet == 0 {
		id, err := d.metadataDropletID(ctx)
		if err != nil {
			return nil, err
		}
		d.droplet = id
	}
	d.log = d.log.With("droplet", d.droplet)
	d.assigner = &assigner{
		title: "DigitalOcean", ipNoun: "reserved IP", instNoun: "droplet", instance: strconv.Itoa(d.droplet),
		poll: cfg.PollInterval, lockWait: cfg.LockWait, log: d.log,
	}
	return d, nil
}

// Name implements Provider.
func (d *DigitalOcean) Name() string { return ProviderDigitalOcean }

// Instance implements Provider: the droplet id.
func (d *DigitalOcean) Instance() string { return strconv.Itoa(d.droplet) }

// DropletID is this droplet's id.
func (d *DigitalOcean) DropletID() int { return d.droplet }

// call runs one godo operation through the shared retry loop.
func (d *DigitalOcean) call(ctx context.Context, name string, fn func(context.Context) (*godo.Response, error)) error {
	return d.api.call(ctx, name, func(ctx context.Context) (int, http.Header, error) {
		resp, err := fn(ctx)
		if resp != nil && resp.Response != nil {
			return resp.StatusCode, resp.Header, err
		}
		return 0, nil, err
	})
}

// describe renders an API failure as "HTTP 429: message" or the transport
// error.
func describe(status int, err error) string {
	var er *godo.ErrorResponse
	if errors.As(err, &er) {
		msg := er.Message
		if msg == "" {
			msg = http.StatusText(status)
		}
		return fmt.Sprintf("HTTP %d: %s", status, msg)
	}
	if err == nil {
		return fmt.Sprintf("HTTP %d", status)
	}
	return err.Error()
}

// Holder implements Provider with GET /v2/reserved_ips/{ip}.
func (d *DigitalOcean) Holder(ctx context.Context, ip netip.Addr) (Holding, error) {
	var rip *godo.ReservedIP
	err := d.call(ctx, CallGetReservedIP, func(ctx context.Context) (*godo.Response, error) {
		var resp *godo.Response
		var err error
		rip, resp, err = d.client.ReservedIPs.Get(ctx, ip.String())
		return resp, err
	})
	if errors.Is(err, ErrNotFound) {
		return Holding{}, fmt.Errorf("reserved IP %s is not in this DigitalOcean account (check VIPD_ADDRESS and the token's team): %w", ip, err)
	}
	if err != nil {
		return Holding{}, fmt.Errorf("get reserved IP %s: %w", ip, err)
	}
	if rip == nil {
		return Holding{}, fmt.Errorf("get reserved IP %s: empty answer", ip)
	}
	h := Holding{Locked: rip.Locked}
	if rip.Droplet != nil && rip.Droplet.ID != 0 {
		h.Holder = strconv.Itoa(rip.Droplet.ID)
		h.Self = rip.Droplet.ID == d.droplet
	}
	return h, nil
}

// Assign implements Provider: POST /v2/reserved_ips/{ip}/actions with
// {"type":"assign","droplet_id":N}, then poll the action until it
// completes, through the shared assigner: a 422 while another action holds
// the IP's lock is waited out and retried; an assign of ours still in
// progress from an earlier, timed-out call is resumed instead of starting
// another.
func (d *DigitalOcean) Assign(ctx context.Context, ip netip.Addr) error {
	return d.assigner.assign(ctx, ip, d)
}

func (d *DigitalOcean) startAssign(ctx context.Context, ip netip.Addr) (int64, error) {
	var action *godo.Action
	err := d.call(ctx, CallAssign, func(ctx context.Context) (*godo.Response, error) {
		var resp *godo.Response
		var err error
		action, resp, err = d.client.ReservedIPActions.Assign(ctx, ip.String(), d.droplet)
		return resp, err
	})
	if errors.Is(err, ErrNotFound) {
		return 0, fmt.Errorf("it is not in this DigitalOcean account, or droplet %d is not: %w", d.droplet, err)
	}
	if err != nil || action == nil || action.ID == 0 || action.Status == godo.ActionCompleted {
		return 0, err
	}
	return int64(action.ID), nil
}

func (d *DigitalOcean) actionState(ctx context.Context, ip netip.Addr, id int64) (ActionState, string, error) {
	var a *godo.Action
	err := d.call(ctx, CallGetAction, func(ctx context.Context) (*godo.Response, error) {
		var resp *godo.Response
		var err error
		a, resp, err = d.client.ReservedIPActions.Get(ctx, ip.String(), int(id))
		return resp, err
	})
	switch {
	case err != nil:
		return ActionRunning, "", err
	case a.Status == godo.ActionCompleted:
		return ActionDone, "", nil
	case a.Status == "errored":
		return ActionFailed, "status errored", nil
	}
	return ActionRunning, "", nil
}

// HeldLocally implements LocalChecker with the metadata service:
// reserved_ip/ipv4/active, then reserved_ip/ipv4/ip_address.
func (d *DigitalOcean) HeldLocally(ctx context.Context, ip netip.Addr) (bool, error) {
	if d.cfg.MetadataURL == "" {
		return false, errors.New("no metadata service configured")
	}
	active, err := d.metadataGet(ctx, CallMetadataReservedIP, "/reserved_ip/ipv4/active")
	if err != nil {
		return false, err
	}
	if active != "true" {
		return false, nil
	}
	addr, err := d.metadataGet(ctx, CallMetadataReservedIP, "/reserved_ip/ipv4/ip_address")
	if err != nil {
		return false, err
	}
	return addr == ip.String(), nil
}

// metadataDropletID reads MetadataURL/id, trying a few times: the metadata
// service can lag right after boot.
func (d *DigitalOcean) metadataDropletID(ctx context.Context) (int, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, time.Second); err != nil {
				break
			}
		}
		body, err := d.metadataGet(ctx, CallMetadataID, "/id")
		if err != nil {
			lastErr = err
			continue
		}
		id, err := strconv.Atoi(body)
		if err != nil || id <= 0 {
			lastErr = fmt.Errorf("answer %q is not a droplet id", body)
			continue
		}
		return id, nil
	}
	return 0, fmt.Errorf("read this droplet's id from the metadata service %s/id: %w (set VIPD_DO_DROPLET_ID, or VIPD_DO_METADATA_URL if the service is elsewhere)", d.cfg.MetadataURL, lastErr)
}

// metadataGet fetches one metadata path as trimmed text.
func (d *DigitalOcean) metadataGet(ctx context.Context, call, path string) (string, error) {
	return metadataGet(ctx, d.meta, d.cfg.Metrics, ProviderDigitalOcean, call, d.cfg.MetadataURL+path, d.now)
}
