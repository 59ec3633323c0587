package cloud

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/internal/fakedo"
)

const (
	testToken = "dop_v1_test"
	testIP    = "192.0.2.10"
	self      = 101
	other     = 102
)

var ip10 = netip.MustParseAddr(testIP)

// syncBuf is a log sink safe for concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	fake *fakedo.Server
	do   *DigitalOcean
	reg  *prometheus.Registry
	logs *syncBuf
}

// newEnv starts a fake with droplets 101 (us) and 102 and the reserved IP
// on holder (0: unassigned), and a backend for droplet 101.
func newEnv(t *testing.T, holder int, fo fakedo.Options, mutate func(*DOConfig)) *env {
	t.Helper()
	if fo.Token == "" {
		fo.Token = testToken
	}
	fake, err := fakedo.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddDroplet(fakedo.Droplet{ID: self, Name: "cp-1", PublicIPv4: "198.51.100.1"})
	fake.AddDroplet(fakedo.Droplet{ID: other, Name: "cp-2", PublicIPv4: "198.51.100.2"})
	fake.AddReservedIP(testIP, holder)

	client, reg, logs := testClient(t)
	cfg := DOConfig{Token: testToken, APIURL: fake.URL(), MetadataURL: fake.MetadataURL(self), DropletID: self, Client: client}
	if mutate != nil {
		mutate(&cfg)
	}
	do, err := NewDigitalOcean(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{fake: fake, do: do, reg: reg, logs: logs}
}

// testClient is the client settings of the backend tests: fast polls and
// back-off, metrics in a fresh registry, debug logs into logs.
func testClient(t *testing.T) (c Client, reg *prometheus.Registry, logs *syncBuf) {
	t.Helper()
	reg = prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	logs = &syncBuf{}
	return Client{
		PollInterval: 20 * time.Millisecond,
		LockWait:     50 * time.Millisecond,
		Backoff:      Backoff{Base: 50 * time.Millisecond, Max: 400 * time.Millisecond},
		Metrics:      m,
		Logger:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}, reg, logs
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) calls(call, outcome string) float64 {
	return testutil.ToFloat64(e.do.cfg.Metrics.calls.WithLabelValues(ProviderDigitalOcean, call, outcome))
}

const actionsPath = "/v2/reserved_ips/" + testIP + "/actions"

func TestAssignPollsTheActionUntilComplete(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{ActionDuration: 300 * time.Millisecond}, nil)
	start := time.Now()
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d, want %d", holder, self)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("Assign returned after %v, before the action could complete", took)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 1 {
		t.Fatalf("%d assign requests, want 1", n)
	}
	polls := e.fake.Count(http.MethodGet, actionsPath+"/")
	if polls < 2 || polls > 40 {
		t.Fatalf("%d action polls for a 300ms action at 20ms interval", polls)
	}
	var body string
	for _, r := range e.fake.Requests() {
		if r.Method == http.MethodPost {
			body = r.Body
		}
	}
	if !strings.Contains(body, `"type":"assign"`) || !strings.Contains(body, `"droplet_id":101`) {
		t.Fatalf("assign body %s", body)
	}
	if n := e.fake.Count("", "/v2/floating_ips"); n != 0 {
		t.Fatalf("%d calls to the deprecated floating_ips endpoints", n)
	}
	if e.calls(CallAssign, OutcomeSuccess) != 1 || e.calls(CallGetAction, OutcomeSuccess) != float64(polls) {
		t.Fatalf("metrics: assign %v, get_action %v", e.calls(CallAssign, OutcomeSuccess), e.calls(CallGetAction, OutcomeSuccess))
	}
	h, err := e.do.Holder(ctxT(t, time.Second), ip10)
	if err != nil || !h.Self || h.Holder != "101" || h.Locked {
		t.Fatalf("holder = %+v, %v", h, err)
	}
}

func TestAssignResumesItsOwnActionAfterATimeout(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{ActionDuration: 600 * time.Millisecond}, nil)
	err := e.do.Assign(ctxT(t, 200*time.Millisecond), ip10)
	if err == nil || !isCtxErr(err) {
		t.Fatalf("short deadline: %v, want a deadline error", err)
	}
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 1 {
		t.Fatalf("%d assign requests, want 1 (the second call resumes polling)", n)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
}

func TestAssignRetriesAnErroredAction(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{ActionDuration: 50 * time.Millisecond}, nil)
	e.fake.FailActions(1)
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 2 {
		t.Fatalf("%d assign requests, want 2", n)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
}

func TestRateLimitStormKeepsRequestsBounded(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, func(c *DOConfig) { c.Backoff.Base = 10 * time.Millisecond })
	// Every call answers 429 with RateLimit-Reset one second ahead.
	e.fake.AddFault(fakedo.Fault{Status: http.StatusTooManyRequests, Count: -1, ResetAfter: time.Second})

	// The driver calls Acquire every ~100ms with a 700ms deadline, for 3s.
	window := 3 * time.Second
	start := time.Now()
	attempts := 0
	var lastErr error
	for time.Since(start) < window {
		attempts++
		lastErr = e.do.Assign(ctxT(t, 700*time.Millisecond), ip10)
		if lastErr == nil {
			t.Fatal("assign succeeded during a 429 storm")
		}
		time.Sleep(100 * time.Millisecond)
	}
	n := len(e.fake.Requests())
	// RateLimit-Reset is whole seconds, so waits are 1-2s: at most one
	// request per second of window, plus the first.
	maxReq := int(window/time.Second) + 1
	t.Logf("429 storm: %d Acquire attempts over %v sent %d requests", attempts, window, n)
	if n > maxReq || n < 1 {
		t.Fatalf("%d requests during the storm, want 1..%d", n, maxReq)
	}
	if !errors.Is(lastErr, ErrRateLimited) {
		t.Fatalf("error during the storm = %v, want ErrRateLimited", lastErr)
	}
	if !strings.Contains(e.logs.String(), "outcome=rate_limited") {
		t.Fatalf("no rate_limited log line:\n%s", e.logs)
	}
	if got := e.calls(CallAssign, OutcomeRateLimited); got != float64(n) {
		t.Fatalf("rate_limited metric = %v, want %d", got, n)
	}

	// After the storm the next call waits out the reset and succeeds.
	e.fake.ClearFaults()
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatalf("after the storm: %v", err)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
}

func TestServerErrorsThenRecovery(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	e.fake.AddFault(fakedo.Fault{Method: http.MethodPost, Status: http.StatusServiceUnavailable, Count: 3})
	start := time.Now()
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	// Backoff 50, 100, 200ms (+ up to 20% jitter) between the four POSTs.
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Fatalf("recovered after %v: no backoff between retries", took)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 4 {
		t.Fatalf("%d POSTs, want 4 (3 failures then success)", n)
	}
	if got := e.calls(CallAssign, OutcomeServerError); got != 3 {
		t.Fatalf("server_error metric = %v", got)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
}

func TestAPIDownThenBack(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	e.fake.Down()
	_, err := e.do.Holder(ctxT(t, 500*time.Millisecond), ip10)
	if err == nil || (!errors.Is(err, ErrUnavailable) && !isCtxErr(err)) {
		t.Fatalf("API down: %v", err)
	}
	down := e.calls(CallGetReservedIP, OutcomeTransport)
	if down < 2 || down > 8 {
		t.Fatalf("%v attempts in 500ms with 50ms..400ms backoff", down)
	}
	if !strings.Contains(e.logs.String(), "outcome=transport_error") {
		t.Fatalf("no transport_error log line:\n%s", e.logs)
	}
	if err := e.fake.Up(); err != nil {
		t.Fatal(err)
	}
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatalf("after the API came back: %v", err)
	}
}

func TestLockedByAnotherActionIsRetried(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{ActionDuration: 50 * time.Millisecond}, nil)
	if _, err := e.fake.LockIP(testIP, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
	posts := 0
	var statuses []int
	for _, r := range e.fake.Requests() {
		if r.Method == http.MethodPost {
			posts++
			statuses = append(statuses, r.Status)
		}
	}
	if posts != 2 || statuses[0] != 422 || statuses[1] != 201 {
		t.Fatalf("POST statuses %v, want [422 201]", statuses)
	}
	if !strings.Contains(e.logs.String(), "locked by another action") {
		t.Fatalf("no lock log line:\n%s", e.logs)
	}
}

// When the action holding the lock moves the IP to another droplet (most
// likely another node's assign), Assign does not move it straight back.
func TestLockHolderMovedTheIP(t *testing.T) {
	e := newEnv(t, 0, fakedo.Options{ActionDuration: 300 * time.Millisecond}, nil)
	if err := startAssign(e, other); err != nil {
		t.Fatal(err)
	}
	err := e.do.Assign(ctxT(t, 5*time.Second), ip10)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "moved to droplet 102") {
		t.Fatalf("err = %v", err)
	}
	if holder, _ := e.fake.Holder(testIP); holder != 102 {
		t.Fatalf("holder = %d, want 102 (not moved back)", holder)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 2 {
		t.Fatalf("%d POSTs, want 2 (the other's assign and our 422)", n)
	}
	// The next acquire (still elected) assigns.
	if err := e.do.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if holder, _ := e.fake.Holder(testIP); holder != self {
		t.Fatalf("holder = %d", holder)
	}
}

func TestLockedUntilDeadlineIsAClearError(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	if _, err := e.fake.LockIP(testIP, time.Minute); err != nil {
		t.Fatal(err)
	}
	err := e.do.Assign(ctxT(t, 300*time.Millisecond), ip10)
	if err == nil || !strings.Contains(err.Error(), "still locked by another action") || !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v", err)
	}
}

func TestOther422IsFinal(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	e.fake.AddReservedIP("192.0.2.20", self) // droplets hold one reserved IP at most
	err := e.do.Assign(ctxT(t, 2*time.Second), ip10)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already has a reserved IP") {
		t.Fatalf("err = %v", err)
	}
	if n := e.fake.Count(http.MethodPost, actionsPath); n != 1 {
		t.Fatalf("%d POSTs, want 1 (not retried)", n)
	}
}

func TestNotFoundIsAClearError(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	missing := netip.MustParseAddr("192.0.2.99")
	_, err := e.do.Holder(ctxT(t, time.Second), missing)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "192.0.2.99 is not in this DigitalOcean account") {
		t.Fatalf("Holder: %v", err)
	}
	err = e.do.Assign(ctxT(t, time.Second), missing)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not in this DigitalOcean account") {
		t.Fatalf("Assign: %v", err)
	}
	if n := len(e.fake.Requests()); n != 2 {
		t.Fatalf("%d requests, want 2 (404 is not retried)", n)
	}
}

func TestBadTokenIsAClearError(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, func(c *DOConfig) { c.Token = "wrong" })
	_, err := e.do.Holder(ctxT(t, time.Second), ip10)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "API token rejected") || !strings.Contains(err.Error(), "DIGITALOCEAN_ACCESS_TOKEN") || !strings.Contains(err.Error(), "Unable to authenticate you") {
		t.Fatalf("err = %v", err)
	}
	ann := NewAnnouncer(e.do, AnnouncerOptions{})
	defer ann.Close()
	if err := ann.Prime(ctxT(t, time.Second), []netip.Prefix{netip.PrefixFrom(ip10, 32)}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("Prime: %v", err)
	}
	if n := len(e.fake.Requests()); n != 2 {
		t.Fatalf("%d requests, want 2 (401 is not retried)", n)
	}
	if got := e.calls(CallGetReservedIP, OutcomeUnauthorized); got != 2 {
		t.Fatalf("unauthorized metric = %v", got)
	}
}

func TestForbiddenNamesTheScopes(t *testing.T) {
	e := newEnv(t, other, fakedo.Options{}, nil)
	e.fake.AddFault(fakedo.Fault{Status: http.StatusForbidden, Count: 1})
	_, err := e.do.Holder(ctxT(t, time.Second), ip10)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "reserved_ip:update") {
		t.Fatalf("err = %v", err)
	}
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("stale\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, other, fakedo.Options{}, func(c *DOConfig) { c.Token, c.TokenFile = "", path })
	if _, err := e.do.Holder(ctxT(t, time.Second), ip10); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("stale token: %v", err)
	}
	// A rotated token file is picked up on the next 401.
	if err := os.WriteFile(path, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.do.Holder(ctxT(t, time.Second), ip10); err != nil {
		t.Fatalf("rotated token: %v", err)
	}
}

func TestTokenSettingErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		cfg      DOConfig
		setting  string
		contains string
	}{
		{"none", DOConfig{DropletID: 1}, "DIGITALOCEAN_ACCESS_TOKEN", "VIPD_DO_TOKEN_FILE"},
		{"missing file", DOConfig{DropletID: 1, TokenFile: filepath.Join(dir, "nope")}, "VIPD_DO_TOKEN_FILE", "no such file"},
		{"empty file", DOConfig{DropletID: 1, TokenFile: empty}, "VIPD_DO_TOKEN_FILE", "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDigitalOcean(context.Background(), tc.cfg)
			var se *SettingError
			if !errors.As(err, &se) || se.Name != tc.setting || !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("err = %v, want a SettingError for %s mentioning %q", err, tc.setting, tc.contains)
			}
		})
	}
}

func TestDropletIDFromMetadata(t *testing.T) {
	e := newEnv(t, 0, fakedo.Options{}, nil)
	do, err := NewDigitalOcean(ctxT(t, 5*time.Second), DOConfig{Token: testToken, APIURL: e.fake.URL(), MetadataURL: e.fake.MetadataURL(other)})
	if err != nil {
		t.Fatal(err)
	}
	if do.DropletID() != other || do.Instance() != "102" {
		t.Fatalf("droplet id = %d", do.DropletID())
	}
	if len(e.fake.Requests()) != 0 {
		t.Fatalf("learning the droplet id called the API: %+v", e.fake.Requests())
	}

	e.fake.MetadataDown()
	start := time.Now()
	_, err = NewDigitalOcean(ctxT(t, 10*time.Second), DOConfig{Token: testToken, APIURL: e.fake.URL(), MetadataURL: e.fake.MetadataURL(other)})
	if err == nil || !strings.Contains(err.Error(), "VIPD_DO_DROPLET_ID") || !strings.Contains(err.Error(), "/metadata/v1/id") {
		t.Fatalf("metadata down: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("gave up after %v", time.Since(start))
	}
}

func TestHeldLocally(t *testing.T) {
	e := newEnv(t, self, fakedo.Options{}, nil)
	held, err := e.do.HeldLocally(ctxT(t, time.Second), ip10)
	if err != nil || !held {
		t.Fatalf("held = %v, %v", held, err)
	}
	if held, _ := e.do.HeldLocally(ctxT(t, time.Second), netip.MustParseAddr("192.0.2.11")); held {
		t.Fatal("another IP reported held")
	}
	e2 := newEnv(t, other, fakedo.Options{}, nil)
	if held, err := e2.do.HeldLocally(ctxT(t, time.Second), ip10); err != nil || held {
		t.Fatalf("held by other = %v, %v", held, err)
	}
}

// startAssign starts an assign to droplet id as another client would.
func startAssign(e *env, id int) error {
	req, err := http.NewRequest(http.MethodPost, e.fake.URL()+"v2/reserved_ips/"+testIP+"/actions", strings.NewReader(fmt.Sprintf(`{"type":"assign","droplet_id":%d}`, id)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("assign: HTTP %d", resp.StatusCode)
	}
	return nil
}
