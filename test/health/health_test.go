// Package health tests vipd's apiserver health probe against a real
// kube-apiserver and etcd with anonymous authentication off
// (--anonymous-auth=false, as CIS-hardened clusters run it) and a client CA
// made by the test: the first-node case (401 while no credential exists),
// the switch to a kubelet-style client certificate or a token, etcd dying
// behind an apiserver that keeps answering, certificate rotation and
// rejected credentials. vipd runs in l2 mode in a lab namespace; the VIP is
// checked in the node's kernel and reached from a client namespace.
//
// kube-apiserver listens on the host's loopback; a TCP relay inside the node
// namespace (0.0.0.0:6443) hands every connection to it unchanged, so vipd
// probes https://127.0.0.1:6443/livez as on a control-plane node and the
// client reaches the real apiserver through the VIP.
package health

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// Detection bound for vipd's default health settings (interval 1 s,
// timeout 3 s, fail threshold 3): three failed probes, each at most the
// timeout, plus the release itself and slack for a loaded CI machine.
const releaseBound = 3*(3*time.Second) + 3*time.Second

var (
	env kubetest.Env
	// clientCA signs the certificates the apiserver trusts; its file is
	// --client-ca-file, which kube-apiserver re-reads when it changes.
	clientCA     *certAuthority
	clientCAFile string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vipd-health-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	clientCA, err = newCA("kubetest-client-ca")
	if err == nil {
		clientCAFile = filepath.Join(dir, "client-ca.crt")
		err = os.WriteFile(clientCAFile, clientCA.pem, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env.Options = kubetest.Options{ExtraArgs: []string{"--anonymous-auth=false", "--client-ca-file=" + clientCAFile}}
	code := env.Main(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// certAuthority issues kubelet-style client certificates.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(name string) (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &certAuthority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// kubeletPEM returns what kubelet keeps in kubelet-client-current.pem: the
// node's client certificate followed by its key, valid for validity.
func (ca *certAuthority) kubeletPEM(t *testing.T, node string, validity time.Duration) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity).Truncate(time.Second),
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
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
}

// writeAtomic replaces path through a rename, as kubelet and kubeadm do.
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
// kubelet-client-current.pem after a rotation.
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

// relay accepts TCP connections on listen inside h's namespace and copies
// each, byte for byte, to target on the host's loopback. It stops, closing
// every connection, when the test ends.
func relay(t *testing.T, h *lab.Host, listen, target string) {
	t.Helper()
	ln, err := h.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				up, err := net.DialTimeout("tcp", target, 2*time.Second)
				if err != nil {
					_ = down.Close()
					return
				}
				if !track(down) || !track(up) {
					_ = down.Close()
					_ = up.Close()
					return
				}
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					_ = dst.Close()
					_ = src.Close()
					done <- struct{}{}
				}
				go pipe(up, down)
				go pipe(down, up)
				<-done
				<-done
				mu.Lock()
				if conns != nil {
					delete(conns, up)
					delete(conns, down)
				}
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
}

// rig is one lab node running vipd next to the real apiserver, and a
// client namespace.
type rig struct {
	t    *testing.T
	srv  *kubetest.Server
	l    *lab.Lab
	node *lab.Host
	vip  netip.Addr
	mon  *lab.Monitor
	bin  string
	dir  string // credential files
	vipd *lab.Proc
}

func newRig(t *testing.T) *rig {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 1, Client: true})
	r := &rig{t: t, srv: srv, l: l, node: l.Nodes[0], vip: l.VIP4(1), bin: bin, dir: t.TempDir()}
	relay(t, r.node, "0.0.0.0:6443", strings.TrimPrefix(srv.URL, "https://"))
	if r.mon, err = l.Monitor(r.vip); err != nil {
		t.Fatal(err)
	}
	// A test that fails leaves etcd running for the next one.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.StartEtcd(ctx); err != nil && !strings.Contains(err.Error(), "already running") {
			t.Errorf("restart etcd: %v", err)
		}
	})
	return r
}

func (r *rig) path(name string) string { return filepath.Join(r.dir, name) }

// start runs vipd with the lab defaults, the VIP, the relayed health URL
// and env.
func (r *rig) start(env ...string) {
	r.t.Helper()
	base := []string{
		"VIPD_ADDRESS=" + r.vip.String() + "/32",
		"VIPD_HEALTH_URL=https://127.0.0.1:6443/livez",
		// Nothing of the host's own /etc/kubernetes or /var/lib/kubelet.
		"VIPD_HEALTH_CA_FILE=" + r.path("ca.crt"),
		"VIPD_HEALTH_CLIENT_CERT=" + r.path("kubelet-client-current.pem"),
		"VIPD_HEALTH_CLIENT_KEY=" + r.path("kubelet-client-current.pem"),
		"VIPD_SA_TOKEN_PATH=" + r.path("token"),
	}
	p, err := r.node.StartVipd(r.bin, append(base, env...)...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.vipd = p
	r.t.Cleanup(func() {
		if r.t.Failed() {
			r.t.Logf("vipd output:\n%s\nVIP timeline:\n%s\napiserver and etcd:\n%s", p.Output(), r.mon, r.srv.LogTail(3000))
		}
	})
}

// nsClient is an HTTP client whose connections are made inside h's
// namespace.
func nsClient(h *lab.Host, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := h.Run(func() error {
					var err error
					c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
			// The serving certificate names 127.0.0.1, not the VIP.
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // reachability only
			DisableKeepAlives: true,
		},
	}
}

// vipdStatus is the part of vipd's /status the test reads.
type vipdStatus struct {
	Health struct {
		Healthy    bool   `json:"healthy"`
		Reason     string `json:"reason"`
		Code       int    `json:"code"`
		Error      string `json:"error"`
		Credential struct {
			Kind     string     `json:"kind"`
			Path     string     `json:"path"`
			Subject  string     `json:"subject"`
			NotAfter *time.Time `json:"not_after"`
			Since    time.Time  `json:"since"`
			Loaded   bool       `json:"loaded"`
			CAFile   string     `json:"ca_file"`
		} `json:"credential"`
	} `json:"health"`
}

func (r *rig) status(ctx context.Context) (vipdStatus, error) {
	var s vipdStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9469/status", nil)
	if err != nil {
		return s, err
	}
	resp, err := nsClient(r.node, 2*time.Second).Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitStatus polls /status until ok accepts it.
func (r *rig) waitStatus(ctx context.Context, what string, ok func(vipdStatus) bool) vipdStatus {
	r.t.Helper()
	var last vipdStatus
	var lastErr error
	for {
		s, err := r.status(ctx)
		if err == nil && ok(s) {
			return s
		}
		last, lastErr = s, err
		select {
		case <-ctx.Done():
			r.t.Fatalf("waiting for %s: %v; last status %+v (err %v)", what, ctx.Err(), last.Health, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checksTotal reads vipd_health_checks_total{result=reason}.
func (r *rig) checksTotal(ctx context.Context, reason string) int {
	r.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9469/metrics", nil)
	resp, err := nsClient(r.node, 2*time.Second).Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^vipd_health_checks_total\{result="` + regexp.QuoteMeta(reason) + `"\} (\d+)$`).FindSubmatch(body)
	if m == nil {
		r.t.Fatalf("no vipd_health_checks_total{result=%q} in /metrics", reason)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// waitHeld waits until the VIP is bound on the node (present) or not.
func (r *rig) waitHeld(ctx context.Context, present bool) time.Time {
	r.t.Helper()
	if err := r.node.WaitAddr(ctx, r.vip, present); err != nil {
		r.t.Fatalf("%v\nVIP timeline:\n%s", err, r.mon)
	}
	at := time.Now()
	// The monitor (sampling every 10 ms) may lag behind the kernel on a
	// loaded machine: later gap checks read its timeline, so wait for it.
	for (len(r.mon.Now()) == 1) != present {
		if ctx.Err() != nil {
			r.t.Fatalf("the monitor never saw the VIP held=%v\nVIP timeline:\n%s", present, r.mon)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return at
}

// changeAfter returns when the monitor (sampling every 10 ms) first saw
// the VIP held (or not) at or after from. The caller has seen the change
// in the kernel already; the monitor may lag a little on a loaded machine.
func (r *rig) changeAfter(from time.Time, held bool) time.Time {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, s := range r.mon.Samples() {
			if (len(s.Holders) == 1) == held && !s.At.Before(from) {
				return s.At
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the monitor never saw the VIP held=%v after %v:\n%s", held, from, r.mon)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// neverReleased fails when the VIP was unbound at any time since from.
func (r *rig) neverReleased(from time.Time, what string) {
	r.t.Helper()
	if gap := r.mon.Longest(from, time.Now(), func(n int) bool { return n == 0 }); gap > 0 {
		r.t.Fatalf("%s: VIP released for %v\n%s", what, gap, r.mon)
	}
}

// reachable checks from the client namespace that the VIP answers as the
// real apiserver (an authenticated 200 on /livez) and was resolved by ARP
// to the node's MAC.
func (r *rig) reachable(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(r.vip.String(), "6443")+"/livez", nil)
	req.Header.Set("Authorization", "Bearer "+kubetest.AdminToken)
	resp, err := nsClient(r.l.Client, 2*time.Second).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusInternalServerError {
		return fmt.Errorf("GET /livez through the VIP: HTTP %d", resp.StatusCode)
	}
	mac, err := r.l.Client.Neigh(ctx, r.vip)
	if err != nil {
		return err
	}
	if mac != r.node.MAC.String() {
		return fmt.Errorf("client resolved %s to %q, want the node's %s", r.vip, mac, r.node.MAC)
	}
	return nil
}

// unreachable checks from the client namespace that nothing answers on
// the VIP any more (the client's ARP entry is flushed first).
func (r *rig) unreachable(ctx context.Context) error {
	if _, err := r.l.Client.Output(ctx, "ip", "neigh", "flush", "to", r.vip.String()); err != nil {
		return err
	}
	c := nsClient(r.l.Client, time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(r.vip.String(), "6443")+"/livez", nil)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		return fmt.Errorf("the VIP still answers (HTTP %d)", resp.StatusCode)
	}
	return nil
}

// etcdOutage kills etcd while vipd holds the VIP with an authenticated
// probe, checks that the VIP is released within the detection bound, then
// restarts etcd and checks that it is held again. It returns the release
// and re-acquire times.
func (r *rig) etcdOutage(ctx context.Context) (release, reacquire time.Duration) {
	r.t.Helper()
	killed := time.Now()
	r.srv.KillEtcd()
	r.waitHeld(ctx, false)
	gone := r.changeAfter(killed, false)
	release = gone.Sub(killed)
	s, err := r.status(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	if s.Health.Healthy || s.Health.Reason == "ok" {
		r.t.Fatalf("VIP released but health is %+v", s.Health)
	}
	r.t.Logf("etcd killed: VIP released after %v (last probe: %s, %s)", release.Round(time.Millisecond), s.Health.Reason, s.Health.Error)
	if release > releaseBound {
		r.t.Errorf("VIP released %v after etcd died, want within %v", release, releaseBound)
	}
	if err := r.unreachable(ctx); err != nil {
		r.t.Error(err)
	}

	restarted := time.Now()
	if err := r.srv.StartEtcd(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.waitHeld(ctx, true)
	reacquire = r.changeAfter(restarted, true).Sub(restarted)
	r.t.Logf("etcd restarted: VIP held again after %v", reacquire.Round(time.Millisecond))
	if err := r.reachable(ctx); err != nil {
		r.t.Error(err)
	}
	return release, reacquire
}

// TestClientCertificate is the systemd case on a hardened cluster: no
// credential at first (the first node), then the kubelet's client
// certificate appears and is rotated, etcd dies, and the certificate is
// rejected.
func TestClientCertificate(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	current := r.path("kubelet-client-current.pem")

	// First node: no certificate, no token, no CA file yet. The apiserver
	// answers every anonymous request with 401, which is healthy now.
	r.start()
	r.waitHeld(ctx, true)
	s := r.waitStatus(ctx, "an anonymous healthy probe", func(s vipdStatus) bool { return s.Health.Healthy && s.Health.Code == 401 })
	if c := s.Health.Credential; c.Kind != "none" || c.Loaded || c.CAFile != "" {
		t.Fatalf("before bootstrap: credential %+v, want none, not loaded, server not verified", c)
	}
	if err := r.reachable(ctx); err != nil {
		t.Fatal(err)
	}

	// kubeadm writes the cluster CA and kubelet's TLS bootstrap writes its
	// client certificate: the next probe uses both, and the VIP stays.
	switched := time.Now()
	writeAtomic(t, r.path("ca.crt"), r.srv.CAData)
	first := r.path("kubelet-client-2026-01-01-00-00-00.pem")
	writeAtomic(t, first, clientCA.kubeletPEM(t, r.node.Name, 24*time.Hour))
	relink(t, first, current)
	s = r.waitStatus(ctx, "the probe to use the kubelet certificate", func(s vipdStatus) bool {
		return s.Health.Credential.Kind == "client-certificate" && s.Health.Code == 200
	})
	if c := s.Health.Credential; c.Path != current || c.Subject != "CN=system:node:"+r.node.Name+",O=system:nodes" ||
		!c.Loaded || c.CAFile != r.path("ca.crt") || c.Since.Before(switched.Add(-time.Second)) {
		t.Fatalf("after the certificate appeared: credential %+v", c)
	}
	took := s.Health.Credential.Since.Sub(switched)
	t.Logf("kubelet certificate used %v after it appeared", took.Round(time.Millisecond))
	// `vipd status` says which credential and since when.
	out, err := r.node.Output(ctx, r.bin, "status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "credential:") || !strings.Contains(string(out), "client-certificate "+current) {
		t.Fatalf("vipd status does not name the credential:\n%s", out)
	}
	time.Sleep(2 * time.Second) // a few authenticated probes
	r.neverReleased(switched, "switch to the client certificate")
	if err := r.reachable(ctx); err != nil {
		t.Fatal(err)
	}

	// etcd dies: the apiserver keeps answering, but the authenticated
	// /livez fails, and the VIP goes.
	release, reacquire := r.etcdOutage(ctx)
	t.Logf("RESULT client certificate: release after etcd died %v, held again %v after etcd restarted", release.Round(time.Millisecond), reacquire.Round(time.Millisecond))

	// Rotation, file replaced (the link becomes a file with a new
	// certificate): used without a restart, the VIP stays.
	s, _ = r.status(ctx)
	before := s.Health.Credential
	rotated := time.Now()
	writeAtomic(t, current, clientCA.kubeletPEM(t, r.node.Name, 48*time.Hour))
	s = r.waitStatus(ctx, "the rotated certificate", func(s vipdStatus) bool {
		c := s.Health.Credential
		return c.Since.After(before.Since) && c.NotAfter != nil && !c.NotAfter.Equal(*before.NotAfter) && s.Health.Code == 200
	})
	t.Logf("rotated certificate used %v after the file was replaced", s.Health.Credential.Since.Sub(rotated).Round(time.Millisecond))
	time.Sleep(1500 * time.Millisecond)
	r.neverReleased(rotated, "certificate rotation")
	if r.vipd.Exited() {
		t.Fatal("vipd exited during the rotation")
	}

	// A certificate from another CA: rejected, reason credential_rejected,
	// VIP released.
	otherCA, err := newCA("some-other-ca")
	if err != nil {
		t.Fatal(err)
	}
	rejectedBefore := r.checksTotal(ctx, "credential_rejected")
	replaced := time.Now()
	writeAtomic(t, current, otherCA.kubeletPEM(t, r.node.Name, 24*time.Hour))
	r.waitHeld(ctx, false)
	s = r.waitStatus(ctx, "credential_rejected", func(s vipdStatus) bool { return !s.Health.Healthy && s.Health.Reason == "credential_rejected" })
	if s.Health.Code != 401 || !strings.Contains(s.Health.Error, "credential rejected") {
		t.Fatalf("other CA: health %+v, want 401 credential rejected", s.Health)
	}
	if n := r.checksTotal(ctx, "credential_rejected"); n < rejectedBefore+3 {
		t.Fatalf(`vipd_health_checks_total{result="credential_rejected"} = %d, want at least %d`, n, rejectedBefore+3)
	}
	t.Logf("certificate from another CA: VIP released %v after the file was replaced", r.changeAfter(replaced, false).Sub(replaced).Round(time.Millisecond))
	if err := r.unreachable(ctx); err != nil {
		t.Fatal(err)
	}

	// A good certificate again, then revoked by the cluster: the
	// apiserver's client CA no longer trusts it (CA rotation), which
	// kube-apiserver picks up from its --client-ca-file without a restart.
	writeAtomic(t, current, clientCA.kubeletPEM(t, r.node.Name, 24*time.Hour))
	r.waitHeld(ctx, true)
	t.Cleanup(func() { _ = os.WriteFile(clientCAFile, clientCA.pem, 0o600) })
	revoked := time.Now()
	writeAtomic(t, clientCAFile, otherCA.pem)
	r.waitHeld(ctx, false)
	s = r.waitStatus(ctx, "credential_rejected after revocation", func(s vipdStatus) bool { return s.Health.Reason == "credential_rejected" })
	t.Logf("certificate revoked (client CA replaced on the apiserver): VIP released %v later", r.changeAfter(revoked, false).Sub(revoked).Round(time.Millisecond))
	writeAtomic(t, clientCAFile, clientCA.pem)
	r.waitHeld(ctx, true)
	if err := r.reachable(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestToken is the same with a bearer token file, as before client
// certificates: 401 is healthy until the token appears, then only 200.
func TestToken(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	writeAtomic(t, r.path("ca.crt"), r.srv.CAData)
	tokenPath := r.path("token")
	r.start("VIPD_HEALTH_CLIENT_CERT=", "VIPD_HEALTH_CLIENT_KEY=")

	r.waitHeld(ctx, true)
	s := r.waitStatus(ctx, "an anonymous healthy probe", func(s vipdStatus) bool { return s.Health.Healthy && s.Health.Code == 401 })
	if c := s.Health.Credential; c.Kind != "none" || c.Loaded || c.CAFile != r.path("ca.crt") {
		t.Fatalf("before the token: credential %+v, want none, not loaded, server verified", c)
	}

	appeared := time.Now()
	writeAtomic(t, tokenPath, []byte(kubetest.UserToken+"\n"))
	s = r.waitStatus(ctx, "the probe to use the token", func(s vipdStatus) bool {
		return s.Health.Credential.Kind == "token" && s.Health.Code == 200
	})
	if c := s.Health.Credential; c.Path != tokenPath || !c.Loaded || c.Subject != "" {
		t.Fatalf("after the token appeared: credential %+v", c)
	}
	time.Sleep(2 * time.Second)
	r.neverReleased(appeared, "switch to the token")
	if err := r.reachable(ctx); err != nil {
		t.Fatal(err)
	}

	release, reacquire := r.etcdOutage(ctx)
	t.Logf("RESULT token: release after etcd died %v, held again %v after etcd restarted", release.Round(time.Millisecond), reacquire.Round(time.Millisecond))

	// Rotated: another valid token, used without a restart.
	s, _ = r.status(ctx)
	before := s.Health.Credential.Since
	rotated := time.Now()
	writeAtomic(t, tokenPath, []byte(kubetest.AdminToken))
	r.waitStatus(ctx, "the rotated token", func(s vipdStatus) bool {
		return s.Health.Credential.Since.After(before) && s.Health.Code == 200
	})
	time.Sleep(1500 * time.Millisecond)
	r.neverReleased(rotated, "token rotation")

	// Rejected: a token the apiserver does not know.
	writeAtomic(t, tokenPath, []byte("not-a-token-this-apiserver-knows"))
	r.waitHeld(ctx, false)
	s = r.waitStatus(ctx, "credential_rejected", func(s vipdStatus) bool { return s.Health.Reason == "credential_rejected" })
	if strings.Contains(s.Health.Error, "not-a-token") {
		t.Fatalf("/status shows the token: %q", s.Health.Error)
	}
	if err := r.unreachable(ctx); err != nil {
		t.Fatal(err)
	}

	// Removed: still not healthy, an anonymous 401 no longer counts once a
	// credential was loaded.
	if err := os.Remove(tokenPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	s = r.waitStatus(ctx, "anonymous after the token", func(s vipdStatus) bool { return s.Health.Credential.Kind == "none" })
	time.Sleep(1500 * time.Millisecond)
	if s, _ = r.status(ctx); s.Health.Healthy || s.Health.Reason != "credential_rejected" || !s.Health.Credential.Loaded {
		t.Fatalf("token removed: health %+v, want unhealthy credential_rejected", s.Health)
	}
	if held, _ := r.node.HasAddr(ctx, r.vip); held {
		t.Fatal("VIP bound with an anonymous probe after a credential was loaded")
	}
}
