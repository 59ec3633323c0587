package fakehttp

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPage(t *testing.T) {
	for _, tc := range []struct {
		query                   string
		total                   int
		page, per, lo, hi, last int
	}{
		{"", 0, 1, 20, 0, 0, 1},
		{"", 45, 1, 20, 0, 20, 3},
		{"page=3", 45, 3, 20, 40, 45, 3},
		{"page=4", 45, 4, 20, 45, 45, 3},
		{"page=0&per_page=0", 45, 1, 20, 0, 20, 3},
		{"page=-2&per_page=x", 45, 1, 20, 0, 20, 3},
		{"page=2&per_page=500", 450, 2, 200, 200, 400, 3},
		{"per_page=5", 5, 1, 5, 0, 5, 1},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v2/things?"+tc.query, nil)
		page, per, lo, hi, last := Page(r, tc.total, 20, 200)
		if page != tc.page || per != tc.per || lo != tc.lo || hi != tc.hi || last != tc.last {
			t.Errorf("%q of %d: page %d per %d [%d,%d) last %d, want page %d per %d [%d,%d) last %d",
				tc.query, tc.total, page, per, lo, hi, last, tc.page, tc.per, tc.lo, tc.hi, tc.last)
		}
	}
}

type fault struct {
	method, path string
	count        int
	status       int
}

func (f *fault) Rule() (string, string, *int) { return f.method, f.path, &f.count }

func TestTakeFault(t *testing.T) {
	faults := []*fault{
		{method: http.MethodPost, path: "/v1/floating_ips", count: 2, status: 423},
		{path: "/v1/", count: -1, status: 503},
	}
	get := httptest.NewRequest(http.MethodGet, "/v1/floating_ips", nil)
	post := httptest.NewRequest(http.MethodPost, "/v1/floating_ips/1/actions/assign", nil)
	other := httptest.NewRequest(http.MethodGet, "/metadata", nil)
	var got []int
	for _, r := range []*http.Request{post, get, post, post, other} {
		f := TakeFault(&faults, r)
		if f == nil {
			got = append(got, 0)
			continue
		}
		got = append(got, f.status)
	}
	want := []int{423, 503, 423, 503, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if len(faults) != 1 || faults[0].count != -1 {
		t.Fatalf("left %d faults (first count %d), want the unlimited one", len(faults), faults[0].count)
	}
}

func TestLogged(t *testing.T) {
	var l Log
	now := time.Unix(1000, 0)
	h := Logged(&l, func() time.Time { return now }, func(w *StatusWriter, r *http.Request) {
		b := make([]byte, 5)
		n, _ := r.Body.Read(b)
		if string(b[:n]) != "hello" {
			t.Errorf("the handler read %q, want the body again", b[:n])
		}
		w.WriteHeader(http.StatusTeapot)
	})
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/x?a=b", strings.NewReader("hello")))
	now = now.Add(time.Second)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v2/y", strings.NewReader("hello")))
	reqs := l.Requests()
	if len(reqs) != 2 || reqs[0].Status != http.StatusTeapot || reqs[0].Body != "hello" || reqs[0].Query != "a=b" || reqs[0].Remote != "192.0.2.1" {
		t.Fatalf("log %+v", reqs)
	}
	if n := l.Count(http.MethodPost, "/v1/"); n != 1 {
		t.Errorf("Count(POST, /v1/) = %d, want 1", n)
	}
	if n := l.Count("", "/v"); n != 2 {
		t.Errorf("Count(any, /v) = %d, want 2", n)
	}
	if n := l.CountSince(time.Unix(1001, 0), "", ""); n != 1 {
		t.Errorf("CountSince(the second request) = %d, want 1", n)
	}
	l.Reset()
	if n := len(l.Requests()); n != 0 {
		t.Errorf("%d requests after Reset", n)
	}
}
