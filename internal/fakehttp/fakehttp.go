// Package fakehttp holds the HTTP plumbing the local fakes of cloud APIs
// share (internal/fakedo, internal/fakehcloud): a listener that can be taken
// down and brought back on the same address, a response writer that
// remembers its status, the request log, the injected-fault list, the
// page/per_page query, and the client's address.
package fakehttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Endpoint is one HTTP listener that can be taken down (clients get
// "connection refused") and brought back on the same address.
type Endpoint struct {
	listen  func(network, addr string) (net.Listener, error)
	handler http.Handler

	mu   sync.Mutex
	addr string
	srv  *http.Server
	done chan struct{}
}

// NewEndpoint returns a stopped endpoint; call Up. listen nil is net.Listen.
func NewEndpoint(listen func(network, addr string) (net.Listener, error), addr string, h http.Handler) *Endpoint {
	if listen == nil {
		listen = net.Listen
	}
	return &Endpoint{listen: listen, addr: addr, handler: h}
}

// Address is the listener's host:port (the real port once Up ran).
func (e *Endpoint) Address() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// Up starts serving (no-op when serving).
func (e *Endpoint) Up() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	// The port may linger briefly after a Down; retry for a moment.
	for i := 0; i < 50; i++ {
		ln, err = e.listen("tcp", e.addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	e.addr = ln.Addr().String()
	srv := &http.Server{Handler: e.handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	e.srv, e.done = srv, done
	return nil
}

// Down closes the listener and every connection and waits for the server
// goroutine to end.
func (e *Endpoint) Down() {
	e.mu.Lock()
	srv, done := e.srv, e.done
	e.srv, e.done = nil, nil
	e.mu.Unlock()
	if srv == nil {
		return
	}
	_ = srv.Close()
	<-done
}

// StatusWriter records the status code written (-1 for a dropped answer).
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

// WriteHeader implements http.ResponseWriter.
func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the hijacker.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Drop breaks the answer half-way (half a status line, then close), so the
// client sees a transport error rather than an idle keep-alive close it
// would retry by itself.
func Drop(w *StatusWriter) {
	w.Status = -1
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_, _ = conn.Write([]byte("HTTP/1.1 5"))
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}

// RemoteIP is the client's address without the port.
func RemoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Request is one entry of a fake's request log.
type Request struct {
	Time   time.Time
	Method string
	Path   string // URL path, without the query
	Query  string // raw query
	Body   string
	Status int    // as written; -1 for a dropped answer
	Remote string // the client's IP address
}

// Log is a fake's request log, safe for concurrent use.
type Log struct {
	mu      sync.Mutex
	entries []Request
}

// Requests returns a copy of the log, oldest first.
func (l *Log) Requests() []Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Request(nil), l.entries...)
}

// Count returns how many logged requests have the method (empty: any) and a
// path starting with prefix.
func (l *Log) Count(method, prefix string) int { return l.CountSince(time.Time{}, method, prefix) }

// CountSince is Count limited to requests logged at or after t.
func (l *Log) CountSince(t time.Time, method, prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.entries {
		if !r.Time.Before(t) && (method == "" || r.Method == method) && strings.HasPrefix(r.Path, prefix) {
			n++
		}
	}
	return n
}

// Reset empties the log.
func (l *Log) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = nil
}

// Logged is h with every request logged in l: the body is read up to 1 MiB
// (h can read it again), and the entry is added with the status h wrote
// once h returns.
func Logged(l *Log, now func() time.Time, h func(w *StatusWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		entry := Request{Time: now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Remote: RemoteIP(r), Body: string(body)}
		sw := &StatusWriter{ResponseWriter: w}
		defer func() {
			entry.Status = sw.Status
			l.mu.Lock()
			l.entries = append(l.entries, entry)
			l.mu.Unlock()
		}()
		h(sw, r)
	})
}

// Rule is a fault of a fake's fault list: the requests it matches (method
// empty: any; the path starts with pathPrefix) and a pointer to how many
// more of them it fails (negative: until the list is cleared).
type Rule interface {
	Rule() (method, pathPrefix string, count *int)
}

// TakeFault finds the first fault of the list that matches r, consumes one
// use of it (a fault used up leaves the list) and returns a copy of it; nil
// when none matches. The caller serialises access to the list.
func TakeFault[F any, PF interface {
	*F
	Rule
}](faults *[]PF, r *http.Request) *F {
	for i, f := range *faults {
		method, prefix, count := f.Rule()
		if method != "" && method != r.Method || !strings.HasPrefix(r.URL.Path, prefix) {
			continue
		}
		cp := *f
		if *count > 0 {
			*count--
			if *count == 0 {
				*faults = append((*faults)[:i:i], (*faults)[i+1:]...)
			}
		}
		return &cp
	}
	return nil
}

// Page reads the page and per_page query parameters (page 1 and def a page
// when absent or below 1, at most limit a page) and returns them with the
// window [lo, hi) of total items the page shows and the last page's number
// (1 when there are no items).
func Page(r *http.Request, total, def, limit int) (page, per, lo, hi, last int) {
	q := r.URL.Query()
	page, _ = strconv.Atoi(q.Get("page"))
	if page < 1 {
		page = 1
	}
	per, _ = strconv.Atoi(q.Get("per_page"))
	if per < 1 {
		per = def
	}
	per = min(per, limit)
	last = max(1, (total+per-1)/per)
	lo = min(total, (page-1)*per)
	hi = min(total, lo+per)
	return page, per, lo, hi, last
}

// Service is the HTTP side of a fake cloud: an API and a metadata endpoint,
// each logging its requests. A fake embeds it, which gives the fake its
// Close, Down/Up (the API), MetadataDown/MetadataUp and request-log methods.
type Service struct {
	api, meta       *Endpoint
	apiLog, metaLog Log
}

// Start serves api on apiAddr and metadata on metaAddr (listen nil is
// net.Listen); name prefixes the errors.
func Start(name string, listen func(network, addr string) (net.Listener, error), apiAddr, metaAddr string,
	now func() time.Time, api, metadata func(w *StatusWriter, r *http.Request)) (*Service, error) {
	s := &Service{}
	s.api = NewEndpoint(listen, apiAddr, Logged(&s.apiLog, now, api))
	s.meta = NewEndpoint(listen, metaAddr, Logged(&s.metaLog, now, metadata))
	if err := s.api.Up(); err != nil {
		return nil, fmt.Errorf("%s: api listener: %w", name, err)
	}
	if err := s.meta.Up(); err != nil {
		s.api.Down()
		return nil, fmt.Errorf("%s: metadata listener: %w", name, err)
	}
	return s, nil
}

// APIAddress and MetadataAddress are the listeners' host:port.
func (s *Service) APIAddress() string      { return s.api.Address() }
func (s *Service) MetadataAddress() string { return s.meta.Address() }

// Close stops both listeners and closes every connection.
func (s *Service) Close() { s.api.Down(); s.meta.Down() }

// Down closes the API listener and all its connections: clients get
// "connection refused" until Up.
func (s *Service) Down() { s.api.Down() }

// Up reopens the API listener on the same address.
func (s *Service) Up() error { return s.api.Up() }

// MetadataDown and MetadataUp do the same for the metadata listener.
func (s *Service) MetadataDown()     { s.meta.Down() }
func (s *Service) MetadataUp() error { return s.meta.Up() }

// Requests returns a copy of the API request log.
func (s *Service) Requests() []Request { return s.apiLog.Requests() }

// MetadataRequests returns a copy of the metadata request log.
func (s *Service) MetadataRequests() []Request { return s.metaLog.Requests() }

// Count returns how many logged API requests have the method (empty: any)
// and a path starting with prefix.
func (s *Service) Count(method, prefix string) int { return s.apiLog.Count(method, prefix) }

// CountSince is Count limited to requests logged at or after t.
func (s *Service) CountSince(t time.Time, method, prefix string) int {
	return s.apiLog.CountSince(t, method, prefix)
}

// ResetLog empties both request logs.
func (s *Service) ResetLog() { s.apiLog.Reset(); s.metaLog.Reset() }

// Controls are the knobs tests turn on a fake's API, safe for concurrent
// use: the one bearer token accepted, the latency added to every answer,
// how long new actions run, how many of the next actions fail, and the
// injected faults. A fake embeds it, which gives the fake its SetToken,
// SetLatency, SetActionDuration, FailActions, AddFault and ClearFaults.
type Controls[F any, PF interface {
	*F
	Rule
}] struct {
	mu          sync.Mutex
	token       string
	latency     time.Duration
	actionDur   time.Duration
	failActions int
	faults      []PF
}

// NewControls starts with the token, latency and action duration given.
func NewControls[F any, PF interface {
	*F
	Rule
}](token string, latency, actionDuration time.Duration) Controls[F, PF] {
	return Controls[F, PF]{token: token, latency: latency, actionDur: actionDuration}
}

// SetToken changes the accepted token.
func (c *Controls[F, PF]) SetToken(token string) { c.mu.Lock(); c.token = token; c.mu.Unlock() }

// SetLatency changes the latency added to every API answer.
func (c *Controls[F, PF]) SetLatency(d time.Duration) { c.mu.Lock(); c.latency = d; c.mu.Unlock() }

// SetActionDuration changes how long new actions run.
func (c *Controls[F, PF]) SetActionDuration(d time.Duration) {
	c.mu.Lock()
	c.actionDur = d
	c.mu.Unlock()
}

// FailActions makes the next n actions end in error without effect.
func (c *Controls[F, PF]) FailActions(n int) { c.mu.Lock(); c.failActions = n; c.mu.Unlock() }

// AddFault registers a fault; faults are tried in the order added.
func (c *Controls[F, PF]) AddFault(f F) { c.mu.Lock(); c.faults = append(c.faults, &f); c.mu.Unlock() }

// ClearFaults removes every fault.
func (c *Controls[F, PF]) ClearFaults() { c.mu.Lock(); c.faults = nil; c.mu.Unlock() }

// Arrive is what every API request meets first: it takes the first fault
// that matches r (nil: none), then waits the latency (or until r ends).
func (c *Controls[F, PF]) Arrive(r *http.Request) *F {
	c.mu.Lock()
	latency := c.latency
	f := TakeFault(&c.faults, r)
	c.mu.Unlock()
	Sleep(r.Context(), latency)
	return f
}

// Authorized reports whether r carries the accepted bearer token.
func (c *Controls[F, PF]) Authorized(r *http.Request) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.Header.Get("Authorization") == "Bearer "+c.token
}

// ActionDuration is how long a new action runs.
func (c *Controls[F, PF]) ActionDuration() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.actionDur
}

// ActionFails reports whether a new action is to fail, using up one of
// FailActions.
func (c *Controls[F, PF]) ActionFails() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failActions <= 0 {
		return false
	}
	c.failActions--
	return true
}
