package cloud

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// caller is the one retry loop every backend's API calls go through: it
// spaces calls with the client's gate, retries 429, 5xx, 409 and transport
// errors with backoff until the call succeeds, fails for good, or the
// caller's deadline would pass before the next attempt; counts and times
// each HTTP request; re-reads a token file once after a 401; and turns a
// final failure into an error wrapping one of the package's sentinels.
// A backend supplies what is its own: the provider label, how to describe
// an SDK error, and the hints that name its settings.
type caller struct {
	provider string // metrics label, "digitalocean"
	title    string // in messages, "DigitalOcean"
	gate     *gate
	metrics  *Metrics
	log      *slog.Logger
	now      func() time.Time
	// reload re-reads the token file after a 401 and reports whether the
	// token changed (nil: never).
	reload func() bool
	// describe renders a failed answer as "HTTP 401: message".
	describe func(status int, err error) string
	// rateWait, when set, reads how long a 429 asks us to wait from the
	// answer's headers instead of the default (the later of Retry-After and
	// RateLimit-Reset), for providers whose RateLimit-Reset means something
	// else.
	rateWait func(h http.Header, now time.Time) time.Duration
	// unauthorizedHint and forbiddenHint end the message of a 401 and a
	// 403 (which settings to check, which scope is missing).
	unauthorizedHint, forbiddenHint string
}

// call runs one API request. fn performs it and returns the HTTP status
// (0 when no answer arrived), the answer's headers and the SDK's error.
func (c *caller) call(ctx context.Context, name string, fn func(context.Context) (int, http.Header, error)) error {
	reloaded := false
	for {
		if err := c.gate.waitGate(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		start := c.now()
		status, header, err := fn(ctx)
		v := classify(status, header, err, ctx.Err(), c.now())
		if v.outcome == OutcomeRateLimited && c.rateWait != nil {
			v.wait = c.rateWait(header, c.now())
		}
		c.metrics.observe(c.provider, name, v.outcome, c.now().Sub(start))
		switch {
		case v.outcome == OutcomeSuccess:
			c.gate.succeeded()
			// The answer spent the last request of the bucket: the next
			// call waits for one to come back instead of earning a 429.
			if c.rateWait != nil && header.Get("RateLimit-Remaining") == "0" {
				c.gate.hold(c.rateWait(header, c.now()))
			}
			return nil
		case v.outcome == OutcomeCanceled:
			return fmt.Errorf("%s: %w", name, errors.Join(ctx.Err(), err))
		case v.retry:
			kind := ErrUnavailable
			if v.outcome == OutcomeRateLimited {
				kind = ErrRateLimited
			}
			wrapped := fmt.Errorf("%w: %s", kind, c.describe(status, err))
			wait := c.gate.failed(v, wrapped)
			c.log.Warn(c.title+" API call failed; backing off", "call", name, "outcome", v.outcome,
				"status", status, "retry_in", wait.Round(time.Millisecond), "err", c.describe(status, err))
			continue
		case v.outcome == OutcomeUnauthorized:
			if !reloaded && c.reload != nil && c.reload() {
				reloaded = true
				continue
			}
			if status == http.StatusForbidden {
				return fmt.Errorf("%s: %w: %s answered %s: %s", name, ErrUnauthorized, c.title, c.describe(status, err), c.forbiddenHint)
			}
			return fmt.Errorf("%s: %w: %s answered %s: %s", name, ErrUnauthorized, c.title, c.describe(status, err), c.unauthorizedHint)
		case v.outcome == OutcomeNotFound:
			return fmt.Errorf("%s: %w (%s)", name, ErrNotFound, c.describe(status, err))
		case v.outcome == OutcomeUnprocessable:
			return fmt.Errorf("%s: %w (%s)", name, ErrRefused, c.describe(status, err))
		case v.outcome == OutcomeLocked:
			return fmt.Errorf("%s: %w (%s)", name, ErrLocked, c.describe(status, err))
		default:
			return fmt.Errorf("%s: %s", name, c.describe(status, err))
		}
	}
}

// ActionState is what one poll of a provider action says.
type ActionState int

// The states of an action.
const (
	ActionRunning ActionState = iota
	ActionDone
	ActionFailed
)

// pollAction polls an action every interval (first poll after one
// interval) until get reports it done or failed, or ctx ends. get returns
// the state and, for a failed action, the provider's reason. A failed
// action is an error wrapping ErrActionFailed.
func pollAction(ctx context.Context, interval time.Duration, what string, get func(context.Context) (ActionState, string, error)) error {
	for {
		if err := sleep(ctx, interval); err != nil {
			return fmt.Errorf("%s still in progress: %w", what, err)
		}
		st, reason, err := get(ctx)
		if err != nil {
			return fmt.Errorf("poll %s: %w", what, err)
		}
		switch st {
		case ActionDone:
			return nil
		case ActionFailed:
			return fmt.Errorf("%s: %w (%s)", what, ErrActionFailed, reason)
		}
	}
}

// pendingActions remembers this node's own assign action still in
// progress per IP, so an acquire that timed out is resumed by the next one
// instead of starting a second action.
type pendingActions struct {
	mu sync.Mutex
	m  map[string]int64
}

func (p *pendingActions) get(ip string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[ip]
}

func (p *pendingActions) set(ip string, id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id == 0 {
		delete(p.m, ip)
		return
	}
	if p.m == nil {
		p.m = map[string]int64{}
	}
	p.m[ip] = id
}

// metadataGet fetches one metadata URL as trimmed text, counted under
// provider and call. Metadata services are link-local and free: no gate,
// no retries here.
func metadataGet(ctx context.Context, client *http.Client, m *Metrics, provider, call, url string, now func() time.Time) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	start := now()
	resp, err := client.Do(req)
	if err != nil {
		m.observe(provider, call, OutcomeTransport, now().Sub(start))
		return "", fmt.Errorf("metadata %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	v := classify(resp.StatusCode, resp.Header, err, ctx.Err(), now())
	m.observe(provider, call, v.outcome, now().Sub(start))
	if err != nil {
		return "", fmt.Errorf("metadata %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metadata %s: HTTP %d", url, resp.StatusCode)
	}
	return strings.TrimSpace(string(body)), nil
}

// Client are the API client's settings every backend's configuration
// has.
type Client struct {
	// UserAgent sent to the API (default "vipd").
	UserAgent string
	// RequestTimeout bounds one HTTP request (default 10s).
	RequestTimeout time.Duration
	// PollInterval is the wait between polls of an assign action (default:
	// the backend's own).
	PollInterval time.Duration
	// LockWait is the wait before trying again while another action holds
	// the IP (default 1s).
	LockWait time.Duration
	// Backoff shapes waits after 429, 5xx and transport errors.
	Backoff Backoff
	Logger  *slog.Logger
	Metrics *Metrics
	// Transport is the HTTP transport (default a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// defaults fills what is unset; poll is the backend's poll interval.
func (c *Client) defaults(poll time.Duration) {
	if c.UserAgent == "" {
		c.UserAgent = "vipd"
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.PollInterval <= 0 {
		c.PollInterval = poll
	}
	if c.LockWait <= 0 {
		c.LockWait = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Transport == nil {
		c.Transport = http.DefaultTransport.(*http.Transport).Clone()
	}
}

// newCaller loads the token and returns the backend's caller (c, given its
// own provider, title, metrics, log, clock, describe and hints, with a gate
// shaped by b and the token's reload) and the HTTP client its SDK sends the
// token with.
func newCaller(c caller, token *tokenSource, b Backoff, transport http.RoundTripper, timeout time.Duration) (*caller, *http.Client, error) {
	if err := token.load(); err != nil {
		return nil, nil, err
	}
	c.gate = newGate(b, c.now)
	c.reload = token.reload
	return &c, &http.Client{Transport: &bearer{src: token, next: transport}, Timeout: timeout}, nil
}
