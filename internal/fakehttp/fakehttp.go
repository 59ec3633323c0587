// Package fakehttp holds the HTTP plumbing the local fakes of cloud APIs
// share (internal/fakedo, internal/fakehcloud): a listener that can be taken
// down and brought back on the same address, a response writer that
// remembers its status, and the client's address.
package fakehttp

import (
	"context"
	"errors"
	"net"
	"net/http"
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
