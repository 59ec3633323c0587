package cloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/hetznercloud/hcloud-go/v2/hcloud/metadata"
)

// ProviderHetzner is the provider label.
const ProviderHetzner = "hetzner"

// Defaults of HetznerConfig.
const (
	DefaultHetznerAPIURL      = "https://api.hetzner.cloud/v1"
	DefaultHetznerMetadataURL = "http://169.254.169.254/hetzner/v1/metadata"
)

// Call labels of the Hetzner backend.
const (
	CallListFloatingIPs   = "list_floating_ips"
	CallGetFloatingIP     = "get_floating_ip"
	CallMetadataInstance  = "metadata_instance_id"
	hetznerMaxPerPage     = 50
	hetznerUnauthorized   = "check HCLOUD_TOKEN or VIPD_HCLOUD_TOKEN_FILE (a project API token with Read & Write)"
	hetznerForbidden      = "the token is read-only: vipd needs a project API token with Read & Write permission"
	hetznerTokenAccepted  = "a Hetzner Cloud project API token with Read & Write permission"
	hetznerFloatingIPHelp = "VIPD_ADDRESS must name floating IPs of the token's project (hcloud floating-ip list), or set VIPD_HCLOUD_FLOATING_IP_ID"
)

// HetznerConfig configures the Hetzner Cloud backend.
type HetznerConfig struct {
	// Token is the project API token (HCLOUD_TOKEN). When empty it is read
	// from TokenFile (VIPD_HCLOUD_TOKEN_FILE), which is read again once
	// when the API answers 401, so a rotated token is picked up.
	Token, TokenFile string
	// APIURL is the API base (VIPD_HCLOUD_API_URL, default
	// https://api.hetzner.cloud/v1).
	APIURL string
	// MetadataURL is the metadata service base (VIPD_HCLOUD_METADATA_URL,
	// default http://169.254.169.254/hetzner/v1/metadata).
	MetadataURL string
	// ServerID is this server (VIPD_HCLOUD_SERVER_ID); 0 reads
	// MetadataURL/instance-id at start-up.
	ServerID int64
	// FloatingIPIDs name the floating IPs by id (VIPD_HCLOUD_FLOATING_IP_ID);
	// VIPs not among them are found by address in the project's list.
	FloatingIPIDs []int64
	// Client: PollInterval is the wait between polls of the assign action
	// (default 500ms, what hcloud-go and the hcloud CLI use); LockWait the
	// wait before trying again after a 423 "locked" (another action on the
	// floating IP is running).
	Client
}

// Hetzner is the floating-IP backend for Hetzner Cloud servers, through
// github.com/hetznercloud/hcloud-go/v2 with its own retries turned off:
// every request goes through the shared caller (one gate per process).
type Hetzner struct {
	cfg      HetznerConfig
	client   *hcloud.Client
	server   int64
	api      *caller
	assigner *assigner
	log      *slog.Logger
	now      func() time.Time

	mu      sync.Mutex
	ids     map[netip.Addr]int64 // floating IP id per address, learned once
	blocked map[netip.Addr]bool  // last seen "blocked" flag (logged on change)
}

// NewHetzner reads the token, learns this server's id (from the metadata
// service unless cfg.ServerID is set) and returns the backend. It makes no
// API call. A missing token is a *SettingError.
func NewHetzner(ctx context.Context, cfg HetznerConfig) (*Hetzner, error) {
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultHetznerAPIURL
	}
	cfg.APIURL = strings.TrimRight(cfg.APIURL, "/")
	if cfg.MetadataURL == "" {
		cfg.MetadataURL = DefaultHetznerMetadataURL
	}
	cfg.MetadataURL = strings.TrimRight(cfg.MetadataURL, "/")
	cfg.Client.defaults(500 * time.Millisecond)
	token := &tokenSource{
		token: cfg.Token, file: cfg.TokenFile, envName: "HCLOUD_TOKEN", fileName: "VIPD_HCLOUD_TOKEN_FILE",
		what: hetznerTokenAccepted, needs: "VIPD_CLOUD_PROVIDER=hetzner needs it",
		log: cfg.Logger.With("provider", ProviderHetzner),
	}
	h := &Hetzner{
		cfg: cfg, now: cfg.Now,
		log: cfg.Logger.With("provider", ProviderHetzner),
		ids: map[netip.Addr]int64{}, blocked: map[netip.Addr]bool{},
	}
	api, httpClient, err := newCaller(caller{
		provider: ProviderHetzner, title: "Hetzner Cloud", metrics: cfg.Metrics, log: h.log, now: cfg.Now,
		describe: describeHcloud, rateWait: hetznerRateWait,
		unauthorizedHint: hetznerUnauthorized, forbiddenHint: hetznerForbidden,
	}, token, cfg.Backoff, cfg.Transport, cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	h.api = api
	app, ver, _ := strings.Cut(cfg.UserAgent, "/")
	h.client = hcloud.NewClient(
		hcloud.WithEndpoint(cfg.APIURL),
		hcloud.WithHTTPClient(httpClient),
		hcloud.WithApplication(app, ver),
		// One retry loop: ours. hcloud-go's own would retry behind the gate.
		hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}),
	)
	cfg.Metrics.init(ProviderHetzner, CallListFloatingIPs, CallGetFloatingIP, CallAssign, CallGetAction, CallMetadataInstance)
	h.server = cfg.ServerID
	if h.server == 0 {
		id, err := h.metadataServerID(ctx)
		if err != nil {
			return nil, err
		}
		h.server = id
	}
	h.log = h.log.With("server", h.server)
	h.api.log = h.log
	h.assigner = &assigner{
		title: "Hetzner Cloud", ipNoun: "floating IP", instNoun: "server", instance: strconv.FormatInt(h.server, 10),
		poll: cfg.PollInterval, lockWait: cfg.LockWait, log: h.log,
	}
	return h, nil
}

// describeHcloud renders a failed answer: "HTTP 401 unauthorized: unable
// to authenticate".
func describeHcloud(status int, err error) string {
	var he hcloud.Error
	if errors.As(err, &he) {
		msg := he.Message
		if msg == "" {
			msg = http.StatusText(status)
		}
		return fmt.Sprintf("HTTP %d %s: %s", status, he.Code, msg)
	}
	if err == nil {
		return fmt.Sprintf("HTTP %d", status)
	}
	if status != 0 {
		return fmt.Sprintf("HTTP %d", status)
	}
	return err.Error()
}

// hetznerRateWait reads a Hetzner 429. Its RateLimit-Reset is when the
// bucket will be FULL again (up to an hour away), while the bucket refills
// steadily (RateLimit-Limit per hour: one request per second by default),
// so the next request is possible after (Reset-now)/(Limit-Remaining), not
// at Reset. Retry-After, when sent, wins if longer.
func hetznerRateWait(hdr http.Header, now time.Time) time.Duration {
	w := retryAfter(hdr, now)
	if hdr == nil {
		return w
	}
	limit, err1 := strconv.Atoi(hdr.Get("RateLimit-Limit"))
	remaining, err2 := strconv.Atoi(hdr.Get("RateLimit-Remaining"))
	reset, err3 := strconv.ParseInt(hdr.Get("RateLimit-Reset"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || limit <= 0 || remaining >= limit {
		return w
	}
	full := time.Unix(reset, 0).Sub(now)
	if full <= 0 {
		return w
	}
	per := time.Duration(math.Ceil(float64(full) / float64(limit-remaining)))
	if per > w {
		w = per
	}
	return w
}

// Name implements Provider.
func (h *Hetzner) Name() string { return ProviderHetzner }

// Instance implements Provider: the server id.
func (h *Hetzner) Instance() string { return strconv.FormatInt(h.server, 10) }

// DeliversToAddress implements AddressDeliverer: Hetzner routes a
// floating IP to its server addressed to the floating IP itself.
func (h *Hetzner) DeliversToAddress() bool { return true }

// IPNoun is the provider's word for the IP, in the announcer's logs.
func (h *Hetzner) IPNoun() string { return "floating IP" }

// ServerID is this server's id.
func (h *Hetzner) ServerID() int64 { return h.server }

// call runs one hcloud-go request through the shared retry loop.
func (h *Hetzner) call(ctx context.Context, name string, fn func(context.Context) (*hcloud.Response, error)) error {
	return h.api.call(ctx, name, func(ctx context.Context) (int, http.Header, error) {
		resp, err := fn(ctx)
		if resp != nil && resp.Response != nil {
			return resp.StatusCode, resp.Header, err
		}
		return 0, nil, err
	})
}

// floatingIP returns the floating IP with address ip, resolving its id
// once: first the configured ids (GET each), then the project's list
// (GET /v1/floating_ips, every page).
func (h *Hetzner) floatingIP(ctx context.Context, ip netip.Addr) (*hcloud.FloatingIP, error) {
	h.mu.Lock()
	id, known := h.ids[ip]
	h.mu.Unlock()
	if known {
		return h.getFloatingIP(ctx, ip, id)
	}
	for _, cid := range h.cfg.FloatingIPIDs {
		fip, err := h.getFloatingIP(ctx, netip.Addr{}, cid)
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("VIPD_HCLOUD_FLOATING_IP_ID=%d: no such floating IP in the token's project: %w", cid, err)
		}
		if err != nil {
			return nil, err
		}
		if a, ok := fipAddr(fip); ok {
			h.remember(a, cid)
			if a == ip {
				return fip, nil
			}
		}
	}
	for page := 1; page > 0; {
		var fips []*hcloud.FloatingIP
		var next int
		err := h.call(ctx, CallListFloatingIPs, func(ctx context.Context) (*hcloud.Response, error) {
			var resp *hcloud.Response
			var err error
			fips, resp, err = h.client.FloatingIP.List(ctx, hcloud.FloatingIPListOpts{ListOpts: hcloud.ListOpts{Page: page, PerPage: hetznerMaxPerPage}})
			if resp != nil && resp.Meta.Pagination != nil {
				next = resp.Meta.Pagination.NextPage
			}
			return resp, err
		})
		if err != nil {
			return nil, err
		}
		for _, f := range fips {
			if a, ok := fipAddr(f); ok {
				h.remember(a, f.ID)
				if a == ip {
					return f, nil
				}
			}
		}
		page = next
	}
	return nil, fmt.Errorf("floating IP %s is not in this Hetzner Cloud project (%s): %w", ip, hetznerFloatingIPHelp, ErrNotFound)
}

// floatingIPRef is the floating IP to act on: only its id matters, so a
// known id costs no request.
func (h *Hetzner) floatingIPRef(ctx context.Context, ip netip.Addr) (*hcloud.FloatingIP, error) {
	h.mu.Lock()
	id, known := h.ids[ip]
	h.mu.Unlock()
	if known {
		return &hcloud.FloatingIP{ID: id}, nil
	}
	return h.floatingIP(ctx, ip)
}

func (h *Hetzner) remember(ip netip.Addr, id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids[ip] = id
}

// fipAddr is the floating IP's address (IPv4 floating IPs only: an IPv6
// one is a /64 network).
func fipAddr(f *hcloud.FloatingIP) (netip.Addr, bool) {
	if f == nil || f.Type != hcloud.FloatingIPTypeIPv4 {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(f.IP)
	return a.Unmap(), ok
}

// getFloatingIP is GET /v1/floating_ips/{id}. want, when valid, is the
// address the id must still have.
func (h *Hetzner) getFloatingIP(ctx context.Context, want netip.Addr, id int64) (*hcloud.FloatingIP, error) {
	var fip *hcloud.FloatingIP
	err := h.call(ctx, CallGetFloatingIP, func(ctx context.Context) (*hcloud.Response, error) {
		var resp *hcloud.Response
		var err error
		fip, resp, err = h.client.FloatingIP.GetByID(ctx, id)
		return resp, err
	})
	if err != nil {
		return nil, fmt.Errorf("floating IP id %d: %w", id, err)
	}
	if fip == nil {
		return nil, fmt.Errorf("floating IP id %d: %w", id, ErrNotFound)
	}
	if want.IsValid() {
		if a, ok := fipAddr(fip); !ok || a != want {
			h.mu.Lock()
			delete(h.ids, want)
			h.mu.Unlock()
			return nil, fmt.Errorf("floating IP %d is no longer %s: %w", id, want, ErrNotFound)
		}
	}
	return fip, nil
}

// Holder implements Provider: the floating IP's server field.
func (h *Hetzner) Holder(ctx context.Context, ip netip.Addr) (Holding, error) {
	fip, err := h.floatingIP(ctx, ip)
	if err != nil {
		return Holding{}, fmt.Errorf("floating IP %s: %w", ip, err)
	}
	var out Holding
	if fip.Server != nil && fip.Server.ID != 0 {
		out.Holder = strconv.FormatInt(fip.Server.ID, 10)
		out.Self = fip.Server.ID == h.server
	}
	h.mu.Lock()
	changed := h.blocked[ip] != fip.Blocked
	h.blocked[ip] = fip.Blocked
	h.mu.Unlock()
	switch {
	case changed && fip.Blocked:
		h.log.Warn("floating IP is blocked by Hetzner (abuse or billing); assigning it will fail", "ip", ip, "id", fip.ID)
	case changed:
		h.log.Info("floating IP is no longer blocked", "ip", ip, "id", fip.ID)
	}
	return out, nil
}

// Assign implements Provider: POST /v1/floating_ips/{id}/actions/assign
// {"server": N}, then poll GET /v1/actions/{id} until success or error,
// through the shared assigner: a 423 "locked" (another action on the IP is
// running) is waited out and retried, unless the IP meanwhile ended up
// here (done) or on another server (that move was most likely another
// node's assign: not undone at once, the election decides); our own action
// still running from an earlier, timed-out call is resumed.
func (h *Hetzner) Assign(ctx context.Context, ip netip.Addr) error {
	return h.assigner.assign(ctx, ip, h)
}

func (h *Hetzner) startAssign(ctx context.Context, ip netip.Addr) (int64, error) {
	fip, err := h.floatingIPRef(ctx, ip)
	if err != nil {
		return 0, err
	}
	var action *hcloud.Action
	err = h.call(ctx, CallAssign, func(ctx context.Context) (*hcloud.Response, error) {
		var resp *hcloud.Response
		var err error
		action, resp, err = h.client.FloatingIP.Assign(ctx, fip, &hcloud.Server{ID: h.server})
		return resp, err
	})
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, fmt.Errorf("server %d is not in the token's project (check VIPD_HCLOUD_SERVER_ID), or the floating IP was deleted: %w", h.server, err)
	case err != nil:
		return 0, err
	case action == nil || action.ID == 0 || action.Status == hcloud.ActionStatusSuccess:
		return 0, nil
	case action.Status == hcloud.ActionStatusError:
		return 0, fmt.Errorf("%w (%s: %s)", ErrActionFailed, action.ErrorCode, action.ErrorMessage)
	}
	return action.ID, nil
}

func (h *Hetzner) actionState(ctx context.Context, _ netip.Addr, id int64) (ActionState, string, error) {
	var a *hcloud.Action
	err := h.call(ctx, CallGetAction, func(ctx context.Context) (*hcloud.Response, error) {
		var resp *hcloud.Response
		var err error
		a, resp, err = h.client.Action.GetByID(ctx, id)
		return resp, err
	})
	switch {
	case err != nil:
		return ActionRunning, "", err
	case a == nil:
		return ActionRunning, "", fmt.Errorf("action %d: %w", id, ErrNotFound)
	case a.Status == hcloud.ActionStatusSuccess:
		return ActionDone, "", nil
	case a.Status == hcloud.ActionStatusError:
		return ActionFailed, a.ErrorCode + ": " + a.ErrorMessage, nil
	}
	return ActionRunning, "", nil
}

// metadataServerID reads MetadataURL/instance-id with hcloud-go's metadata
// client, trying a few times: the service can lag right after boot.
func (h *Hetzner) metadataServerID(ctx context.Context) (int64, error) {
	mc := metadata.NewClient(
		metadata.WithEndpoint(h.cfg.MetadataURL),
		metadata.WithHTTPClient(&http.Client{Transport: h.cfg.Transport}),
		metadata.WithTimeout(2*time.Second),
	)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, time.Second); err != nil {
				break
			}
		}
		start := h.now()
		id, err := mc.InstanceIDWithContext(ctx)
		outcome := OutcomeSuccess
		if err != nil {
			outcome = OutcomeTransport
		}
		h.cfg.Metrics.observe(ProviderHetzner, CallMetadataInstance, outcome, h.now().Sub(start))
		if err == nil && id > 0 {
			return id, nil
		}
		if err == nil {
			err = fmt.Errorf("answer %d is not a server id", id)
		}
		lastErr = err
	}
	return 0, fmt.Errorf("read this server's id from the metadata service %s/instance-id: %w (set VIPD_HCLOUD_SERVER_ID, or VIPD_HCLOUD_METADATA_URL if the service is elsewhere)", h.cfg.MetadataURL, lastErr)
}
