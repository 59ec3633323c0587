// Package kubetest runs a real kube-apiserver backed by a real etcd for
// integration tests of the controllers/ packages.
//
// etcd comes from the system (Debian's etcd-server: /usr/bin/etcd); the
// kube-apiserver binary is built once from the Go module proxy by
// hack/k8s-binaries.sh (make kube-apiserver) and cached under .cache/ at the
// repository root.
// KUBE_APISERVER and ETCD override the paths.
//
// A test package shares one server through TestMain:
//
//	var env kubetest.Env
//
//	func TestMain(m *testing.M) { os.Exit(env.Main(m)) }
//
//	func TestX(t *testing.T) {
//		srv := env.Require(t) // skips locally, fails with CI=true, when missing
//		...
//	}
package kubetest

import (
	"bytes"
	"cmp"
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
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vipd/vipd/internal/testenv"
)

// KubeVersion is the kube-apiserver version hack/k8s-binaries.sh builds (the
// Makefile's KUBE_VERSION; test/helm checks both).
const KubeVersion = "v1.34.4"

// Tokens accepted by the server (static token file).
const (
	// AdminToken authenticates as user "admin" in group system:masters.
	AdminToken = "kubetest-admin-token"
	// UserToken authenticates as User (no groups besides system:authenticated),
	// so tests can check that a ClusterRole grants enough.
	UserToken = "kubetest-user-token"
	// User is the name UserToken authenticates as.
	User = "vipd-controller"
)

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	// URL is the apiserver's https address on 127.0.0.1.
	URL string
	// CAData is the PEM certificate the apiserver serves (self-signed).
	CAData []byte

	dir       string
	etcd      *proc
	apiserver *proc
	logs      []string
	etcdBin   string
	etcdArgs  []string
	etcdURL   string // etcd's client URL
	// spawnc runs process starts on one locked OS thread (see spawner).
	spawnc   chan func()
	stopOnce sync.Once
}

// spawner starts the child processes from one OS thread that lives until
// Stop. Children get SIGKILL when the thread that forked them exits
// (Pdeathsig), and Go ends a thread whose goroutine exits while locked to
// it (as the lab's namespace helpers do): a child forked from an arbitrary
// thread, such as etcd restarted by a test, could die at random.
func (s *Server) spawner() {
	runtime.LockOSThread()
	for f := range s.spawnc {
		f()
	}
}

// proc is a child process reaped by its own goroutine.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Config returns a client config authenticated as the cluster admin.
func (s *Server) Config() *rest.Config { return s.configFor(AdminToken) }

// UserConfig returns a client config authenticated as User, which only has
// the permissions the test grants it through RBAC.
func (s *Server) UserConfig() *rest.Config { return s.configFor(UserToken) }

func (s *Server) configFor(token string) *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), s.CAData...)},
		QPS:             200,
		Burst:           400,
	}
}

// Kubeconfig writes a kubeconfig file for the given identity into dir and
// returns its path. admin selects AdminToken, otherwise UserToken.
func (s *Server) Kubeconfig(dir string, admin bool) (string, error) {
	return s.WriteKubeconfig(dir, KubeconfigOptions{User: !admin, Namespace: "default"})
}

// KubeconfigOptions shape a kubeconfig; the zero value is the admin at
// s.URL, with no namespace in its context.
type KubeconfigOptions struct {
	// Server is where the client reaches the apiserver (default s.URL; a
	// relay's https://127.0.0.1:port in a network namespace).
	Server string
	// User authenticates as User (UserToken) instead of the admin.
	User bool
	// As and AsGroups impersonate another identity (see ServiceAccount).
	As       string
	AsGroups []string
	// Namespace is the context's namespace; empty names none, which is not
	// the same for every client: vipd's controllers then choose their own
	// Lease namespace.
	Namespace string
}

// ServiceAccount are options that authenticate as the admin and
// impersonate the ServiceAccount ns/name with the groups a pod's token
// carries, so that every request is authorized by the RBAC bound to that
// ServiceAccount only; the context's namespace is ns.
func ServiceAccount(ns, name string) KubeconfigOptions {
	return KubeconfigOptions{
		As:        "system:serviceaccount:" + ns + ":" + name,
		AsGroups:  []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		Namespace: ns,
	}
}

// WriteKubeconfig writes a kubeconfig file (and the CA it names) into dir
// and returns its path.
func (s *Server) WriteKubeconfig(dir string, o KubeconfigOptions) (string, error) {
	caPath := filepath.Join(dir, "kubetest-ca.crt")
	if err := os.WriteFile(caPath, s.CAData, 0o600); err != nil {
		return "", fmt.Errorf("write CA: %w", err)
	}
	token := AdminToken
	if o.User {
		token = UserToken
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cmp.Or(o.Server, s.URL), CertificateAuthority: caPath}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: token, Impersonate: o.As, ImpersonateGroups: o.AsGroups}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest", Namespace: o.Namespace}
	cfg.CurrentContext = "kubetest"
	p := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return p, nil
}

// Stop kills both processes and removes the temporary directory.
func (s *Server) Stop() {
	for _, p := range []*proc{s.apiserver, s.etcd} {
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	if s.spawnc != nil {
		s.stopOnce.Do(func() { close(s.spawnc) })
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// LogTail returns the last n bytes of each process log, for failure messages.
func (s *Server) LogTail(n int) string {
	var b strings.Builder
	for _, p := range s.logs {
		data, _ := os.ReadFile(p)
		if len(data) > n {
			data = data[len(data)-n:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", filepath.Base(p), data)
	}
	return b.String()
}

// Binaries locates etcd and kube-apiserver, or explains what is missing and
// how to get it.
func Binaries() (etcd, apiserver string, err error) {
	etcd = os.Getenv("ETCD")
	if etcd == "" {
		etcd = "/usr/bin/etcd"
		if p, lerr := exec.LookPath("etcd"); lerr == nil {
			etcd = p
		}
	}
	if _, serr := os.Stat(etcd); serr != nil {
		return "", "", fmt.Errorf("etcd not found at %s (apt-get install etcd-server, or set ETCD)", etcd)
	}
	apiserver = os.Getenv("KUBE_APISERVER")
	if apiserver == "" {
		root, rerr := repoRoot()
		if rerr != nil {
			return "", "", rerr
		}
		apiserver = filepath.Join(root, ".cache", "kube-apiserver-"+KubeVersion)
	}
	if _, serr := os.Stat(apiserver); serr != nil {
		return "", "", fmt.Errorf("kube-apiserver not found at %s (run make kube-apiserver, or set KUBE_APISERVER)", apiserver)
	}
	return etcd, apiserver, nil
}

// repoRoot finds the module root from this source file's location, falling
// back to walking up from the working directory to go.mod.
func repoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot() (string, error) { return repoRoot() }

// Options adjust the apiserver a test starts; the zero value is what Start
// uses.
type Options struct {
	// ExtraArgs are appended to kube-apiserver's command line, for example
	// --anonymous-auth=false or --client-ca-file=PATH (which kube-apiserver
	// re-reads when the file changes).
	ExtraArgs []string
}

// Start launches etcd and kube-apiserver on loopback ports and waits until
// the apiserver reports /readyz.
func Start(ctx context.Context) (*Server, error) { return StartWith(ctx, Options{}) }

// StartWith is Start with options.
func StartWith(ctx context.Context, opts Options) (*Server, error) {
	etcdBin, apiBin, err := Binaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	s := &Server{dir: dir, spawnc: make(chan func())}
	go s.spawner()
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	s.etcdBin, s.etcdURL = etcdBin, clientURL
	s.etcdArgs = []string{
		"--name=kubetest",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubetest=" + peerURL,
		"--log-level=warn",
		"--logger=zap",
	}
	if err := s.StartEtcd(ctx); err != nil {
		return nil, err
	}

	if err := s.writeCredentials(); err != nil {
		return nil, err
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	s.apiserver, err = s.spawn("kube-apiserver.log", apiBin, append([]string{
		"--etcd-servers=" + clientURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "serving.key"),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		// No kube-controller-manager runs, so nothing creates default
		// service accounts; pods would be refused by this plugin.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}, opts.ExtraArgs...)...)
	if err != nil {
		return nil, err
	}
	tlsCfg := &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}
	tlsCfg.RootCAs.AppendCertsFromPEM(s.CAData)
	if err := waitHTTP(ctx, s, s.URL+"/readyz", tlsCfg, 90*time.Second); err != nil {
		return nil, fmt.Errorf("kube-apiserver did not become ready: %w\n%s", err, s.LogTail(4000))
	}
	ok = true
	return s, nil
}

// KillEtcd kills etcd (SIGKILL), as a crash would, and waits for it to
// exit. The apiserver keeps running.
func (s *Server) KillEtcd() {
	if s.etcd == nil || s.etcd.exited() {
		return
	}
	_ = s.etcd.cmd.Process.Kill()
	<-s.etcd.done
}

// StartEtcd starts etcd (again, after KillEtcd) on the same ports and data
// and waits until it reports healthy.
func (s *Server) StartEtcd(ctx context.Context) error {
	if s.etcd != nil && !s.etcd.exited() {
		return errors.New("etcd is already running")
	}
	var err error
	if s.etcd, err = s.spawn("etcd.log", s.etcdBin, s.etcdArgs...); err != nil {
		return err
	}
	if err := waitHTTP(ctx, s, s.etcdURL+"/health", nil, 30*time.Second); err != nil {
		return fmt.Errorf("etcd did not become healthy: %w\n%s", err, s.LogTail(2000))
	}
	return nil
}

func (s *Server) spawn(logName, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(s.dir, logName)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", logPath, err)
	}
	defer f.Close()
	if !slices.Contains(s.logs, logPath) {
		s.logs = append(s.logs, logPath)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	// Own process group, and die with the test binary if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	errc := make(chan error, 1)
	s.spawnc <- func() { errc <- cmd.Start() }
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{name: filepath.Base(bin), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (s *Server) writeCredentials() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubetest-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	s.CAData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal serving key: %w", err)
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	files := map[string][]byte{
		"serving.crt": s.CAData,
		"serving.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"tokens.csv": []byte(AdminToken + ",admin,admin-uid,system:masters\n" +
			UserToken + "," + User + "," + User + "-uid\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

func waitHTTP(ctx context.Context, s *Server, url string, tlsCfg *tls.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer client.CloseIdleConnections()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+AdminToken)
		resp, err := client.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(body.String()))
		} else {
			last = err
		}
		for _, p := range []*proc{s.etcd, s.apiserver} {
			if p != nil && p.exited() {
				return fmt.Errorf("%s exited early (last error: %v)", p.name, last)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Env shares one Server between the tests of a package. Use it from
// TestMain (see the package documentation). The server is started by the
// first Require, so tests that do not need it do not pay for it.
type Env struct {
	// Options are used to start the server; set them before the first
	// Require.
	Options Options

	once sync.Once
	srv  *Server
	err  error
	main bool
}

// Main runs the tests and stops the server if one was started.
func (e *Env) Main(m *testing.M) int {
	e.main = true
	code := m.Run()
	if e.srv != nil {
		e.srv.Stop()
	}
	return code
}

// Require returns the shared server, starting it on first use. When the
// binaries are missing it skips the test (fails with CI=true); when the
// server fails to start it fails the test. With -short (outside CI) it
// skips: these are integration tests.
func (e *Env) Require(t testing.TB) *Server {
	t.Helper()
	testenv.Short(t)
	if !e.main {
		t.Fatal("kubetest.Env used without Env.Main in TestMain")
	}
	if _, _, err := Binaries(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	e.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		e.srv, e.err = StartWith(ctx, e.Options)
		if e.err != nil {
			e.err = fmt.Errorf("start kube-apiserver: %w", e.err)
		}
	})
	if e.err != nil {
		t.Fatalf("%v", e.err)
	}
	return e.srv
}
