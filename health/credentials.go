package health

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Credential kinds, as shown in Status and /status.
const (
	CredentialNone       = "none"
	CredentialClientCert = "client-certificate"
	CredentialToken      = "token"
)

// Credential describes what the probe authenticates with and how it checks
// the server. It never holds the secret itself.
type Credential struct {
	Kind     string    // CredentialNone, CredentialClientCert or CredentialToken
	Path     string    // the file it was read from ("" for none)
	Subject  string    // client certificate subject, such as "CN=system:node:cp1,O=system:nodes"
	NotAfter time.Time // client certificate expiry
	Since    time.Time // when the probe started using this credential (this version of the file)
	// Loaded tells whether any credential was loaded since vipd started:
	// from then on HTTP 401 and 403 are failures (credential rejected).
	Loaded  bool
	CAFile  string    // CA bundle verifying the server; "" while verification is skipped (loopback only)
	CASince time.Time // when that CA bundle was loaded
}

// probeCreds is what one probe uses.
type probeCreds struct {
	cert   *tls.Certificate
	token  string
	pool   *x509.CertPool
	loaded bool
	desc   string // for error messages: "client certificate /path" or "token /path"
}

// credentials keeps the client certificate, the bearer token and the CA
// bundle read from their files, re-reading them as the watch rule says.
// The client certificate wins over the token when both are available: a
// probe sends one credential, so Status can say which one was judged.
type credentials struct {
	certPath, keyPath, tokenPath, caPath string
	logger                               *slog.Logger
	stat                                 func(string) (fileID, error)

	mu           sync.Mutex
	certW, keyW  watch
	cert         *tls.Certificate
	certSubject  string
	certNotAfter time.Time
	certVersion  int
	tokenW       watch
	token        string
	tokenVersion int
	caW          watch
	pool         *x509.CertPool
	caSince      time.Time
	loaded       bool
	// refused: the apiserver answered the last liveness probe with 401 or
	// 403, so a missing credential is looked for on every probe.
	refused    bool
	cur        Credential
	curVersion int
	lastErr    map[string]string // path -> last error logged, to log each once
}

func newCredentials(cfg Config, logger *slog.Logger, now time.Time) *credentials {
	return &credentials{
		certPath: cfg.ClientCert, keyPath: cfg.ClientKey, tokenPath: cfg.TokenPath, caPath: cfg.CAFile,
		logger: logger, stat: statFile, lastErr: map[string]string{},
		cur: Credential{Kind: CredentialNone, Since: now},
	}
}

// refresh re-reads what is due and returns what the next probe uses.
func (s *credentials) refresh(now time.Time) probeCreds {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshCert(now)
	s.refreshToken(now)
	s.refreshCA(now)

	next := Credential{Kind: CredentialNone, Loaded: s.loaded}
	version := 0
	p := probeCreds{pool: s.pool, loaded: s.loaded}
	switch {
	case s.cert != nil:
		next.Kind, next.Path, next.Subject, next.NotAfter = CredentialClientCert, s.certPath, s.certSubject, s.certNotAfter
		version = s.certVersion
		p.cert, p.desc = s.cert, "client certificate "+s.certPath
	case s.token != "":
		next.Kind, next.Path = CredentialToken, s.tokenPath
		version = s.tokenVersion
		p.token, p.desc = s.token, "token "+s.tokenPath
	}
	if next.Kind != s.cur.Kind || next.Path != s.cur.Path || version != s.curVersion {
		next.Since = now
		s.logger.Info("health: probe credential", "kind", next.Kind, "path", next.Path, "subject", next.Subject,
			"not_after", next.NotAfter, "previous", s.cur.Kind)
	} else {
		next.Since = s.cur.Since
	}
	if s.pool != nil {
		next.CAFile, next.CASince = s.caPath, s.caSince
	}
	s.cur, s.curVersion = next, version
	return p
}

// answered records the HTTP status of a liveness probe: while it is 401
// or 403, a missing credential is looked for on every probe.
func (s *credentials) answered(code int) {
	s.mu.Lock()
	s.refused = code == http.StatusUnauthorized || code == http.StatusForbidden
	s.mu.Unlock()
}

// status returns the credential in use.
func (s *credentials) status() Credential {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *credentials) refreshCert(now time.Time) {
	if s.certPath == "" {
		return
	}
	due := s.certW.due(now, s.refused, s.certPath, s.stat)
	if s.keyPath != s.certPath && s.keyW.due(now, s.refused, s.keyPath, s.stat) {
		due = true
	}
	if !due {
		return
	}
	certID, certErr := s.stat(s.certPath)
	keyID, keyErr := s.stat(s.keyPath)
	var (
		cert     *tls.Certificate
		subject  string
		notAfter time.Time
		err      error
	)
	switch {
	case notFound(certErr):
		err = certErr
	case notFound(keyErr):
		err = keyErr
	default:
		cert, subject, notAfter, err = loadKeyPair(s.certPath, s.keyPath)
	}
	switch {
	case err == nil:
		s.certW.read(now, certID, true)
		s.keyW.read(now, keyID, true)
		s.forget(s.certPath)
		if s.cert == nil || !bytes.Equal(s.cert.Certificate[0], cert.Certificate[0]) {
			s.cert, s.certSubject, s.certNotAfter = cert, subject, notAfter
			s.certVersion++
			s.loaded = true
		}
	case notFound(err):
		// Not there (yet, or any more): probe with the next credential.
		s.certW.read(now, certID, false)
		s.keyW.read(now, keyID, false)
		if s.cert != nil {
			s.logger.Warn("health: client certificate no longer available", "cert", s.certPath, "key", s.keyPath, "err", err)
			s.cert = nil
		}
	default:
		// Present but unusable, e.g. half written: keep what was loaded
		// and try again on the next probe.
		s.certW.read(now, certID, false)
		s.keyW.read(now, keyID, false)
		s.once(s.certPath, "health: cannot use client certificate, keeping the previous one", err,
			"cert", s.certPath, "key", s.keyPath)
	}
}

func (s *credentials) refreshToken(now time.Time) {
	if s.tokenPath == "" || !s.tokenW.due(now, s.refused, s.tokenPath, s.stat) {
		return
	}
	id, err := s.stat(s.tokenPath)
	var data []byte
	if !notFound(err) {
		data, err = os.ReadFile(s.tokenPath)
	}
	tok := string(bytes.TrimSpace(data))
	if err != nil {
		tok = ""
	}
	s.tokenW.read(now, id, tok != "")
	switch {
	case tok != "" && s.token == "":
		s.logger.Info("health: bearer token loaded", "path", s.tokenPath)
	case tok == "" && s.token != "":
		s.logger.Warn("health: bearer token no longer available", "path", s.tokenPath, "err", readErr(err))
	}
	// A token file that exists but cannot be read is probably a
	// permission mistake: say so once rather than silently probing
	// without it.
	if err != nil && !notFound(err) {
		s.once(s.tokenPath, "health: cannot read token file", err, "path", s.tokenPath)
	} else {
		s.forget(s.tokenPath)
	}
	if tok != "" && tok != s.token {
		s.tokenVersion++
		s.loaded = true
	}
	s.token = tok
}

func (s *credentials) refreshCA(now time.Time) {
	if s.caPath == "" || !s.caW.due(now, s.refused, s.caPath, s.stat) {
		return
	}
	id, err := s.stat(s.caPath)
	var pool *x509.CertPool
	if !notFound(err) {
		pool, err = loadCA(s.caPath)
	}
	s.caW.read(now, id, err == nil)
	switch {
	case err == nil:
		if s.pool == nil {
			s.logger.Info("health: verifying the apiserver certificate", "ca_file", s.caPath)
		}
		if s.pool == nil || !s.pool.Equal(pool) {
			s.caSince = now
		}
		s.pool = pool
		s.forget(s.caPath)
	case notFound(err) && s.pool == nil:
		// Before bootstrap: verification stays skipped (loopback only).
	default:
		// Never fall back to an unverified probe once a CA was loaded.
		s.once(s.caPath, "health: cannot read the CA bundle, keeping the previous one", err, "ca_file", s.caPath)
	}
}

func (s *credentials) once(path, msg string, err error, args ...any) {
	if s.lastErr[path] == err.Error() {
		return
	}
	s.lastErr[path] = err.Error()
	s.logger.Warn(msg, append(args, "err", err)...)
}

func (s *credentials) forget(path string) { delete(s.lastErr, path) }

func readErr(err error) string {
	if err == nil {
		return "file is empty"
	}
	return err.Error()
}

// loadKeyPair reads a PEM client certificate and its key; certPath and
// keyPath may be the same file (kubelet-client-current.pem holds both).
func loadKeyPair(certPath, keyPath string) (*tls.Certificate, string, time.Time, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, "", time.Time{}, err
	}
	keyPEM := certPEM
	if keyPath != certPath {
		if keyPEM, err = os.ReadFile(keyPath); err != nil {
			return nil, "", time.Time{}, err
		}
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("not a PEM certificate with its private key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("parse certificate: %w", err)
	}
	pair.Leaf = leaf
	return &pair, subjectString(leaf), leaf.NotAfter, nil
}

func subjectString(c *x509.Certificate) string {
	parts := []string{"CN=" + c.Subject.CommonName}
	for _, o := range c.Subject.Organization {
		parts = append(parts, "O="+o)
	}
	return strings.Join(parts, ",")
}

// loadCA reads a PEM CA bundle.
func loadCA(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errNoPEM
	}
	return pool, nil
}

var errNoPEM = errors.New("no PEM certificate found")
