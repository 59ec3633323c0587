// Package fakehcloud is a local fake of the parts of the Hetzner Cloud API
// that vipd uses (floating IPs, their assign/unassign actions, actions) and
// of the server metadata service. It follows the public API documentation
// (https://docs.hetzner.cloud): the /v1 paths and verbs, the JSON objects
// (floating_ip, action with running/success/error and progress, pagination
// meta), the error object {"error":{"code","message","details"}} with the
// documented codes (unauthorized, forbidden, not_found, locked,
// rate_limit_exceeded, service_error, ...), and the rate limit: a bucket of
// RateLimit-Limit requests per hour that refills steadily, reported on every
// answer as RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset (Unix
// time at which the bucket is full again), with 429 rate_limit_exceeded when
// it is empty.
//
// An assign action stays "running" for ActionDuration (progress rising),
// then ends "success" and moves the IP; while it runs, other actions on the
// floating IP get 423 locked. Faults (status codes, dropped connections,
// latency), an empty rate-limit bucket, a wrong token and a server that is
// down can be injected, and every request is logged.
//
// A Server is safe for concurrent use; action effects are applied lazily
// when the server is asked anything, using Options.Now.
package fakehcloud

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/fakehttp"
)

// Options configure a fake.
type Options struct {
	// Token is the only bearer token accepted (default "fake-token").
	Token string
	// ActionDuration is how long an assign stays running (default 0: done
	// on the next request).
	ActionDuration time.Duration
	// Latency is added before every API answer.
	Latency time.Duration
	// RateLimit is the bucket size per hour (default 3600, Hetzner's
	// default per project).
	RateLimit int
	// Listen opens the listeners (default net.Listen).
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
	Method, Path string
	// Status to answer; zero (or Drop) breaks the connection instead.
	Status int
	// Code and Message of the error object (defaults by status).
	Code, Message string
	// Count is how many requests fail; negative: until ClearFaults.
	Count int
	// Delay is added to each failing answer.
	Delay time.Duration
	Drop  bool
}

// Rule is the fault's match for fakehttp.TakeFault.
func (f *Fault) Rule() (method, pathPrefix string, count *int) { return f.Method, f.Path, &f.Count }

// FloatingIP is the fake's view of one floating IP.
type FloatingIP struct {
	ID      int64
	Name    string
	IP      string
	Server  int64 // 0: unassigned
	Blocked bool
}

// Action is the fake's view of one action.
type Action struct {
	ID         int64
	Command    string // assign_floating_ip, unassign_floating_ip
	Status     string // running, success, error
	FloatingIP int64
	Server     int64
	Started    time.Time
	Finished   time.Time
	ends       time.Time
	fail       bool
	external   bool // made by LockIP: no effect
}

// Server is a running fake.
type Server struct {
	opts Options
	now  func() time.Time
	*fakehttp.Service

	fakehttp.Controls[Fault, *Fault]

	mu         sync.Mutex
	servers    map[int64]string // id -> name
	fips       map[int64]*FloatingIP
	fipOrder   []int64
	actions    map[int64]*Action
	nextAction int64
	limit      int
	remaining  float64
	refilled   time.Time
}

// New starts a fake API and metadata service.
func New(opts Options) (*Server, error) {
	if opts.Token == "" {
		opts.Token = "fake-token"
	}
	if opts.RateLimit <= 0 {
		opts.RateLimit = 3600
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
		Controls: fakehttp.NewControls[Fault](opts.Token, opts.Latency, opts.ActionDuration),
		opts:     opts, now: now,
		servers: map[int64]string{}, fips: map[int64]*FloatingIP{}, actions: map[int64]*Action{},
		nextAction: 13000000, limit: opts.RateLimit, remaining: float64(opts.RateLimit), refilled: now(),
	}
	svc, err := fakehttp.Start("fakehcloud", opts.Listen, opts.Addr, opts.MetadataAddr, now, s.serveAPI, s.serveMetadata)
	if err != nil {
		return nil, err
	}
	s.Service = svc
	return s, nil
}

// URL is the API base URL ending in /v1 (hcloud.WithEndpoint).
func (s *Server) URL() string { return "http://" + s.APIAddress() + "/v1" }

// MetadataURL is the metadata base (ending in /hetzner/v1/metadata) that
// answers for server id.
func (s *Server) MetadataURL(id int64) string {
	return fmt.Sprintf("http://%s/server/%d/hetzner/v1/metadata", s.MetadataAddress(), id)
}

// ExhaustRateLimit empties the rate-limit bucket: requests get 429 until it
// refills (one request per 3600/RateLimit seconds).
func (s *Server) ExhaustRateLimit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refillLocked()
	s.remaining = 0
}

// AddServer registers a server.
func (s *Server) AddServer(id int64, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servers[id] = name
}

// AddFloatingIP registers (or replaces) a floating IP.
func (s *Server) AddFloatingIP(f FloatingIP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.fips[f.ID]; !ok {
		s.fipOrder = append(s.fipOrder, f.ID)
	}
	ff := f
	s.fips[f.ID] = &ff
}

// SetHolder moves a floating IP at once (someone else's doing).
func (s *Server) SetHolder(id, server int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.fips[id]; ok {
		f.Server = server
	}
}

// Holder returns the server the floating IP with address ip is assigned
// to (0: none), after applying finished actions.
func (s *Server) Holder(ip string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	for _, f := range s.fips {
		if f.IP == ip {
			return f.Server
		}
	}
	return 0
}

// LockIP starts an action by "someone else" on the floating IP that runs
// for d and has no effect: meanwhile, actions on it get 423 locked.
func (s *Server) LockIP(id int64, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.newActionLocked("assign_floating_ip", id, 0, d)
	a.external = true
}

// Actions returns a copy of every action, oldest first.
func (s *Server) Actions() []Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	var out []Action
	for id := int64(13000000); id < s.nextAction; id++ {
		if a, ok := s.actions[id]; ok {
			out = append(out, *a)
		}
	}
	return out
}

// newActionLocked starts an action. The caller holds s.mu.
func (s *Server) newActionLocked(cmd string, fip, server int64, d time.Duration) *Action {
	now := s.now()
	a := &Action{ID: s.nextAction, Command: cmd, Status: "running", FloatingIP: fip, Server: server, Started: now, ends: now.Add(d)}
	s.nextAction++
	s.actions[a.ID] = a
	return a
}

// settleLocked finishes actions whose time has come. The caller holds s.mu.
func (s *Server) settleLocked() {
	now := s.now()
	for id := int64(13000000); id < s.nextAction; id++ {
		a := s.actions[id]
		if a == nil || a.Status != "running" || now.Before(a.ends) {
			continue
		}
		a.Finished = now
		if a.fail {
			a.Status = "error"
			continue
		}
		a.Status = "success"
		if a.external {
			continue
		}
		if f, ok := s.fips[a.FloatingIP]; ok {
			switch a.Command {
			case "assign_floating_ip":
				f.Server = a.Server
			case "unassign_floating_ip":
				f.Server = 0
			}
		}
	}
}

// runningOnLocked reports whether an action on floating IP id is running.
func (s *Server) runningOnLocked(id int64) bool {
	for _, a := range s.actions {
		if a.FloatingIP == id && a.Status == "running" {
			return true
		}
	}
	return false
}

// refillLocked adds what the bucket earned since the last refill.
func (s *Server) refillLocked() {
	now := s.now()
	per := time.Hour / time.Duration(s.limit)
	earned := float64(now.Sub(s.refilled)) / float64(per)
	s.remaining = min(float64(s.limit), s.remaining+earned)
	s.refilled = now
}
