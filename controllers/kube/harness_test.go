package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vipd/vipd/internal/fakecf"
	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
)

var env kubetest.Env

func TestMain(m *testing.M) {
	// client-go logs through klog (leader election, reflectors); the
	// controllers' own logs are captured per test.
	klog.SetLogger(logr.Discard())
	os.Exit(env.Main(m))
}

const (
	doToken = "do-test-token"
	cfToken = "cf-test-token"
	// caseLabel isolates each test's nodes on the shared apiserver.
	caseLabel = "vipd.test/case"
	workLabel = "doks.digitalocean.com/node-pool"
)

// harness is one test's view of the shared apiserver plus its own fakes.
type harness struct {
	t    testing.TB
	ctx  context.Context
	srv  *kubetest.Server
	kc   kubernetes.Interface
	dyn  dynamic.Interface
	ns   string // test namespace: pools, record sets and pods
	id   string // value of caseLabel on this test's nodes
	do   *fakedo.Server
	cf   *fakecf.Server
	cfZ  string // Cloudflare zone ID of example.com
	logs *testenv.Buffer
}

func repoPath(t testing.TB, rel string) string {
	t.Helper()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	testenv.Short(t)
	srv := env.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(id) > 40 {
		id = id[:40]
	}
	id = strings.Trim(id, "-") + "-" + hex.EncodeToString(b)
	h := &harness{t: t, ctx: ctx, srv: srv, ns: id, id: id, logs: &testenv.Buffer{}}
	var err error
	if h.kc, err = kubernetes.NewForConfig(srv.Config()); err != nil {
		t.Fatal(err)
	}
	if h.dyn, err = dynamic.NewForConfig(srv.Config()); err != nil {
		t.Fatal(err)
	}
	h.installOnce()
	if _, err := h.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = h.kc.CoreV1().Nodes().DeleteCollection(bg, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: caseLabel + "=" + h.id})
		_ = h.kc.CoreV1().Namespaces().Delete(bg, h.ns, metav1.DeleteOptions{})
	})
	h.do, err = fakedo.New(fakedo.Options{Token: doToken, ActionDuration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.do.Close)
	h.do.AddDomain("example.com")
	h.cf = fakecf.New(cfToken)
	t.Cleanup(h.cf.Close)
	h.cfZ = h.cf.AddZone("example.com")
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("VIPD_TEST_LOGS") != "" {
			t.Logf("controller logs:\n%s", h.logs.String())
		}
	})
	return h
}

// installOnce applies the project's CRDs and RBAC (idempotent) and binds
// the RBAC ClusterRole and leader-election Role to the test user the
// controllers run as.
func (h *harness) installOnce() {
	t := h.t
	ctx, cancel := context.WithTimeout(h.ctx, time.Minute)
	defer cancel()
	for _, ns := range []string{"flipop", "shop"} { // shop: the EgressPolicy example's namespace
		_, err := h.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	objs, err := kubetest.ReadObjects(
		repoPath(t, "deploy/kube/crds/floatingippool.yaml"),
		repoPath(t, "deploy/kube/crds/nodednsrecordset.yaml"),
		repoPath(t, "deploy/kube/crds/ippool.yaml"),
		repoPath(t, "deploy/kube/crds/ipallocation.yaml"),
		repoPath(t, "deploy/kube/crds/egresspolicy.yaml"),
		repoPath(t, "deploy/kube/rbac.yaml"),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, h.srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubetest.User}}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-test-user"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "vipd-controllers"},
		Subjects:   user,
	}
	if _, err := h.kc.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-test-user", Namespace: "flipop"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "vipd-controllers-leader-election"},
		Subjects:   user,
	}
	if _, err := h.kc.RbacV1().RoleBindings("flipop").Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// controller is one running Run call.
type controller struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, set before done is closed
	reg    *prometheus.Registry
	id     string
}

func (c *controller) stop(t testing.TB) {
	t.Helper()
	c.cancel()
	select {
	case <-c.done:
		if c.err != nil {
			t.Errorf("controller %s returned %v", c.id, c.err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("controller %s did not stop within 20s", c.id)
	}
}

// start runs kube.Run as the RBAC-restricted test user.
func (h *harness) start(identity string, controllers ...string) *controller {
	h.t.Helper()
	return h.startWith(identity, func(c *Config) {
		if len(controllers) > 0 {
			c.Controllers = controllers
		}
	})
}

// startWith is start with a chance to edit the configuration.
func (h *harness) startWith(identity string, edit func(*Config)) *controller {
	h.t.Helper()
	controllers := []string{ControllerFloatingIPPool, ControllerNodeDNSRecordSet}
	ctx, cancel := context.WithCancel(h.ctx)
	c := &controller{cancel: cancel, done: make(chan struct{}), reg: prometheus.NewPedanticRegistry(), id: identity}
	cfg := Config{
		RESTConfig:       h.srv.UserConfig(),
		Controllers:      controllers,
		Namespace:        h.ns,
		DOToken:          doToken,
		DOAPIURL:         h.do.URL(),
		CloudflareToken:  cfToken,
		CloudflareAPIURL: h.cf.URL(),
		LeaseNamespace:   "flipop",
		LeaseName:        "lease-" + h.id,
		Identity:         identity,
		LeaseDuration:    4 * time.Second,
		RenewDeadline:    3 * time.Second,
		RetryPeriod:      300 * time.Millisecond,
		DNSDebounce:      200 * time.Millisecond,
		DNSMaxDelay:      2 * time.Second,
		ProviderTimeout:  5 * time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("instance", identity)
	go func() { c.err = Run(ctx, cfg, log, c.reg); close(c.done) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
		}
	})
	return c
}

// node creates a Ready node for droplet id with the test's labels and the
// "work" pool label, and registers the droplet with the DO fake.
func (h *harness) node(name string, droplet int, external string) string {
	h.t.Helper()
	return h.nodeIn(name, droplet, external, "")
}

// nodeIn is node with a bench/group label (when group is not empty).
func (h *harness) nodeIn(name string, droplet int, external, group string) string {
	h.t.Helper()
	full := h.id + "-" + name
	labels := map[string]string{caseLabel: h.id, workLabel: "work"}
	if group != "" {
		labels["bench/group"] = group
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: full, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: fmt.Sprintf("digitalocean://%d", droplet)},
	}
	if _, err := h.kc.CoreV1().Nodes().Create(h.ctx, n, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.do.AddDroplet(fakedo.Droplet{ID: droplet, Name: full, PublicIPv4: external})
	h.updateNodeStatus(full, func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		n.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeExternalIP, Address: external},
			{Type: corev1.NodeInternalIP, Address: "10.0.0." + fmt.Sprint(droplet%250)},
			{Type: corev1.NodeExternalIP, Address: "2001:db8::" + fmt.Sprint(droplet)},
		}
	})
	// The TaintNodesByCondition admission plugin gives new nodes the
	// not-ready taint; the node lifecycle controller (not running here)
	// removes it once the node is Ready. Do its job.
	h.updateNode(full, func(n *corev1.Node) { n.Spec.Taints = nil })
	return full
}

func (h *harness) updateNodeStatus(name string, f func(*corev1.Node)) {
	h.t.Helper()
	for i := 0; ; i++ {
		n, err := h.kc.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		f(n)
		_, err = h.kc.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			h.t.Fatal(err)
		}
	}
}

func (h *harness) updateNode(name string, f func(*corev1.Node)) {
	h.t.Helper()
	for i := 0; ; i++ {
		n, err := h.kc.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		f(n)
		_, err = h.kc.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			h.t.Fatal(err)
		}
	}
}

func (h *harness) setNodeReady(name string, ready bool) {
	h.t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	h.updateNodeStatus(name, func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, LastHeartbeatTime: metav1.Now()}}
	})
}

// pod creates an ingress controller pod (the example's labels) on the node.
func (h *harness) pod(name, node string, ready bool) string {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns,
			Labels: map[string]string{"app": "nginx-ingress", "component": "controller"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/ingress"}}},
	}
	if _, err := h.kc.CoreV1().Pods(h.ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.setPodReady(name, ready)
	return name
}

func (h *harness) setPodReady(name string, ready bool) {
	h.t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	for i := 0; ; i++ {
		p, err := h.kc.CoreV1().Pods(h.ns).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		_, err = h.kc.CoreV1().Pods(h.ns).UpdateStatus(h.ctx, p, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			h.t.Fatal(err)
		}
	}
}

// example reads a manifest from deploy/kube/examples (FLIPOP's format) and
// adapts it to this test: its namespace, the pods' namespace, and the
// test's node label added to nodeLabel.
func (h *harness) example(file string, edit func(spec map[string]any)) *unstructured.Unstructured {
	h.t.Helper()
	objs, err := kubetest.ReadObjects(repoPath(h.t, "deploy/kube/examples/"+file))
	if err != nil || len(objs) != 1 {
		h.t.Fatalf("read example %s: %v (%d objects)", file, err, len(objs))
	}
	u := objs[0]
	u.SetNamespace(h.ns)
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	match, _, _ := unstructured.NestedMap(spec, "match")
	if match != nil {
		if nl, _ := match["nodeLabel"].(string); nl != "" {
			match["nodeLabel"] = nl + "," + caseLabel + "=" + h.id
		} else {
			match["nodeLabel"] = caseLabel + "=" + h.id
		}
		if _, ok := match["podNamespace"]; ok {
			match["podNamespace"] = h.ns
		}
		spec["match"] = match
	}
	if edit != nil {
		edit(spec)
	}
	u.Object["spec"] = spec
	return u
}

func (h *harness) apply(u *unstructured.Unstructured) {
	h.t.Helper()
	if err := kubetest.Apply(h.ctx, h.srv.Config(), u); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) pool(name string) *FloatingIPPool {
	h.t.Helper()
	u, err := h.dyn.Resource(FloatingIPPoolResource).Namespace(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var p FloatingIPPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		h.t.Fatal(err)
	}
	return &p
}

func (h *harness) recordSet(name string) *NodeDNSRecordSet {
	h.t.Helper()
	u, err := h.dyn.Resource(NodeDNSRecordSetResource).Namespace(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var s NodeDNSRecordSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
		h.t.Fatal(err)
	}
	return &s
}

func (h *harness) annotation(node string) string {
	h.t.Helper()
	n, err := h.kc.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return n.Annotations[ReservedIPAnnotation]
}

// doRecords returns the DO fake's A records of a relative name, as sorted
// "ip/ttl" strings.
func (h *harness) doRecords(name string) []string {
	var out []string
	for _, r := range h.do.Records("example.com") {
		if r.Type == "A" && r.Name == name {
			out = append(out, fmt.Sprintf("%s/%d", r.Data, r.TTL))
		}
	}
	return sortedUnique(out)
}

func (h *harness) assignCalls() int {
	n := 0
	for _, r := range h.do.Requests() {
		if r.Method == "POST" && strings.HasPrefix(r.Path, "/v2/reserved_ips/") && strings.HasSuffix(r.Path, "/actions") {
			n++
		}
	}
	return n
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// never checks that f keeps returning nil for the duration.
func never(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func metricValue(reg *prometheus.Registry, name string, labels map[string]string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), nil
			case m.Gauge != nil:
				return m.Gauge.GetValue(), nil
			}
		}
	}
	return 0, errors.New("metric " + name + " with those labels not found")
}
