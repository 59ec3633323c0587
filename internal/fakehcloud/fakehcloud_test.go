package fakehcloud

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

func do(t *testing.T, s *Server, method, path, token, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(b, &a.body); err != nil {
		t.Fatalf("%s %s: not JSON: %q", method, path, b)
	}
	return a
}

func errCode(a answer) string {
	e, _ := a.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func newTestServer(t *testing.T, o Options) (*Server, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	o.Now = clk.now
	o.Token = "tok"
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	s.AddServer(42, "cp-1")
	s.AddFloatingIP(FloatingIP{ID: 7, IP: "192.0.2.7"})
	return s, clk
}

func TestErrorsAndRateLimitHeaders(t *testing.T) {
	s, clk := newTestServer(t, Options{RateLimit: 3600})
	a := do(t, s, http.MethodGet, "/floating_ips/7", "wrong", "")
	if a.status != 401 || errCode(a) != "unauthorized" {
		t.Fatalf("wrong token: %d %v", a.status, a.body)
	}
	a = do(t, s, http.MethodGet, "/floating_ips/8", "tok", "")
	if a.status != 404 || errCode(a) != "not_found" {
		t.Fatalf("unknown id: %d %v", a.status, a.body)
	}
	a = do(t, s, http.MethodGet, "/floating_ips/7", "tok", "")
	if a.status != 200 || a.header.Get("RateLimit-Limit") != "3600" || a.header.Get("RateLimit-Remaining") != "3597" {
		t.Fatalf("headers after 3 requests: %v", a.header)
	}
	// Reset is when the bucket is full again: 3 requests at one per second.
	if got := a.header.Get("RateLimit-Reset"); got != strconv.FormatInt(clk.now().Unix()+3, 10) {
		t.Fatalf("RateLimit-Reset %s, want now+3", got)
	}
	s.ExhaustRateLimit()
	a = do(t, s, http.MethodGet, "/floating_ips/7", "tok", "")
	if a.status != 429 || errCode(a) != "rate_limit_exceeded" || a.header.Get("RateLimit-Remaining") != "0" ||
		a.header.Get("RateLimit-Reset") != strconv.FormatInt(clk.now().Unix()+3600, 10) {
		t.Fatalf("empty bucket: %d %v %v", a.status, a.header, a.body)
	}
	clk.add(time.Second)
	if a = do(t, s, http.MethodGet, "/floating_ips/7", "tok", ""); a.status != 200 {
		t.Fatalf("a second later: %d", a.status)
	}
	if a = do(t, s, http.MethodGet, "/floating_ips/7", "tok", ""); a.status != 429 {
		t.Fatalf("the refilled request was spent: %d", a.status)
	}
}

func TestAssignActionLocksAndCompletes(t *testing.T) {
	s, clk := newTestServer(t, Options{ActionDuration: 3 * time.Second})
	a := do(t, s, http.MethodPost, "/floating_ips/7/actions/assign", "tok", `{"server":42}`)
	act, _ := a.body["action"].(map[string]any)
	if a.status != 201 || act["status"] != "running" || act["command"] != "assign_floating_ip" {
		t.Fatalf("assign: %d %v", a.status, a.body)
	}
	id := strconv.FormatFloat(act["id"].(float64), 'f', 0, 64)
	if a = do(t, s, http.MethodPost, "/floating_ips/7/actions/assign", "tok", `{"server":42}`); a.status != 423 || errCode(a) != "locked" {
		t.Fatalf("second assign while running: %d %v", a.status, a.body)
	}
	clk.add(1500 * time.Millisecond)
	a = do(t, s, http.MethodGet, "/actions/"+id, "tok", "")
	act, _ = a.body["action"].(map[string]any)
	if act["status"] != "running" || act["progress"].(float64) != 50 || act["finished"] != nil {
		t.Fatalf("half-way: %v", act)
	}
	if s.Holder("192.0.2.7") != 0 {
		t.Fatal("moved before the action completed")
	}
	clk.add(1500 * time.Millisecond)
	a = do(t, s, http.MethodGet, "/actions/"+id, "tok", "")
	act, _ = a.body["action"].(map[string]any)
	if act["status"] != "success" || act["progress"].(float64) != 100 || act["finished"] == nil || s.Holder("192.0.2.7") != 42 {
		t.Fatalf("done: %v, holder %d", act, s.Holder("192.0.2.7"))
	}
	a = do(t, s, http.MethodGet, "/floating_ips/7", "tok", "")
	fip, _ := a.body["floating_ip"].(map[string]any)
	if fip["server"].(float64) != 42 || fip["type"] != "ipv4" {
		t.Fatalf("floating IP: %v", fip)
	}
	// Validation of the body and of the server.
	if a = do(t, s, http.MethodPost, "/floating_ips/7/actions/assign", "tok", `{}`); a.status != 400 || errCode(a) != "invalid_input" {
		t.Fatalf("no server: %d %v", a.status, a.body)
	}
	if a = do(t, s, http.MethodPost, "/floating_ips/7/actions/assign", "tok", `{"server":1}`); a.status != 404 {
		t.Fatalf("unknown server: %d %v", a.status, a.body)
	}
	// A failing action ends in error without effect.
	s.FailActions(1)
	s.SetActionDuration(0)
	s.AddServer(43, "cp-2")
	a = do(t, s, http.MethodPost, "/floating_ips/7/actions/assign", "tok", `{"server":43}`)
	act, _ = a.body["action"].(map[string]any)
	if act["status"] != "error" || s.Holder("192.0.2.7") != 42 {
		t.Fatalf("failed action: %v, holder %d", act, s.Holder("192.0.2.7"))
	}
}

func TestListPagination(t *testing.T) {
	s, _ := newTestServer(t, Options{})
	for i := 1; i <= 30; i++ {
		s.AddFloatingIP(FloatingIP{ID: int64(100 + i), IP: "198.51.100." + strconv.Itoa(i)})
	}
	a := do(t, s, http.MethodGet, "/floating_ips?page=2&per_page=25", "tok", "")
	items, _ := a.body["floating_ips"].([]any)
	meta := a.body["meta"].(map[string]any)["pagination"].(map[string]any)
	if len(items) != 6 || meta["page"].(float64) != 2 || meta["next_page"] != nil || meta["previous_page"].(float64) != 1 ||
		meta["last_page"].(float64) != 2 || meta["total_entries"].(float64) != 31 {
		t.Fatalf("page 2: %d items, meta %v", len(items), meta)
	}
}

func TestMetadata(t *testing.T) {
	s, _ := newTestServer(t, Options{})
	resp, err := http.Get(s.MetadataURL(42) + "/instance-id")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "42" {
		t.Fatalf("instance-id: %d %q", resp.StatusCode, b)
	}
	resp, err = http.Get(s.MetadataURL(99) + "/instance-id")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("unknown server: %d", resp.StatusCode)
	}
}
