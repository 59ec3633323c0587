package health

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWatchDue is the re-read rule on a fake clock with a fake stat.
func TestWatchDue(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := fileID{link: "kubelet-client-2026-01-01.pem", dev: 1, ino: 10, size: 100, mtimeNano: 1}
	b := a
	b.link = "kubelet-client-2026-02-01.pem" // symlink retargeted
	c := a
	c.ino = 11 // file replaced by rename
	d := a
	d.size = 120 // rewritten in place
	loaded := func() watch { var w watch; w.read(t0, a, true); return w }
	failed := func() watch { w := loaded(); w.read(t0, a, false); return w }()         // present, not usable
	missing := func() watch { w := loaded(); w.read(t0, fileID{}, false); return w }() // the stat found nothing
	tests := []struct {
		name      string
		w         watch
		at        time.Duration // after t0
		eager     bool
		id        fileID
		statErr   error
		want      bool
		wantStats int
	}{
		{"never read", watch{}, 0, false, a, nil, true, 0},
		{"present but not usable: every probe", failed, time.Millisecond, false, a, nil, true, 0},
		{"missing, within the check period", missing, time.Millisecond, false, a, nil, false, 0},
		{"missing, within the check period, eager", missing, time.Millisecond, true, a, nil, true, 0},
		{"missing, check period over", missing, checkEvery, false, a, nil, true, 0},
		{"missing, clock went backwards", missing, -time.Second, false, a, nil, true, 0},
		{"loaded, unchanged, within the check period: no stat", loaded(), checkEvery - time.Millisecond, false, b, nil, false, 0},
		{"loaded, unchanged at the check", loaded(), checkEvery, false, a, nil, false, 1},
		{"symlink retargeted", loaded(), checkEvery, false, b, nil, true, 1},
		{"file replaced", loaded(), checkEvery, false, c, nil, true, 1},
		{"rewritten in place", loaded(), checkEvery, false, d, nil, true, 1},
		{"file gone", loaded(), checkEvery, false, fileID{}, fs.ErrNotExist, true, 1},
		{"re-read anyway after rereadEvery", loaded(), rereadEvery, false, a, nil, true, 0},
		{"clock went backwards", loaded(), -time.Second, false, a, nil, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stats := 0
			stat := func(string) (fileID, error) { stats++; return tt.id, tt.statErr }
			w := tt.w
			if got := w.due(t0.Add(tt.at), tt.eager, "/p", stat); got != tt.want || stats != tt.wantStats {
				t.Fatalf("due = %v with %d stats, want %v with %d", got, stats, tt.want, tt.wantStats)
			}
		})
	}

	// The check itself is rate limited: an unchanged file is statted at
	// most once per checkEvery however often the probe runs.
	w := loaded()
	stats := 0
	stat := func(string) (fileID, error) { stats++; return a, nil }
	for ms := 0; ms < int(3*checkEvery/time.Millisecond); ms += 100 {
		if w.due(t0.Add(time.Duration(ms)*time.Millisecond), true, "/p", stat) {
			t.Fatalf("unchanged file due at +%dms", ms)
		}
	}
	if stats != 2 {
		t.Fatalf("%d stats in 3 check periods (probing every 100ms), want 2", stats)
	}
}

// TestJudgeStatus is the 401 rule.
func TestJudgeStatus(t *testing.T) {
	tests := []struct {
		code   int
		loaded bool
		want   string
	}{
		{200, false, ReasonOK},
		{200, true, ReasonOK},
		{401, false, ReasonOK}, // first node, nothing to authenticate with yet
		{401, true, ReasonCredentialRejected},
		{403, false, ReasonForbidden},
		{403, true, ReasonCredentialRejected},
		{500, true, ReasonHTTP5xx},
		{404, false, ReasonHTTPOther},
	}
	for _, tt := range tests {
		if got := judgeStatus(tt.code, tt.loaded); got != tt.want {
			t.Errorf("judgeStatus(%d, loaded=%v) = %q, want %q", tt.code, tt.loaded, got, tt.want)
		}
	}
}

// testCA issues client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a kubelet-style PEM client certificate for cn and its key.
func (ca *testCA) issue(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// writeAtomic writes data to path through a rename, as kubelet does.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// relink points link at target through a rename, as kubelet retargets
// kubelet-client-current.pem.
func relink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// authServer is an apiserver stand-in with anonymous auth off: 200 for a
// client certificate from trusted, 401 otherwise; it records the common
// name of the last client certificate ("" for none).
func authServer(t *testing.T, trusted *testCA) (*httptest.Server, *atomic.Value) {
	t.Helper()
	var lastCN atomic.Value
	lastCN.Store("")
	pool := x509.NewCertPool()
	pool.AddCert(trusted.cert)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := ""
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		lastCN.Store(cn)
		opts := x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		if len(r.TLS.PeerCertificates) == 0 {
			w.WriteHeader(http.StatusUnauthorized)
		} else if _, err := r.TLS.PeerCertificates[0].Verify(opts); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	// Like kube-apiserver: ask for a certificate, name only the trusted CA
	// as acceptable, and verify it in the handler (an unknown certificate
	// is a 401, not a handshake failure).
	ts.TLS = &tls.Config{ClientAuth: tls.RequestClientCert, ClientCAs: pool}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return ts, &lastCN
}

// TestClientCertificateLifecycle follows a kubelet-style certificate from
// absent through appear, rotation by symlink and by rename, a certificate
// from another CA and removal, on a fake clock.
func TestClientCertificateLifecycle(t *testing.T) {
	ca, other := newTestCA(t, "cluster-ca"), newTestCA(t, "other-ca")
	ts, lastCN := authServer(t, ca)
	dir := t.TempDir()
	current := filepath.Join(dir, "kubelet-client-current.pem")
	clock := newFakeClock()
	reg := prometheus.NewRegistry()
	c := newChecker(t, Config{URL: ts.URL + "/livez", ClientCert: current, ClientKey: current,
		TokenPath: filepath.Join(dir, "no-token")}, reg, WithClock(clock))

	write := func(name string, ca *testCA, cn string) string {
		cert, key := ca.issue(t, cn)
		p := filepath.Join(dir, name)
		writeAtomic(t, p, append(cert, key...))
		return p
	}
	step := func(desc string, advance time.Duration, wantCN, wantReason, wantKind string) Credential {
		t.Helper()
		clock.Advance(advance)
		r := c.Probe(t.Context())
		st := c.record(r, ReadyzUnknown)
		if got := lastCN.Load().(string); got != wantCN {
			t.Fatalf("%s: server saw certificate %q, want %q", desc, got, wantCN)
		}
		if r.Reason != wantReason {
			t.Fatalf("%s: reason %q, want %q (err %v)", desc, r.Reason, wantReason, r.Err)
		}
		if st.Credential.Kind != wantKind {
			t.Fatalf("%s: credential %+v, want kind %s", desc, st.Credential, wantKind)
		}
		return st.Credential
	}

	step("nothing yet: anonymous 401 is healthy", 0, "", ReasonOK, CredentialNone)

	relink(t, write("kubelet-client-2026-01-01.pem", ca, "system:node:a"), current)
	cr := step("certificate appears: used by the next probe", time.Second, "system:node:a", ReasonOK, CredentialClientCert)
	if cr.Path != current || cr.Subject != "CN=system:node:a,O=system:nodes" || !cr.Since.Equal(clock.Now()) || !cr.Loaded || cr.NotAfter.IsZero() {
		t.Fatalf("credential after load = %+v", cr)
	}
	loadedAt := cr.Since

	relink(t, write("kubelet-client-2026-02-01.pem", ca, "system:node:b"), current)
	if cr := step("retargeted, not checked yet", checkEvery-2*time.Second, "system:node:a", ReasonOK, CredentialClientCert); !cr.Since.Equal(loadedAt) {
		t.Fatalf("since moved without a change: %v, want %v", cr.Since, loadedAt)
	}
	cr = step("retargeted, checked: rotated without restart", 2*time.Second, "system:node:b", ReasonOK, CredentialClientCert)
	if !cr.Since.Equal(clock.Now()) {
		t.Fatalf("since after rotation = %v, want %v", cr.Since, clock.Now())
	}

	// The link itself replaced by a regular file.
	cert, key := ca.issue(t, "system:node:c")
	writeAtomic(t, current, append(cert, key...))
	step("file replaced", checkEvery, "system:node:c", ReasonOK, CredentialClientCert)

	// A certificate the apiserver does not trust is still sent, and its
	// rejection is a failure.
	cert, key = other.issue(t, "system:node:d")
	writeAtomic(t, current, append(cert, key...))
	r := func() Result { clock.Advance(checkEvery); return c.Probe(t.Context()) }()
	if r.Reason != ReasonCredentialRejected || r.Code != 401 || lastCN.Load().(string) != "system:node:d" {
		t.Fatalf("other CA: reason %q code %d server saw %q, want credential_rejected/401/system:node:d", r.Reason, r.Code, lastCN.Load())
	}
	if !strings.Contains(r.Err.Error(), "credential rejected") || !strings.Contains(r.Err.Error(), current) {
		t.Fatalf("error %q does not name the rejected credential", r.Err)
	}

	// Half written: the previous certificate stays in use.
	if err := os.Remove(current); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(current, cert, 0o600); err != nil { // certificate without its key yet
		t.Fatal(err)
	}
	step("half-written file keeps the previous certificate", checkEvery, "system:node:d", ReasonCredentialRejected, CredentialClientCert)
	if err := os.WriteFile(current, append(cert, key...), 0o600); err != nil {
		t.Fatal(err)
	}

	if err := os.Remove(current); err != nil {
		t.Fatal(err)
	}
	step("removed: anonymous, and 401 is no longer healthy", checkEvery, "", ReasonCredentialRejected, CredentialNone)

	got, err := testutil.GatherAndCount(reg, "vipd_health_checks_total")
	if err != nil || got == 0 {
		t.Fatalf("vipd_health_checks_total: %d series, %v", got, err)
	}
	if v := testutil.ToFloat64(c.metrics.checks.WithLabelValues(ReasonCredentialRejected)); v != 3 {
		t.Fatalf(`vipd_health_checks_total{result="credential_rejected"} = %v, want 3`, v)
	}
}

// TestClientCertSeparateFiles: cert and key in two files, the key written
// after the certificate; the mismatched pair in between is not used.
func TestClientCertSeparateFiles(t *testing.T) {
	ca := newTestCA(t, "cluster-ca")
	ts, lastCN := authServer(t, ca)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	clock := newFakeClock()
	c := newChecker(t, Config{URL: ts.URL + "/livez", ClientCert: certPath, ClientKey: keyPath}, nil, WithClock(clock))

	cert1, key1 := ca.issue(t, "one")
	writeAtomic(t, certPath, cert1)
	if r := c.Probe(t.Context()); r.Reason != ReasonOK || lastCN.Load().(string) != "" {
		t.Fatalf("certificate without key: reason %q, server saw %q; want anonymous ok", r.Reason, lastCN.Load())
	}
	writeAtomic(t, keyPath, key1)
	if r := c.Probe(t.Context()); r.Reason != ReasonOK || lastCN.Load().(string) != "one" {
		t.Fatalf("pair complete: reason %q, server saw %q; want ok as one", r.Reason, lastCN.Load())
	}
	cert2, key2 := ca.issue(t, "two")
	writeAtomic(t, certPath, cert2) // key not yet rotated: mismatched pair
	clock.Advance(checkEvery)
	if r := c.Probe(t.Context()); r.Reason != ReasonOK || lastCN.Load().(string) != "one" {
		t.Fatalf("mismatched pair: reason %q, server saw %q; want the previous pair", r.Reason, lastCN.Load())
	}
	writeAtomic(t, keyPath, key2)
	if r := c.Probe(t.Context()); r.Reason != ReasonOK || lastCN.Load().(string) != "two" {
		t.Fatalf("pair rotated: reason %q, server saw %q; want two (a failed read is retried every probe)", r.Reason, lastCN.Load())
	}
}

// TestCertificateWinsOverToken: with both, the probe sends the
// certificate only, and falls back to the token when it goes away.
func TestCertificateWinsOverToken(t *testing.T) {
	ca := newTestCA(t, "cluster-ca")
	var lastAuth atomic.Value
	lastAuth.Store("")
	ts, lastCN := authServer(t, ca)
	ts.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastAuth.Store(r.Header.Get("Authorization"))
		cn := ""
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		lastCN.Store(cn)
	})
	dir := t.TempDir()
	certPath, tokenPath := filepath.Join(dir, "kubelet.pem"), filepath.Join(dir, "token")
	writeToken(t, tokenPath, "tok")
	cert, key := ca.issue(t, "node")
	writeAtomic(t, certPath, append(cert, key...))
	clock := newFakeClock()
	c := newChecker(t, Config{URL: ts.URL + "/livez", ClientCert: certPath, ClientKey: certPath, TokenPath: tokenPath}, nil, WithClock(clock))
	c.record(c.Probe(t.Context()), ReadyzUnknown)
	if lastCN.Load() != "node" || lastAuth.Load() != "" || c.Status().Credential.Kind != CredentialClientCert {
		t.Fatalf("both present: server saw cert %q auth %q, status %+v; want the certificate only", lastCN.Load(), lastAuth.Load(), c.Status().Credential)
	}
	if err := os.Remove(certPath); err != nil {
		t.Fatal(err)
	}
	clock.Advance(checkEvery)
	c.record(c.Probe(t.Context()), ReadyzUnknown)
	if lastCN.Load() != "" || lastAuth.Load() != "Bearer tok" || c.Status().Credential.Kind != CredentialToken {
		t.Fatalf("certificate gone: server saw cert %q auth %q, status %+v; want the token", lastCN.Load(), lastAuth.Load(), c.Status().Credential)
	}
}

// TestCAFileAppears: before the CA bundle exists a loopback probe skips
// verification; once loaded it verifies, and a CA bundle that disappears or
// breaks afterwards never turns verification off again.
func TestCAFileAppears(t *testing.T) {
	ts := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {})
	dir := t.TempDir()
	caPath := filepath.Join(dir, "ca.crt")
	clock := newFakeClock()
	c := newChecker(t, Config{URL: ts.URL + "/livez", CAFile: caPath}, nil, WithClock(clock))
	probe := func(desc, want string, wantCA bool) {
		t.Helper()
		clock.Advance(checkEvery)
		r := c.Probe(t.Context())
		st := c.record(r, ReadyzUnknown)
		if r.Reason != want || (st.Credential.CAFile != "") != wantCA {
			t.Fatalf("%s: reason %q (err %v), CA %q; want %q, CA loaded %v", desc, r.Reason, r.Err, st.Credential.CAFile, want, wantCA)
		}
	}
	probe("no CA yet: unverified on loopback", ReasonOK, false)
	writeAtomic(t, caPath, newTestCA(t, "wrong").pem)
	probe("wrong CA appears: verified and refused", ReasonTLS, true)
	writeAtomic(t, caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}))
	probe("right CA: verified", ReasonOK, true)
	if err := os.Remove(caPath); err != nil {
		t.Fatal(err)
	}
	probe("CA removed: still verifying with the last one", ReasonOK, true)
	writeAtomic(t, caPath, []byte("garbage"))
	probe("CA garbage: still verifying with the last one", ReasonOK, true)
	writeAtomic(t, caPath, newTestCA(t, "wrong").pem)
	probe("CA replaced by a wrong one: refused", ReasonTLS, true)
}

func TestStatFile(t *testing.T) {
	dir := t.TempDir()
	a, b, link := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "current")
	writeAtomic(t, a, []byte("same"))
	writeAtomic(t, b, []byte("same"))
	relink(t, "a", link)
	ida, err := statFile(link)
	if err != nil || ida.link != "a" || ida.ino == 0 {
		t.Fatalf("statFile(link to a) = %+v, %v", ida, err)
	}
	relink(t, "b", link)
	idb, _ := statFile(link)
	if idb == ida {
		t.Fatalf("retargeted link has the same identity %+v", idb)
	}
	if _, err := statFile(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("statFile(missing) error %v, want not-exist", err)
	}
	// A regular file is identified by its own inode, like the link to it.
	if id, err := statFile(b); err != nil || id.link != "" || id.ino != idb.ino || id.size != idb.size || id.mtimeNano != idb.mtimeNano {
		t.Fatalf("statFile(b) = %+v, %v; want the identity of the link to b without a link (%+v)", id, err, idb)
	}
	// A dangling link is a missing file.
	relink(t, "gone", link)
	if _, err := statFile(link); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("statFile(dangling link) error %v, want not-exist", err)
	}
}

// TestMissingCredentialIsOnlyStatted: before bootstrap the probes look for
// the credential files, on every probe while the apiserver refuses them,
// every checkEvery while it answers; one the stat does not find is not
// opened (each system call wakes the runtime's monitor thread of an idle
// node). The files here exist, but the stat says they do not: nothing is
// read. Once the stat finds them they are read at once.
func TestMissingCredentialIsOnlyStatted(t *testing.T) {
	dir := t.TempDir()
	tokenPath, caPath := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	writeAtomic(t, tokenPath, []byte("s3cret\n"))
	writeAtomic(t, caPath, newTestCA(t, "kubernetes").pem)
	c := newCredentials(Config{TokenPath: tokenPath, CAFile: caPath}, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Unix(0, 0))
	stats := map[string]int{}
	c.stat = func(p string) (fileID, error) { stats[p]++; return fileID{}, fs.ErrNotExist }
	probes := func(from, to int, wantStats int) {
		t.Helper()
		clear(stats)
		for i := from; i < to; i++ {
			p := c.refresh(time.Unix(int64(i), 0))
			if p.token != "" || p.pool != nil || p.loaded {
				t.Fatalf("probe %d: token read %v, CA read %v, loaded %v from files the stat did not find", i, p.token != "", p.pool != nil, p.loaded)
			}
		}
		if stats[tokenPath] != wantStats || stats[caPath] != wantStats {
			t.Fatalf("probes at %d..%d s: stats %v, want %d per file", from, to-1, stats, wantStats)
		}
	}
	c.answered(http.StatusUnauthorized)
	probes(0, 3, 3) // refused: one per file and probe
	c.answered(http.StatusOK)
	probes(3, 7, 0)  // answered: the last look was at 2 s
	probes(7, 12, 1) // at 7 s, then not before 12 s
	c.stat = statFile
	p := c.refresh(time.Unix(12, 0))
	if p.token != "s3cret" || p.pool == nil || !p.loaded {
		t.Fatalf("token right %v, CA read %v, loaded %v once the files are found; want all", p.token == "s3cret", p.pool != nil, p.loaded)
	}
	if st := c.status(); st.Kind != CredentialToken || st.CAFile != caPath {
		t.Fatalf("status %+v, want the token verified with %s", st, caPath)
	}
}

// TestLoopbackVerifiesChainWithoutHostName: kubeadm's apiserver certificate
// names the node, the service IP and "kubernetes", not 127.0.0.1. On
// loopback the chain is verified against the cluster CA and the name is not
// checked; a certificate from another CA still fails.
func TestLoopbackVerifiesChainWithoutHostName(t *testing.T) {
	ca := newTestCA(t, "kubernetes")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"cp-1", "kubernetes", "kubernetes.default"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "other.crt")
	writeAtomic(t, good, ca.pem)
	writeAtomic(t, bad, newTestCA(t, "kubernetes").pem) // same name, other key
	port := ts.URL[strings.LastIndex(ts.URL, ":")+1:]
	for _, tt := range []struct {
		name, url, ca, want string
	}{
		{"127.0.0.1, cluster CA", "https://127.0.0.1:" + port + "/livez", good, ReasonOK},
		{"localhost, cluster CA", "https://localhost:" + port + "/livez", good, ReasonOK},
		{"127.0.0.1, other CA", "https://127.0.0.1:" + port + "/livez", bad, ReasonTLS},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newChecker(t, Config{URL: tt.url, CAFile: tt.ca}, nil).Probe(t.Context())
			if r.Reason != tt.want {
				t.Fatalf("Probe = %q (%v), want %q", r.Reason, r.Err, tt.want)
			}
		})
	}
}
