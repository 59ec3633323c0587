package lab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"sync"
	"time"
)

// Mode is how a fake apiserver answers.
type Mode string

// Modes of a fake apiserver.
const (
	OK           Mode = "ok"           // 200
	Unauthorized Mode = "unauthorized" // 401
	Failing      Mode = "failing"      // 500
	Hanging      Mode = "hanging"      // accepts, never answers
	Down         Mode = "down"         // listener closed: connection refused
)

// APIServer is a fake kube-apiserver: a TLS server inside a node namespace
// whose every path (/livez included) answers as its Mode says, with the
// node's name as the body so a client can tell who answered.
type APIServer struct {
	host    *Host
	addr    string
	tlsConf *tls.Config
	mu      sync.Mutex
	mode    Mode
	ln      net.Listener
	srv     *http.Server
	hang    chan struct{} // closed when leaving Hanging
	firstOK time.Time     // first 200 on /livez since the last SetMode(OK)
	livez   int           // /livez requests seen
}

// StartAPIServer listens on addr (e.g. "0.0.0.0:6443") in the host's
// namespace, answering 200. It is stopped when the lab closes.
func (h *Host) StartAPIServer(addr string, mode Mode) (*APIServer, error) {
	cert, err := selfSigned(h.Name)
	if err != nil {
		return nil, err
	}
	a := &APIServer{host: h, addr: addr, mode: Down, hang: make(chan struct{}),
		tlsConf: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	if err := a.SetMode(mode); err != nil {
		return nil, err
	}
	h.lab.OnClose(func() { _ = a.SetMode(Down) })
	return a, nil
}

// SetMode changes how the server answers from now on.
func (a *APIServer) SetMode(m Mode) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mode == Hanging && m != Hanging {
		close(a.hang)
		a.hang = make(chan struct{})
	}
	if m == OK && a.mode != OK {
		a.firstOK = time.Time{}
	}
	prev := a.mode
	a.mode = m
	switch {
	case m == Down && prev != Down:
		if a.srv != nil {
			err := a.srv.Close()
			a.srv, a.ln = nil, nil
			return err
		}
	case m != Down && prev == Down:
		ln, err := a.host.Listen("tcp", a.addr)
		if err != nil {
			a.mode = Down
			return fmt.Errorf("fake apiserver on %s in %s: %w", a.addr, a.host.NS, err)
		}
		a.ln = tls.NewListener(ln, a.tlsConf)
		a.srv = &http.Server{Handler: http.HandlerFunc(a.serve), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
		srv, l := a.srv, a.ln
		go func() { _ = srv.Serve(l) }()
	}
	return nil
}

// Mode returns the current mode.
func (a *APIServer) Mode() Mode {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mode
}

// FirstOK returns when /livez was first answered 200 since the server was
// last switched to OK (zero if not yet).
func (a *APIServer) FirstOK() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.firstOK
}

// LivezCount returns how many /livez requests were seen.
func (a *APIServer) LivezCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.livez
}

func (a *APIServer) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	mode, hang := a.mode, a.hang
	if r.URL.Path == "/livez" {
		a.livez++
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	switch mode {
	case OK:
		if r.URL.Path == "/livez" {
			a.mu.Lock()
			if a.firstOK.IsZero() {
				a.firstOK = time.Now()
			}
			a.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	case Unauthorized:
		w.WriteHeader(http.StatusUnauthorized)
	case Hanging:
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		return
	default:
		w.WriteHeader(http.StatusInternalServerError)
	}
	fmt.Fprintln(w, a.host.Name)
}

func selfSigned(name string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "fake-apiserver-" + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Probe makes one fresh TLS connection from the host to addr and returns
// the body of a 200 answer (the answering node's name).
func (h *Host) Probe(ctx context.Context, addr string, timeout time.Duration) (string, error) {
	var conn net.Conn
	d := net.Dialer{Timeout: timeout}
	err := h.Run(func() error {
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // lab-only fake apiserver
	if _, err := fmt.Fprintf(tc, "GET /probe HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n"); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := readAll(tc, buf)
	if err != nil && n == 0 {
		return "", err
	}
	return parseProbe(string(buf[:n]))
}

func readAll(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func parseProbe(resp string) (string, error) {
	var code int
	if _, err := fmt.Sscanf(resp, "HTTP/1.1 %d", &code); err != nil {
		return "", fmt.Errorf("bad response %q", resp)
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("status %d", code)
	}
	i := indexBody(resp)
	if i < 0 {
		return "", errors.New("no body")
	}
	body := resp[i:]
	for len(body) > 0 && (body[len(body)-1] == '\n' || body[len(body)-1] == '\r') {
		body = body[:len(body)-1]
	}
	return body, nil
}

func indexBody(s string) int {
	for i := 0; i+3 < len(s); i++ {
		if s[i:i+4] == "\r\n\r\n" {
			return i + 4
		}
	}
	return -1
}
