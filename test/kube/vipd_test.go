// Package kube tests the real `vipd run` binary in FLIPOP-style
// controllers-only mode (VIPD_CONTROLLERS set, no VIPD_ADDRESS): vipd
// supervises its vipd-controllers child, which reconciles a FloatingIPPool
// against a real kube-apiserver + etcd and the fake DigitalOcean API. vipd
// binds no VIP in this mode, so everything runs on the host's loopback.
package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// FLIPOP's names, which vipd keeps for compatibility.
const (
	annotation = "flipop.digitalocean.com/ipv4-reserved-ip"
	leaseName  = "floating-ip-pool-controller-leader-election"
	namespace  = "flipop" // where the example pool and the RBAC live
	doToken    = "do-e2e-token"
	nodeName   = "vipd-e2e" // VIPD_NODE_NAME
)

// env is the package's apiserver, started by the first test that needs it.
var env kubetest.Env

// vipdBuild is the vipd + vipd-controllers pair, built once on first use.
var vipdBuild = lab.Build{Controllers: true}

func TestMain(m *testing.M) {
	// client-go in this test process (applying manifests) logs through klog.
	klog.SetLogger(logr.Discard())
	code := env.Main(m)
	vipdBuild.Remove()
	os.Exit(code)
}

// TestControllersOnlyMode runs `vipd run` with VIPD_CONTROLLERS=floatingippool
// and no VIP, and checks what an operator replacing FLIPOP relies on: the
// reserved IP is assigned and the node annotated, the child's flipop_*
// metrics appear on vipd's /metrics, `vipd status` answers, a crashed child
// is restarted, and SIGTERM stops vipd and its child cleanly.
func TestControllersOnlyMode(t *testing.T) {
	srv := env.Require(t)
	bin := vipdBuild.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	kc, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := install(ctx, t, srv, kc)

	fake, err := fakedo.New(fakedo.Options{Token: doToken, ActionDuration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddDomain("example.com")

	// Two nodes of the "work" pool, each running a ready ingress pod; the
	// pool assigns its one IP to the first by name.
	nodeA := kubetest.DropletNode(ctx, t, kc, fake, "e2e-node-a", 1001, "198.51.100.1")
	kubetest.DropletNode(ctx, t, kc, fake, "e2e-node-b", 1002, "198.51.100.2")
	objs, err := kubetest.ReadObjects(repoPath(t, "deploy/kube/examples/floatingippool.yaml"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("read the example pool: %v (%d objects)", err, len(objs))
	}
	pool := objs[0]
	if err := unstructured.SetNestedField(pool.Object, int64(1), "spec", "desiredIPs"); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), pool); err != nil {
		t.Fatal(err)
	}

	metricsAddr := testenv.FreeAddr(t)
	d := startVipd(t, bin,
		"VIPD_CONTROLLERS=floatingippool",
		"VIPD_KUBECONFIG="+kubeconfig,
		"VIPD_METRICS_ADDRESS="+metricsAddr,
		"VIPD_STATE_DIR="+t.TempDir(),
		"VIPD_NODE_NAME="+nodeName,
		"VIPD_DO_API_URL="+fake.URL(),
		"DIGITALOCEAN_ACCESS_TOKEN="+doToken,
	)
	firstChild := d.waitChild(ctx, 0)

	// The pool creates one reserved IP, assigns it to node a's droplet and
	// annotates node a, as FLIPOP does.
	var ip string
	eventually(ctx, t, 45*time.Second, "node annotated with the reserved IP", d, func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ip = n.Annotations[annotation]; ip == "" {
			return fmt.Errorf("no %s annotation on %s (annotations %v)", annotation, nodeA, n.Annotations)
		}
		return nil
	})
	assigns := assignActions(fake, ip, 1001)
	if assigns != 1 {
		t.Fatalf("fakedo saw %d assigns of %s to droplet 1001, want 1 (actions %+v)", assigns, ip, fake.Actions())
	}
	// The annotation is written once the assign is accepted; the action
	// then completes (300 ms in the fake).
	eventually(ctx, t, 10*time.Second, "reserved IP on droplet 1001", d, func() error {
		if holder, ok := fake.Holder(ip); !ok || holder != 1001 {
			return fmt.Errorf("%s is on droplet %d (exists %v)", ip, holder, ok)
		}
		return nil
	})

	// The pool's dnsRecordSet (hello-world.example.com) holds the IP.
	eventually(ctx, t, 15*time.Second, "A record hello-world.example.com", d, func() error {
		var got []string
		for _, r := range fake.Records("example.com") {
			if r.Type == "A" && r.Name == "hello-world" {
				got = append(got, fmt.Sprintf("%s/%d", r.Data, r.TTL))
			}
		}
		if len(got) != 1 || got[0] != ip+"/120" {
			return fmt.Errorf("A records hello-world: %v, want [%s/120]", got, ip)
		}
		return nil
	})

	// The child's metrics are merged into vipd's own /metrics.
	ipNode := regexp.MustCompile(`(?m)^flipop_floatingippoolcontroller_ip_node\{[^}]*ip="` +
		regexp.QuoteMeta(ip) + `"[^}]*node="` + regexp.QuoteMeta(nodeA) + `"[^}]*\} 1$`)
	eventually(ctx, t, 15*time.Second, "flipop metrics merged into /metrics", d, func() error {
		body, err := get(ctx, metricsAddr, "/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(body, "vipd_build_info{") {
			return fmt.Errorf("no vipd_build_info in /metrics:\n%s", body)
		}
		if !ipNode.MatchString(body) {
			return fmt.Errorf("no flipop_floatingippoolcontroller_ip_node for %s on %s in /metrics:\n%s", ip, nodeA, grepLines(body, "flipop_"))
		}
		return nil
	})

	// `vipd status` talks to the running daemon.
	out, err := exec.CommandContext(ctx, bin, "status", "--address", metricsAddr).CombinedOutput()
	if err != nil {
		t.Fatalf("vipd status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "node:") || !strings.Contains(string(out), nodeName) {
		t.Fatalf("vipd status does not name the node %s:\n%s", nodeName, out)
	}
	out, err = exec.CommandContext(ctx, bin, "status", "--json", "--address", metricsAddr).Output()
	if err != nil {
		t.Fatalf("vipd status --json: %v\n%s", err, out)
	}
	var st struct {
		Node string            `json:"node"`
		VIPs []json.RawMessage `json:"vips"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Node != nodeName || len(st.VIPs) != 0 {
		t.Fatalf("vipd status --json: node %q, %d VIPs (want %q, none), err %v:\n%s", st.Node, len(st.VIPs), nodeName, err, out)
	}

	// client-go's own logging (leader election) goes through the
	// structured logger, not raw klog lines on stderr.
	if m := klogLine.FindString(d.output()); m != "" {
		t.Errorf("raw klog output in vipd's log: %q", m)
	}

	// A crashed child is restarted; its metrics disappear from /metrics
	// while it is down or standing by, and come back once the new child
	// leads (it waits for the dead child's Lease to expire).
	if err := syscall.Kill(firstChild, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := d.waitOutput(ctx, 10*time.Second, "restarting"); err != nil {
		t.Fatal(err)
	}
	body, err := get(ctx, metricsAddr, "/metrics")
	if err != nil {
		t.Fatalf("/metrics while the child is down: %v", err)
	}
	if !strings.Contains(body, "vipd_build_info{") || ipNode.MatchString(body) {
		t.Fatalf("/metrics right after the child died: want vipd_build_info and no pool metrics:\n%s", grepLines(body, "vipd_build_info", "flipop_"))
	}
	secondChild := d.waitChild(ctx, firstChild)
	eventually(ctx, t, 45*time.Second, "flipop metrics back after the restart", d, func() error {
		body, err := get(ctx, metricsAddr, "/metrics")
		if err != nil {
			return err
		}
		if !ipNode.MatchString(body) {
			return fmt.Errorf("no pool metrics yet:\n%s", grepLines(body, "flipop_"))
		}
		return nil
	})
	if n := assignActions(fake, ip, 1001); n != assigns {
		t.Errorf("the restarted child assigned %s again (%d assigns)", ip, n)
	}

	// SIGTERM: vipd stops its child and exits 0, leaving no process and a
	// released Lease (the next instance, or FLIPOP, takes over at once).
	children := d.children()
	if len(children) != 1 || children[0] != secondChild {
		t.Fatalf("vipd's vipd-controllers children: %v, want [%d]", children, secondChild)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, err := d.wait(10 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("vipd after SIGTERM: exit %d, %v\n%s", code, err, d.output())
	}
	t.Logf("vipd stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	for _, pid := range []int{firstChild, secondChild} {
		if isControllers(pid) {
			t.Errorf("vipd-controllers pid %d still runs after vipd exited", pid)
		}
	}
	lease, err := kc.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Lease %s/%s: %v", namespace, leaseName, err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after a clean stop", *h)
	}
}

// TestConfigErrorsExit2: settings the controllers cannot work with stop
// `vipd run` with exit 2 (configuration error) instead of a restart loop.
func TestConfigErrorsExit2(t *testing.T) {
	testenv.Short(t)
	bin := vipdBuild.Path(t)
	for _, tc := range []struct {
		name string
		env  []string
		// oneLine: the whole output is one line (vipd rejects it itself).
		oneLine bool
		want    []string
	}{
		{
			name:    "unknown controller",
			env:     []string{"VIPD_CONTROLLERS=floatingippool,flipop", "DIGITALOCEAN_ACCESS_TOKEN=" + doToken},
			oneLine: true,
			want:    []string{"VIPD_CONTROLLERS", `"flipop"`},
		},
		{
			// Rejected by the child, which vipd then does not restart.
			name: "no provider token",
			env:  []string{"VIPD_CONTROLLERS=floatingippool", "VIPD_KUBECONFIG=" + unreachableKubeconfig(t)},
			// vipd itself rejects it before starting the child.
			want:    []string{`vipd: invalid DIGITALOCEAN_ACCESS_TOKEN=""`, "CLOUDFLARE_API_TOKEN"},
			oneLine: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "run")
			cmd.Env = append(append(baseEnv(),
				"VIPD_METRICS_ADDRESS="+testenv.FreeAddr(t),
				"VIPD_STATE_DIR="+t.TempDir(),
				"VIPD_NODE_NAME="+nodeName,
			), tc.env...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("vipd run: %v, want exit 2\n%s", err, out)
			}
			text := strings.TrimSpace(string(out))
			if lines := strings.Count(text, "\n") + 1; tc.oneLine && lines != 1 {
				t.Errorf("want one line, got %d:\n%s", lines, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output does not mention %s:\n%s", w, out)
				}
			}
			if strings.Contains(text, "restarting") {
				t.Errorf("vipd restarted the controllers on a configuration error:\n%s", out)
			}
		})
	}
}

// unreachableKubeconfig writes a valid kubeconfig for a server that does
// not exist (the controllers must fail before they need it).
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- {name: c, cluster: {server: "https://127.0.0.1:1"}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: c, context: {cluster: c, user: u}}
current-context: c
`
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// install applies the shipped CRDs and RBAC, binds them to the
// RBAC-restricted test user, and returns a kubeconfig for that user whose
// context namespace is flipop (the Lease namespace, as in a pod there).
func install(ctx context.Context, t *testing.T, srv *kubetest.Server, kc kubernetes.Interface) string {
	t.Helper()
	for _, ns := range []string{namespace, "ingress"} {
		_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	objs, err := kubetest.ReadObjects(
		repoPath(t, "deploy/kube/crds/floatingippool.yaml"),
		repoPath(t, "deploy/kube/crds/nodednsrecordset.yaml"),
		repoPath(t, "deploy/kube/rbac.yaml"),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubetest.User}}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-e2e-user"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "vipd-controllers"},
		Subjects:   user,
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-e2e-user", Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "vipd-controllers-leader-election"},
		Subjects:   user,
	}
	if _, err := kc.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	path, err := srv.WriteKubeconfig(t.TempDir(), kubetest.KubeconfigOptions{User: true, Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// assignActions counts the fake's assign actions of ip to droplet.
func assignActions(fake *fakedo.Server, ip string, droplet int) int {
	n := 0
	for _, a := range fake.Actions() {
		if a.Type == "assign_ip" && a.IP == ip && a.DropletID == droplet {
			n++
		}
	}
	return n
}

// klogLine matches klog's own header ("I1122 01:02:03.456789   123 file.go:1]").
var klogLine = regexp.MustCompile(`(?m)^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ \S+:\d+\] .*$`)

// vipd is a running `vipd run`.
type vipd struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	seen map[int]bool // vipd-controllers pids seen, killed at cleanup
	mu   sync.Mutex
}

// baseEnv is the test's environment without vipd settings, provider
// tokens or a kubeconfig of the host.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "VIPD_") || k == "DIGITALOCEAN_ACCESS_TOKEN" || k == "CLOUDFLARE_API_TOKEN" || k == "CLOUDFLARE_TOKEN" || k == "KUBECONFIG" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func startVipd(t *testing.T, bin string, env ...string) *vipd {
	t.Helper()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(baseEnv(), env...)
	d := &vipd{t: t, cmd: cmd, out: &testenv.Buffer{}, done: make(chan struct{}), seen: map[int]bool{}}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	// Own process group (the child inherits it) so cleanup reaches both;
	// and die with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start vipd: %v", err)
	}
	go func() { _ = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		if !d.exited() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			select {
			case <-d.done:
			case <-time.After(10 * time.Second):
				t.Errorf("vipd pid %d did not die after SIGKILL", cmd.Process.Pid)
			}
		}
		d.mu.Lock()
		for pid := range d.seen {
			if isControllers(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		d.mu.Unlock()
		if t.Failed() || os.Getenv("VIPD_TEST_LOGS") != "" {
			t.Logf("vipd output:\n%s", d.output())
		}
	})
	return d
}

func (d *vipd) output() string { return d.out.String() }

func (d *vipd) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// wait returns the exit code, or an error if vipd still runs after timeout.
func (d *vipd) wait(timeout time.Duration) (int, error) {
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("vipd still running after %v", timeout)
	}
}

// children returns the pids of vipd's vipd-controllers children, from
// /proc/<pid>/task/*/children.
func (d *vipd) children() []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", d.cmd.Process.Pid))
	var out []int
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(field)
			if err == nil && isControllers(pid) {
				out = append(out, pid)
			}
		}
	}
	d.mu.Lock()
	for _, pid := range out {
		d.seen[pid] = true
	}
	d.mu.Unlock()
	return out
}

// waitChild waits until vipd runs a vipd-controllers child other than not.
func (d *vipd) waitChild(ctx context.Context, not int) int {
	d.t.Helper()
	var pid int
	eventually(ctx, d.t, 15*time.Second, "vipd-controllers child running", d, func() error {
		for _, c := range d.children() {
			if c != not {
				pid = c
				return nil
			}
		}
		return fmt.Errorf("no vipd-controllers child of vipd (pid %d) besides %d", d.cmd.Process.Pid, not)
	})
	return pid
}

// waitOutput waits until vipd's output contains substr.
func (d *vipd) waitOutput(ctx context.Context, timeout time.Duration, substr string) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(d.output(), substr) {
		if d.exited() {
			return fmt.Errorf("vipd exited before logging %q", substr)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("vipd did not log %q within %v", substr, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// isControllers reports whether pid is a live vipd-controllers process.
func isControllers(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv0, _, _ := bytes.Cut(b, []byte{0})
	if filepath.Base(string(argv0)) != "vipd-controllers" {
		return false
	}
	// A zombie (exited, not yet reaped) has an empty cmdline, so reaching
	// here means it runs; check the state anyway.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := bytes.Cut(stat, []byte(") "))
	return len(rest) > 0 && rest[0] != 'Z' && rest[0] != 'X'
}

// eventually polls f until it returns nil; it fails the test at the
// timeout or when vipd has exited.
func eventually(ctx context.Context, t *testing.T, timeout time.Duration, what string, d *vipd, f func() error) {
	t.Helper()
	testenv.Eventually(ctx, t, timeout, what, func() error {
		err := f()
		if err != nil && d.exited() {
			return testenv.Stop(fmt.Errorf("vipd exited (%v); last error: %w", d.cmd.ProcessState, err))
		}
		return err
	})
}

func get(ctx context.Context, addr, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return string(b), nil
}

// grepLines keeps the lines of s that start with one of the prefixes.
func grepLines(s string, prefixes ...string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				b.WriteString(line + "\n")
				break
			}
		}
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}
