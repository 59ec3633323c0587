// Package fakecf is a local fake of the Cloudflare v4 API calls vipd's DNS
// provider makes: GET /zones?name=, and list/create/update (PUT, PATCH) and
// delete of /zones/{zone_id}/dns_records, with the real envelopes
// ({"success","errors","messages","result","result_info"}), pagination
// (page, per_page, capped by SetMaxPerPage) and the type/name (and
// name.exact) filters. Like Cloudflare, PUT overwrites a record (an omitted
// "proxied" turns proxying off) while PATCH changes only the fields sent,
// a proxied record's TTL is 1 ("automatic"), TTLs are 60-86400 or 1 (30 and
// up on Enterprise zones), and a request over the rate limit
// (SetRateLimit) is answered 429 with Retry-After. It keeps a request log
// and can inject failures.
//
//	fake := fakecf.New("token")
//	defer fake.Close()
//	zoneID := fake.AddZone("example.com")
//	... point the client at fake.URL() (".../client/v4") ...
//	fake.Records(zoneID)
package fakecf

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Record is a DNS record as the API returns it.
type Record struct {
	ID         string    `json:"id"`
	ZoneID     string    `json:"zone_id"`
	ZoneName   string    `json:"zone_name"`
	Name       string    `json:"name"`
	Type       string    `json:"type"`
	Content    string    `json:"content"`
	Proxiable  bool      `json:"proxiable"`
	Proxied    bool      `json:"proxied"`
	TTL        int       `json:"ttl"`
	Locked     bool      `json:"locked"`
	Comment    *string   `json:"comment"`
	Tags       []string  `json:"tags"`
	CreatedOn  time.Time `json:"created_on"`
	ModifiedOn time.Time `json:"modified_on"`
}

// Request is one entry of the request log.
type Request struct {
	Method string
	Path   string // without /client/v4 and without the query
	Query  string
	Body   string
	Status int
}

// Fault makes matching requests fail with Status (and a Cloudflare error
// envelope). Method "" matches any method; Path is a prefix of the path
// after /client/v4. Count < 0 means until ClearFaults. RetryAfter, when
// not empty, is sent as the Retry-After header.
type Fault struct {
	Method     string
	Path       string
	Status     int
	Count      int
	RetryAfter string
}

// Server is the fake. It is safe for concurrent use.
type Server struct {
	srv   *httptest.Server
	token string

	mu         sync.Mutex
	zones      map[string]string // id -> name
	enterprise map[string]bool   // zone ids on the Enterprise plan
	records    map[string][]*Record
	log        []Request
	faults     []*Fault
	maxPerPage int
	rateN      int
	rateWindow time.Duration
	recent     []time.Time // accepted requests inside the rate window
}

// New starts a fake accepting only the bearer token.
func New(token string) *Server {
	s := &Server{token: token, zones: map[string]string{}, enterprise: map[string]bool{}, records: map[string][]*Record{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the API base URL, ".../client/v4" (no trailing slash).
func (s *Server) URL() string { return s.srv.URL + "/client/v4" }

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// AddZone creates a zone and returns its 32-hex-digit ID.
func (s *Server) AddZone(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := newID()
	s.zones[id] = name
	return id
}

// AddZoneWithID creates a zone with a given ID (FLIPOP's tests call their
// zone "ZONE"); enterprise zones accept TTLs from 30 seconds.
func (s *Server) AddZoneWithID(id, name string, enterprise bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.zones[id] = name
	s.enterprise[id] = enterprise
}

// SetMaxPerPage caps per_page of record lists (0: no cap), so that clients
// must follow the pages.
func (s *Server) SetMaxPerPage(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxPerPage = n
}

// SetRateLimit answers 429 with Retry-After to requests beyond n within
// any window (Cloudflare's global limit is 1200 per 5 minutes). n <= 0
// turns it off.
func (s *Server) SetRateLimit(n int, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rateN, s.rateWindow, s.recent = n, window, nil
}

// AddRecord inserts a record directly (not logged) and returns its ID.
func (s *Server) AddRecord(zoneID string, r Record) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.ID, r.ZoneID, r.ZoneName = newID(), zoneID, s.zones[zoneID]
	if r.Proxied {
		r.TTL = 1
	}
	s.records[zoneID] = append(s.records[zoneID], &r)
	return r.ID
}

// Records returns a copy of the zone's records sorted by name and content.
func (s *Server) Records(zoneID string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, 0, len(s.records[zoneID]))
	for _, r := range s.records[zoneID] {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Content < out[j].Content
	})
	return out
}

// AddFault registers a fault.
func (s *Server) AddFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes all faults.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Requests returns a copy of the request log.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// Count returns how many logged requests had the method (any if "") and a
// path starting with prefix.
func (s *Server) Count(method, prefix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.log {
		if (method == "" || r.Method == method) && strings.HasPrefix(r.Path, prefix) {
			n++
		}
	}
	return n
}

type envelope struct {
	Success    bool        `json:"success"`
	Errors     []apiMsg    `json:"errors"`
	Messages   []apiMsg    `json:"messages"`
	Result     any         `json:"result"`
	ResultInfo *resultInfo `json:"result_info,omitempty"`
}

type apiMsg struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type resultInfo struct {
	Page       int `json:"page"`
	PerPage    int `json:"per_page"`
	Count      int `json:"count"`
	TotalCount int `json:"total_count"`
	TotalPages int `json:"total_pages"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	path := strings.TrimPrefix(r.URL.Path, "/client/v4")
	status := http.StatusOK
	defer func() {
		s.mu.Lock()
		s.log = append(s.log, Request{Method: r.Method, Path: path, Query: r.URL.RawQuery, Body: string(body), Status: status})
		s.mu.Unlock()
	}()
	reply := func(code int, env envelope) {
		status = code
		if env.Errors == nil {
			env.Errors = []apiMsg{}
		}
		env.Messages = []apiMsg{}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(env)
	}
	fail := func(code, errCode int, msg string) {
		reply(code, envelope{Errors: []apiMsg{{Code: errCode, Message: msg}}})
	}
	failAfter := func(code, errCode int, msg, retryAfter string) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		fail(code, errCode, msg)
	}
	if !strings.HasPrefix(r.URL.Path, "/client/v4/") {
		fail(http.StatusNotFound, 7000, "No route for that URI")
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+s.token {
		fail(http.StatusBadRequest, 6003, "Invalid request headers")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rateN > 0 {
		now := time.Now()
		keep := s.recent[:0]
		for _, t := range s.recent {
			if now.Sub(t) < s.rateWindow {
				keep = append(keep, t)
			}
		}
		s.recent = keep
		if len(s.recent) >= s.rateN {
			wait := s.rateWindow - now.Sub(s.recent[0])
			secs := int((wait + time.Second - 1) / time.Second)
			failAfter(http.StatusTooManyRequests, 10000, "Rate limited. Please wait and consider throttling your request speed", strconv.Itoa(max(secs, 1)))
			return
		}
		s.recent = append(s.recent, now)
	}
	for _, f := range s.faults {
		if f.Count != 0 && (f.Method == "" || f.Method == r.Method) && strings.HasPrefix(path, f.Path) {
			if f.Count > 0 {
				f.Count--
			}
			failAfter(f.Status, 10000+f.Status, http.StatusText(f.Status), f.RetryAfter)
			return
		}
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) == 1 && parts[0] == "zones" && r.Method == http.MethodGet:
		name := r.URL.Query().Get("name")
		var zs []map[string]any
		for id, n := range s.zones {
			if name == "" || n == name {
				zs = append(zs, map[string]any{"id": id, "name": n, "status": "active"})
			}
		}
		if zs == nil {
			zs = []map[string]any{}
		}
		reply(http.StatusOK, envelope{Success: true, Result: zs,
			ResultInfo: &resultInfo{Page: 1, PerPage: 50, Count: len(zs), TotalCount: len(zs), TotalPages: 1}})
	case len(parts) >= 3 && parts[0] == "zones" && parts[2] == "dns_records":
		zid := parts[1]
		if _, ok := s.zones[zid]; !ok {
			fail(http.StatusNotFound, 7003, "Could not route to /zones/"+zid+"/dns_records, perhaps your object identifier is invalid?")
			return
		}
		if len(parts) == 3 {
			switch r.Method {
			case http.MethodGet:
				s.list(r, zid, reply)
			case http.MethodPost:
				rec, err := decodeRecord(body, s.enterprise[zid])
				if err != nil {
					fail(http.StatusBadRequest, 9207, err.Error())
					return
				}
				now := time.Now().UTC()
				rec.ID, rec.ZoneID, rec.ZoneName, rec.CreatedOn, rec.ModifiedOn = newID(), zid, s.zones[zid], now, now
				s.records[zid] = append(s.records[zid], rec)
				reply(http.StatusOK, envelope{Success: true, Result: rec})
			default:
				fail(http.StatusMethodNotAllowed, 10000, "Method not allowed")
			}
			return
		}
		if len(parts) != 4 {
			fail(http.StatusNotFound, 7000, "No route for that URI")
			return
		}
		idx := -1
		for i, rec := range s.records[zid] {
			if rec.ID == parts[3] {
				idx = i
			}
		}
		if idx < 0 {
			fail(http.StatusNotFound, 81044, "Record does not exist.")
			return
		}
		cur := s.records[zid][idx]
		switch r.Method {
		case http.MethodGet:
			reply(http.StatusOK, envelope{Success: true, Result: cur})
		case http.MethodPut, http.MethodPatch:
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(body, &fields); err != nil {
				fail(http.StatusBadRequest, 9207, "Request body is invalid.")
				return
			}
			var rec *Record
			if r.Method == http.MethodPut {
				// PUT overwrites: what is not sent takes its default.
				var err error
				if rec, err = decodeRecord(body, s.enterprise[zid]); err != nil {
					fail(http.StatusBadRequest, 9207, err.Error())
					return
				}
			} else {
				// PATCH changes only the fields sent.
				merged := *cur
				for _, k := range []string{"id", "zone_id", "zone_name", "created_on", "modified_on"} {
					delete(fields, k)
				}
				b, _ := json.Marshal(fields)
				if err := json.Unmarshal(b, &merged); err != nil {
					fail(http.StatusBadRequest, 9207, "Request body is invalid.")
					return
				}
				mb, _ := json.Marshal(merged)
				var err error
				if rec, err = decodeRecord(mb, s.enterprise[zid]); err != nil {
					fail(http.StatusBadRequest, 9207, err.Error())
					return
				}
			}
			rec.ID, rec.ZoneID, rec.ZoneName, rec.CreatedOn = cur.ID, cur.ZoneID, cur.ZoneName, cur.CreatedOn
			rec.ModifiedOn = time.Now().UTC()
			*cur = *rec
			reply(http.StatusOK, envelope{Success: true, Result: cur})
		case http.MethodDelete:
			s.records[zid] = append(s.records[zid][:idx:idx], s.records[zid][idx+1:]...)
			reply(http.StatusOK, envelope{Success: true, Result: map[string]string{"id": cur.ID}})
		default:
			fail(http.StatusMethodNotAllowed, 10000, "Method not allowed")
		}
	default:
		fail(http.StatusNotFound, 7000, "No route for that URI")
	}
}

func decodeRecord(body []byte, enterprise bool) (*Record, error) {
	var rec Record
	if err := json.Unmarshal(body, &rec); err != nil {
		return nil, fmt.Errorf("request body is invalid: %w", err)
	}
	if rec.Type == "" || rec.Name == "" || rec.Content == "" {
		return nil, fmt.Errorf("type, name and content are required")
	}
	if rec.TTL == 0 {
		rec.TTL = 1 // omitted: automatic
	}
	minTTL := 60
	if enterprise {
		minTTL = 30
	}
	if rec.TTL != 1 && (rec.TTL < minTTL || rec.TTL > 86400) {
		return nil, fmt.Errorf("ttl must be between %d and 86400 seconds, or 1 for Automatic", minTTL)
	}
	if rec.Proxied {
		rec.TTL = 1 // a proxied record's TTL is always automatic
	}
	return &rec, nil
}

func (s *Server) list(r *http.Request, zid string, reply func(int, envelope)) {
	q := r.URL.Query()
	typ := q.Get("type")
	name := q.Get("name")
	if name == "" {
		name = q.Get("name.exact")
	}
	var match []*Record
	for _, rec := range s.records[zid] {
		if typ != "" && rec.Type != typ {
			continue
		}
		if name != "" && !strings.EqualFold(rec.Name, name) {
			continue
		}
		match = append(match, rec)
	}
	page, _ := strconv.Atoi(q.Get("page"))
	if page < 1 {
		page = 1
	}
	per, _ := strconv.Atoi(q.Get("per_page"))
	if per < 1 {
		per = 100
	}
	if s.maxPerPage > 0 && per > s.maxPerPage {
		per = s.maxPerPage
	}
	pages := (len(match) + per - 1) / per
	if pages == 0 {
		pages = 1
	}
	start := min((page-1)*per, len(match))
	end := min(start+per, len(match))
	items := match[start:end]
	if items == nil {
		items = []*Record{}
	}
	reply(http.StatusOK, envelope{Success: true, Result: items,
		ResultInfo: &resultInfo{Page: page, PerPage: per, Count: len(items), TotalCount: len(match), TotalPages: pages}})
}
