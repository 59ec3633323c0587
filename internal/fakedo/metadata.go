package fakedo

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/vipd/vipd/internal/fakehttp"
)

// serveMetadata answers the droplet metadata API (no token). Paths are
// /metadata/v1/... (droplet chosen by source address, else the default
// droplet) or /droplet/{id}/metadata/v1/... (that droplet).
func (s *Server) serveMetadata(sw *fakehttp.StatusWriter, r *http.Request) {
	s.mu.Lock()
	f := fakehttp.TakeFault(&s.metaFaults, r)
	s.mu.Unlock()
	if f != nil {
		s.writeFault(sw, r, f)
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()

	path := r.URL.Path
	id := 0
	if rest, ok := strings.CutPrefix(path, "/droplet/"); ok {
		idText, tail, _ := strings.Cut(rest, "/")
		n, err := strconv.Atoi(idText)
		if err != nil {
			http.NotFound(sw, r)
			return
		}
		id, path = n, "/"+tail
	} else {
		if n, ok := s.metaBySource[fakehttp.RemoteIP(r)]; ok {
			id = n
		} else {
			id = s.metaDefault
		}
	}
	d, ok := s.droplets[id]
	if !ok {
		http.NotFound(sw, r)
		return
	}
	rip := s.holdsLocked(d.ID)

	text := func(v string) {
		sw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		sw.WriteHeader(http.StatusOK)
		_, _ = sw.Write([]byte(v))
	}
	switch strings.TrimSuffix(path, "/") {
	case "/metadata/v1.json":
		writeJSON(sw, http.StatusOK, s.metadataJSON(d, rip))
	case "/metadata/v1/id":
		text(strconv.Itoa(d.ID))
	case "/metadata/v1/hostname":
		text(d.Name)
	case "/metadata/v1/region":
		text(s.opts.Region)
	case "/metadata/v1/reserved_ip/ipv4/active", "/metadata/v1/floating_ip/ipv4/active":
		text(strconv.FormatBool(rip != ""))
	case "/metadata/v1/reserved_ip/ipv4/ip_address", "/metadata/v1/floating_ip/ipv4/ip_address":
		if rip == "" {
			http.NotFound(sw, r)
			return
		}
		text(rip)
	case "/metadata/v1/interfaces/public/0/ipv4/address":
		text(d.PublicIPv4)
	case "/metadata/v1/interfaces/public/0/anchor_ipv4/address":
		text(d.AnchorIPv4)
	case "/metadata/v1/interfaces/private/0/ipv4/address":
		text(d.PrivateIPv4)
	default:
		http.NotFound(sw, r)
	}
}

func (s *Server) metadataJSON(d *Droplet, rip string) map[string]any {
	public := map[string]any{
		"ipv4": map[string]any{"ip_address": d.PublicIPv4, "netmask": "255.255.240.0", "gateway": gateway(d.PublicIPv4)},
		"mac":  "de:ad:be:ef:00:01", "type": "public",
	}
	if d.AnchorIPv4 != "" {
		public["anchor_ipv4"] = map[string]any{"ip_address": d.AnchorIPv4, "netmask": "255.255.0.0", "gateway": gateway(d.AnchorIPv4)}
	}
	ifaces := map[string]any{"public": []any{public}}
	if d.PrivateIPv4 != "" {
		ifaces["private"] = []any{map[string]any{
			"ipv4": map[string]any{"ip_address": d.PrivateIPv4, "netmask": "255.255.0.0", "gateway": "0.0.0.0"},
			"mac":  "de:ad:be:ef:00:02", "type": "private",
		}}
	}
	ripv4 := map[string]any{"active": rip != ""}
	if rip != "" {
		ripv4["ip_address"] = rip
	}
	return map[string]any{
		"droplet_id": d.ID, "hostname": d.Name, "region": s.opts.Region, "tags": d.Tags,
		"interfaces":  ifaces,
		"reserved_ip": map[string]any{"ipv4": ripv4},
		"floating_ip": map[string]any{"ipv4": ripv4},
		"features":    map[string]any{"dhcp_enabled": false},
	}
}
