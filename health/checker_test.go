package health

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/internal/rawconn"
)

// fakeClock is a settable Clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newChecker builds a checker with short timings for tests.
func newChecker(t *testing.T, cfg Config, reg prometheus.Registerer, opts ...Option) *Checker {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	c, err := NewChecker(cfg, testLogger(t), reg, opts...)
	if err != nil {
		t.Fatalf("NewChecker: %v", err)
	}
	return c
}

// tlsServer starts an httptest TLS server closed at the end of the test.
func tlsServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	return ts
}

func writeToken(t *testing.T, path, tok string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestProbeStatusCodes(t *testing.T) {
	tests := []struct {
		code       int
		withToken  bool
		wantReason string
	}{
		{200, false, ReasonOK},
		{200, true, ReasonOK},
		{401, false, ReasonOK}, // pre-bootstrap: anonymous 401 proves the apiserver is up
		{401, true, ReasonCredentialRejected},
		{403, false, ReasonForbidden},
		{403, true, ReasonCredentialRejected},
		{500, true, ReasonHTTP5xx},
		{503, false, ReasonHTTP5xx},
		{404, true, ReasonHTTPOther},
		{302, true, ReasonHTTPOther}, // redirects are not followed
		{204, false, ReasonHTTPOther},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(http.StatusText(tt.code), " ", "_")+map[bool]string{true: "/token", false: "/anonymous"}[tt.withToken], func(t *testing.T) {
			ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/livez" {
					t.Errorf("request path %q, want /livez", r.URL.Path)
				}
				if tt.code == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tt.code)
				_, _ = w.Write([]byte("[-]etcd failed: reason withheld\n"))
			})
			cfg := Config{URL: ts.URL + "/livez"}
			if tt.withToken {
				cfg.TokenPath = filepath.Join(t.TempDir(), "token")
				writeToken(t, cfg.TokenPath, "secret\n")
			}
			r := newChecker(t, cfg, nil).Probe(t.Context())
			if r.Reason != tt.wantReason || r.Code != tt.code || r.OK != (tt.wantReason == ReasonOK) {
				t.Fatalf("Probe = {OK:%v Reason:%q Code:%d Err:%v}, want reason %q code %d", r.OK, r.Reason, r.Code, r.Err, tt.wantReason, tt.code)
			}
			if r.OK != (r.Err == nil) {
				t.Fatalf("Err = %v with OK=%v", r.Err, r.OK)
			}
			if !r.OK && tt.code != 204 && !strings.Contains(r.Err.Error(), "etcd failed") {
				t.Fatalf("Err %q does not carry the body", r.Err)
			}
		})
	}
}

func TestProbeTimeout(t *testing.T) {
	release := make(chan struct{})
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release) // runs before ts.Close, so the handler never blocks Close
	const timeout = 300 * time.Millisecond
	c := newChecker(t, Config{URL: ts.URL + "/livez", Timeout: timeout}, nil)
	start := time.Now()
	r := c.Probe(t.Context())
	took := time.Since(start)
	if r.Reason != ReasonTimeout || r.OK {
		t.Fatalf("Probe = {Reason:%q Err:%v}, want %q", r.Reason, r.Err, ReasonTimeout)
	}
	if took < timeout || took > timeout+time.Second {
		t.Fatalf("probe of a hanging server took %v, want about %v", took, timeout)
	}
}

func TestProbeRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	r := newChecker(t, Config{URL: "https://" + addr + "/livez"}, nil).Probe(t.Context())
	if r.Reason != ReasonRefused || r.Code != 0 {
		t.Fatalf("Probe = {Reason:%q Code:%d Err:%v}, want %q", r.Reason, r.Code, r.Err, ReasonRefused)
	}
}

// rawServer accepts TCP connections and answers each with junk bytes.
func rawServer(t *testing.T, junk string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			// Wait for the client to speak (request or ClientHello), then
			// answer with junk.
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = conn.Read(make([]byte, 1024))
			_, _ = conn.Write([]byte(junk))
			_ = conn.Close()
		}
	})
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}

func TestProbeGarbage(t *testing.T) {
	// A TLS server that answers the request with bytes that are not HTTP.
	junkTLS := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_, _ = buf.WriteString("SSH-2.0-OpenSSH_9.2\r\n\r\n")
		_ = buf.Flush()
		_ = conn.Close()
	})
	raw := rawServer(t, "220 smtp.example ESMTP ready\r\n")
	tests := []struct {
		name, url, want string
	}{
		{"TLS server writes non-HTTP", junkTLS.URL + "/livez", ReasonError},
		{"plain http server writes non-HTTP", "http://" + raw + "/livez", ReasonError},
		// Junk where a TLS handshake was expected is a TLS failure.
		{"https URL to a non-TLS server", "https://" + raw + "/livez", ReasonTLS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newChecker(t, Config{URL: tt.url}, nil).Probe(t.Context())
			if r.Reason != tt.want || r.Code != 0 {
				t.Fatalf("Probe = {Reason:%q Code:%d Err:%v}, want %q", r.Reason, r.Code, r.Err, tt.want)
			}
		})
	}
}

// writeCA writes a fresh self-signed CA certificate unrelated to httptest's.
func writeCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "other-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, der)
}

func writePEM(t *testing.T, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProbeCAFile(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {})
	tests := []struct {
		name, caFile, want string
	}{
		{"matching CA verifies", writePEM(t, ts.Certificate().Raw), ReasonOK},
		{"other CA fails verification", writeCA(t), ReasonTLS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newChecker(t, Config{URL: ts.URL + "/livez", CAFile: tt.caFile}, nil).Probe(t.Context())
			if r.Reason != tt.want {
				t.Fatalf("Probe = {Reason:%q Err:%v}, want %q", r.Reason, r.Err, tt.want)
			}
		})
	}
}

func TestNewCheckerConfig(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	writeToken(t, notPEM, "not a certificate")
	certOnly := filepath.Join(t.TempDir(), "client.crt")
	cert, _ := newTestCA(t, "ca").issue(t, "node")
	writeToken(t, certOnly, string(cert))
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" for success
	}{
		{"defaults", Config{}, ""},
		{"loopback v4 without CA", Config{URL: "https://127.0.0.2:6443/livez"}, ""},
		{"loopback v6 without CA", Config{URL: "https://[::1]:6443/livez"}, ""},
		{"localhost without CA", Config{URL: "https://LOCALHOST:6443/livez"}, ""},
		{"localhost. without CA", Config{URL: "https://localhost.:6443/livez"}, ""},
		{"v4-mapped loopback without CA", Config{URL: "https://[::ffff:127.0.0.1]:6443/livez"}, ""},
		{"localhost-like name without CA", Config{URL: "https://localhost.example.com:6443/livez"}, "VIPD_HEALTH_CA_FILE"},
		{"remote with CA", Config{URL: "https://10.0.0.1:6443/livez", CAFile: writeCA(t)}, ""},
		{"remote plain http", Config{URL: "http://10.0.0.1:8080/livez"}, ""},
		{"remote without CA", Config{URL: "https://10.0.0.1:6443/livez"}, "VIPD_HEALTH_CA_FILE"},
		{"remote name without CA", Config{URL: "https://api.example.com:6443/livez"}, "VIPD_HEALTH_CA_FILE"},
		{"missing CA file on loopback: waited for", Config{CAFile: "/nonexistent/ca.crt"}, ""},
		{"missing CA file for a remote URL", Config{URL: "https://10.0.0.1:6443/livez", CAFile: "/nonexistent/ca.crt"}, "VIPD_HEALTH_CA_FILE"},
		{"CA path is a directory", Config{CAFile: t.TempDir()}, "VIPD_HEALTH_CA_FILE"},
		{"client cert without key", Config{ClientCert: "/nonexistent/c.pem"}, "VIPD_HEALTH_CLIENT_KEY"},
		{"client key without cert", Config{ClientKey: "/nonexistent/c.pem"}, "VIPD_HEALTH_CLIENT_CERT"},
		{"missing client cert: waited for", Config{ClientCert: "/nonexistent/c.pem", ClientKey: "/nonexistent/c.pem"}, ""},
		{"client cert file without a key", Config{ClientCert: notPEM, ClientKey: notPEM}, "VIPD_HEALTH_CLIENT_CERT"},
		{"client cert there, key not yet: waited for", Config{ClientCert: certOnly, ClientKey: "/nonexistent/k.pem"}, ""},
		{"client cert not PEM, key not there yet", Config{ClientCert: notPEM, ClientKey: "/nonexistent/k.pem"}, "VIPD_HEALTH_CLIENT_CERT"},
		{"CA file without PEM", Config{CAFile: notPEM}, "VIPD_HEALTH_CA_FILE"},
		{"bad scheme", Config{URL: "ftp://127.0.0.1/livez"}, "VIPD_HEALTH_URL"},
		{"no host", Config{URL: "https:///livez"}, "VIPD_HEALTH_URL"},
		{"negative interval", Config{Interval: -time.Second}, "VIPD_HEALTH_INTERVAL"},
		{"negative timeout", Config{Timeout: -time.Second}, "VIPD_HEALTH_TIMEOUT"},
		{"negative fail threshold", Config{FailThreshold: -1}, "VIPD_FAIL_THRESHOLD"},
		{"negative rise threshold", Config{RiseThreshold: -1}, "VIPD_RISE_THRESHOLD"},
		{"readyz next to livez", Config{ReadyzURL: "https://127.0.0.1:6443/readyz"}, ""},
		{"readyz on another port", Config{ReadyzURL: "https://127.0.0.1:6444/readyz"}, "VIPD_HEALTH_READYZ_URL"},
		{"readyz over http", Config{ReadyzURL: "http://127.0.0.1:6443/readyz"}, "VIPD_HEALTH_READYZ_URL"},
		{"readyz not a URL", Config{ReadyzURL: "readyz"}, "VIPD_HEALTH_READYZ_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewChecker(tt.cfg, nil, nil)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("NewChecker: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("NewChecker error = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

// TestToken follows a token file through appear, rotate and disappear, and
// checks what the server receives and how it is judged, on a fake clock.
func TestToken(t *testing.T) {
	var lastAuth atomic.Value
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		lastAuth.Store(auth)
		if auth != "Bearer current" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	path := filepath.Join(t.TempDir(), "token")
	clock := newFakeClock()
	c := newChecker(t, Config{URL: ts.URL + "/livez", TokenPath: path}, nil, WithClock(clock))

	step := func(desc string, advance time.Duration, wantAuth, wantReason string) {
		t.Helper()
		clock.Advance(advance)
		r := c.Probe(t.Context())
		if got := lastAuth.Load().(string); got != wantAuth {
			t.Fatalf("%s: server saw Authorization %q, want %q", desc, got, wantAuth)
		}
		if r.Reason != wantReason {
			t.Fatalf("%s: reason %q, want %q (err %v)", desc, r.Reason, wantReason, r.Err)
		}
		if r.Err != nil && (strings.Contains(r.Err.Error(), "Bearer") || strings.Contains(r.Err.Error(), " old")) {
			t.Fatalf("%s: error %q carries the token", desc, r.Err)
		}
	}

	step("no token file", 0, "", ReasonOK) // anonymous 401 is healthy before any credential
	writeToken(t, path, "")
	step("empty token file", 0, "", ReasonOK)
	writeToken(t, path, "old\n")
	step("token appears: used at once", 0, "Bearer old", ReasonCredentialRejected)
	writeToken(t, path, "current")
	step("rotated, not checked yet", checkEvery-time.Second, "Bearer old", ReasonCredentialRejected)
	step("rotated, checked", time.Second, "Bearer current", ReasonOK)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	step("removed, not checked yet", time.Second, "Bearer current", ReasonOK)
	// Once a credential was loaded an anonymous 401 is no longer healthy.
	step("removed, checked", checkEvery, "", ReasonCredentialRejected)
	writeToken(t, path, "current")
	step("token back: used at once", 0, "Bearer current", ReasonOK)
}

// TestTokenWhileAnswered: while the apiserver answers without a
// credential (anonymous access to /livez allowed), a credential that
// appears changes no verdict: it is looked for every checkEvery, not on
// every probe (each look is a system call that wakes the runtime's monitor
// thread), and used from the look that finds it. Once the apiserver
// refuses a probe, the next probe looks again.
func TestTokenWhileAnswered(t *testing.T) {
	var lastAuth atomic.Value
	var code atomic.Int32
	code.Store(http.StatusOK)
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		lastAuth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(code.Load()))
	})
	path := filepath.Join(t.TempDir(), "token")
	clock := newFakeClock()
	c := newChecker(t, Config{URL: ts.URL + "/livez", TokenPath: path}, nil, WithClock(clock))
	stats := 0
	c.creds.stat = func(p string) (fileID, error) { stats++; return statFile(p) }
	probe := func(desc string, advance time.Duration, wantAuth string, wantStats int, wantOK bool) {
		t.Helper()
		stats = 0
		clock.Advance(advance)
		r := c.Probe(t.Context())
		if got := lastAuth.Load().(string); got != wantAuth || stats != wantStats {
			t.Fatalf("%s: server saw Authorization %q after %d stats, want %q after %d", desc, got, stats, wantAuth, wantStats)
		}
		if r.OK != wantOK {
			t.Fatalf("%s: probe ok %v, want %v (%s, %v)", desc, r.OK, wantOK, r.Reason, r.Err)
		}
	}
	probe("no token file: looked for", 0, "", 1, true)
	for range 4 {
		probe("answered: not looked for again within the check period", time.Second, "", 0, true)
	}
	writeToken(t, path, "late")
	probe("token written, check period not over: not seen", time.Second-time.Millisecond, "", 0, true)
	probe("check period over: looked for and used", time.Millisecond, "Bearer late", 1, true)

	// The apiserver refuses anonymous probes: a missing token is looked
	// for on every probe, and one that appears is used at the next.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	probe("removed: seen at the next check", checkEvery, "", 2, true) // the check, then the read's own look
	code.Store(http.StatusUnauthorized)
	probe("refused, a credential was loaded before: a failure", time.Second, "", 0, false)
	probe("refused: looked for on every probe", time.Second, "", 1, false)
	probe("refused: looked for on every probe, again", 0, "", 1, false)
	writeToken(t, path, "back")
	code.Store(http.StatusOK)
	probe("token back while refused: used at the next probe", time.Second, "Bearer back", 1, true)
}

func TestTokenEmptyPathNeverSends(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Authorization"); a != "" {
			t.Errorf("Authorization %q sent without a token path", a)
		}
	})
	if r := newChecker(t, Config{URL: ts.URL + "/livez"}, nil).Probe(t.Context()); !r.OK {
		t.Fatalf("Probe = %q (%v), want ok", r.Reason, r.Err)
	}
}

// statusServer answers with the code stored in code.
func statusServer(t *testing.T, code *atomic.Int32) *httptest.Server {
	return tlsServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(code.Load())) })
}

// runChecker runs c in the background and returns its reports and a stop
// function that cancels Run and waits for it to return.
func runChecker(t *testing.T, c *Checker) (<-chan Status, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	reports := make(chan Status, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func(s Status) { reports <- s })
	}()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	}
	t.Cleanup(func() { cancel(); <-done })
	return reports, stop
}

func nextReport(t *testing.T, reports <-chan Status) Status {
	t.Helper()
	select {
	case s := <-reports:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no report from Run")
		return Status{}
	}
}

func TestRunProbesImmediately(t *testing.T) {
	var code atomic.Int32
	code.Store(200)
	ts := statusServer(t, &code)
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: time.Hour}, nil)
	if s := c.Status(); s.Healthy || s.Reason != "" {
		t.Fatalf("Status before Run = %+v, want unhealthy with no reason", s)
	}
	reports, stop := runChecker(t, c)
	s := nextReport(t, reports) // an hour-long interval: only an immediate probe can report
	if !s.Healthy || s.Reason != ReasonOK || s.Code != 200 || s.Consecutive != 1 {
		t.Fatalf("first report = %+v, want healthy ok/200 after one probe", s)
	}
	if got := c.Status(); got != s {
		t.Fatalf("Status() = %+v, want the reported %+v", got, s)
	}
	stop()
	if len(reports) != 0 {
		t.Fatalf("%d extra reports within the interval", len(reports))
	}
}

func TestRunThresholdsAndMetrics(t *testing.T) {
	var code atomic.Int32
	code.Store(200)
	ts := statusServer(t, &code)
	reg := prometheus.NewRegistry()
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: 5 * time.Millisecond, FailThreshold: 3, RiseThreshold: 2}, reg)
	upIs := func(want float64) {
		t.Helper()
		if got := testutil.ToFloat64(c.metrics.up); got != want {
			t.Fatalf("vipd_health_up = %v, want %v", got, want)
		}
	}
	upIs(0)
	reports, stop := runChecker(t, c)

	// Rise 2: the first good probe keeps it unhealthy, the second heals.
	if s := nextReport(t, reports); s.Healthy || s.Consecutive != 1 {
		t.Fatalf("report 1 = %+v, want unhealthy after one success with rise 2", s)
	}
	healed := nextReport(t, reports)
	if !healed.Healthy || healed.Consecutive != 2 || !healed.Since.Equal(healed.Checked) {
		t.Fatalf("report 2 = %+v, want healthy since this probe", healed)
	}
	upIs(1)

	// Fail 3: wait for the first failure, then the next two.
	code.Store(503)
	s := nextReport(t, reports)
	for s.Reason == ReasonOK {
		s = nextReport(t, reports)
	}
	for i := 1; i <= 2; i++ {
		if !s.Healthy || s.Consecutive != i || s.Reason != ReasonHTTP5xx || s.Code != 503 || !s.Since.Equal(healed.Since) {
			t.Fatalf("failure %d: %+v, want still healthy since %v", i, s, healed.Since)
		}
		s = nextReport(t, reports)
	}
	if s.Healthy || s.Consecutive != 3 || !s.Since.Equal(s.Checked) || s.Error == "" {
		t.Fatalf("failure 3: %+v, want unhealthy since this probe, with an error", s)
	}
	upIs(0)
	stop()

	// Every probe Run made is counted once, by reason.
	okCount := testutil.ToFloat64(c.metrics.checks.WithLabelValues(ReasonOK))
	failCount := testutil.ToFloat64(c.metrics.checks.WithLabelValues(ReasonHTTP5xx))
	if okCount < 2 || failCount < 3 {
		t.Fatalf("checks ok=%v http_5xx=%v, want at least 2 and 3", okCount, failCount)
	}
	for _, r := range []string{ReasonCredentialRejected, ReasonForbidden, ReasonHTTPOther, ReasonRefused, ReasonTimeout, ReasonTLS, ReasonError} {
		if v := testutil.ToFloat64(c.metrics.checks.WithLabelValues(r)); v != 0 {
			t.Fatalf("checks{result=%q} = %v, want 0", r, v)
		}
	}
	if got := histogramCount(t, reg, "vipd_health_check_duration_seconds"); got != uint64(okCount+failCount) {
		t.Fatalf("duration histogram has %d samples, want %v", got, okCount+failCount)
	}
}

func histogramCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

func TestMetricsByReason(t *testing.T) {
	var code atomic.Int32
	ts := statusServer(t, &code)
	reg := prometheus.NewRegistry()
	c := newChecker(t, Config{URL: ts.URL + "/livez"}, reg)
	for _, status := range []int32{200, 200, 500, 403, 302} {
		code.Store(status)
		c.Probe(t.Context())
	}
	want := `
# HELP vipd_health_checks_total Apiserver health probes by result (ok or the failure reason).
# TYPE vipd_health_checks_total counter
vipd_health_checks_total{result="credential_rejected"} 0
vipd_health_checks_total{result="error"} 0
vipd_health_checks_total{result="forbidden"} 1
vipd_health_checks_total{result="http_5xx"} 1
vipd_health_checks_total{result="http_other"} 1
vipd_health_checks_total{result="ok"} 2
vipd_health_checks_total{result="refused"} 0
vipd_health_checks_total{result="timeout"} 0
vipd_health_checks_total{result="tls"} 0
# HELP vipd_health_up 1 when the apiserver health check considers this node healthy (after thresholds), else 0.
# TYPE vipd_health_up gauge
vipd_health_up 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "vipd_health_checks_total", "vipd_health_up"); err != nil {
		t.Fatal(err)
	}
	if got := histogramCount(t, reg, "vipd_health_check_duration_seconds"); got != 5 {
		t.Fatalf("duration histogram has %d samples, want 5", got)
	}
	if _, err := NewChecker(Config{}, nil, reg); err == nil {
		t.Fatal("second checker on the same registry: no error, want a duplicate registration error")
	}
}

// TestRunNoPileUp runs against a server slower than the interval and checks
// that probes never overlap.
func TestRunNoPileUp(t *testing.T) {
	const delay = 40 * time.Millisecond
	var inFlight, maxInFlight, total atomic.Int32
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		total.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(delay)
	})
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: time.Millisecond}, nil)
	reports, stop := runChecker(t, c)
	for range 5 {
		nextReport(t, reports)
	}
	stop()
	if m := maxInFlight.Load(); m != 1 {
		t.Fatalf("%d probes in flight at once, want 1", m)
	}
	// Every finished probe reported; at most one more was cut short by stop.
	if n, reported := total.Load(), int32(5+len(reports)); n > reported+1 {
		t.Fatalf("%d requests for %d reports: probes piled up", n, reported)
	}
}

// TestProbeCancelledNotCounted checks that a probe cut short by shutdown is
// not counted as a failure.
func TestProbeCancelledNotCounted(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	c := newChecker(t, Config{URL: ts.URL + "/livez"}, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	c.Probe(ctx)
	for _, r := range reasons {
		if v := testutil.ToFloat64(c.metrics.checks.WithLabelValues(r)); v != 0 {
			t.Fatalf("checks{result=%q} = %v after a cancelled probe, want 0", r, v)
		}
	}
}

// BenchmarkProbe measures one probe on loopback, with the fresh connection
// and TLS handshake every probe pays.
func BenchmarkProbe(b *testing.B) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer ts.Close()
	c, err := NewChecker(Config{URL: ts.URL + "/livez"}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if r := c.Probe(b.Context()); !r.OK {
			b.Fatalf("probe: %s: %v", r.Reason, r.Err)
		}
	}
}

// TestProbeKeepAlive: successful probes share one connection (no TLS
// handshake per probe); a failed probe drops it, and so does a server that
// closes it (a restarted apiserver): the next probe dials anew and still
// sees the right answer.
func TestProbeKeepAlive(t *testing.T) {
	var conns atomic.Int32
	var code atomic.Int32
	code.Store(200)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(code.Load()))
	}))
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	c := newChecker(t, Config{URL: ts.URL + "/livez"}, nil)
	probe := func(want string) {
		t.Helper()
		if r := c.Probe(t.Context()); r.Reason != want {
			t.Fatalf("Probe = %q (%v), want %q", r.Reason, r.Err, want)
		}
	}
	for range 5 {
		probe(ReasonOK)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 successful probes used %d connections, want 1", n)
	}
	code.Store(500)
	probe(ReasonHTTP5xx)
	code.Store(200)
	probe(ReasonOK)
	if n := conns.Load(); n != 2 {
		t.Fatalf("after a failed probe: %d connections in all, want 2 (the failed probe's connection dropped)", n)
	}
	ts.CloseClientConnections() // the apiserver restarts
	probe(ReasonOK)
	if n := conns.Load(); n != 3 {
		t.Fatalf("after the server closed the connection: %d connections in all, want 3", n)
	}
}

// TestProbeKeepAliveServerGone: a kept connection does not hide an
// apiserver that went away: the probe after it is refused.
func TestProbeKeepAliveServerGone(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	c := newChecker(t, Config{URL: ts.URL + "/livez"}, nil)
	if r := c.Probe(t.Context()); !r.OK {
		t.Fatalf("first probe: %q (%v)", r.Reason, r.Err)
	}
	ts.CloseClientConnections()
	ts.Close()
	if r := c.Probe(t.Context()); r.OK || r.Reason != ReasonRefused {
		t.Fatalf("probe after the server stopped = %q (%v), want %q", r.Reason, r.Err, ReasonRefused)
	}
}

// TestRunGridAndOverrun: probes fall on the wall clock's multiples of the
// interval (the cluster's heartbeat ticks on the same grid), and a probe
// that runs past the next multiple (a hanging apiserver) is followed at
// once, not a whole interval later: the probe rate must not halve when
// the apiserver hangs.
func TestRunGridAndOverrun(t *testing.T) {
	const iv = 100 * time.Millisecond
	var slow atomic.Bool
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			time.Sleep(105 * time.Millisecond)
		}
	})
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: iv, Timeout: time.Second}, nil)
	reports, stop := runChecker(t, c)
	defer stop()
	nextReport(t, reports) // the probe at start, off the grid
	var phases []time.Duration
	for range 4 {
		s := nextReport(t, reports)
		phases = append(phases, s.Checked.Sub(s.Checked.Truncate(iv)))
	}
	slices.Sort(phases)
	if phases[1] > 30*time.Millisecond {
		t.Errorf("probes %v after the interval's multiples, want on the grid", phases)
	}
	slow.Store(true)
	nextReport(t, reports)
	start := time.Now()
	for range 5 {
		nextReport(t, reports)
	}
	// Back to back: about 5 x 105 ms; waiting for the next multiple after
	// each would take 5 x 200 ms. The bound leaves a loaded machine 75 ms
	// a probe.
	if el := time.Since(start); el > 900*time.Millisecond {
		t.Errorf("5 probes of 105 ms at a 100 ms interval took %v, want them back to back (about 525 ms)", el)
	}
}

// TestRunDrain runs a checker against a server that answers /livez and
// /readyz as kube-apiserver does through a graceful stop with
// --shutdown-delay-duration: /readyz fails its shutdown check while /livez
// passes, then the listener goes. The report after the first probe that
// sees the shutdown asks for a handover, the node stays healthy (the
// apiserver still serves) but is no longer eligible once handed over, and
// the drain gauge follows.
func TestRunDrain(t *testing.T) {
	var shutdown atomic.Bool
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz" && shutdown.Load():
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("[+]ping ok\n[-]shutdown failed: reason withheld\nreadyz check failed\n"))
		default:
			_, _ = w.Write([]byte("ok"))
		}
	})
	reg := prometheus.NewRegistry()
	c := newChecker(t, Config{URL: ts.URL + "/livez", ReadyzURL: ts.URL + "/readyz", Interval: 5 * time.Millisecond}, reg)
	reports, stop := runChecker(t, c)
	defer stop()
	if s := nextReport(t, reports); !s.Healthy || !s.Eligible || s.Draining || s.HandOver || s.Readyz != "serving" {
		t.Fatalf("first report = %+v, want healthy, eligible, serving", s)
	}
	shutdown.Store(true)
	s := nextReport(t, reports)
	for !s.Draining {
		s = nextReport(t, reports)
	}
	if !s.HandOver || s.DrainReason != DrainShutdown || !s.Healthy || !s.Eligible || s.Readyz != "shutdown" {
		t.Fatalf("first draining report = %+v, want a handover asked, still healthy and eligible", s)
	}
	if got := testutil.ToFloat64(c.metrics.draining); got != 1 {
		t.Fatalf("vipd_health_draining = %v, want 1", got)
	}
	if s := nextReport(t, reports); s.HandOver || !s.Draining {
		t.Fatalf("asked again while the first handover runs: %+v", s)
	}
	handed := time.Now()
	if c.HandedOver(true) {
		t.Fatal("HandedOver(true) while draining left the node eligible")
	}
	s = nextReport(t, reports)
	for !s.Checked.After(handed) {
		s = nextReport(t, reports)
	}
	if !s.Healthy || s.Eligible || s.HandOver {
		t.Fatalf("after the handover: %+v, want healthy, not eligible, no new handover", s)
	}
	// Restarted: /readyz passes its shutdown check again.
	shutdown.Store(false)
	s = nextReport(t, reports)
	for s.Draining {
		s = nextReport(t, reports)
	}
	if !s.Eligible || s.HandOver {
		t.Fatalf("after the restart: %+v, want eligible", s)
	}
	if got := testutil.ToFloat64(c.metrics.draining); got != 0 {
		t.Fatalf("vipd_health_draining = %v, want 0", got)
	}
}

// TestRunDrainRefused: without a shutdown delay the listener goes at
// once; the first refused probe after a good one asks for the handover,
// while the fail threshold has not yet made the node unhealthy.
func TestRunDrainRefused(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	c := newChecker(t, Config{URL: ts.URL + "/livez", ReadyzURL: ts.URL + "/readyz", Interval: 5 * time.Millisecond, FailThreshold: 3}, nil)
	reports, stop := runChecker(t, c)
	defer stop()
	if s := nextReport(t, reports); !s.Healthy || s.Draining {
		t.Fatalf("first report = %+v, want healthy", s)
	}
	ts.Close()
	s := nextReport(t, reports)
	for s.Reason == ReasonOK {
		s = nextReport(t, reports)
	}
	if s.Reason != ReasonRefused || !s.Draining || !s.HandOver || s.DrainReason != DrainRefused || !s.Healthy {
		t.Fatalf("first refused probe: %+v, want a handover asked while still healthy", s)
	}
}

// TestProbeConnectionIsRaw: the probe's connections read and write with
// raw calls (internal/rawconn), so an idle node's probes do not wake the
// runtime's monitor thread; the probe still works through them, the
// connection kept from one probe to the next.
func TestProbeConnectionIsRaw(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	c := newChecker(t, Config{URL: ts.URL + "/livez"}, prometheus.NewRegistry())
	_, tr := c.client(probeCreds{})
	var dialed []net.Conn
	dial := tr.DialTLSContext
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		dialed = append(dialed, conn)
		return conn, err
	}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, err := client.Get(ts.URL + "/livez")
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d: %s", i, resp.Status)
		}
	}
	if len(dialed) != 1 {
		t.Fatalf("%d connections for 3 probes, want 1", len(dialed))
	}
	w, ok := dialed[0].(*peerWatch)
	if !ok {
		t.Fatalf("the probe's connection is a %T, want *peerWatch", dialed[0])
	}
	tc, ok := w.Conn.(*tls.Conn)
	if !ok {
		t.Fatalf("the probe's connection carries a %T, want *tls.Conn", w.Conn)
	}
	if _, ok := tc.NetConn().(*rawconn.Conn); !ok {
		t.Fatalf("the probe's socket is a %T, want *rawconn.Conn", tc.NetConn())
	}
}

// TestRunProbesWhenServerCloses: when the apiserver closes the kept
// connection between probes (it stops listening and closes its idle
// connections as it shuts down), the next probe runs at once rather
// than at the next tick, at most once per interval; the probe after it
// is on the grid again. An apiserver stopped without a shutdown delay is
// refused at once: the first refused probe asks for the handover.
func TestRunProbesWhenServerCloses(t *testing.T) {
	for _, scheme := range []string{"https", "http"} {
		t.Run(scheme, func(t *testing.T) {
			t.Parallel()
			h := func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }
			var ts *httptest.Server
			if scheme == "https" {
				ts = tlsServer(t, h)
			} else {
				ts = httptest.NewServer(http.HandlerFunc(h))
				t.Cleanup(ts.Close)
			}
			testProbesWhenServerCloses(t, ts)
		})
	}
}

func testProbesWhenServerCloses(t *testing.T, ts *httptest.Server) {
	const iv = 2 * time.Second
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: iv}, nil)
	reports, stop := runChecker(t, c)
	defer stop()
	nextReport(t, reports) // at start
	// Close between probes, at least 700 ms before the next tick.
	if time.Until(time.Now().Truncate(iv).Add(iv)) < 900*time.Millisecond {
		nextReport(t, reports)
	}
	time.Sleep(100 * time.Millisecond)
	closed := time.Now()
	ts.CloseClientConnections()
	s := nextReport(t, reports)
	if el := s.Checked.Sub(closed); el > 500*time.Millisecond || s.Reason != ReasonOK {
		t.Fatalf("after the server closed the connection: %+v %v later, want an OK probe at once", s, el)
	}
	// A second close in the same interval waits for the tick.
	ts.CloseClientConnections()
	s = nextReport(t, reports)
	if ph := s.Checked.Sub(s.Checked.Truncate(iv)); ph > 300*time.Millisecond {
		t.Fatalf("second close in one interval probed at phase %v, want the tick (%+v)", ph, s)
	}
	// The server stops: its listener and connections close together,
	// after the tick that follows (more than an interval after the
	// first early probe).
	nextReport(t, reports)
	time.Sleep(100 * time.Millisecond)
	closed = time.Now()
	ts.Close()
	s = nextReport(t, reports)
	if el := s.Checked.Sub(closed); el > 500*time.Millisecond || s.Reason != ReasonRefused || !s.HandOver {
		t.Fatalf("after the server stopped: %+v %v later, want a refused probe asking for the handover at once", s, el)
	}
}

// TestPeerWatch: a read that finds the connection ended by the other side
// (end of stream, reset) tells closed; this side's Close does not.
func TestPeerWatch(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pair := func() (*peerWatch, net.Conn, *atomic.Int32) {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rawconn.Wrap(c)
		if err != nil {
			t.Fatal(err)
		}
		var n atomic.Int32
		return &peerWatch{Conn: rc, closed: func() { n.Add(1) }}, s, &n
	}
	buf := make([]byte, 8)

	w, s, n := pair()
	_, _ = s.Write([]byte("x"))
	if _, err := w.Read(buf); err != nil || n.Load() != 0 {
		t.Fatalf("a read of data: %v, closed told %d times", err, n.Load())
	}
	s.Close()
	if _, err := w.Read(buf); !errors.Is(err, io.EOF) || n.Load() != 1 {
		t.Fatalf("after the peer closed: %v, closed told %d times, want EOF and once", err, n.Load())
	}
	w.Close()

	w, s, n = pair()
	_ = s.(*net.TCPConn).SetLinger(0) // a reset
	s.Close()
	if _, err := w.Read(buf); err == nil || n.Load() != 1 {
		t.Fatalf("after the peer reset: %v, closed told %d times, want an error and once", err, n.Load())
	}
	w.Close()

	w, s, n = pair()
	defer s.Close()
	go func() { time.Sleep(50 * time.Millisecond); w.Close() }()
	if _, err := w.Read(buf); err == nil || n.Load() != 0 {
		t.Fatalf("after this side's Close: %v, closed told %d times, want an error and never", err, n.Load())
	}
}

// TestRunKickKeepsThreshold: the early probe after the apiserver closed
// the connection takes the next tick's place, so the fail threshold
// still spans its intervals: from the first failed probe (the early one)
// to the verdict, threshold-1 whole intervals.
func TestRunKickKeepsThreshold(t *testing.T) {
	const iv = 200 * time.Millisecond
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	c := newChecker(t, Config{URL: ts.URL + "/livez", Interval: iv, FailThreshold: 3, Timeout: 150 * time.Millisecond}, nil)
	reports, stop := runChecker(t, c)
	defer stop()
	nextReport(t, reports)
	nextReport(t, reports) // on the grid, the connection kept
	time.Sleep(30 * time.Millisecond)
	closed := time.Now()
	ts.Close()
	first := nextReport(t, reports)
	if first.Reason != ReasonRefused || first.Checked.Sub(closed) > iv/2 {
		t.Fatalf("first probe after the server stopped: %q %v after, want refused at once", first.Reason, first.Checked.Sub(closed))
	}
	s := first
	for s.Healthy {
		s = nextReport(t, reports)
	}
	if d := s.Checked.Sub(first.Checked); d < 2*iv-20*time.Millisecond {
		t.Fatalf("unhealthy %v after the first failed probe, want at least 2 intervals (%v): the early probe added a failure instead of moving one", d, 2*iv)
	}
}
