package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the configuration contract (DESIGN.md section 5).
const (
	DefaultURL           = "https://127.0.0.1:6443/livez"
	DefaultInterval      = time.Second
	DefaultTimeout       = 3 * time.Second
	DefaultFailThreshold = 3
	DefaultRiseThreshold = 1
	DefaultTokenPath     = "/var/run/secrets/kubernetes.io/serviceaccount/token"
)

// Reasons label every probe outcome; they are the values of the result
// label of vipd_health_checks_total and must stay stable.
const (
	ReasonOK           = "ok"           // 200, or 401 without a token
	ReasonUnauthorized = "unauthorized" // 401 although a token was sent
	ReasonForbidden    = "forbidden"    // 403
	ReasonHTTP5xx      = "http_5xx"     // any 5xx status
	ReasonHTTPOther    = "http_other"   // any other status, redirects included
	ReasonRefused      = "refused"      // connection refused
	ReasonTimeout      = "timeout"      // no complete answer within the timeout
	ReasonTLS          = "tls"          // handshake or certificate failure
	ReasonError        = "error"        // anything else: garbage, resets, ...
)

var reasons = []string{
	ReasonOK, ReasonUnauthorized, ReasonForbidden, ReasonHTTP5xx, ReasonHTTPOther,
	ReasonRefused, ReasonTimeout, ReasonTLS, ReasonError,
}

// Config configures a Checker. Zero URL, Interval, Timeout and thresholds
// take the defaults above; an empty TokenPath means "never send a token" and
// an empty CAFile means "skip verification, loopback hosts only".
type Config struct {
	URL           string        // VIPD_HEALTH_URL
	Interval      time.Duration // VIPD_HEALTH_INTERVAL
	Timeout       time.Duration // VIPD_HEALTH_TIMEOUT
	FailThreshold int           // VIPD_FAIL_THRESHOLD
	RiseThreshold int           // VIPD_RISE_THRESHOLD
	TokenPath     string        // VIPD_SA_TOKEN_PATH
	CAFile        string        // VIPD_HEALTH_CA_FILE
}

// Clock tells the time. The token cache reads it, so tests can move time.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Option adjusts a Checker at construction.
type Option func(*Checker)

// WithClock replaces the wall clock used for the token cache and for the
// times in Status and Result.
func WithClock(c Clock) Option { return func(k *Checker) { k.clock = c } }

// Result is the outcome of one probe, before thresholds.
type Result struct {
	OK       bool          // the probe succeeded (Reason == ReasonOK)
	Reason   string        // one of the Reason constants
	Code     int           // HTTP status, 0 when there was no answer
	Err      error         // what went wrong; nil when OK
	Duration time.Duration // wall time of the probe
	Checked  time.Time     // when the probe finished (Checker's clock)
}

// Status is the checker's view after thresholds.
type Status struct {
	Healthy     bool
	Reason      string    // last probe's reason, "" before the first probe
	Code        int       // last probe's HTTP status, or 0
	Error       string    // last probe's error text, "" when it succeeded
	Checked     time.Time // when the last probe finished
	Since       time.Time // when Healthy last changed (creation time at first)
	Consecutive int       // probes in a row with the last probe's outcome
}

// Checker probes the apiserver. Probe, Status and Run are safe for
// concurrent use, but only one Run should be active.
type Checker struct {
	cfg     Config
	logger  *slog.Logger
	clock   Clock
	client  *http.Client
	token   *tokenSource
	metrics *metrics

	mu      sync.Mutex
	tracker *Tracker
	status  Status
}

// NewChecker validates cfg and builds a Checker. Metrics are registered
// into reg unless it is nil. Errors name the setting at fault.
func NewChecker(cfg Config, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Checker, error) {
	cfg = withDefaults(cfg)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Checker{cfg: cfg, logger: logger, clock: systemClock{}}
	for _, o := range opts {
		o(c)
	}
	tlsConf, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	c.client = &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil, // never send the probe through a proxy
			DialContext:            (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			TLSClientConfig:        tlsConf,
			TLSHandshakeTimeout:    cfg.Timeout,
			ResponseHeaderTimeout:  cfg.Timeout,
			DisableKeepAlives:      true, // a fresh connection per probe sees a dead apiserver
			MaxResponseHeaderBytes: 64 << 10,
		},
		// A redirect is an answer in its own right (http_other), not
		// something to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c.token = &tokenSource{path: cfg.TokenPath, clock: c.clock, logger: logger}
	if c.metrics, err = newMetrics(reg); err != nil {
		return nil, err
	}
	now := c.clock.Now()
	c.tracker = NewTracker(cfg.FailThreshold, cfg.RiseThreshold, now)
	c.status = Status{Since: now}
	c.metrics.setUp(false)
	return c, nil
}

func withDefaults(cfg Config) Config {
	if cfg.URL == "" {
		cfg.URL = DefaultURL
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.FailThreshold == 0 {
		cfg.FailThreshold = DefaultFailThreshold
	}
	if cfg.RiseThreshold == 0 {
		cfg.RiseThreshold = DefaultRiseThreshold
	}
	return cfg
}

// validate checks cfg and returns the TLS configuration for its URL.
func validate(cfg Config) (*tls.Config, error) {
	switch {
	case cfg.Interval < 0:
		return nil, fmt.Errorf("VIPD_HEALTH_INTERVAL=%s: want a positive duration such as 1s or 200ms", cfg.Interval)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("VIPD_HEALTH_TIMEOUT=%s: want a positive duration such as 3s", cfg.Timeout)
	case cfg.FailThreshold < 0:
		return nil, fmt.Errorf("VIPD_FAIL_THRESHOLD=%d: want a whole number of 1 or more", cfg.FailThreshold)
	case cfg.RiseThreshold < 0:
		return nil, fmt.Errorf("VIPD_RISE_THRESHOLD=%d: want a whole number of 1 or more", cfg.RiseThreshold)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" {
		return nil, fmt.Errorf("VIPD_HEALTH_URL=%q: want an http:// or https:// URL with a host, such as %s", cfg.URL, DefaultURL)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("VIPD_HEALTH_CA_FILE=%q: %w", cfg.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("VIPD_HEALTH_CA_FILE=%q: no PEM certificate found, want a PEM CA bundle such as /etc/kubernetes/pki/ca.crt", cfg.CAFile)
		}
		conf.RootCAs = pool
		return conf, nil
	}
	if u.Scheme == "https" && !isLoopbackHost(u.Hostname()) {
		return nil, fmt.Errorf("VIPD_HEALTH_CA_FILE is required when VIPD_HEALTH_URL (%q) is not on a loopback address (127.0.0.0/8, ::1, localhost): the certificate is only left unverified on loopback", cfg.URL)
	}
	conf.InsecureSkipVerify = true
	return conf, nil
}

func isLoopbackHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// Probe sends one request and classifies the answer. It returns within
// the configured timeout. Thresholds are not applied and Status is not
// changed; the checks counter and duration histogram are updated unless
// ctx was cancelled.
func (c *Checker) Probe(ctx context.Context) Result {
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	r := c.probe(pctx)
	r.Duration = time.Since(start)
	r.Checked = c.clock.Now()
	r.OK = r.Reason == ReasonOK
	if ctx.Err() == nil {
		c.metrics.probed(r)
	}
	c.logger.Debug("health: probe", "url", c.cfg.URL, "result", r.Reason, "code", r.Code,
		"duration", r.Duration, "err", r.Err)
	return r
}

func (c *Checker) probe(ctx context.Context) Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.URL, nil)
	if err != nil {
		return Result{Reason: ReasonError, Err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("User-Agent", "vipd-health")
	tok := c.token.get()
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return Result{Reason: classifyError(err), Err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	r := Result{Code: resp.StatusCode, Reason: judgeStatus(resp.StatusCode, tok != "")}
	if r.Reason != ReasonOK {
		// The apiserver names the failing checks in the body; keep the
		// start of it for the log.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.Err = fmt.Errorf("GET %s: HTTP %d", c.cfg.URL, resp.StatusCode)
		if b := strings.TrimSpace(string(body)); b != "" {
			r.Err = fmt.Errorf("%w: %s", r.Err, b)
		}
	}
	return r
}

// judgeStatus classifies an HTTP answer. withToken tells whether a bearer
// token was sent: only then is 401 a failure (see the package comment).
func judgeStatus(code int, withToken bool) string {
	switch {
	case code == http.StatusOK:
		return ReasonOK
	case code == http.StatusUnauthorized && withToken:
		return ReasonUnauthorized
	case code == http.StatusUnauthorized:
		return ReasonOK
	case code == http.StatusForbidden:
		return ReasonForbidden
	case code >= 500 && code <= 599:
		return ReasonHTTP5xx
	default:
		return ReasonHTTPOther
	}
}

// classifyError names a transport failure.
func classifyError(err error) string {
	var (
		netErr    net.Error
		verifyErr *tls.CertificateVerificationError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
		authErr   x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		certErr   x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return ReasonTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case errors.As(err, &verifyErr), errors.As(err, &recordErr), errors.As(err, &alertErr),
		errors.As(err, &authErr), errors.As(err, &hostErr), errors.As(err, &certErr):
		return ReasonTLS
	default:
		return ReasonError
	}
}

// Run probes at once, then every Interval, until ctx is done. After every
// probe it applies the thresholds and calls report (if not nil) with the
// new Status; compare Healthy or Since with the previous one to see a
// change. Probes never overlap: a probe slower than Interval delays the
// next one instead of piling up. report runs on Run's goroutine and should
// return quickly.
func (c *Checker) Run(ctx context.Context, report func(Status)) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		r := c.Probe(ctx)
		if ctx.Err() != nil {
			return
		}
		st := c.record(r)
		if report != nil {
			report(st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// record applies one probe result to the thresholds.
func (c *Checker) record(r Result) Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := c.tracker.Observe(r.OK, r.Checked)
	st := Status{
		Healthy:     c.tracker.Healthy(),
		Reason:      r.Reason,
		Code:        r.Code,
		Checked:     r.Checked,
		Since:       c.tracker.Since(),
		Consecutive: c.tracker.Consecutive(),
	}
	if r.Err != nil {
		st.Error = r.Err.Error()
	}
	c.status = st
	c.metrics.setUp(st.Healthy)
	if changed {
		level := slog.LevelInfo
		if !st.Healthy {
			level = slog.LevelWarn
		}
		c.logger.Log(context.Background(), level, "health: apiserver health changed",
			"healthy", st.Healthy, "reason", st.Reason, "code", st.Code,
			"consecutive", st.Consecutive, "err", st.Error)
	}
	return st
}

// Status returns the latest status.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}
