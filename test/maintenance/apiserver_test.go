// Package maintenance tests control-plane maintenance without an outage
// (issue 28) in network namespaces with real kube-apiservers: one etcd
// (in the lab's client namespace) and three kube-apiservers, one in each
// node namespace on 0.0.0.0:6443, behind the VIP that vipd keeps. A
// second client namespace opens a fresh TLS connection to VIP:6443 every
// 10 ms and records which apiserver answered (the CN of its serving
// certificate) and which attempts failed.
//
// The apiservers are started once for every case: a graceful restart of
// the holder's apiserver with --shutdown-delay-duration=3s (SIGTERM as the
// kubelet sends it when kubeadm swaps the static pod, restarted once it
// exited), a rolling restart of all three, and a graceful stop without a
// shutdown delay (the kube-apiserver default).
package maintenance

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// Bounds asserted on a loaded 2-core machine. With a shutdown delay no
// attempt may fail (the target; the gaps, at most 100 ms there,
// are printed, and bounded here by 700 ms); without one the gap is at
// most 1.5 s. With VIPD_HEALTH_READYZ_URL=off (only the refused-listener
// signal) one run measured 12 and 183 failed attempts and a 940 ms gap
// for the two delay cases; before this work the fail threshold cost 2.3 s.
const (
	delayGapLimit   = 700 * time.Millisecond
	noDelayGapLimit = 1500 * time.Millisecond
)

// apiLab is the lab with its etcd, apiservers and vipds.
type apiLab struct {
	*lab.Lab
	t       *testing.T
	dir     string
	apiBin  string
	etcdURL string
	vip     netip.Addr
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	apis    map[string]*lab.Proc
	vipds   map[string]*lab.Proc
	client  *lab.Host
}

func TestAPIServerRestarts(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	etcdBin, apiBin, err := kubetest.Binaries()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 3, Client: true, Extra: []string{"e"}})
	a := &apiLab{Lab: l, t: t, dir: t.TempDir(), apiBin: apiBin, vip: l.VIP4(70),
		apis: map[string]*lab.Proc{}, vipds: map[string]*lab.Proc{}, client: l.Client}
	a.writeCredentials()
	a.startEtcd(ctx, etcdBin)
	var wg sync.WaitGroup
	for _, n := range l.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.startAPIServer(n, 3*time.Second)
		}()
	}
	wg.Wait()
	for _, n := range l.Nodes {
		a.waitReady(ctx, n)
	}
	for _, n := range l.Nodes {
		p, err := n.StartVipd(bin, "VIPD_ADDRESS="+a.vip.String()+"/32", "VIPD_PEERS="+l.Peers(n))
		if err != nil {
			t.Fatal(err)
		}
		a.vipds[n.Name] = p
	}
	holder := a.waitHolder(ctx, "")
	for _, n := range l.Nodes {
		a.waitEligible(ctx, n)
	}
	t.Logf("%s holds %s", holder, a.vip)

	pr := a.startProber(10 * time.Millisecond)
	defer pr.stop()
	results := map[string]string{}

	// 1. A graceful restart of the holder's apiserver with a 3 s delay.
	t.Run("holder graceful restart, 3s shutdown delay", func(t *testing.T) {
		h := l.Node(a.waitHolder(ctx, ""))
		from := time.Now()
		a.restart(ctx, h, 3*time.Second, true)
		to := time.Now()
		gap, failed := pr.outage(from, to)
		results["restart holder (3s delay)"] = fmt.Sprintf("max gap %v, %d failed attempts", gap.Round(time.Millisecond), failed)
		if gap > delayGapLimit || failed > 0 {
			t.Errorf("gap %v (limit %v), %d failed attempts (want none)\n%s", gap, delayGapLimit, failed, pr.timeline(from, to))
		}
		if now := a.waitHolder(ctx, ""); now == h.Name {
			t.Errorf("the VIP stayed on %s through its apiserver's restart", h.Name)
		}
		if !strings.Contains(a.vipds[h.Name].Output(), "apiserver going away: handed over") {
			t.Errorf("%s did not hand over on the apiserver's shutdown:\n%s", h.Name, tail(a.vipds[h.Name].Output(), 3000))
		}
	})

	// 2. A rolling restart of all three, one after the other.
	t.Run("rolling restart of all three, 3s shutdown delay", func(t *testing.T) {
		from := time.Now()
		for _, n := range l.Nodes {
			a.restart(ctx, n, 3*time.Second, true)
			a.waitEligible(ctx, n)
		}
		to := time.Now()
		gap, failed := pr.outage(from, to)
		results["rolling restart (3s delay)"] = fmt.Sprintf("max gap %v, %d failed attempts", gap.Round(time.Millisecond), failed)
		if gap > delayGapLimit || failed > 0 {
			t.Errorf("gap %v (limit %v), %d failed attempts (want none)\n%s", gap, delayGapLimit, failed, pr.timeline(from, to))
		}
	})

	// 3. Without a shutdown delay the listener closes at once: the first
	// refused probe hands over.
	t.Run("holder graceful stop without a shutdown delay", func(t *testing.T) {
		h := l.Node(a.waitHolder(ctx, ""))
		// Its apiserver again, now without a delay; the VIP goes
		// elsewhere meanwhile and is handed back with vipd handover.
		a.restart(ctx, h, 0, false)
		a.waitEligible(ctx, h)
		if cur := a.waitHolder(ctx, ""); cur != h.Name {
			a.handover(ctx, l.Node(cur), h.Name)
			a.waitHolder(ctx, h.Name)
		}
		from := time.Now()
		a.restart(ctx, h, 0, false)
		to := time.Now()
		gap, failed := pr.outage(from, to)
		results["restart holder (no delay)"] = fmt.Sprintf("max gap %v, %d failed attempts", gap.Round(time.Millisecond), failed)
		if gap > noDelayGapLimit {
			t.Errorf("gap %v > %v\n%s", gap, noDelayGapLimit, pr.timeline(from, to))
		}
	})
	keys := make([]string, 0, len(results))
	for k := range results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%-28s %s", k, results[k])
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// writeCredentials makes a CA, a serving certificate per node (CN = the
// node's name, so a client sees who answered), the service account key
// and a token file.
func (a *apiLab) writeCredentials() {
	t := a.t
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "maintenance-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	a.ca, _ = x509.ParseCertificate(der)
	a.caKey = key
	for i, n := range a.Nodes {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		leaf := &x509.Certificate{SerialNumber: big.NewInt(int64(10 + i)), Subject: pkix.Name{CommonName: n.Name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), n.IPv4.AsSlice(), a.vip.AsSlice()}, DNSNames: []string{"localhost"}}
		ld, err := x509.CreateCertificate(rand.Reader, leaf, a.ca, &k.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		a.write(n.Name+".crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ld}))
		a.write(n.Name+".key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	a.write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)}))
	a.write("tokens.csv", []byte(kubetest.AdminToken+",admin,admin-uid,system:masters\n"))
}

func (a *apiLab) write(name string, data []byte) {
	if err := os.WriteFile(filepath.Join(a.dir, name), data, 0o600); err != nil {
		a.t.Fatal(err)
	}
}

// startEtcd runs etcd in the extra host "e", reachable from every node.
func (a *apiLab) startEtcd(ctx context.Context, bin string) {
	e := a.Extra["e"]
	a.etcdURL = "http://" + e.IPv4.String() + ":2379"
	p, err := e.Start("etcd", nil, bin,
		"--name=maint", "--data-dir="+filepath.Join(a.dir, "etcd"),
		"--listen-client-urls="+a.etcdURL, "--advertise-client-urls="+a.etcdURL,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=maint=http://127.0.0.1:2380", "--log-level=warn", "--logger=zap")
	if err != nil {
		a.t.Fatal(err)
	}
	hc := nsClient(e, nil)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(a.etcdURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) || p.Exited() {
			a.t.Fatalf("etcd not healthy: %v\n%s", err, tail(p.Output(), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startAPIServer starts kube-apiserver in n's namespace on 0.0.0.0:6443.
func (a *apiLab) startAPIServer(n *lab.Host, delay time.Duration) {
	f := func(name string) string { return filepath.Join(a.dir, name) }
	p, err := n.Start("kube-apiserver "+n.Name, nil, a.apiBin,
		"--etcd-servers="+a.etcdURL,
		"--bind-address=0.0.0.0", "--secure-port=6443",
		"--advertise-address="+n.IPv4.String(),
		"--tls-cert-file="+f(n.Name+".crt"), "--tls-private-key-file="+f(n.Name+".key"),
		"--cert-dir="+f("certs-"+n.Name),
		"--token-auth-file="+f("tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+f("sa.key"), "--service-account-signing-key-file="+f("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		fmt.Sprintf("--shutdown-delay-duration=%s", delay),
		"--v=1")
	if err != nil {
		a.t.Error(err)
		return
	}
	a.apis[n.Name] = p
}

// get sends GET url from inside n with the admin token.
func (a *apiLab) get(n *lab.Host, url string) (int, string, error) {
	hc := nsClient(n, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // lab
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+kubetest.AdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	return resp.StatusCode, string(b), nil
}

func (a *apiLab) waitReady(ctx context.Context, n *lab.Host) {
	a.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, body, err := a.get(n, "https://127.0.0.1:6443/readyz")
		if code == 200 {
			return
		}
		if p := a.apis[n.Name]; p == nil || p.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
			out := ""
			if p != nil {
				out = tail(p.Output(), 3000)
			}
			a.t.Fatalf("%s: apiserver not ready: %d %s %v\n%s", n.Name, code, body, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restart stops n's apiserver with SIGTERM, waits for it to exit, starts
// it again with the given delay and waits until it is ready. With
// checkShutdown, /readyz must have reported the shutdown while /livez
// still answered.
func (a *apiLab) restart(ctx context.Context, n *lab.Host, delay time.Duration, checkShutdown bool) {
	a.t.Helper()
	p := a.apis[n.Name]
	if err := p.Signal(syscall.SIGTERM); err != nil {
		a.t.Fatal(err)
	}
	if checkShutdown {
		seen := false
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && !seen; {
			code, body, _ := a.get(n, "https://127.0.0.1:6443/readyz")
			lcode, _, _ := a.get(n, "https://127.0.0.1:6443/livez")
			seen = code == 500 && strings.Contains(body, "[-]shutdown failed") && lcode == 200
			time.Sleep(50 * time.Millisecond)
		}
		if !seen {
			a.t.Errorf("%s: /readyz never reported [-]shutdown failed while /livez answered 200", n.Name)
		}
	}
	if _, err := p.Wait(delay + 60*time.Second); err != nil {
		a.t.Fatalf("%s: apiserver did not exit after SIGTERM: %v", n.Name, err)
	}
	a.startAPIServer(n, delay)
	a.waitReady(ctx, n)
}

// waitEligible waits until n's vipd reports its apiserver healthy and
// not draining (its metrics).
func (a *apiLab) waitEligible(ctx context.Context, n *lab.Host) {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := n.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
		if err == nil && strings.Contains(string(out), "vipd_health_up 1") && strings.Contains(string(out), "vipd_health_draining 0") {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: vipd not healthy and undrained: %v\n%s", n.Name, err, tail(a.vipds[n.Name].Output(), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitHolder waits until exactly one node holds the VIP (want, if not
// empty) and returns it.
func (a *apiLab) waitHolder(ctx context.Context, want string) string {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		hs, err := a.Holders(ctx, a.vip)
		if err == nil && len(hs) == 1 && (want == "" || hs[0] == want) {
			return hs[0]
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("holders of %s: %v %v, want one (%q)", a.vip, hs, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// handover runs `vipd handover --to to` in from's namespace.
func (a *apiLab) handover(ctx context.Context, from *lab.Host, to string) {
	a.t.Helper()
	bin, err := lab.VipdBinary(ctx, a.t.TempDir())
	if err != nil {
		a.t.Fatal(err)
	}
	out, err := from.Output(ctx, bin, "handover", "--to", to, "--state-dir", filepath.Join(os.TempDir(), "vipd-lab-"+from.NS))
	if err != nil {
		a.t.Fatalf("vipd handover --to %s on %s: %v\n%s", to, from.Name, err, out)
	}
}

// nsClient is an HTTP client whose connections are opened inside h.
func nsClient(h *lab.Host, tc *tls.Config) *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: tc, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := h.Run(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// attempt is one client connection to the VIP.
type attempt struct {
	sent time.Time
	node string // CN of the serving certificate; "" when it failed
	err  string
}

type prober struct {
	mu     sync.Mutex
	tries  []attempt
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startProber opens a fresh TLS connection to VIP:6443 from the client
// namespace every period and sends GET /version over it.
func (a *apiLab) startProber(period time.Duration) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{cancel: cancel}
	addr := net.JoinHostPort(a.vip.String(), "6443")
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			p.wg.Add(1)
			go func(sent time.Time) {
				defer p.wg.Done()
				node, err := a.try(ctx, addr)
				at := attempt{sent: sent, node: node}
				if err != nil {
					at.node, at.err = "", err.Error()
				}
				p.mu.Lock()
				p.tries = append(p.tries, at)
				p.mu.Unlock()
			}(time.Now())
		}
	}()
	a.OnClose(p.stop)
	return p
}

func (p *prober) stop() {
	p.cancel()
	p.wg.Wait()
}

// try connects once: TCP, TLS (verified against the lab CA), GET /version.
func (a *apiLab) try(ctx context.Context, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn net.Conn
	err := a.client.Run(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	pool := x509.NewCertPool()
	pool.AddCert(a.ca)
	tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: a.vip.String(), MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(tc, "GET /version HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr); err != nil {
		return "", err
	}
	b, _ := io.ReadAll(io.LimitReader(tc, 8<<10))
	if !strings.HasPrefix(string(b), "HTTP/1.1 200") {
		return "", fmt.Errorf("answer %q", tail(strings.SplitN(string(b), "\r\n", 2)[0], 80))
	}
	return tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// outage returns the longest time between two answered attempts sent in
// [from, to] (the attempts just outside count as the edges) and how many
// attempts sent in [from, to] failed.
func (p *prober) outage(from, to time.Time) (time.Duration, int) {
	time.Sleep(2100 * time.Millisecond) // the last attempts finish
	p.mu.Lock()
	tries := append([]attempt(nil), p.tries...)
	p.mu.Unlock()
	sort.Slice(tries, func(i, j int) bool { return tries[i].sent.Before(tries[j].sent) })
	var gap time.Duration
	var last time.Time
	failed := 0
	for _, at := range tries {
		in := !at.sent.Before(from) && !at.sent.After(to)
		if in && at.node == "" {
			failed++
		}
		if at.node == "" {
			continue
		}
		if !last.IsZero() && (in || at.sent.After(to)) {
			if d := at.sent.Sub(last); d > gap {
				gap = d
			}
		}
		last = at.sent
		if at.sent.After(to) {
			break
		}
	}
	return gap, failed
}

// timeline prints who answered in [from, to], one line per change.
func (p *prober) timeline(from, to time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	prev := "?"
	for _, at := range p.tries {
		if at.sent.Before(from) || at.sent.After(to) {
			continue
		}
		who := at.node
		if who == "" {
			who = "FAILED " + at.err
		}
		if who != prev {
			fmt.Fprintf(&b, "+%v %s\n", at.sent.Sub(from).Round(time.Millisecond), who)
			prev = who
		}
	}
	return b.String()
}
