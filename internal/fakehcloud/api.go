package fakehcloud

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/fakehttp"
)

// Error codes and messages as the API documents them.
var defaultErrors = map[int][2]string{
	http.StatusBadRequest:          {"invalid_input", "invalid input in field 'server'"},
	http.StatusUnauthorized:        {"unauthorized", "unable to authenticate"},
	http.StatusForbidden:           {"forbidden", "insufficient permissions for this request"},
	http.StatusNotFound:            {"not_found", "resource not found"},
	http.StatusConflict:            {"conflict", "resource has changed during the request, please retry"},
	http.StatusLocked:              {"locked", "floating ip is locked"},
	http.StatusTooManyRequests:     {"rate_limit_exceeded", "limit of requests per hour reached"},
	http.StatusInternalServerError: {"server_error", "an error occurred within the API backend"},
	http.StatusBadGateway:          {"bad_gateway", "the request could not be answered by the API backend"},
	http.StatusServiceUnavailable:  {"service_error", "the service is unavailable"},
	http.StatusGatewayTimeout:      {"timeout", "the request could not be answered in time"},
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if code == "" || msg == "" {
		d, ok := defaultErrors[status]
		if !ok {
			d = [2]string{"unknown_error", http.StatusText(status)}
		}
		if code == "" {
			code = d[0]
		}
		if msg == "" {
			msg = d[1]
		}
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg, "details": nil}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) serveAPI(sw *fakehttp.StatusWriter, r *http.Request) {
	if f := s.Arrive(r); f != nil {
		fakehttp.Sleep(r.Context(), f.Delay)
		if f.Drop || f.Status == 0 {
			fakehttp.Drop(sw)
			return
		}
		s.mu.Lock()
		s.rateHeadersLocked(sw.Header())
		s.mu.Unlock()
		writeError(sw, f.Status, f.Code, f.Message)
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// Every answer, errors included, costs one request of the bucket and
	// reports it, as the real API does.
	s.refillLocked()
	limited := s.remaining < 1
	if !limited {
		s.remaining--
	}
	s.rateHeadersLocked(sw.Header())
	if limited {
		writeError(sw, http.StatusTooManyRequests, "", "")
		return
	}
	if !s.Authorized(r) {
		writeError(sw, http.StatusUnauthorized, "", "")
		return
	}
	s.settleLocked()
	s.route(sw, r)
}

// rateHeadersLocked sets RateLimit-Limit, -Remaining and -Reset (the Unix
// time at which the bucket is full again).
func (s *Server) rateHeadersLocked(h http.Header) {
	per := time.Hour / time.Duration(s.limit)
	missing := float64(s.limit) - s.remaining
	reset := s.now().Add(time.Duration(math.Ceil(missing * float64(per))))
	h.Set("RateLimit-Limit", strconv.Itoa(s.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(int(math.Floor(s.remaining))))
	h.Set("RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(reset.UnixNano())/1e9)), 10))
}

// route dispatches an authenticated request. The caller holds s.mu.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, "/v1"), "/"), "/")
	switch {
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "floating_ips":
		s.listFloatingIPs(w, r)
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "floating_ips":
		f, ok := s.fipLocked(parts[1])
		if !ok {
			writeError(w, http.StatusNotFound, "", "")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"floating_ip": s.fipJSON(f)})
	case r.Method == http.MethodPost && len(parts) == 4 && parts[0] == "floating_ips" && parts[2] == "actions":
		s.floatingIPAction(w, r, parts[1], parts[3])
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "actions":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		a, ok := s.actions[id]
		if err != nil || !ok {
			writeError(w, http.StatusNotFound, "", "")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"action": s.actionJSON(a)})
	default:
		writeError(w, http.StatusNotFound, "not_found", "route not found")
	}
}

func (s *Server) fipLocked(idStr string) (*FloatingIP, bool) {
	id, err := strconv.ParseInt(idStr, 10, 64)
	if err != nil {
		return nil, false
	}
	f, ok := s.fips[id]
	return f, ok
}

// listFloatingIPs is GET /v1/floating_ips with page / per_page (default
// 25, at most 50) and the pagination meta.
func (s *Server) listFloatingIPs(w http.ResponseWriter, r *http.Request) {
	total := len(s.fipOrder)
	page, per, lo, hi, last := fakehttp.Page(r, total, 25, 50)
	items := []any{}
	for i := lo; i < hi; i++ {
		items = append(items, s.fipJSON(s.fips[s.fipOrder[i]]))
	}
	pageRef := func(p int) any {
		if p < 1 || p > last {
			return nil
		}
		return p
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"floating_ips": items,
		"meta": map[string]any{"pagination": map[string]any{
			"page": page, "per_page": per, "previous_page": pageRef(page - 1), "next_page": pageRef(page + 1),
			"last_page": last, "total_entries": total,
		}},
	})
}

// floatingIPAction is POST /v1/floating_ips/{id}/actions/{assign|unassign}.
func (s *Server) floatingIPAction(w http.ResponseWriter, r *http.Request, idStr, verb string) {
	f, ok := s.fipLocked(idStr)
	if !ok {
		writeError(w, http.StatusNotFound, "", "")
		return
	}
	if s.runningOnLocked(f.ID) {
		writeError(w, http.StatusLocked, "", "")
		return
	}
	var a *Action
	d := s.ActionDuration()
	switch verb {
	case "assign":
		var req struct {
			Server *int64 `json:"server"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, "json_error", "invalid JSON")
			return
		}
		if req.Server == nil {
			writeError(w, http.StatusBadRequest, "invalid_input", "invalid input in field 'server'")
			return
		}
		if _, ok := s.servers[*req.Server]; !ok {
			writeError(w, http.StatusNotFound, "not_found", "server not found")
			return
		}
		a = s.newActionLocked("assign_floating_ip", f.ID, *req.Server, d)
	case "unassign":
		a = s.newActionLocked("unassign_floating_ip", f.ID, 0, d)
	default:
		writeError(w, http.StatusNotFound, "not_found", "route not found")
		return
	}
	a.fail = s.ActionFails()
	if d <= 0 {
		s.settleLocked()
	}
	writeJSON(w, http.StatusCreated, map[string]any{"action": s.actionJSON(a)})
}

func (s *Server) fipJSON(f *FloatingIP) map[string]any {
	var server any
	if f.Server != 0 {
		server = f.Server
	}
	name := f.Name
	if name == "" {
		name = "vip-" + strconv.FormatInt(f.ID, 10)
	}
	return map[string]any{
		"id": f.ID, "name": name, "description": "", "ip": f.IP, "type": "ipv4", "server": server,
		"dns_ptr": []any{map[string]any{"ip": f.IP, "dns_ptr": "static." + f.IP + ".clients.your-server.de"}},
		"home_location": map[string]any{
			"id": 1, "name": "fsn1", "description": "Falkenstein DC Park 1", "country": "DE", "city": "Falkenstein",
			"latitude": 50.47612, "longitude": 12.370071, "network_zone": "eu-central",
		},
		"blocked": f.Blocked, "protection": map[string]any{"delete": false}, "labels": map[string]any{},
		"created": "2026-01-30T23:55:00+00:00",
	}
}

func (s *Server) actionJSON(a *Action) map[string]any {
	progress := 100
	var finished, errObj any
	if a.Status == "running" {
		total := a.ends.Sub(a.Started)
		progress = 0
		if total > 0 {
			progress = min(99, int(100*s.now().Sub(a.Started)/total))
		}
	} else {
		finished = a.Finished.UTC().Format(time.RFC3339)
	}
	if a.Status == "error" {
		progress = 100
		errObj = map[string]any{"code": "action_failed", "message": "Action failed"}
	}
	res := []any{map[string]any{"id": a.FloatingIP, "type": "floating_ip"}}
	if a.Server != 0 {
		res = append(res, map[string]any{"id": a.Server, "type": "server"})
	}
	return map[string]any{
		"id": a.ID, "command": a.Command, "status": a.Status, "progress": progress,
		"started": a.Started.UTC().Format(time.RFC3339), "finished": finished,
		"resources": res, "error": errObj,
	}
}

// serveMetadata answers /server/{id}/hetzner/v1/metadata/{instance-id,
// hostname, public-ipv4} for the server named in the path, as text.
func (s *Server) serveMetadata(sw *fakehttp.StatusWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/server/")
	idStr, key, ok2 := strings.Cut(rest, "/hetzner/v1/metadata/")
	id, err := strconv.ParseInt(idStr, 10, 64)
	s.mu.Lock()
	name, known := s.servers[id]
	s.mu.Unlock()
	if !ok || !ok2 || err != nil || !known || r.Method != http.MethodGet {
		http.NotFound(sw, r)
		return
	}
	switch key {
	case "instance-id":
		_, _ = io.WriteString(sw, strconv.FormatInt(id, 10))
	case "hostname":
		_, _ = io.WriteString(sw, name)
	default:
		http.NotFound(sw, r)
	}
}
