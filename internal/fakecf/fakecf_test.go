package fakecf

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func call(t *testing.T, s *Server, method, path, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var env map[string]any
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, b)
	}
	return resp.StatusCode, resp.Header, env
}

func TestPutOverwritesPatchMerges(t *testing.T) {
	s := New("tok")
	defer s.Close()
	z := s.AddZone("example.com")
	id := s.AddRecord(z, Record{Type: "A", Name: "a.example.com", Content: "192.0.2.1", TTL: 300, Proxied: true})
	if r := s.Records(z)[0]; r.TTL != 1 {
		t.Fatalf("proxied record TTL %d, want 1 (automatic)", r.TTL)
	}
	// PATCH without "proxied": still proxied.
	if code, _, _ := call(t, s, http.MethodPatch, "/zones/"+z+"/dns_records/"+id, `{"content":"192.0.2.2","ttl":120}`); code != 200 {
		t.Fatalf("PATCH: %d", code)
	}
	if r := s.Records(z)[0]; !r.Proxied || r.Content != "192.0.2.2" || r.Type != "A" || r.Name != "a.example.com" {
		t.Fatalf("after PATCH %+v", r)
	}
	// PUT without "proxied": overwritten, proxying off.
	if code, _, _ := call(t, s, http.MethodPut, "/zones/"+z+"/dns_records/"+id, `{"type":"A","name":"a.example.com","content":"192.0.2.3","ttl":120}`); code != 200 {
		t.Fatalf("PUT: %d", code)
	}
	if r := s.Records(z)[0]; r.Proxied || r.TTL != 120 || r.Content != "192.0.2.3" {
		t.Fatalf("after PUT %+v", r)
	}
	// TTL rules: 30 only on Enterprise zones.
	if code, _, _ := call(t, s, http.MethodPatch, "/zones/"+z+"/dns_records/"+id, `{"ttl":30}`); code != 400 {
		t.Fatalf("TTL 30 on a free zone: %d", code)
	}
	s.AddZoneWithID("ZONE", "example.org", true)
	if code, _, _ := call(t, s, http.MethodPost, "/zones/ZONE/dns_records", `{"type":"A","name":"name","content":"10.0.0.1","ttl":30}`); code != 200 {
		t.Fatalf("TTL 30 on an Enterprise zone: %d", code)
	}
}

func TestPagesAndRateLimit(t *testing.T) {
	s := New("tok")
	defer s.Close()
	z := s.AddZone("example.com")
	for range 25 {
		s.AddRecord(z, Record{Type: "A", Name: "a.example.com", Content: "192.0.2.1", TTL: 60})
	}
	s.SetMaxPerPage(10)
	_, _, env := call(t, s, http.MethodGet, "/zones/"+z+"/dns_records?name=a.example.com&per_page=100&page=3", "")
	info := env["result_info"].(map[string]any)
	if info["total_pages"].(float64) != 3 || info["count"].(float64) != 5 || info["per_page"].(float64) != 10 {
		t.Fatalf("result_info %v", info)
	}
	_, _, env = call(t, s, http.MethodGet, "/zones?name=example.com", "")
	if zs := env["result"].([]any); len(zs) != 1 || zs[0].(map[string]any)["id"] != z {
		t.Fatalf("zone by name: %v", env["result"])
	}
	s.SetRateLimit(2, time.Second)
	for i := range 3 {
		code, hdr, _ := call(t, s, http.MethodGet, "/zones", "")
		if i < 2 && code != 200 {
			t.Fatalf("request %d: %d", i, code)
		}
		if i == 2 && (code != 429 || hdr.Get("Retry-After") != "1") {
			t.Fatalf("over the limit: %d Retry-After %q", code, hdr.Get("Retry-After"))
		}
	}
	time.Sleep(1100 * time.Millisecond)
	if code, _, _ := call(t, s, http.MethodGet, "/zones", ""); code != 200 {
		t.Fatalf("after the window: %d", code)
	}
}
