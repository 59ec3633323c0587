package main

import (
	"context"
	"net"
	"net/http"
	"time"
)

// shutdownWait is how long Close lets the requests in flight finish
// before it closes their connections.
const shutdownWait = 200 * time.Millisecond

// httpServer serves HTTP on a listener from one goroutine, which Close
// stops and waits for: the status server and the control socket.
type httpServer struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{} // closed when Serve has returned
}

// serveHTTP starts serving h on ln.
func serveHTTP(ln net.Listener, h http.Handler) *httpServer {
	s := &httpServer{srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s
}

// addr is the address it listens on.
func (s *httpServer) addr() string { return s.ln.Addr().String() }

// Close stops listening, gives the requests in flight shutdownWait,
// closes what is left and returns once the server's goroutine has.
func (s *httpServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}
