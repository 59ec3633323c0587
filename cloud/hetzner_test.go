package cloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/internal/fakehcloud"
)

const (
	hzToken  = "hcloud-test-token"
	hzSelf   = int64(4201)
	hzOther  = int64(4202)
	hzFIP    = int64(777)
	hzAssign = "/v1/floating_ips/777/actions/assign"
)

type hzEnv struct {
	fake *fakehcloud.Server
	hz   *Hetzner
	logs *syncBuf
}

// newHzEnv starts a fake with servers 4201 (us) and 4202, floating IP 777
// = 192.0.2.10 on holder (0: unassigned), and a backend for 4201 that
// learns its id from the metadata service.
func newHzEnv(t *testing.T, holder int64, fo fakehcloud.Options, mutate func(*HetznerConfig)) *hzEnv {
	t.Helper()
	if fo.Token == "" {
		fo.Token = hzToken
	}
	fake, err := fakehcloud.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddServer(hzSelf, "cp-1")
	fake.AddServer(hzOther, "cp-2")
	fake.AddFloatingIP(fakehcloud.FloatingIP{ID: hzFIP, IP: testIP, Server: holder})
	client, _, logs := testClient(t)
	cfg := HetznerConfig{Token: hzToken, APIURL: fake.URL(), MetadataURL: fake.MetadataURL(hzSelf), Client: client}
	if mutate != nil {
		mutate(&cfg)
	}
	hz, err := NewHetzner(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &hzEnv{fake: fake, hz: hz, logs: logs}
}

func (e *hzEnv) calls(call, outcome string) float64 {
	return testutil.ToFloat64(e.hz.cfg.Metrics.calls.WithLabelValues(ProviderHetzner, call, outcome))
}

func (e *hzEnv) statuses(method, path string) []int {
	var out []int
	for _, r := range e.fake.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r.Status)
		}
	}
	return out
}

func TestHetznerAssignPollsTheAction(t *testing.T) {
	e := newHzEnv(t, hzOther, fakehcloud.Options{ActionDuration: 300 * time.Millisecond}, nil)
	if e.hz.Instance() != strconv.FormatInt(hzSelf, 10) {
		t.Fatalf("server id %s, want %d from the metadata service", e.hz.Instance(), hzSelf)
	}
	h, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10)
	if err != nil || h.Self || h.Holder != "4202" {
		t.Fatalf("holder before = %+v, %v", h, err)
	}
	start := time.Now()
	if err := e.hz.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("assign returned after %v, before the action (300ms) finished", took)
	}
	if got := e.fake.Holder(testIP); got != hzSelf {
		t.Fatalf("holder after assign = %d", got)
	}
	var body string
	for _, r := range e.fake.Requests() {
		if r.Method == http.MethodPost {
			if r.Path != hzAssign {
				t.Fatalf("POST %s", r.Path)
			}
			body = r.Body
		}
	}
	if !strings.Contains(body, `"server":4201`) {
		t.Fatalf("assign body %q", body)
	}
	if polls := e.fake.Count(http.MethodGet, "/v1/actions/"); polls < 2 {
		t.Fatalf("%d polls of GET /v1/actions/{id}", polls)
	}
	if e.calls(CallAssign, OutcomeSuccess) != 1 || e.calls(CallGetAction, OutcomeSuccess) < 2 || e.calls(CallMetadataInstance, OutcomeSuccess) != 1 {
		t.Fatalf("metrics: assign %v, get_action %v, metadata %v", e.calls(CallAssign, OutcomeSuccess), e.calls(CallGetAction, OutcomeSuccess), e.calls(CallMetadataInstance, OutcomeSuccess))
	}
	h, err = e.hz.Holder(ctxT(t, 2*time.Second), ip10)
	if err != nil || !h.Self {
		t.Fatalf("holder after = %+v, %v", h, err)
	}
}

// The floating IP is found by address across pages of the list; later
// calls use its id (GET /v1/floating_ips/{id}), never the list again.
func TestHetznerFindsTheFloatingIPByAddressAcrossPages(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{}, nil)
	for i := 1; i <= 60; i++ {
		e.fake.AddFloatingIP(fakehcloud.FloatingIP{ID: int64(1000 + i), IP: fmt.Sprintf("198.51.100.%d", i)})
	}
	// 777 was added first: move it to the end so it sits on page 2.
	e.fake.AddFloatingIP(fakehcloud.FloatingIP{ID: 2000, IP: "203.0.113.77", Server: hzOther})
	want := netip.MustParseAddr("203.0.113.77")
	for i := 0; i < 3; i++ {
		h, err := e.hz.Holder(ctxT(t, 2*time.Second), want)
		if err != nil || h.Holder != "4202" {
			t.Fatalf("holder = %+v, %v", h, err)
		}
	}
	if n := e.fake.Count(http.MethodGet, "/v1/floating_ips"); n != 2+2 {
		var paths []string
		for _, r := range e.fake.Requests() {
			paths = append(paths, r.Path+"?"+r.Query)
		}
		t.Fatalf("%d GETs, want 2 list pages then 2 by id: %v", n, paths)
	}
	if n := e.fake.Count(http.MethodGet, "/v1/floating_ips/2000"); n != 2 {
		t.Fatalf("%d GET by id", n)
	}
	// A second VIP seen in the same list (a server may hold several): its
	// id is known, one GET by id and no list.
	lists := func() int {
		n := 0
		for _, r := range e.fake.Requests() {
			if r.Path == "/v1/floating_ips" {
				n++
			}
		}
		return n
	}
	l0 := lists()
	if _, err := e.hz.Holder(ctxT(t, 2*time.Second), netip.MustParseAddr("198.51.100.5")); err != nil {
		t.Fatal(err)
	}
	if lists() != l0 || e.fake.Count(http.MethodGet, "/v1/floating_ips/1005") != 1 {
		t.Fatalf("second VIP: %d more lists, %d GETs by id", lists()-l0, e.fake.Count(http.MethodGet, "/v1/floating_ips/1005"))
	}
	// An address that is not a floating IP of the project.
	_, err := e.hz.Holder(ctxT(t, 2*time.Second), netip.MustParseAddr("192.0.2.99"))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "192.0.2.99 is not in this Hetzner Cloud project") {
		t.Fatalf("unknown IP: %v", err)
	}
}

// VIPD_HCLOUD_FLOATING_IP_ID: the ids are fetched directly, no list; an id
// that does not exist is an error naming the setting.
func TestHetznerFloatingIPByID(t *testing.T) {
	e := newHzEnv(t, hzOther, fakehcloud.Options{}, func(c *HetznerConfig) { c.FloatingIPIDs = []int64{hzFIP} })
	if _, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.Count(http.MethodGet, "/v1/floating_ips"); n != 1 || e.fake.Count(http.MethodGet, "/v1/floating_ips/777") != 1 {
		t.Fatalf("%d floating IP requests, want one GET by id", n)
	}
	e = newHzEnv(t, 0, fakehcloud.Options{}, func(c *HetznerConfig) { c.FloatingIPIDs = []int64{999} })
	_, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "VIPD_HCLOUD_FLOATING_IP_ID=999") {
		t.Fatalf("missing id: %v", err)
	}
}

func TestHetznerTokenErrors(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{}, nil)
	e.fake.SetToken("another")
	_, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10)
	msg := fmt.Sprint(err)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(msg, "API token rejected") || !strings.Contains(msg, "HTTP 401 unauthorized: unable to authenticate") || !strings.Contains(msg, "HCLOUD_TOKEN") {
		t.Fatalf("wrong token: %v", err)
	}
	if strings.Contains(msg, hzToken) {
		t.Fatalf("the token is echoed: %v", err)
	}
	if n := len(e.fake.Requests()); n != 1 {
		t.Fatalf("%d requests with a rejected token, want 1 (no retry)", n)
	}
	if e.calls(CallListFloatingIPs, OutcomeUnauthorized) != 1 {
		t.Fatal("unauthorized not counted")
	}

	// A read-only token: 403 forbidden on the assign.
	e = newHzEnv(t, 0, fakehcloud.Options{}, nil)
	e.fake.AddFault(fakehcloud.Fault{Method: http.MethodPost, Status: http.StatusForbidden, Count: -1})
	err = e.hz.Assign(ctxT(t, 2*time.Second), ip10)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "Read & Write") {
		t.Fatalf("read-only token: %v", err)
	}

	// A rotated token file is read again after a 401.
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e = newHzEnv(t, 0, fakehcloud.Options{Token: "new"}, func(c *HetznerConfig) { c.Token, c.TokenFile = "", file })
	if err := os.WriteFile(file, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
}

func TestHetznerSettings(t *testing.T) {
	fake, err := fakehcloud.New(fakehcloud.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddServer(hzSelf, "cp-1")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		cfg      HetznerConfig
		setting  string
		contains string
	}{
		{"no token", HetznerConfig{}, "HCLOUD_TOKEN", "VIPD_HCLOUD_TOKEN_FILE"},
		{"missing file", HetznerConfig{TokenFile: "/nonexistent/token"}, "VIPD_HCLOUD_TOKEN_FILE", "no such file"},
		{"empty file", HetznerConfig{TokenFile: empty}, "VIPD_HCLOUD_TOKEN_FILE", "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.APIURL, tc.cfg.ServerID = fake.URL(), hzSelf
			_, err := NewHetzner(context.Background(), tc.cfg)
			var se *SettingError
			if !errors.As(err, &se) || se.Name != tc.setting || !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("err = %v, want a %s setting error", err, tc.setting)
			}
		})
	}
	// No metadata service and no server id: the error names both settings.
	fake.Close()
	_, err = NewHetzner(ctxT(t, 5*time.Second), HetznerConfig{Token: "x", MetadataURL: fake.MetadataURL(hzSelf)})
	if err == nil || !strings.Contains(err.Error(), "VIPD_HCLOUD_SERVER_ID") || !strings.Contains(err.Error(), "/instance-id") {
		t.Fatalf("metadata down: %v", err)
	}
}

// An empty rate-limit bucket: Hetzner's RateLimit-Reset is when the bucket
// is full again, but one request comes back every 3600/limit s; vipd waits
// that long per attempt (not until the reset), and assigns.
func TestHetznerRateLimitedWaitsForOneRequest(t *testing.T) {
	// 36000 per hour: one request per 100 ms; a full bucket is an hour away.
	e := newHzEnv(t, 0, fakehcloud.Options{RateLimit: 36000}, func(c *HetznerConfig) { c.ServerID = hzSelf })
	e.fake.ExhaustRateLimit()
	start := time.Now()
	if err := e.hz.Assign(ctxT(t, 10*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	limited := e.calls(CallListFloatingIPs, OutcomeRateLimited) + e.calls(CallAssign, OutcomeRateLimited)
	t.Logf("assign with an empty bucket (1 request / 100 ms): %v, %v requests answered 429, %d requests", took.Round(time.Millisecond), limited, len(e.fake.Requests()))
	// The first request finds the bucket empty (429); after that vipd paces
	// itself by RateLimit-Remaining and gets no other 429.
	if limited != 1 || took > 3*time.Second {
		t.Fatalf("took %v with %v 429s, want exactly one", took, limited)
	}
	if len(e.fake.Requests()) > 8 {
		t.Fatalf("%d requests: the client did not wait between attempts", len(e.fake.Requests()))
	}
	if e.fake.Holder(testIP) != hzSelf {
		t.Fatal("not assigned")
	}
}

func TestHetznerRateWait(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	h := func(limit, remaining string, reset int64, retry string) http.Header {
		out := http.Header{}
		out.Set("RateLimit-Limit", limit)
		out.Set("RateLimit-Remaining", remaining)
		out.Set("RateLimit-Reset", strconv.FormatInt(reset, 10))
		if retry != "" {
			out.Set("Retry-After", retry)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"default bucket empty: one second", h("3600", "0", now.Unix()+3600, ""), time.Second},
		{"small bucket: 3600/360 = 10 s", h("360", "0", now.Unix()+3600, ""), 10 * time.Second},
		{"Retry-After longer wins", h("3600", "0", now.Unix()+3600, "5"), 5 * time.Second},
		{"reset in the past", h("3600", "0", now.Unix()-5, ""), 0},
		{"bucket full: nothing to wait for", h("3600", "3600", now.Unix(), ""), 0},
		{"no headers", nil, 0},
		{"garbage", h("x", "0", now.Unix()+10, ""), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hetznerRateWait(tc.h, now); got != tc.want {
				t.Fatalf("wait %v, want %v", got, tc.want)
			}
		})
	}
}

// 5xx and broken connections are retried with backoff; the assign goes
// through and every failure is counted.
func TestHetznerServerErrorsAreRetried(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{}, func(c *HetznerConfig) { c.ServerID = hzSelf; c.FloatingIPIDs = []int64{hzFIP} })
	e.fake.AddFault(fakehcloud.Fault{Method: http.MethodPost, Status: http.StatusServiceUnavailable, Count: 2})
	e.fake.AddFault(fakehcloud.Fault{Method: http.MethodPost, Drop: true, Count: 1})
	if err := e.hz.Assign(ctxT(t, 10*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if got := e.statuses(http.MethodPost, hzAssign); len(got) != 4 || got[3] != http.StatusCreated {
		t.Fatalf("assign statuses %v, want two 503, a dropped one, then 201", got)
	}
	if e.calls(CallAssign, OutcomeServerError) != 2 || e.calls(CallAssign, OutcomeTransport) != 1 {
		t.Fatalf("server_error %v transport_error %v", e.calls(CallAssign, OutcomeServerError), e.calls(CallAssign, OutcomeTransport))
	}
	if !strings.Contains(e.logs.String(), "service_error") {
		t.Fatalf("the API's error code is not logged:\n%s", e.logs)
	}

	// Down for good: the deadline ends the attempt with ErrUnavailable.
	e.fake.Down()
	err := e.hz.Assign(ctxT(t, 500*time.Millisecond), ip10)
	if err == nil || (!errors.Is(err, ErrUnavailable) && !isCtxErr(err)) {
		t.Fatalf("API down: %v", err)
	}
}

// 423 locked: another action on the floating IP is running. vipd waits and
// assigns once it is over.
func TestHetznerLockedIsWaitedOut(t *testing.T) {
	e := newHzEnv(t, hzOther, fakehcloud.Options{ActionDuration: 100 * time.Millisecond}, func(c *HetznerConfig) { c.ServerID = hzSelf })
	e.fake.LockIP(hzFIP, 300*time.Millisecond)
	if err := e.hz.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	st := e.statuses(http.MethodPost, hzAssign)
	if len(st) < 2 || st[0] != http.StatusLocked || st[len(st)-1] != http.StatusCreated {
		t.Fatalf("assign statuses %v, want 423 first and 201 last", st)
	}
	if !strings.Contains(e.logs.String(), "locked by another action") || e.calls(CallAssign, OutcomeLocked) < 1 {
		t.Fatalf("lock not logged or counted:\n%s", e.logs)
	}
	if e.fake.Holder(testIP) != hzSelf {
		t.Fatal("not assigned")
	}
}

// The action holding the lock moved the IP to another server (most likely
// another node's assign): vipd does not move it straight back.
func TestHetznerLockedMoveElsewhereIsNotUndone(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{}, func(c *HetznerConfig) { c.ServerID = hzSelf })
	e.fake.LockIP(hzFIP, 400*time.Millisecond)
	go func() {
		time.Sleep(150 * time.Millisecond)
		e.fake.SetHolder(hzFIP, hzOther)
	}()
	err := e.hz.Assign(ctxT(t, 5*time.Second), ip10)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "moved to server 4202") {
		t.Fatalf("err = %v", err)
	}
	if e.fake.Holder(testIP) != hzOther {
		t.Fatal("the IP was moved back")
	}
}

// An assign action that ends in "error" is tried again; an assign whose
// caller gave up while its action ran is resumed, not sent twice.
func TestHetznerActionErrorAndResume(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{ActionDuration: 100 * time.Millisecond}, func(c *HetznerConfig) { c.ServerID = hzSelf })
	e.fake.FailActions(1)
	if err := e.hz.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.Count(http.MethodPost, hzAssign); n != 2 || e.fake.Holder(testIP) != hzSelf {
		t.Fatalf("%d assigns after a failed action, holder %d", n, e.fake.Holder(testIP))
	}
	if !strings.Contains(e.logs.String(), "action_failed") {
		t.Fatalf("the action's error is not logged:\n%s", e.logs)
	}

	e.fake.SetHolder(hzFIP, hzOther)
	e.fake.SetActionDuration(800 * time.Millisecond)
	before := e.fake.Count(http.MethodPost, hzAssign)
	if err := e.hz.Assign(ctxT(t, 300*time.Millisecond), ip10); err == nil {
		t.Fatal("assign returned before its action finished")
	}
	if err := e.hz.Assign(ctxT(t, 5*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.Count(http.MethodPost, hzAssign) - before; n != 1 {
		t.Fatalf("%d assigns for one move, want 1 (the second call resumes the action)", n)
	}
	if e.fake.Holder(testIP) != hzSelf {
		t.Fatal("not assigned")
	}
}

// The announcer's guarantees hold with the Hetzner backend: a lone node
// never takes a floating IP another server holds, and a release never
// calls the API (nothing is unassigned).
func TestHetznerAnnouncerLoneAndRelease(t *testing.T) {
	e := newHzEnv(t, hzOther, fakehcloud.Options{}, func(c *HetznerConfig) { c.ServerID = hzSelf })
	a := NewAnnouncer(e.hz, AnnouncerOptions{CoolOff: -1})
	defer a.Close()
	vip := netip.PrefixFrom(ip10, 32)
	err := a.AcquireLone(ctxT(t, 2*time.Second), vip)
	if !errors.Is(err, ErrHeldElsewhere) || !strings.Contains(err.Error(), "floating IP 192.0.2.10 is assigned to instance 4202") {
		t.Fatalf("lone acquire of an IP held elsewhere: %v", err)
	}
	if n := e.fake.Count(http.MethodPost, ""); n != 0 {
		t.Fatalf("%d POSTs", n)
	}
	e.fake.SetHolder(hzFIP, 0)
	if err := a.AcquireLone(ctxT(t, 2*time.Second), vip); err != nil {
		t.Fatal(err)
	}
	before := len(e.fake.Requests())
	if err := a.Release(ctxT(t, time.Second), vip); err != nil {
		t.Fatal(err)
	}
	if n := len(e.fake.Requests()) - before; n != 0 || e.fake.Holder(testIP) != hzSelf {
		t.Fatalf("release made %d requests; holder %d", n, e.fake.Holder(testIP))
	}
	if n := e.fake.Count(http.MethodPost, "/v1/floating_ips/777/actions/unassign"); n != 0 {
		t.Fatalf("%d unassigns", n)
	}
}

// A floating IP Hetzner blocked is reported once, not at every refresh.
func TestHetznerBlockedIsLoggedOnce(t *testing.T) {
	e := newHzEnv(t, 0, fakehcloud.Options{}, nil)
	e.fake.AddFloatingIP(fakehcloud.FloatingIP{ID: hzFIP, IP: testIP, Blocked: true})
	for i := 0; i < 3; i++ {
		if _, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(e.logs.String(), "blocked by Hetzner"); n != 1 {
		t.Fatalf("%d warnings in 3 checks, want 1:\n%s", n, e.logs)
	}
	e.fake.AddFloatingIP(fakehcloud.FloatingIP{ID: hzFIP, IP: testIP})
	if _, err := e.hz.Holder(ctxT(t, 2*time.Second), ip10); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.logs.String(), "no longer blocked") {
		t.Fatalf("unblock not logged:\n%s", e.logs)
	}
}
