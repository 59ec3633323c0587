package health

import (
	"bytes"
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/internal/gridclock"
	"github.com/vipd/vipd/internal/rawconn"
)

// Defaults of the configuration contract (DESIGN.md section 5).
const (
	DefaultURL           = "https://127.0.0.1:6443/livez"
	DefaultInterval      = time.Second
	DefaultTimeout       = 3 * time.Second
	DefaultFailThreshold = 3
	DefaultRiseThreshold = 1
	DefaultTokenPath     = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	// DefaultClientCert is the kubelet's own rotating client certificate,
	// certificate and key in one file (VIPD_HEALTH_CLIENT_CERT and _KEY).
	DefaultClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"
	// DefaultCAFile is kubeadm's cluster CA (VIPD_HEALTH_CA_FILE).
	DefaultCAFile = "/etc/kubernetes/pki/ca.crt"
)

// Reasons label every probe outcome; they are the values of the result
// label of vipd_health_checks_total and must stay stable.
const (
	ReasonOK = "ok" // 200, or 401 before any credential was loaded
	// ReasonCredentialRejected is a 401 or 403 once a credential was
	// loaded: the apiserver refuses this node's certificate or token (or
	// the credential is gone), which is as broken as a failing apiserver.
	ReasonCredentialRejected = "credential_rejected"
	ReasonForbidden          = "forbidden"  // 403 before any credential was loaded
	ReasonHTTP5xx            = "http_5xx"   // any 5xx status
	ReasonHTTPOther          = "http_other" // any other status, redirects included
	ReasonRefused            = "refused"    // connection refused
	ReasonTimeout            = "timeout"    // no complete answer within the timeout
	ReasonTLS                = "tls"        // handshake or certificate failure
	ReasonError              = "error"      // anything else: garbage, resets, ...
)

var reasons = []string{
	ReasonOK, ReasonCredentialRejected, ReasonForbidden, ReasonHTTP5xx, ReasonHTTPOther,
	ReasonRefused, ReasonTimeout, ReasonTLS, ReasonError,
}

// Config configures a Checker. Zero URL, Interval, Timeout and thresholds
// take the defaults above; an empty TokenPath means "never send a token",
// empty ClientCert and ClientKey "never send a client certificate" and an
// empty CAFile "skip verification, loopback hosts only". Files that do not
// exist yet are waited for (see the package comment).
type Config struct {
	URL string // VIPD_HEALTH_URL
	// ReadyzURL is probed after every good probe of URL to see the
	// apiserver's graceful shutdown early (VIPD_HEALTH_READYZ_URL);
	// empty: not probed.
	ReadyzURL     string
	Interval      time.Duration // VIPD_HEALTH_INTERVAL
	Timeout       time.Duration // VIPD_HEALTH_TIMEOUT
	FailThreshold int           // VIPD_FAIL_THRESHOLD
	RiseThreshold int           // VIPD_RISE_THRESHOLD
	TokenPath     string        // VIPD_SA_TOKEN_PATH
	ClientCert    string        // VIPD_HEALTH_CLIENT_CERT
	ClientKey     string        // VIPD_HEALTH_CLIENT_KEY
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

// WithClock replaces the wall clock used for re-reading credential files and
// for the times in Status and Result.
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
	Reason      string     // last probe's reason, "" before the first probe
	Code        int        // last probe's HTTP status, or 0
	Error       string     // last probe's error text, "" when it succeeded
	Checked     time.Time  // when the last probe finished
	Since       time.Time  // when Healthy last changed (creation time at first)
	Consecutive int        // probes in a row with the last probe's outcome
	Credential  Credential // what the probes authenticate with, and since when
	// Readyz is what the last probe of the readyz URL said about the
	// apiserver's shutdown check ("serving", "shutdown", "unknown").
	Readyz string
	// Draining: the apiserver is going away (see Drain); DrainReason and
	// DrainSince tell why and since when.
	Draining    bool
	DrainReason string
	DrainSince  time.Time
	// HandOver asks the caller to hand every VIP held here over now and
	// to report the outcome with HandedOver.
	HandOver bool
	// Eligible is what to tell the election: Healthy, but false once the
	// VIPs were handed over in a drain, until the apiserver is back.
	Eligible bool
}

// Checker probes the apiserver. Probe, Status and Run are safe for
// concurrent use, but only one Run should be active.
type Checker struct {
	cfg      Config
	logger   *slog.Logger
	clock    Clock
	creds    *credentials
	metrics  *metrics
	loopback bool // the URL's host is a loopback address

	mu      sync.Mutex
	tracker *Tracker
	drain   Drain
	status  Status

	// Run's way to probe at once (gridclock's kick) when the apiserver
	// closes the kept connection between probes; the probe in flight and
	// the last such early probe (unix nanoseconds) bound it to one per
	// interval.
	kick     atomic.Pointer[func()]
	inFlight atomic.Bool
	kickedAt atomic.Int64

	connMu sync.Mutex // the kept probe connection (conn)
	tr     *http.Transport
	httpc  *http.Client
	trCert *tls.Certificate
	trPool *x509.CertPool
	trBorn time.Time
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
	if err := validate(cfg); err != nil {
		return nil, err
	}
	var err error
	if c.metrics, err = newMetrics(reg); err != nil {
		return nil, err
	}
	if u, err := url.Parse(cfg.URL); err == nil {
		c.loopback = isLoopbackHost(u.Hostname())
	}
	now := c.clock.Now()
	c.creds = newCredentials(cfg, logger, now)
	c.tracker = NewTracker(cfg.FailThreshold, cfg.RiseThreshold, now)
	c.status = Status{Since: now, Credential: c.creds.status()}
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

// validate checks cfg. Credential and CA files that exist must be usable;
// missing ones are waited for, except the CA bundle of a URL that is not on
// loopback, which must exist from the start.
func validate(cfg Config) error {
	switch {
	case cfg.Interval < 0:
		return fmt.Errorf("VIPD_HEALTH_INTERVAL=%s: want a positive duration such as 1s or 200ms", cfg.Interval)
	case cfg.Timeout < 0:
		return fmt.Errorf("VIPD_HEALTH_TIMEOUT=%s: want a positive duration such as 3s", cfg.Timeout)
	case cfg.FailThreshold < 0:
		return fmt.Errorf("VIPD_FAIL_THRESHOLD=%d: want a whole number of 1 or more", cfg.FailThreshold)
	case cfg.RiseThreshold < 0:
		return fmt.Errorf("VIPD_RISE_THRESHOLD=%d: want a whole number of 1 or more", cfg.RiseThreshold)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" {
		return fmt.Errorf("VIPD_HEALTH_URL=%q: want an http:// or https:// URL with a host, such as %s", cfg.URL, DefaultURL)
	}
	if cfg.ReadyzURL != "" {
		r, err := url.Parse(cfg.ReadyzURL)
		if err != nil || (r.Scheme != "https" && r.Scheme != "http") || r.Hostname() == "" {
			return fmt.Errorf("VIPD_HEALTH_READYZ_URL=%q: want an http:// or https:// URL with a host, such as https://127.0.0.1:6443/readyz, or off", cfg.ReadyzURL)
		}
		if r.Scheme != u.Scheme || r.Host != u.Host {
			return fmt.Errorf("VIPD_HEALTH_READYZ_URL=%q: want the same scheme, host and port as VIPD_HEALTH_URL (%q): both probe the local apiserver with the same credentials", cfg.ReadyzURL, cfg.URL)
		}
	}
	if (cfg.ClientCert == "") != (cfg.ClientKey == "") {
		return fmt.Errorf("VIPD_HEALTH_CLIENT_CERT=%q and VIPD_HEALTH_CLIENT_KEY=%q: set both (they may name the same file, such as %s) or neither", cfg.ClientCert, cfg.ClientKey, DefaultClientCert)
	}
	if cfg.ClientCert != "" {
		_, _, _, err := loadKeyPair(cfg.ClientCert, cfg.ClientKey)
		if notFound(err) {
			// Waited for; but a certificate that is there must be one.
			if data, rerr := os.ReadFile(cfg.ClientCert); rerr == nil && !bytes.Contains(data, []byte("-----BEGIN CERTIFICATE-----")) {
				err = errors.New("no PEM certificate found")
			} else {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("VIPD_HEALTH_CLIENT_CERT=%q, VIPD_HEALTH_CLIENT_KEY=%q: %w; want a PEM client certificate and its private key, in one file or two", cfg.ClientCert, cfg.ClientKey, err)
		}
	}
	remote := u.Scheme == "https" && !isLoopbackHost(u.Hostname())
	if cfg.CAFile != "" {
		_, err := loadCA(cfg.CAFile)
		switch {
		case errors.Is(err, errNoPEM):
			return fmt.Errorf("VIPD_HEALTH_CA_FILE=%q: no PEM certificate found, want a PEM CA bundle such as %s", cfg.CAFile, DefaultCAFile)
		case notFound(err) && remote:
			return fmt.Errorf("VIPD_HEALTH_CA_FILE=%q: %w; it must exist when VIPD_HEALTH_URL (%q) is not on a loopback address", cfg.CAFile, err, cfg.URL)
		case err != nil && !notFound(err):
			return fmt.Errorf("VIPD_HEALTH_CA_FILE=%q: %w", cfg.CAFile, err)
		}
		return nil
	}
	if remote {
		return fmt.Errorf("VIPD_HEALTH_CA_FILE is required when VIPD_HEALTH_URL (%q) is not on a loopback address (127.0.0.0/8, ::1, localhost): the certificate is only left unverified on loopback", cfg.URL)
	}
	return nil
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
	pc := c.creds.refresh(c.clock.Now())
	if pc.token != "" {
		req.Header.Set("Authorization", "Bearer "+pc.token)
	}
	client, tr := c.conn(pc)
	resp, err := client.Do(req)
	if err != nil {
		tr.CloseIdleConnections()
		return Result{Reason: classifyError(err), Err: err}
	}
	c.creds.answered(resp.StatusCode)
	r := Result{Code: resp.StatusCode, Reason: judgeStatus(resp.StatusCode, pc.loaded)}
	defer func() {
		// Drain what is left of a short answer so the connection can be
		// kept; after a failure it is dropped: the next probe dials anew.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		_ = resp.Body.Close()
		if r.Reason != ReasonOK {
			tr.CloseIdleConnections()
		}
	}()
	if r.Reason != ReasonOK {
		// The apiserver names the failing checks in the body; keep the
		// start of it for the log.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.Err = fmt.Errorf("GET %s: HTTP %d", c.cfg.URL, resp.StatusCode)
		if r.Reason == ReasonCredentialRejected {
			desc := pc.desc
			if desc == "" {
				desc = "no credential (the one loaded before is gone)"
			}
			r.Err = fmt.Errorf("%w: credential rejected: %s", r.Err, desc)
		}
		if b := strings.TrimSpace(string(body)); b != "" {
			r.Err = fmt.Errorf("%w: %s", r.Err, b)
		}
	}
	return r
}

// ConnMaxAge is how long a probe connection is kept (keep-alive): a new
// TLS handshake per probe would cost more CPU than the rest of an idle
// vipd. A connection is dropped after any failed probe, when the
// credentials or the CA change, and after ConnMaxAge, so a dead or
// restarted apiserver is seen as today (a closed connection is noticed by
// the transport, which dials anew) and the server re-checks this node's
// certificate at least this often.
const ConnMaxAge = 2 * time.Minute

// conn returns the HTTP client for one probe with pc's credentials, the
// kept one while it is younger than ConnMaxAge and pc's certificate and
// CA are those it was built with.
func (c *Checker) conn(pc probeCreds) (*http.Client, *http.Transport) {
	now := time.Now()
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.tr != nil && c.trCert == pc.cert && c.trPool == pc.pool && now.Sub(c.trBorn) < ConnMaxAge {
		return c.httpc, c.tr
	}
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	c.httpc, c.tr = c.client(pc)
	c.trCert, c.trPool, c.trBorn = pc.cert, pc.pool, now
	return c.httpc, c.tr
}

// closeConn drops the kept connection (Run's end).
func (c *Checker) closeConn() {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.tr != nil {
		c.tr.CloseIdleConnections()
		c.tr, c.httpc = nil, nil
	}
}

// client returns an HTTP client with pc's credentials.
func (c *Checker) client(pc probeCreds) (*http.Client, *http.Transport) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case pc.pool != nil && c.loopback:
		// kubeadm's apiserver certificate does not name 127.0.0.1, so on
		// loopback the chain is verified against the cluster CA without
		// the host name check: only that CA can vouch for the server.
		conf.InsecureSkipVerify = true
		conf.VerifyConnection = verifyChain(pc.pool)
	case pc.pool != nil:
		conf.RootCAs = pc.pool
	default:
		// validate allowed this only for loopback URLs.
		conf.InsecureSkipVerify = true
	}
	if pc.cert != nil {
		cert := pc.cert
		// Always offer the certificate, even when the server does not
		// list its CA as acceptable: a rejected certificate must be seen
		// as rejected, not silently turned into an anonymous request.
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	tr := &http.Transport{
		Proxy: nil, // never send the probe through a proxy
		// http:// URLs, then https:// ones (the handshake done here).
		DialContext:            plainDialer(c.cfg.Timeout, c.peerClosed),
		DialTLSContext:         tlsDialer(conf, c.cfg.Timeout, c.peerClosed),
		ResponseHeaderTimeout:  c.cfg.Timeout,
		MaxIdleConns:           1,
		MaxIdleConnsPerHost:    1,
		IdleConnTimeout:        ConnMaxAge,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: tr,
		// A redirect is an answer in its own right (http_other), not
		// something to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, tr
}

// tlsDialer dials the probe's connections and runs their TLS handshake
// (within timeout). The socket reads and writes with raw calls
// (internal/rawconn): the probe runs every interval on every node, and
// each regular socket call woke the Go runtime's monitor thread, which
// then polled every 20 µs through the rest of the probe (on an idle
// node, the monitor thread's wake-ups cost as much as the probes). The
// dial itself is a regular one; the connection is kept between probes.
// The handshake is done here rather than by http.Transport so that the
// end of the connection is seen above TLS (peerWatch): the apiserver's
// close_notify ends the TLS stream, and TLS then reads no further.
func tlsDialer(conf *tls.Config, timeout time.Duration, closed func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := rawDial(ctx, timeout, network, addr)
		if err != nil {
			return nil, err
		}
		cfg := conf.Clone()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				c.Close()
				return nil, err
			}
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		hctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := tc.HandshakeContext(hctx); err != nil {
			c.Close()
			return nil, err
		}
		return &peerWatch{Conn: tc, closed: closed}, nil
	}
}

// plainDialer dials the connections of an http:// URL: raw calls, watched
// for the end of the connection as tlsDialer's are.
func plainDialer(timeout time.Duration, closed func()) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := rawDial(ctx, timeout, network, addr)
		if err != nil {
			return nil, err
		}
		return &peerWatch{Conn: c, closed: closed}, nil
	}
}

// rawDial dials addr; the connection reads and writes with raw calls
// unless it has no socket of its own.
func rawDial(ctx context.Context, timeout time.Duration, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if rc, err := rawconn.Wrap(c); err == nil {
		return rc, nil
	}
	return c, nil
}

// peerWatch tells closed when a read finds the connection ended by the
// other side (a TLS close_notify, the end of the stream, a reset). http.Transport keeps a read waiting on an idle kept
// connection, so an apiserver that shuts down (and closes its idle
// connections as it stops listening) is noticed then, not at the next
// probe.
type peerWatch struct {
	net.Conn
	closed func()
}

func (w *peerWatch) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		w.closed()
	}
	return n, err
}

// peerClosed: the apiserver ended the kept connection. Between probes,
// the next probe runs now rather than at the next tick (an apiserver
// stopped without a shutdown delay refuses at once, and the first refused
// probe hands the VIPs over). The early probe takes the next tick's
// place, so the fail threshold spans as many intervals as without it; at
// most one early probe per interval.
func (c *Checker) peerClosed() {
	k := c.kick.Load()
	if k == nil || c.inFlight.Load() {
		return
	}
	now := time.Now().UnixNano()
	last := c.kickedAt.Load()
	if now-last < int64(c.cfg.Interval) || !c.kickedAt.CompareAndSwap(last, now) {
		return
	}
	c.logger.Debug("health: the apiserver closed the probe connection; probing now")
	(*k)()
}

// verifyChain checks the server's certificate chain against roots, for
// server authentication, without a host name.
func verifyChain(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the server sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
		}
		return nil
	}
}

// judgeStatus classifies an HTTP answer. loaded tells whether a credential
// was loaded since start: from then on 401 and 403 are failures (see the
// package comment).
func judgeStatus(code int, loaded bool) string {
	switch {
	case code == http.StatusOK:
		return ReasonOK
	case (code == http.StatusUnauthorized || code == http.StatusForbidden) && loaded:
		return ReasonCredentialRejected
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

// Run probes at once, then at every multiple of Interval on the wall clock
// until ctx is done. It waits on a timerfd (gridclock), not a Go timer:
// the cluster's member heartbeats tick on the same grid, so an idle node
// wakes once for both. After every probe it applies the thresholds and
// calls report (if not nil) with the new Status; compare Healthy or Since
// with the previous one to see a change. Probes never overlap: a probe
// that runs past the next multiple (a hanging apiserver, probed with a
// timeout as long as the interval) is followed at once, as a ticker would;
// waiting for the multiple after would halve the probe rate exactly when
// it matters. report runs on Run's goroutine and should return quickly.
func (c *Checker) Run(ctx context.Context, report func(Status)) {
	iv := c.cfg.Interval
	defer c.closeConn()
	wait, drain, kick := gridclock.Ticker(ctx, iv, func(err error) {
		c.logger.Warn("health: probes tick on a Go timer", "err", err)
	})
	c.kick.Store(&kick)
	defer c.kick.Store(nil)
	due := time.Now()
	for {
		c.inFlight.Store(true)
		r := c.Probe(ctx)
		rz := ReadyzUnknown
		if r.OK && c.cfg.ReadyzURL != "" {
			rz = c.ProbeReadyz(ctx)
		}
		c.inFlight.Store(false)
		if ctx.Err() != nil {
			return
		}
		st := c.record(r, rz)
		if report != nil {
			report(st)
		}
		now := time.Now()
		due = due.Truncate(iv).Add(iv)
		if !due.After(now) {
			due = now
			drain() // the tick this probe ran past
			continue
		}
		if !wait() {
			return
		}
	}
}

// record applies one probe result (and what the readyz URL said) to the
// thresholds and the drain decision.
func (c *Checker) record(r Result, rz Readyz) Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := c.tracker.Observe(r.OK, r.Checked)
	dec := c.drain.Observe(r, rz, r.Checked)
	st := Status{
		Readyz:      rz.String(),
		Draining:    dec.Draining,
		DrainReason: dec.Reason,
		DrainSince:  dec.Since,
		HandOver:    dec.HandOver,
		Eligible:    c.drain.Eligible(c.tracker.Healthy()),
		Healthy:     c.tracker.Healthy(),
		Reason:      r.Reason,
		Code:        r.Code,
		Checked:     r.Checked,
		Since:       c.tracker.Since(),
		Consecutive: c.tracker.Consecutive(),
		Credential:  c.creds.status(),
	}
	if r.Err != nil {
		st.Error = r.Err.Error()
	}
	c.status = st
	c.metrics.setUp(st.Healthy)
	c.metrics.setDraining(st.Draining)
	if dec.Changed && dec.Draining {
		c.logger.Warn("health: the apiserver is going away: handing over", "reason", dec.Reason,
			"readyz", st.Readyz, "livez", r.Reason, "err", st.Error)
	} else if dec.Changed {
		c.logger.Info("health: the apiserver is back after a drain", "readyz", st.Readyz)
	}
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

// HandedOver reports the outcome of the handover a Status with HandOver
// asked for: done is true when this node holds no VIP any more. It
// returns the node's eligibility for the election from now on (see
// Status.Eligible).
func (c *Checker) HandedOver(done bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drain.HandedOver(done)
	c.status.HandOver = false
	c.status.Eligible = c.drain.Eligible(c.tracker.Healthy())
	return c.status.Eligible
}

// ProbeReadyz sends one request to the readyz URL and tells what it says
// about the apiserver's shutdown check, within the configured timeout.
// It shares the probe connection and credentials of Probe.
func (c *Checker) ProbeReadyz(ctx context.Context) Readyz {
	if c.cfg.ReadyzURL == "" {
		return ReadyzUnknown
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, c.cfg.ReadyzURL, nil)
	if err != nil {
		return ReadyzUnknown
	}
	req.Header.Set("User-Agent", "vipd-health")
	pc := c.creds.refresh(c.clock.Now())
	if pc.token != "" {
		req.Header.Set("Authorization", "Bearer "+pc.token)
	}
	client, tr := c.conn(pc)
	resp, err := client.Do(req)
	if err != nil {
		tr.CloseIdleConnections()
		c.logger.Debug("health: readyz probe", "url", c.cfg.ReadyzURL, "err", err)
		return ReadyzUnknown
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	_ = resp.Body.Close()
	rz := JudgeReadyz(resp.StatusCode, body)
	c.logger.Debug("health: readyz probe", "url", c.cfg.ReadyzURL, "code", resp.StatusCode, "shutdown", rz.String())
	return rz
}

// Status returns the latest status.
func (c *Checker) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}
