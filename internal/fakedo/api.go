package fakedo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/fakehttp"
)

// Error ids and messages as the real API sends them.
const (
	msgNotFound     = "The resource you were accessing could not be found."
	msgUnauthorized = "Unable to authenticate you"
	msgRateLimited  = "API Rate limit exceeded."
	msgServerError  = "Server Error"
)

func (s *Server) serveAPI(sw *fakehttp.StatusWriter, r *http.Request) {
	if f := s.Arrive(r); f != nil {
		s.writeFault(sw, r, f)
		return
	}

	s.mu.Lock()
	s.rateRemain--
	if s.rateRemain <= 0 {
		s.rateRemain = s.rateLimit
	}
	sw.Header().Set("RateLimit-Limit", strconv.Itoa(s.rateLimit))
	sw.Header().Set("RateLimit-Remaining", strconv.Itoa(s.rateRemain))
	sw.Header().Set("RateLimit-Reset", strconv.FormatInt(s.now().Add(time.Minute).Unix(), 10))
	s.mu.Unlock()

	if !s.Authorized(r) {
		writeError(sw, http.StatusUnauthorized, "unauthorized", msgUnauthorized)
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	s.route(sw, r)
}

func (s *Server) writeFault(w *fakehttp.StatusWriter, r *http.Request, f *Fault) {
	fakehttp.Sleep(r.Context(), f.Delay)
	if f.Drop || f.Status == 0 {
		fakehttp.Drop(w)
		return
	}
	switch {
	case f.Status == http.StatusTooManyRequests:
		reset := f.ResetAfter
		if reset <= 0 {
			reset = time.Second
		}
		s.mu.Lock()
		limit := s.rateLimit
		s.mu.Unlock()
		w.Header().Set("RateLimit-Limit", strconv.Itoa(limit))
		w.Header().Set("RateLimit-Remaining", "0")
		// The real API sends the reset as Unix seconds; round up so a
		// client waiting until then never comes back early.
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(s.now().Add(reset+time.Second-1).Unix(), 10))
		if f.RetryAfter {
			w.Header().Set("Retry-After", strconv.Itoa(int((reset+time.Second-1)/time.Second)))
		}
		writeError(w, f.Status, "too_many_requests", msgRateLimited)
	case f.Status == http.StatusNotFound:
		writeError(w, f.Status, "not_found", msgNotFound)
	case f.Status == http.StatusUnauthorized:
		writeError(w, f.Status, "unauthorized", msgUnauthorized)
	case f.Status == http.StatusUnprocessableEntity:
		writeError(w, f.Status, "unprocessable_entity", "Injected failure.")
	case f.Status >= 500:
		writeError(w, f.Status, "server_error", msgServerError)
	default:
		writeError(w, f.Status, strings.ToLower(strings.ReplaceAll(http.StatusText(f.Status), " ", "_")), http.StatusText(f.Status))
	}
}

func writeError(w http.ResponseWriter, status int, id, msg string) {
	writeJSON(w, status, map[string]any{"id": id, "message": msg, "request_id": fmt.Sprintf("fake-%d", time.Now().UnixNano())})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	b, err := json.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// route dispatches an authenticated request. The caller holds s.mu.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(parts) < 2 || parts[0] != "v2" {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	m := r.Method
	switch {
	case parts[1] == "reserved_ips" && len(parts) == 2 && m == http.MethodGet:
		s.listReservedIPs(w, r)
	case parts[1] == "reserved_ips" && len(parts) == 2 && m == http.MethodPost:
		s.createReservedIP(w, r)
	case parts[1] == "reserved_ips" && len(parts) == 3 && m == http.MethodGet:
		s.getReservedIP(w, r, parts[2])
	case parts[1] == "reserved_ips" && len(parts) == 3 && m == http.MethodDelete:
		s.deleteReservedIP(w, parts[2])
	case parts[1] == "reserved_ips" && len(parts) == 4 && parts[3] == "actions" && m == http.MethodPost:
		s.postAction(w, r, parts[2])
	case parts[1] == "reserved_ips" && len(parts) == 4 && parts[3] == "actions" && m == http.MethodGet:
		s.listIPActions(w, r, parts[2])
	case parts[1] == "reserved_ips" && len(parts) == 5 && parts[3] == "actions" && m == http.MethodGet:
		s.getAction(w, parts[2], parts[4])
	case parts[1] == "actions" && len(parts) == 3 && m == http.MethodGet:
		s.getAction(w, "", parts[2])
	case parts[1] == "droplets" && len(parts) == 2 && m == http.MethodGet:
		s.listDroplets(w, r)
	case parts[1] == "droplets" && len(parts) == 3 && m == http.MethodGet:
		s.getDroplet(w, parts[2])
	case parts[1] == "domains" && len(parts) == 3 && m == http.MethodGet:
		s.getDomain(w, parts[2])
	case parts[1] == "domains" && len(parts) == 4 && parts[3] == "records" && m == http.MethodGet:
		s.listRecords(w, r, parts[2])
	case parts[1] == "domains" && len(parts) == 4 && parts[3] == "records" && m == http.MethodPost:
		s.createRecord(w, r, parts[2])
	case parts[1] == "domains" && len(parts) == 5 && parts[3] == "records" && m == http.MethodGet:
		s.getRecord(w, parts[2], parts[4])
	case parts[1] == "domains" && len(parts) == 5 && parts[3] == "records" && (m == http.MethodPut || m == http.MethodPatch):
		s.updateRecord(w, r, parts[2], parts[4])
	case parts[1] == "domains" && len(parts) == 5 && parts[3] == "records" && m == http.MethodDelete:
		s.deleteRecord(w, parts[2], parts[4])
	default:
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
	}
}

// settleLocked completes actions whose time has come and applies them.
func (s *Server) settleLocked() {
	now := s.now()
	ids := make([]int, 0)
	for id, a := range s.actions {
		if a.Status == "in-progress" && !now.Before(a.ends) {
			ids = append(ids, id)
		}
	}
	sort.Ints(ids)
	for _, id := range ids {
		a := s.actions[id]
		a.CompletedAt = a.ends
		if a.fail {
			a.Status = "errored"
			continue
		}
		a.Status = "completed"
		if a.external {
			continue
		}
		if r, ok := s.rips[a.IP]; ok {
			switch a.Type {
			case "assign_ip":
				r.dropletID = a.DropletID
			case "unassign_ip":
				r.dropletID = 0
			}
		}
	}
}

func (s *Server) newActionLocked(r *reservedIP, typ string, dropletID int, d time.Duration) *Action {
	now := s.now()
	a := &Action{ID: s.nextAction, Type: typ, Status: "in-progress", IP: r.ip, DropletID: dropletID, StartedAt: now, ends: now.Add(d)}
	s.nextAction++
	a.fail = s.ActionFails()
	s.actions[a.ID] = a
	r.actions = append(r.actions, a.ID)
	return a
}

// holdsLocked returns the reserved IP assigned to a droplet, or "".
func (s *Server) holdsLocked(dropletID int) string {
	for _, ip := range s.ripOrder {
		if s.rips[ip].dropletID == dropletID {
			return ip
		}
	}
	return ""
}

func (s *Server) lockedLocked(r *reservedIP) bool {
	for _, id := range r.actions {
		if s.actions[id].Status == "in-progress" {
			return true
		}
	}
	return false
}

func (s *Server) regionJSON() map[string]any {
	return map[string]any{
		"slug": s.opts.Region, "name": strings.ToUpper(s.opts.Region), "available": true,
		"features": []string{"backups", "ipv6", "metadata"}, "sizes": []string{"s-1vcpu-1gb"},
	}
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (s *Server) actionJSON(a *Action) map[string]any {
	var completed any
	if !a.CompletedAt.IsZero() {
		completed = ts(a.CompletedAt)
	}
	var rid int64
	if addr, err := netip.ParseAddr(a.IP); err == nil && addr.Is4() {
		b := addr.As4()
		rid = int64(b[0])<<24 | int64(b[1])<<16 | int64(b[2])<<8 | int64(b[3])
	}
	return map[string]any{
		"id": a.ID, "status": a.Status, "type": a.Type, "started_at": ts(a.StartedAt),
		"completed_at": completed, "resource_id": rid, "resource_type": "reserved_ip",
		"region": s.regionJSON(), "region_slug": s.opts.Region,
	}
}

func (s *Server) dropletJSON(d *Droplet) map[string]any {
	v4 := []map[string]any{}
	if d.PublicIPv4 != "" {
		v4 = append(v4, map[string]any{"ip_address": d.PublicIPv4, "netmask": "255.255.240.0", "gateway": gateway(d.PublicIPv4), "type": "public"})
	}
	for _, ip := range s.ripOrder {
		if s.rips[ip].dropletID == d.ID {
			v4 = append(v4, map[string]any{"ip_address": ip, "netmask": "255.255.255.255", "gateway": "", "type": "public"})
		}
	}
	if d.PrivateIPv4 != "" {
		v4 = append(v4, map[string]any{"ip_address": d.PrivateIPv4, "netmask": "255.255.0.0", "gateway": gateway(d.PrivateIPv4), "type": "private"})
	}
	tags := d.Tags
	if tags == nil {
		tags = []string{}
	}
	return map[string]any{
		"id": d.ID, "name": d.Name, "memory": 1024, "vcpus": 1, "disk": 25, "locked": false,
		"status": "active", "created_at": "2020-07-21T18:37:44Z", "features": []string{"monitoring"},
		"backup_ids": []int{}, "snapshot_ids": []int{}, "volume_ids": []string{},
		"region": s.regionJSON(), "size_slug": "s-1vcpu-1gb",
		"networks": map[string]any{"v4": v4, "v6": []any{}}, "tags": tags,
		"vpc_uuid": "760e09ef-dc84-11e8-981e-3cfdfeaae000",
	}
}

// gateway guesses the .1 of the address's /24, good enough for a fake.
func gateway(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return ""
	}
	b := a.As4()
	b[3] = 1
	return netip.AddrFrom4(b).String()
}

func (s *Server) ripJSON(r *reservedIP) map[string]any {
	var droplet any
	if d, ok := s.droplets[r.dropletID]; ok && r.dropletID != 0 {
		droplet = s.dropletJSON(d)
	} else if r.dropletID != 0 {
		droplet = map[string]any{"id": r.dropletID}
	}
	return map[string]any{"ip": r.ip, "region": s.regionJSON(), "droplet": droplet, "locked": s.lockedLocked(r), "project_id": r.projectID}
}

// page cuts items per the page/per_page query and returns the links and
// meta objects of the real API (links.pages is absent on a single page).
func page[T any](r *http.Request, items []T) ([]T, map[string]any, map[string]any) {
	q := r.URL.Query()
	total := len(items)
	p, per, lo, hi, last := fakehttp.Page(r, total, 20, 200)
	link := func(n int) string {
		qq := url.Values{}
		for k, v := range q {
			qq[k] = v
		}
		qq.Set("page", strconv.Itoa(n))
		qq.Set("per_page", strconv.Itoa(per))
		return (&url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawQuery: qq.Encode()}).String()
	}
	pages := map[string]any{}
	if p > 1 {
		pages["first"] = link(1)
		pages["prev"] = link(p - 1)
	}
	if p < last {
		pages["next"] = link(p + 1)
		pages["last"] = link(last)
	}
	links := map[string]any{}
	if len(pages) > 0 {
		links["pages"] = pages
	}
	return items[lo:hi], links, map[string]any{"total": total}
}

func (s *Server) listReservedIPs(w http.ResponseWriter, r *http.Request) {
	all := make([]map[string]any, 0, len(s.ripOrder))
	for _, ip := range s.ripOrder {
		all = append(all, s.ripJSON(s.rips[ip]))
	}
	items, links, meta := page(r, all)
	writeJSON(w, http.StatusOK, map[string]any{"reserved_ips": items, "links": links, "meta": meta})
}

func (s *Server) getReservedIP(w http.ResponseWriter, _ *http.Request, ip string) {
	rip, ok := s.rips[ip]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reserved_ip": s.ripJSON(rip)})
}

func (s *Server) createReservedIP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Region    string `json:"region"`
		DropletID int    `json:"droplet_id"`
		ProjectID string `json:"project_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	if req.DropletID == 0 && req.Region == "" {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Region or droplet_id must be provided.")
		return
	}
	if req.DropletID != 0 {
		if _, ok := s.droplets[req.DropletID]; !ok {
			writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Droplet was not found.")
			return
		}
		if s.holdsLocked(req.DropletID) != "" {
			writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Droplet already has a reserved IP assigned.")
			return
		}
	}
	ip := ""
	for a := s.opts.IPPool.Addr().Next(); s.opts.IPPool.Contains(a); a = a.Next() {
		if _, used := s.rips[a.String()]; !used {
			ip = a.String()
			break
		}
	}
	if ip == "" {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "You have reached the reserved IP limit.")
		return
	}
	rip := &reservedIP{ip: ip, projectID: req.ProjectID}
	if rip.projectID == "" {
		rip.projectID = "746c6152-2fa2-11ed-92d3-27aaa54e4988"
	}
	s.rips[ip] = rip
	s.ripOrder = append(s.ripOrder, ip)
	links := map[string]any{}
	if req.DropletID != 0 {
		// The IP shows the droplet at once; the assign action that the
		// real API reports is kept in progress for the usual time.
		rip.dropletID = req.DropletID
		a := s.newActionLocked(rip, "assign_ip", req.DropletID, s.ActionDuration())
		a.external = true
		base := "http://" + r.Host + "/v2/"
		links["droplets"] = []map[string]any{{"id": req.DropletID, "rel": "droplet", "href": fmt.Sprintf("%sdroplets/%d", base, req.DropletID)}}
		links["actions"] = []map[string]any{{"id": a.ID, "rel": "assign_ip", "href": fmt.Sprintf("%sactions/%d", base, a.ID)}}
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"reserved_ip": s.ripJSON(rip), "links": links})
}

func (s *Server) deleteReservedIP(w http.ResponseWriter, ip string) {
	rip, ok := s.rips[ip]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	if s.lockedLocked(rip) {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "The reserved IP is locked by an action in progress; try again later.")
		return
	}
	delete(s.rips, ip)
	for i, v := range s.ripOrder {
		if v == ip {
			s.ripOrder = append(s.ripOrder[:i:i], s.ripOrder[i+1:]...)
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) postAction(w http.ResponseWriter, r *http.Request, ip string) {
	rip, ok := s.rips[ip]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	var req struct {
		Type      string `json:"type"`
		DropletID int    `json:"droplet_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	if s.lockedLocked(rip) {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "The reserved IP is locked by another action in progress; try again later.")
		return
	}
	var a *Action
	switch req.Type {
	case "assign":
		if _, ok := s.droplets[req.DropletID]; !ok {
			writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Droplet was not found.")
			return
		}
		if other := s.holdsLocked(req.DropletID); other != "" && other != ip {
			writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Droplet already has a reserved IP assigned.")
			return
		}
		a = s.newActionLocked(rip, "assign_ip", req.DropletID, s.ActionDuration())
	case "unassign":
		if rip.dropletID == 0 {
			writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "The reserved IP is not assigned to a droplet.")
			return
		}
		a = s.newActionLocked(rip, "unassign_ip", 0, s.ActionDuration())
	default:
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", "Type must be one of: assign, unassign.")
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"action": s.actionJSON(a)})
}

func (s *Server) listIPActions(w http.ResponseWriter, r *http.Request, ip string) {
	rip, ok := s.rips[ip]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	all := make([]map[string]any, 0, len(rip.actions))
	for _, id := range rip.actions {
		all = append(all, s.actionJSON(s.actions[id]))
	}
	items, links, meta := page(r, all)
	writeJSON(w, http.StatusOK, map[string]any{"actions": items, "links": links, "meta": meta})
}

func (s *Server) getAction(w http.ResponseWriter, ip, idText string) {
	id, err := strconv.Atoi(idText)
	a, ok := s.actions[id]
	if err != nil || !ok || (ip != "" && a.IP != ip) {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": s.actionJSON(a)})
}

func (s *Server) listDroplets(w http.ResponseWriter, r *http.Request) {
	tag := r.URL.Query().Get("tag_name")
	name := r.URL.Query().Get("name")
	all := make([]map[string]any, 0, len(s.dropletOrder))
	for _, id := range s.dropletOrder {
		d := s.droplets[id]
		if name != "" && d.Name != name {
			continue
		}
		if tag != "" && !contains(d.Tags, tag) {
			continue
		}
		all = append(all, s.dropletJSON(d))
	}
	items, links, meta := page(r, all)
	writeJSON(w, http.StatusOK, map[string]any{"droplets": items, "links": links, "meta": meta})
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (s *Server) getDroplet(w http.ResponseWriter, idText string) {
	id, err := strconv.Atoi(idText)
	d, ok := s.droplets[id]
	if err != nil || !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"droplet": s.dropletJSON(d)})
}

func (s *Server) getDomain(w http.ResponseWriter, domain string) {
	if _, ok := s.domains[domain]; !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"domain": map[string]any{"name": domain, "ttl": 1800, "zone_file": ""}})
}

// fqdn is the name filter form of a record name ("@" is the apex).
func fqdn(name, domain string) string {
	if name == "@" || name == "" {
		return domain
	}
	return name + "." + domain
}

func (s *Server) listRecords(w http.ResponseWriter, r *http.Request, domain string) {
	recs, ok := s.domains[domain]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	typ := r.URL.Query().Get("type")
	name := strings.TrimSuffix(r.URL.Query().Get("name"), ".")
	all := make([]Record, 0, len(recs))
	for _, rec := range recs {
		if typ != "" && !strings.EqualFold(rec.Type, typ) {
			continue
		}
		if name != "" && !strings.EqualFold(fqdn(rec.Name, domain), name) {
			continue
		}
		all = append(all, *rec)
	}
	items, links, meta := page(r, all)
	writeJSON(w, http.StatusOK, map[string]any{"domain_records": items, "links": links, "meta": meta})
}

func (s *Server) findRecord(domain, idText string) (*Record, bool) {
	id, err := strconv.Atoi(idText)
	if err != nil {
		return nil, false
	}
	for _, rec := range s.domains[domain] {
		if rec.ID == id {
			return rec, true
		}
	}
	return nil, false
}

func (s *Server) getRecord(w http.ResponseWriter, domain, idText string) {
	rec, ok := s.findRecord(domain, idText)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"domain_record": rec})
}

// applyRecordFields copies the fields present in a request body onto rec.
func applyRecordFields(rec *Record, fields map[string]json.RawMessage) error {
	str := func(k string, dst *string) error {
		if v, ok := fields[k]; ok {
			return json.Unmarshal(v, dst)
		}
		return nil
	}
	num := func(k string, dst **int) error {
		if v, ok := fields[k]; ok {
			var n *int
			if err := json.Unmarshal(v, &n); err != nil {
				return err
			}
			*dst = n
		}
		return nil
	}
	for _, err := range []error{str("type", &rec.Type), str("name", &rec.Name), str("data", &rec.Data),
		num("priority", &rec.Priority), num("port", &rec.Port), num("weight", &rec.Weight), num("flags", &rec.Flags)} {
		if err != nil {
			return err
		}
	}
	if v, ok := fields["ttl"]; ok {
		if err := json.Unmarshal(v, &rec.TTL); err != nil {
			return err
		}
	}
	if v, ok := fields["tag"]; ok {
		var t *string
		if err := json.Unmarshal(v, &t); err != nil {
			return err
		}
		rec.Tag = t
	}
	// Fields that do not apply to the type read as null, like the real API.
	switch strings.ToUpper(rec.Type) {
	case "MX":
		rec.Port, rec.Weight, rec.Flags, rec.Tag = nil, nil, nil, nil
	case "SRV":
		rec.Flags, rec.Tag = nil, nil
	case "CAA":
		rec.Priority, rec.Port, rec.Weight = nil, nil, nil
	default:
		rec.Priority, rec.Port, rec.Weight, rec.Flags, rec.Tag = nil, nil, nil, nil, nil
	}
	return nil
}

func validRecord(rec *Record) string {
	switch {
	case rec.Type == "":
		return "Type can't be blank."
	case rec.Data == "":
		return "Data needs to end with a dot (.) or be an IP address; it can't be blank."
	case strings.EqualFold(rec.Type, "A"):
		if a, err := netip.ParseAddr(rec.Data); err != nil || !a.Is4() {
			return "Data must be a valid IPv4 address."
		}
	case strings.EqualFold(rec.Type, "AAAA"):
		if a, err := netip.ParseAddr(rec.Data); err != nil || !a.Is6() {
			return "Data must be a valid IPv6 address."
		}
	}
	return ""
}

func (s *Server) createRecord(w http.ResponseWriter, r *http.Request, domain string) {
	if _, ok := s.domains[domain]; !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	var fields map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&fields); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	rec := &Record{TTL: 1800}
	if err := applyRecordFields(rec, fields); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	if rec.Name == "" {
		rec.Name = "@"
	}
	if rec.TTL == 0 {
		rec.TTL = 1800
	}
	if msg := validRecord(rec); msg != "" {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", msg)
		return
	}
	s.nextRecord++
	rec.ID = s.nextRecord
	s.domains[domain] = append(s.domains[domain], rec)
	writeJSON(w, http.StatusCreated, map[string]any{"domain_record": rec})
}

func (s *Server) updateRecord(w http.ResponseWriter, r *http.Request, domain, idText string) {
	rec, ok := s.findRecord(domain, idText)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	var fields map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&fields); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	updated := *rec
	if err := applyRecordFields(&updated, fields); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "unable to parse request body")
		return
	}
	if msg := validRecord(&updated); msg != "" {
		writeError(w, http.StatusUnprocessableEntity, "unprocessable_entity", msg)
		return
	}
	*rec = updated
	writeJSON(w, http.StatusOK, map[string]any{"domain_record": rec})
}

func (s *Server) deleteRecord(w http.ResponseWriter, domain, idText string) {
	rec, ok := s.findRecord(domain, idText)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", msgNotFound)
		return
	}
	recs := s.domains[domain]
	for i, x := range recs {
		if x == rec {
			s.domains[domain] = append(recs[:i:i], recs[i+1:]...)
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
