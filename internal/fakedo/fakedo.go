// Package fakedo is a local fake of the parts of the DigitalOcean API that
// vipd uses (reserved IPs and their actions, droplets, domain records) and of
// the droplet metadata service. It follows the real paths, status codes and
// JSON shapes closely enough that github.com/digitalocean/godo decodes its
// answers, and it lets tests inject faults (error statuses, 429 storms with
// rate-limit headers, latency, a server that is down) and assert on a log of
// the requests it saw.
//
// A Server is safe for concurrent use. State changes caused by actions
// (an assign completing after Options.ActionDuration) are applied lazily
// whenever the server is asked anything, using Options.Now.
//
// Typical use:
//
//	fake, err := fakedo.New(fakedo.Options{Token: "t", ActionDuration: 200 * time.Millisecond})
//	defer fake.Close()
//	fake.AddDroplet(fakedo.Droplet{ID: 101, Name: "node-1", PublicIPv4: "198.51.100.1"})
//	fake.AddReservedIP("192.0.2.10", 0)
//	client, _ := godo.New(httpClientWithBearer("t"), godo.SetBaseURL(fake.URL()))
//	fake.AddFault(fakedo.Fault{Path: "/v2/reserved_ips", Status: 429, Count: -1, ResetAfter: 2 * time.Second})
//	n := fake.Count(http.MethodPost, "/v2/reserved_ips/192.0.2.10/actions")
//
// The metadata server answers /metadata/v1/id, /metadata/v1.json,
// /metadata/v1/reserved_ip/ipv4/{active,ip_address} and a few interface
// addresses for the droplet named in the path (MetadataURL(id)) or chosen
// by the caller's source address (SetMetadataSource).
package fakedo

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/fakehttp"
)

// Options configure a fake.
type Options struct {
	// Token is the only bearer token accepted. Empty means "fake-token".
	Token string
	// ActionDuration is how long an action stays "in-progress" before it
	// completes and takes effect. Zero completes actions on the next request.
	ActionDuration time.Duration
	// Latency is added before every API answer (not metadata answers).
	Latency time.Duration
	// Region is the slug of the single region the fake models ("nyc3").
	Region string
	// IPPool is where reserved IPs created without an explicit address come
	// from (default 203.0.113.0/24).
	IPPool netip.Prefix
	// Listen opens the API and metadata listeners. Default net.Listen. Pass
	// e.g. a lab host's Listen to serve inside a network namespace.
	Listen func(network, addr string) (net.Listener, error)
	// Addr and MetadataAddr are where to listen (default "127.0.0.1:0").
	Addr, MetadataAddr string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Request is one entry of the request log.
type Request = fakehttp.Request

// Fault makes matching requests fail. A request matches when its method
// equals Method (empty: any) and its path starts with Path (empty: any).
type Fault struct {
	Method string
	Path   string
	// Status to answer (e.g. 429, 500, 503). Zero with Drop set aborts the
	// connection instead of answering.
	Status int
	// Count is how many matching requests fail; negative means until
	// ClearFaults.
	Count int
	// Delay is added to each failing answer.
	Delay time.Duration
	// ResetAfter sets RateLimit-Reset to now+ResetAfter (429 answers; default
	// 1s) and, when RetryAfter is true, also a Retry-After header.
	ResetAfter time.Duration
	RetryAfter bool
	// Drop breaks the connection in the middle of the answer (a transport
	// error for the client).
	Drop bool
}

// Rule is the fault's match for fakehttp.TakeFault.
func (f *Fault) Rule() (method, pathPrefix string, count *int) { return f.Method, f.Path, &f.Count }

// Droplet describes a droplet the fake knows.
type Droplet struct {
	ID          int
	Name        string
	PublicIPv4  string
	PrivateIPv4 string
	AnchorIPv4  string // anchor address used by reserved IPs (metadata only)
	Tags        []string
}

// Record is a DNS record in a domain of the fake.
type Record struct {
	ID       int     `json:"id"`
	Type     string  `json:"type"`
	Name     string  `json:"name"`
	Data     string  `json:"data"`
	Priority *int    `json:"priority"`
	Port     *int    `json:"port"`
	TTL      int     `json:"ttl"`
	Weight   *int    `json:"weight"`
	Flags    *int    `json:"flags"`
	Tag      *string `json:"tag"`
}

// Action is the fake's view of an action.
type Action struct {
	ID          int
	Type        string // assign_ip, unassign_ip
	Status      string // in-progress, completed, errored
	IP          string
	DropletID   int // target of an assign
	StartedAt   time.Time
	CompletedAt time.Time
	ends        time.Time
	external    bool // made by LockIP: no effect
	fail        bool
}

type reservedIP struct {
	ip        string
	dropletID int // 0: unassigned
	projectID string
	actions   []int
}

// Server is a running fake.
type Server struct {
	opts Options
	now  func() time.Time

	*fakehttp.Service

	fakehttp.Controls[Fault, *Fault]

	mu           sync.Mutex
	droplets     map[int]*Droplet
	dropletOrder []int
	rips         map[string]*reservedIP
	ripOrder     []string
	actions      map[int]*Action
	nextAction   int
	domains      map[string][]*Record
	nextRecord   int
	metaBySource map[string]int
	metaDefault  int
	metaFaults   []*Fault
	rateLimit    int
	rateRemain   int
}

// New starts a fake API and a fake metadata server.
func New(opts Options) (*Server, error) {
	if opts.Token == "" {
		opts.Token = "fake-token"
	}
	if opts.Region == "" {
		opts.Region = "nyc3"
	}
	if !opts.IPPool.IsValid() {
		opts.IPPool = netip.MustParsePrefix("203.0.113.0/24")
	}
	if opts.Listen == nil {
		opts.Listen = net.Listen
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.MetadataAddr == "" {
		opts.MetadataAddr = "127.0.0.1:0"
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s := &Server{
		Controls:     fakehttp.NewControls[Fault](opts.Token, opts.Latency, opts.ActionDuration),
		opts:         opts,
		now:          now,
		droplets:     map[int]*Droplet{},
		rips:         map[string]*reservedIP{},
		actions:      map[int]*Action{},
		nextAction:   1500000,
		domains:      map[string][]*Record{},
		nextRecord:   28000000,
		metaBySource: map[string]int{},
		rateLimit:    5000,
		rateRemain:   5000,
	}
	svc, err := fakehttp.Start("fakedo", opts.Listen, opts.Addr, opts.MetadataAddr, now, s.serveAPI, s.serveMetadata)
	if err != nil {
		return nil, err
	}
	s.Service = svc
	return s, nil
}

// URL is the API base URL with a trailing slash, for godo.SetBaseURL.
func (s *Server) URL() string { return "http://" + s.APIAddress() + "/" }

// Addr is the API listener's host:port.
func (s *Server) Addr() string { return s.APIAddress() }

// MetadataURL is the metadata base URL (ending in /metadata/v1) that
// answers for droplet id, whoever asks. With id 0 the droplet is chosen by
// the caller's source address (SetMetadataSource) or the default droplet.
func (s *Server) MetadataURL(id int) string {
	if id == 0 {
		return "http://" + s.MetadataAddress() + "/metadata/v1"
	}
	return fmt.Sprintf("http://%s/droplet/%d/metadata/v1", s.MetadataAddress(), id)
}

// AddMetadataFault registers a fault for the metadata server.
func (s *Server) AddMetadataFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metaFaults = append(s.metaFaults, &f)
}

// ClearFaults removes every fault (API and metadata).
func (s *Server) ClearFaults() {
	s.Controls.ClearFaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metaFaults = nil
}

// AddDroplet registers a droplet. The first droplet added is the default
// answer of the metadata server.
func (s *Server) AddDroplet(d Droplet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.droplets[d.ID]; !ok {
		s.dropletOrder = append(s.dropletOrder, d.ID)
	}
	dd := d
	dd.Tags = append([]string(nil), d.Tags...)
	s.droplets[d.ID] = &dd
	if s.metaDefault == 0 {
		s.metaDefault = d.ID
	}
}

// SetMetadataSource makes plain /metadata/v1 requests from source address
// addr (an IP, no port) answer for droplet id.
func (s *Server) SetMetadataSource(addr string, id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metaBySource[addr] = id
}

// AddReservedIP registers a reserved IP, assigned to dropletID (0: none).
func (s *Server) AddReservedIP(ip string, dropletID int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rips[ip]; !ok {
		s.ripOrder = append(s.ripOrder, ip)
	}
	s.rips[ip] = &reservedIP{ip: ip, dropletID: dropletID, projectID: "746c6152-2fa2-11ed-92d3-27aaa54e4988"}
}

// Holder returns the droplet the reserved IP is assigned to (0: none) and
// whether the IP exists, after applying finished actions.
func (s *Server) Holder(ip string) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	r, ok := s.rips[ip]
	if !ok {
		return 0, false
	}
	return r.dropletID, true
}

// LockIP starts an in-progress action on ip made by "someone else" that
// lasts d and has no effect: while it runs, actions on ip get 422.
func (s *Server) LockIP(ip string, d time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rips[ip]
	if !ok {
		return 0, fmt.Errorf("fakedo: no reserved IP %s", ip)
	}
	a := s.newActionLocked(r, "assign_ip", r.dropletID, d)
	a.external = true
	return a.ID, nil
}

// Actions returns a copy of every action, oldest first.
func (s *Server) Actions() []Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	out := make([]Action, 0, len(s.actions))
	for id := 1500000; id < s.nextAction; id++ {
		if a, ok := s.actions[id]; ok {
			out = append(out, *a)
		}
	}
	return out
}

// AddDomain registers an (empty) domain.
func (s *Server) AddDomain(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.domains[name]; !ok {
		s.domains[name] = nil
	}
}

// AddRecord adds a record to a domain (created if needed) and returns its id.
func (s *Server) AddRecord(domain string, r Record) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextRecord++
	r.ID = s.nextRecord
	rr := r
	s.domains[domain] = append(s.domains[domain], &rr)
	return r.ID
}

// Records returns a copy of a domain's records.
func (s *Server) Records(domain string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, 0, len(s.domains[domain]))
	for _, r := range s.domains[domain] {
		out = append(out, *r)
	}
	return out
}
