package ipam

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
)

// CAPIVersion is the Cluster API release whose IPAM CRDs the tests install
// (fetched into the module cache by `make go-deps`).
const CAPIVersion = kubetest.ClusterAPIVersion

var env kubetest.Env

func TestMain(m *testing.M) { os.Exit(env.Main(m)) }

// harness is one test's view of the shared apiserver.
type harness struct {
	t    *testing.T
	srv  *kubetest.Server
	ctx  context.Context
	kc   kubernetes.Interface
	dyn  dynamic.Interface
	ns   string
	logs *testenv.Buffer
}

var crdOnce sync.Map // CRD file set -> error

func newHarness(t *testing.T, capi bool) *harness {
	t.Helper()
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	h := &harness{t: t, srv: srv, ctx: ctx, logs: &testenv.Buffer{}}
	var err error
	if h.kc, err = kubernetes.NewForConfig(srv.Config()); err != nil {
		t.Fatal(err)
	}
	if h.dyn, err = dynamic.NewForConfig(srv.Config()); err != nil {
		t.Fatal(err)
	}
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(root, "deploy/kube/crds/ippool.yaml"), filepath.Join(root, "deploy/kube/crds/ipallocation.yaml")}
	if capi {
		files = append(files, capiCRDs(t)...)
	}
	key := strings.Join(files, ",")
	if e, ok := crdOnce.Load(key); ok && e == nil {
		// installed
	} else {
		objs, err := kubetest.ReadObjects(files...)
		if err != nil {
			t.Fatal(err)
		}
		err = kubetest.Apply(ctx, srv.Config(), objs...)
		crdOnce.Store(key, err)
		if err != nil {
			t.Fatal(err)
		}
	}
	h.ns = strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(h.ns) > 50 {
		h.ns = h.ns[:50]
	}
	if _, err := h.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller logs:\n%s", h.logs.String())
		}
	})
	return h
}

// capiCRDs returns Cluster API's own IPAM CRD files from the module cache.
func capiCRDs(t *testing.T) []string { return kubetest.ClusterAPICRDs(t) }

// run starts a controller replica; it stops at the end of the test (or
// when the returned stop is called) and is waited for.
func (h *harness) run(opts Options, cfg *rest.Config) (stop func()) {
	h.t.Helper()
	if cfg == nil {
		cfg = h.srv.Config()
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Resync == 0 {
		opts.Resync = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, kc, dc, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run: %v", err)
				}
			case <-time.After(20 * time.Second):
				h.t.Errorf("Run did not return 20s after its context ended")
			}
		})
	}
	h.t.Cleanup(stop)
	return stop
}

// pool creates an IPPool limited to the test's namespace (the apiserver is
// shared by the package's tests) and deletes it at the end.
func (h *harness) pool(name string, mutate func(*v1alpha1.IPPoolSpec), addrs ...string) {
	h.t.Helper()
	spec := v1alpha1.IPPoolSpec{Addresses: addrs, ServiceAllocation: &v1alpha1.ServiceAllocation{Namespaces: []string{h.ns}}}
	if mutate != nil {
		mutate(&spec)
	}
	obj := &v1alpha1.IPPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.Group + "/" + v1alpha1.Version, Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       spec,
	}
	u, err := toUnstructured(obj)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.dyn.Resource(v1alpha1.IPPoolResource).Create(h.ctx, u, metav1.CreateOptions{}); err != nil {
		h.t.Fatalf("create pool %s: %v", name, err)
	}
	h.t.Cleanup(func() {
		_ = h.dyn.Resource(v1alpha1.IPPoolResource).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func (h *harness) getPool(name string) v1alpha1.IPPool {
	h.t.Helper()
	u, err := h.dyn.Resource(v1alpha1.IPPoolResource).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var p v1alpha1.IPPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) updatePool(name string, mutate func(*v1alpha1.IPPoolSpec)) {
	h.t.Helper()
	p := h.getPool(name)
	mutate(&p.Spec)
	u, err := toUnstructured(&p)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.dyn.Resource(v1alpha1.IPPoolResource).Update(h.ctx, u, metav1.UpdateOptions{}); err != nil {
		h.t.Fatalf("update pool %s: %v", name, err)
	}
}

type svcOpt func(*corev1.Service)

func withAnnotation(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func withPorts(ports ...int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.Ports = nil
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: corev1.ProtocolTCP})
		}
	}
}

func withClass(class string) svcOpt {
	return func(s *corev1.Service) {
		if class == "" {
			s.Spec.LoadBalancerClass = nil
			return
		}
		s.Spec.LoadBalancerClass = &class
	}
}

// service creates a LoadBalancer Service of class vipd.io/lb.
func (h *harness) service(name string, opts ...svcOpt) *corev1.Service {
	h.t.Helper()
	class := LoadBalancerClass
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, o := range opts {
		o(s)
	}
	out, err := h.kc.CoreV1().Services(h.ns).Create(h.ctx, s, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatalf("create Service %s: %v", name, err)
	}
	return out
}

func (h *harness) getService(name string) *corev1.Service {
	h.t.Helper()
	s, err := h.kc.CoreV1().Services(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// eventually polls cond until it returns "" or the timeout passes.
func (h *harness) eventually(timeout time.Duration, what string, cond func() string) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		if last = cond(); last == "" {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within %s: %s", what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ingressIPs(s *corev1.Service) string {
	var out []string
	for _, i := range s.Status.LoadBalancer.Ingress {
		m := ""
		if i.IPMode != nil {
			m = "(" + string(*i.IPMode) + ")"
		}
		out = append(out, i.IP+m)
	}
	return strings.Join(out, ",")
}

// waitIngress waits until the Service's status shows exactly want
// ("192.0.2.1(VIP),..." ; "" for none).
func (h *harness) waitIngress(name, want string) *corev1.Service {
	h.t.Helper()
	var s *corev1.Service
	h.eventually(15*time.Second, "Service "+name+" ingress "+want, func() string {
		s = h.getService(name)
		if got := ingressIPs(s); got != want {
			return fmt.Sprintf("ingress %q, condition %+v", got, condition(s))
		}
		return ""
	})
	return s
}

func condition(s *corev1.Service) *metav1.Condition {
	for i := range s.Status.Conditions {
		if s.Status.Conditions[i].Type == ConditionAllocated {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}

// allocations lists every IPAllocation from the API server, by address.
func (h *harness) allocations() map[string]*v1alpha1.IPAllocation {
	h.t.Helper()
	l, err := h.dyn.Resource(v1alpha1.IPAllocationResource).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]*v1alpha1.IPAllocation{}
	for i := range l.Items {
		al, err := FromUnstructured(&l.Items[i])
		if err != nil {
			h.t.Fatal(err)
		}
		out[al.Spec.Address] = al
	}
	return out
}

func (h *harness) events(object string) []corev1.Event {
	h.t.Helper()
	l, err := h.kc.CoreV1().Events(h.ns).List(h.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + object})
	if err != nil {
		h.t.Fatal(err)
	}
	return l.Items
}

func (h *harness) waitEvent(object, typ, reason, contains string) {
	h.t.Helper()
	h.eventually(15*time.Second, fmt.Sprintf("%s event %s on %s", typ, reason, object), func() string {
		var seen []string
		for _, e := range h.events(object) {
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Message, contains) {
				return ""
			}
			seen = append(seen, e.Type+"/"+e.Reason+": "+e.Message)
		}
		return fmt.Sprintf("events: %v", seen)
	})
}

func (h *harness) waitGone(get func() error, what string) {
	h.t.Helper()
	h.eventually(15*time.Second, what+" gone", func() string {
		if err := get(); apierrors.IsNotFound(err) {
			return ""
		} else if err != nil {
			return err.Error()
		}
		return "still there"
	})
}

func unstructuredString(u *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, path...)
	return s
}

// make go-deps fetches the Cluster API release the tests install.
func TestCAPIVersionMatchesMakefile(t *testing.T) {
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "CAPI_VERSION := "+CAPIVersion+"\n") {
		t.Errorf("the Makefile's CAPI_VERSION is not %s", CAPIVersion)
	}
}
