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
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// Bounds asserted on a loaded 2-core machine. With a shutdown delay every
// attempt must find an apiserver (outcome.check; the gaps, at most 100 ms
// in the target, are printed, and bounded here by 1 s as every
// planned handover in test/l2 is: 86-481 ms measured under load);
// without one the gap is at most 1.5 s. With VIPD_HEALTH_READYZ_URL=off
// (only the refused-listener signal) one run measured 12 and 183 failed
// attempts and a 940 ms gap for the two delay cases; before this work the
// fail threshold cost 2.3 s.
const (
	delayGapLimit   = time.Second // test/l2's handoverGapLimit: a planned handover on a loaded machine
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
	mu      sync.Mutex // apis: apiservers start in parallel
	apis    map[string]*lab.Proc
	delays  map[string]time.Duration // each apiserver's --shutdown-delay-duration
	vipds   map[string]*lab.Proc
	client  *lab.Host
	// startVipd (re)starts n's vipd with the lab's settings.
	startVipd func(n *lab.Host)
}

func TestAPIServerRestarts(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "curl", "nft")
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
		apis: map[string]*lab.Proc{}, delays: map[string]time.Duration{}, vipds: map[string]*lab.Proc{}, client: l.Client}
	a.writeCredentials()
	a.startEtcd(ctx, etcdBin)
	// The apiservers of the nodes, and one in "e" that is never restarted:
	// the kubeconfig of vipd-controllers points there. A watch on an
	// apiserver that shuts down keeps it from exiting for up to its
	// request timeout (60 s), as kubelet's and every controller's do on a
	// real control-plane node.
	var wg sync.WaitGroup
	for _, n := range append([]*lab.Host{l.Extra["e"]}, l.Nodes...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.startAPIServer(n, 3*time.Second)
		}()
	}
	wg.Wait()
	for _, n := range append([]*lab.Host{l.Extra["e"]}, l.Nodes...) {
		a.waitReady(ctx, n)
	}
	// Every node's Node object, for the cordon case: vipd-controllers
	// (VIPD_CONTROLLERS=cordon: only the cordon watch) watches its own.
	kc := a.kubeClient(l.Extra["e"].IPv4)
	for _, n := range l.Nodes {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := a.writeKubeconfig(l.Extra["e"].IPv4)
	// The lease election explicitly: these cases must run the same
	// before and after it became the default.
	a.startVipd = func(n *lab.Host) {
		p, err := n.StartVipd(bin, "VIPD_ELECTION=lease", "VIPD_ADDRESS="+a.vip.String()+"/32", "VIPD_PEERS="+l.Peers(n),
			"VIPD_CONTROLLERS=cordon", "VIPD_KUBECONFIG="+kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		a.vipds[n.Name] = p
	}
	for _, n := range l.Nodes {
		a.startVipd(n)
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
		defer a.sub(t)()
		h := l.Node(a.waitHolder(ctx, ""))
		from := time.Now()
		a.restart(ctx, h, 3*time.Second, true)
		to := time.Now()
		o := pr.outage(from, to)
		results["restart holder (3s delay)"] = o.String()
		o.check(t, delayGapLimit, pr.timeline(from, to))
		if now := a.waitHolder(ctx, ""); now == h.Name {
			t.Errorf("the VIP stayed on %s through its apiserver's restart", h.Name)
		}
		if !strings.Contains(a.vipds[h.Name].Output(), "apiserver going away: handed over") {
			t.Errorf("%s did not hand over on the apiserver's shutdown:\n%s", h.Name, tail(a.vipds[h.Name].Output(), 3000))
		}
	})

	// 2. A rolling restart of all three, one after the other.
	t.Run("rolling restart of all three, 3s shutdown delay", func(t *testing.T) {
		defer a.sub(t)()
		from := time.Now()
		for _, n := range l.Nodes {
			a.restart(ctx, n, 3*time.Second, true)
			a.waitEligible(ctx, n)
		}
		to := time.Now()
		o := pr.outage(from, to)
		results["rolling restart (3s delay)"] = o.String()
		o.check(t, delayGapLimit, pr.timeline(from, to))
	})

	// 3. Without a shutdown delay the listener closes at once: the first
	// refused probe hands over.
	t.Run("holder graceful stop without a shutdown delay", func(t *testing.T) {
		defer a.sub(t)()
		h := l.Node(a.waitHolder(ctx, ""))
		// Its apiserver again, now without a delay; the VIP goes
		// elsewhere meanwhile and is handed back with vipd handover.
		a.restart(ctx, h, 0, false)
		a.waitEligible(ctx, h)
		// The lease election's leader hears that h is healthy again with
		// h's answer to its next renewal (every 200 ms); a vipd handover
		// to h before that is refused ("no eligible node") and waits out
		// its timeout.
		time.Sleep(500 * time.Millisecond)
		if cur := a.waitHolder(ctx, ""); cur != h.Name {
			a.handover(ctx, l.Node(cur), h.Name)
			a.waitHolder(ctx, h.Name)
		}
		mark := len(a.vipds[h.Name].Output())
		from := time.Now()
		a.restart(ctx, h, 0, false)
		to := time.Now()
		o := pr.outage(from, to)
		results["restart holder (no delay)"] = o.String()
		t.Logf("without a delay:\n%s", pr.timeline(from, to))
		if o.gap > noDelayGapLimit {
			t.Errorf("%v; want a gap of at most %v\n%s", o, noDelayGapLimit, pr.timeline(from, to))
		}
		// Mostly the refused port starts the drain; a probe that falls
		// into the moment between SIGTERM and the listener's close sees
		// /readyz report the shutdown first (CI saw it once). Either is
		// the drain this case is about; the fail threshold is not.
		since := a.vipds[h.Name].Output()[mark:]
		switch reason := drainReason(since); reason {
		case "apiserver_refused":
		case "apiserver_shutdown":
			t.Logf("%s drained on /readyz's shutdown before its port closed", h.Name)
		default:
			t.Errorf("%s did not drain when its apiserver stopped:\n%s", h.Name, tail(since, 3000))
		}
	})
	// 4. kubectl cordon (or drain) of the holder's Node moves the VIP
	// first, by a planned handover the node's vipd-controllers asks for.
	t.Run("cordon of the holder's Node", func(t *testing.T) {
		defer a.sub(t)()
		h := a.waitHolder(ctx, "")
		from := time.Now()
		patch := func(p string) {
			if _, err := kc.CoreV1().Nodes().Patch(ctx, h, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		patch(`{"spec":{"unschedulable":true}}`)
		deadline := time.Now().Add(20 * time.Second)
		for {
			hs, err := a.Holders(ctx, a.vip)
			if err == nil && len(hs) == 1 && hs[0] != h {
				t.Logf("cordon of %s: %s holds the VIP %v later", h, hs[0], time.Since(from).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the VIP did not leave cordoned %s: holders %v %v\n%s", h, hs, err, tail(a.vipds[h].Output(), 4000))
			}
			time.Sleep(20 * time.Millisecond)
		}
		to := time.Now()
		o := pr.outage(from, to)
		results["cordon of the holder"] = o.String()
		o.check(t, delayGapLimit, pr.timeline(from, to))
		if !strings.Contains(a.vipds[h].Output(), "cordoned: asked vipd for a handover") {
			t.Errorf("%s's vipd-controllers did not log the handover it asked for", h)
		}
		patch(`{"spec":{"unschedulable":null}}`)
	})
	// 5. Planned handovers, make-before-break: twenty in a row,
	// alternating a graceful stop of the holder's vipd (SIGTERM, then it
	// starts again) and vipd handover. No attempt may go unanswered; every
	// stopped vipd leaves nothing of its own in the kernel.
	t.Run("20 planned handovers (SIGTERM and vipd handover)", func(t *testing.T) {
		defer a.sub(t)()
		from := time.Now()
		var stoppedLogs strings.Builder // the logs of the vipds stopped here
		for i := 0; i < 20; i++ {
			h := l.Node(a.waitHolder(ctx, ""))
			t.Logf("+%v (%s): move %d from %s (%s)", time.Since(from).Round(time.Millisecond), time.Now().UTC().Format("15:04:05.000"), i, h.Name, map[bool]string{true: "SIGTERM", false: "vipd handover"}[i%2 == 0])
			if i%2 == 0 {
				p := a.vipds[h.Name]
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if code, err := p.Wait(20 * time.Second); err != nil || code != 0 {
					t.Fatalf("%s: vipd after SIGTERM: exit %d, %v\n%s", h.Name, code, err, tail(p.Output(), 3000))
				}
				a.checkClean(ctx, h)
				stoppedLogs.WriteString(p.Output())

				a.waitOther(ctx, h.Name)
				a.startVipd(h)
				a.waitEligible(ctx, h)
				for _, n := range l.Nodes {
					a.waitVoters(ctx, n, 3)
				}
			} else {
				next := ""
				for _, n := range l.Nodes {
					if n.Name != h.Name && next == "" {
						next = n.Name
					}
				}
				a.handover(ctx, h, next)
				a.waitHolder(ctx, next)
			}
		}
		to := time.Now()
		o := pr.outage(from, to)
		results["20 planned handovers"] = o.String()
		o.check(t, delayGapLimit, pr.timeline(from, to))
		t.Logf("timeline:\n%s", pr.timeline(from, to))
		if t.Failed() {
			t.Logf("stopped vipds:\n%s", tail(stoppedLogs.String(), 20000))
		}
		var overlaps []string
		logs := []string{stoppedLogs.String()}
		for _, n := range l.Nodes {
			logs = append(logs, a.vipds[n.Name].Output())
		}
		for _, log := range logs {
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, "planned transfer: released after the overlap") {
					overlaps = append(overlaps, line[strings.Index(line, "address="):])
				}
			}
		}
		t.Logf("%d make-before-break overlaps logged:\n%s", len(overlaps), strings.Join(overlaps, "\n"))
		if len(overlaps) == 0 {
			t.Errorf("no make-before-break overlap logged")
		}
	})
	// keepalived with a /livez track script on the same lab, for the
	// comparison the closing note wants (opt-in: about 40 s more).
	if os.Getenv("VIPD_COMPARE_KEEPALIVED") != "" {
		t.Run("keepalived with a /livez track script", func(t *testing.T) {
			defer a.sub(t)()
			a.compareKeepalived(ctx, pr, results)
		})
	}
	keys := make([]string, 0, len(results))
	for k := range results {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%-28s %s", k, results[k])
	}
}

// sub makes the lab's helpers fail t (a subtest) until the returned
// function restores the parent.
func (a *apiLab) sub(t *testing.T) func() {
	parent := a.t
	a.t = t
	return func() { a.t = parent }
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
	for i, n := range append([]*lab.Host{a.Extra["e"]}, a.Nodes...) {
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
	a.mu.Lock()
	a.apis[n.Name] = p
	a.delays[n.Name] = delay
	a.mu.Unlock()
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

// kubeClient is an admin client that reaches addr's apiserver from the
// client namespace.
func (a *apiLab) kubeClient(addr netip.Addr) kubernetes.Interface {
	a.t.Helper()
	rc := &rest.Config{Host: "https://" + net.JoinHostPort(addr.String(), "6443"), BearerToken: kubetest.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, Timeout: 10 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := a.client.Run(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		a.t.Fatal(err)
	}
	return kc
}

// writeKubeconfig writes the kubeconfig vipd-controllers uses on every
// node: the apiserver at addr, the admin token.
func (a *apiLab) writeKubeconfig(addr netip.Addr) string {
	kc := `apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://` + net.JoinHostPort(addr.String(), "6443") + `
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: ` + kubetest.AdminToken + `
contexts:
- name: lab
  context: {cluster: lab, user: admin, namespace: default}
current-context: lab
`
	a.write("kubeconfig", []byte(kc))
	return filepath.Join(a.dir, "kubeconfig")
}

func (a *apiLab) waitReady(ctx context.Context, n *lab.Host) {
	a.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, body, err := a.get(n, "https://127.0.0.1:6443/readyz")
		if code == 200 {
			return
		}
		a.mu.Lock()
		p := a.apis[n.Name]
		a.mu.Unlock()
		if p == nil || p.Exited() || time.Now().After(deadline) || ctx.Err() != nil {
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
			var logs strings.Builder
			for _, n := range a.Nodes {
				if p := a.vipds[n.Name]; p != nil {
					fmt.Fprintf(&logs, "--- vipd %s:\n%s\n", n.Name, tail(p.Output(), 2500))
				}
			}
			a.t.Fatalf("holders of %s: %v %v, want one (%q)\n%s", a.vip, hs, err, want, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitVoters waits until n's vipd counts want voters and no learner in
// the lease election (a restarted node rejoins as a learner first).
func (a *apiLab) waitVoters(ctx context.Context, n *lab.Host, want int) {
	a.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := n.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
		if err == nil && strings.Contains(string(out), fmt.Sprintf(`vipd_cluster_members{state="voters"} %d`, want)) &&
			strings.Contains(string(out), `vipd_cluster_members{state="learners"} 0`) {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not %d voters: %v\n%s", n.Name, want, err, tail(a.vipds[n.Name].Output(), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitOther waits until one node other than not holds the VIP.
func (a *apiLab) waitOther(ctx context.Context, not string) {
	a.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		hs, err := a.Holders(ctx, a.vip)
		if err == nil && len(hs) == 1 && hs[0] != not {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("no holder other than %s: %v %v", not, hs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkClean asserts that a stopped vipd left nothing of its own in n's
// kernel: not the VIP, no nftables table or ip rule of vipd's.
func (a *apiLab) checkClean(ctx context.Context, n *lab.Host) {
	a.t.Helper()
	if has, err := n.HasAddr(ctx, a.vip); err != nil || has {
		a.t.Errorf("%s: the VIP is still bound after vipd stopped (%v)", n.Name, err)
	}
	if out, err := n.Output(ctx, "nft", "list", "tables"); err != nil || strings.Contains(string(out), "vipd") {
		a.t.Errorf("%s: nftables after vipd stopped: %s %v", n.Name, out, err)
	}
	if out, err := n.Output(ctx, "ip", "rule", "show"); err != nil || strings.Contains(string(out), "7950") {
		a.t.Errorf("%s: ip rules after vipd stopped: %s %v", n.Name, out, err)
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
		var logs strings.Builder
		for _, n := range a.Nodes {
			var lines []string
			for _, line := range strings.Split(a.vipds[n.Name].Output(), "\n") {
				if !strings.Contains(line, "level=DEBUG") {
					lines = append(lines, line)
				}
			}
			fmt.Fprintf(&logs, "--- vipd %s:\n%s\n", n.Name, tail(strings.Join(lines, "\n"), 4000))
		}
		a.t.Fatalf("vipd handover --to %s on %s: %v\n%s\n%s", to, from.Name, err, out, logs.String())
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
	// cut: the connection was established, then failed (the VIP moved
	// under it, or the server closed it); otherwise nobody answered.
	cut bool
	rtt time.Duration
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
				node, cut, err := a.try(ctx, addr)
				at := attempt{sent: sent, node: node, rtt: time.Since(sent)}
				if err != nil {
					at.node, at.err, at.cut = "", err.Error(), cut
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
// cut tells a failure after the TCP connection was established.
func (a *apiLab) try(ctx context.Context, addr string) (node string, cut bool, err error) {
	node, err = a.try1(ctx, addr, &cut)
	return node, cut, err
}

func (a *apiLab) try1(ctx context.Context, addr string, cut *bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn net.Conn
	err := a.client.Run(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		*cut = establishedThenReset(err)
		return "", err
	}
	*cut = true
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

// establishedThenReset tells a dial error of a connection that was
// established and then reset before the dialer looked at it: Linux
// reports a reset in SYN_SENT as ECONNREFUSED (tcp_reset) and
// ECONNRESET only in a later state, so "connect: connection reset by
// peer" is a connection the old holder accepted (SYN-ACK) whose ACK the
// move rerouted to the new holder, which reset it. That is a connection
// cut in flight, like a reset during the TLS handshake, not an attempt
// that nobody answered. One CI run counted it as unanswered.
func establishedThenReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}

// outcome is what the client saw in a window.
type outcome struct {
	gap     time.Duration // longest time between two answered attempts
	refused int           // attempts nobody answered (refused, timed out)
	cut     int           // attempts cut after their connection was established
	slow    int           // answered attempts that took over 900 ms (a SYN retransmit)
	moves   int           // changes of the answering apiserver
}

func (o outcome) String() string {
	return fmt.Sprintf("max gap %v, %d attempts unanswered, %d cut in flight, %d slow, %d moves",
		o.gap.Round(time.Millisecond), o.refused, o.cut, o.slow, o.moves)
}

// check asserts what a planned move must cost: no attempt that nobody
// answered (refused or timed out before a connection was established)
// and a bounded gap. Connections in flight at the move are cut (counted
// and printed, not asserted): one a client opened to the old holder is
// rerouted by the move to the new holder, which resets it. Their number
// depends on how long a connection takes on the loaded machine; until
// make-before-break transfers (issue 28, Build 2) let the old holder keep
// answering for the VIP through the move, that is what a move costs, as
// it does when keepalived moves a VIP. Attempts that took a SYN
// retransmit (over 900 ms) are printed too.
func (o outcome) check(t *testing.T, gapLimit time.Duration, timeline string) {
	t.Helper()
	if o.gap > gapLimit || o.refused > 0 {
		t.Errorf("%v; want a gap of at most %v and no unanswered attempt\n%s", o, gapLimit, timeline)
	}
}

// outage returns what the client saw for attempts sent in [from, to]
// (the answered attempts just outside count as the gap's edges).
func (p *prober) outage(from, to time.Time) outcome {
	time.Sleep(2100 * time.Millisecond) // the last attempts finish
	p.mu.Lock()
	tries := append([]attempt(nil), p.tries...)
	p.mu.Unlock()
	sort.Slice(tries, func(i, j int) bool { return tries[i].sent.Before(tries[j].sent) })
	var o outcome
	var last time.Time
	lastNode := ""
	for _, at := range tries {
		in := !at.sent.Before(from) && !at.sent.After(to)
		switch {
		case in && at.node == "" && at.cut:
			o.cut++
		case in && at.node == "":
			o.refused++
		case in && at.rtt > 900*time.Millisecond:
			o.slow++
		}
		if at.node == "" {
			continue
		}
		if !last.IsZero() && (in || at.sent.After(to)) {
			if d := at.sent.Sub(last); d > o.gap {
				o.gap = d
			}
			if at.node != lastNode {
				o.moves++
			}
		}
		last, lastNode = at.sent, at.node
		if at.sent.After(to) {
			break
		}
	}
	return o
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
		} else if at.rtt > 900*time.Millisecond {
			who += fmt.Sprintf(" (slow: %v)", at.rtt.Round(time.Millisecond))
		}
		if who != prev {
			fmt.Fprintf(&b, "+%v %s\n", at.sent.Sub(from).Round(time.Millisecond), who)
			prev = who
		}
	}
	return b.String()
}

// compareKeepalived stops every vipd, runs keepalived (VRRPv3, no
// preemption, the VIP on eth0, a track script that fetches the local
// /livez every second and fails after three misses: what operators run
// today) on the nodes, and measures the same restarts.
func (a *apiLab) compareKeepalived(ctx context.Context, pr *prober, results map[string]string) {
	t := a.t
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		testenv.Missing(t, "keepalived (apt-get install keepalived)")
	}
	for _, n := range a.Nodes {
		if p := a.vipds[n.Name]; !p.Exited() {
			_ = p.Signal(syscall.SIGTERM)
			_, _ = p.Wait(10 * time.Second)
		}
	}
	for _, n := range a.Nodes {
		if a.delays[n.Name] != 3*time.Second {
			a.restart(ctx, n, 3*time.Second, false)
		}
	}
	for _, n := range a.Nodes {
		dir := filepath.Join(a.dir, "keepalived-"+n.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf(`global_defs {
    router_id %s
    vrrp_version 3
    script_user root
    enable_script_security
    vrrp_garp_master_delay 5
}
vrrp_script chk_apiserver {
    script "/usr/bin/curl -sfk -o /dev/null --max-time 1 https://127.0.0.1:6443/livez"
    interval 1
    timeout 1
    rise 1
    fall 3
}
vrrp_instance VI_1 {
    state BACKUP
    nopreempt
    interface %s
    virtual_router_id 70
    priority 100
    advert_int 1
    virtual_ipaddress {
        %s/32 dev %s
    }
    track_script {
        chk_apiserver
    }
}
`, n.Name, n.Link, a.vip, n.Link)
		path := filepath.Join(dir, "keepalived.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Start("keepalived "+n.Name, nil, bin, "--dont-fork", "--log-console", "--no-syslog", "--vrrp", "--dont-respawn",
			"--use-file", path, "--pid", filepath.Join(dir, "keepalived.pid"), "--vrrp_pid", filepath.Join(dir, "vrrp.pid")); err != nil {
			t.Fatal(err)
		}
	}
	h := a.Node(a.waitHolder(ctx, ""))
	time.Sleep(2 * time.Second) // settled: the other two are BACKUP
	from := time.Now()
	a.restart(ctx, h, 3*time.Second, false)
	time.Sleep(4 * time.Second) // the track script's rise
	results["keepalived: restart holder (3s delay)"] = pr.outage(from, time.Now()).String()
	from = time.Now()
	for _, n := range a.Nodes {
		a.restart(ctx, n, 3*time.Second, false)
		time.Sleep(4 * time.Second)
	}
	results["keepalived: rolling restart (3s delay)"] = pr.outage(from, time.Now()).String()
}

// TestEstablishedThenReset: the prober's line between an attempt nobody
// answered and one cut in flight. A refused port (a reset to the SYN,
// from the kernel on loopback) and a timeout stay unanswered; a reset
// after the handshake is a cut.
func TestEstablishedThenReset(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, refused := net.Dial("tcp", closed)
	if !errors.Is(refused, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v, want ECONNREFUSED", refused)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, canceled := (&net.Dialer{}).DialContext(ctx, "tcp", closed)
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", refused, false},
		{"canceled", canceled, false},
		{"timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{"reset after the handshake", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNRESET)}, true},
	} {
		if got := establishedThenReset(c.err); got != c.want {
			t.Errorf("%s (%v): establishedThenReset = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// drainReason is the reason of the first "handed over" drain line in a
// vipd's log, "" without one.
func drainReason(log string) string {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `msg="apiserver going away: handed over"`) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if r, ok := strings.CutPrefix(f, "reason="); ok {
				return r
			}
		}
	}
	return ""
}

func TestDrainReason(t *testing.T) {
	for _, c := range []struct{ log, want string }{
		{`time=2026-12-02T03:25:44.653Z level=INFO msg="apiserver going away: handed over" node=n1 reason=apiserver_refused vip=10.0.0.1 to=n3`, "apiserver_refused"},
		{"x\ntime=t level=INFO msg=\"apiserver going away: handed over\" node=n1 reason=apiserver_shutdown vip=v\n", "apiserver_shutdown"},
		{`time=t level=WARN msg="apiserver going away: no handover, retrying after the next probe" node=n1 reason=apiserver_refused`, ""},
		{"", ""},
	} {
		if got := drainReason(c.log); got != c.want {
			t.Errorf("drainReason(%q) = %q, want %q", c.log, got, c.want)
		}
	}
}
