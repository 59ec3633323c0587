package helm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
)

// PrometheusOperatorVersion is the prometheus-operator release whose
// ServiceMonitor, PodMonitor and PrometheusRule CRDs the install test serves (from the
// module cache, as Cluster API's; `make go-deps` fetches it).
const PrometheusOperatorVersion = "v0.85.0"

var (
	ippools     = schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "ippools"}
	claims      = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddressclaims"}
	ipaddresses = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddresses"}
	crdsOnce    sync.Once
	crdsErr     error
)

// moduleDir returns the directory of a module in the module cache.
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		testenv.Missing(t, "%s is not in the module cache (make go-deps): %v", mod, err)
	}
	i := strings.Index(string(out), `"Dir": "`)
	if i < 0 {
		testenv.Missing(t, "go mod download %s: no Dir in %s", mod, out)
	}
	rest := string(out)[i+len(`"Dir": "`):]
	return rest[:strings.Index(rest, `"`)]
}

// serveForeignCRDs installs the CRDs the chart's objects need besides its
// own: Cluster API's (ipam controller) and prometheus-operator's
// ServiceMonitor, PodMonitor and PrometheusRule, all from the module cache.
func serveForeignCRDs(ctx context.Context, t *testing.T, srv *kubetest.Server) {
	t.Helper()
	files := kubetest.ClusterAPICRDs(t)
	po := moduleDir(t, "github.com/prometheus-operator/prometheus-operator@"+PrometheusOperatorVersion)
	for _, f := range []string{"monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		files = append(files, filepath.Join(po, "example", "prometheus-operator-crd", f))
	}
	crdsOnce.Do(func() {
		objs, err := kubetest.ReadObjects(files...)
		if err != nil {
			crdsErr = err
			return
		}
		crdsErr = kubetest.Apply(ctx, srv.Config(), objs...)
	})
	if crdsErr != nil {
		t.Fatal(crdsErr)
	}
}

func ensureNamespace(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns string) {
	t.Helper()
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// saKubeconfig writes a kubeconfig that authenticates as the admin and
// impersonates the ServiceAccount ns/name with the groups a pod's token
// carries, so every request is authorized by the RBAC bound to it only.
func saKubeconfig(t *testing.T, srv *kubetest.Server, ns, name string) string {
	t.Helper()
	return saKubeconfigVia(t, srv, srv.URL, ns, name)
}

// saKubeconfigVia is saKubeconfig for the apiserver reached at server.
func saKubeconfigVia(t *testing.T, srv *kubetest.Server, server, ns, name string) string {
	t.Helper()
	o := kubetest.ServiceAccount(ns, name)
	o.Server = server
	p, err := srv.WriteKubeconfig(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runDeployment runs the Deployment's container as the kubelet would, on
// this host: its args and env (fieldRefs and Secrets resolved), the state emptyDir as a temporary directory, and the pod's
// ServiceAccount as its identity. Only the metrics address moves to a free
// loopback port. It is stopped (SIGTERM, as the kubelet does) at cleanup.
func runDeployment(t *testing.T, srv *kubetest.Server, d *unstructured.Unstructured) *testenv.Buffer {
	t.Helper()
	bin := vipdBuild.Path(t)
	spec, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	sa, _ := spec["serviceAccountName"].(string)
	if sa == "" {
		t.Fatalf("Deployment %s has no serviceAccountName", d.GetName())
	}
	c := spec["containers"].([]any)[0].(map[string]any)
	var args []string
	for _, a := range c["args"].([]any) {
		args = append(args, a.(string))
	}
	env := []string{
		"VIPD_KUBECONFIG=" + saKubeconfig(t, srv, d.GetNamespace(), sa),
		"VIPD_STATE_DIR=" + t.TempDir(),
		"VIPD_NODE_NAME=helm-test",
	}
	for _, e := range c["env"].([]any) {
		m := e.(map[string]any)
		name := m["name"].(string)
		if name == "VIPD_METRICS_ADDRESS" {
			env = append(env, name+"="+testenv.FreeAddr(t))
			continue
		}
		if v, ok := m["value"]; ok {
			env = append(env, fmt.Sprintf("%s=%v", name, v))
			continue
		}
		from := m["valueFrom"].(map[string]any)
		switch {
		case from["fieldRef"] != nil:
			path := from["fieldRef"].(map[string]any)["fieldPath"]
			if path != "metadata.namespace" {
				t.Fatalf("env %s: fieldRef %v not resolved by the test", name, path)
			}
			env = append(env, name+"="+d.GetNamespace())
		case from["secretKeyRef"] != nil:
			// As the kubelet: the Secret's key, or nothing when an
			// optional Secret or key is missing.
			ref := from["secretKeyRef"].(map[string]any)
			opt, _ := ref["optional"].(bool)
			kc, err := kubernetes.NewForConfig(srv.Config())
			if err != nil {
				t.Fatal(err)
			}
			sec, err := kc.CoreV1().Secrets(d.GetNamespace()).Get(context.Background(), ref["name"].(string), metav1.GetOptions{})
			if err != nil && !(apierrors.IsNotFound(err) && opt) {
				t.Fatalf("env %s: Secret %v: %v", name, ref["name"], err)
			}
			if v, ok := sec.Data[ref["key"].(string)]; ok {
				env = append(env, name+"="+string(v))
			} else if !opt {
				t.Fatalf("env %s: Secret %v has no key %v", name, ref["name"], ref["key"])
			}
		default:
			t.Fatalf("env %s: valueFrom %v not resolved by the test", name, from)
		}
	}
	var base []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "VIPD_") && k != "KUBECONFIG" && k != "DIGITALOCEAN_ACCESS_TOKEN" && k != "CLOUDFLARE_API_TOKEN" {
			base = append(base, kv)
		}
	}
	out := &testenv.Buffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(base, env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("vipd after SIGTERM: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("vipd did not stop 15s after SIGTERM")
		}
		if t.Failed() {
			t.Logf("vipd output:\n%s", out.String())
		}
	})
	return out
}

// canI asks the apiserver whether the ServiceAccount ns/name may do verb on
// group/resource.
func canI(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns, name, verb, group, resource string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: resource,
		},
	}}
	got, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed
}

// access is one permission a ServiceAccount should or should not have.
type access struct {
	verb, group, resource string
	want                  bool
}

// waitAccess waits until the apiserver's authorizer (whose RBAC view lags
// an apply by a moment) answers every access as wanted, and reports those
// that still differ after 15 s.
func waitAccess(ctx context.Context, t *testing.T, kc kubernetes.Interface, ns, sa string, as ...access) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var wrong []string
		for _, a := range as {
			if got := canI(ctx, t, kc, ns, sa, a.verb, a.group, a.resource); got != a.want {
				wrong = append(wrong, fmt.Sprintf("%s %s/%s: allowed %v, want %v", a.verb, a.group, a.resource, got, a.want))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Errorf("ServiceAccount %s/%s: %s", ns, sa, strings.Join(wrong, "; "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestInstall applies everything the chart renders with every part on to a
// real apiserver (accepted, including the DaemonSet, the monitoring objects
// against prometheus-operator's own CRDs and the Deployment), then runs the
// controllers Deployment exactly as rendered under its ServiceAccount: a
// LoadBalancer Service gets an address from an IPPool and a Cluster API
// IPAddressClaim an IPAddress, with no permission error on the way.
func TestInstall(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc, dyn := srv.Clients(t)
	serveForeignCRDs(ctx, t, srv)
	ensureNamespace(ctx, t, kc, namespace)

	// Every object of the full values is accepted. The DaemonSet's and
	// the FLIPOP controllers' Secrets are not needed for acceptance.
	full := render(t, "-f", fullValues(t))
	if err := kubetest.Apply(ctx, srv.Config(), full...); err != nil {
		t.Fatalf("apply the chart with full values: %v", err)
	}
	for _, o := range full {
		if o.GetKind() == "DaemonSet" {
			nodeSA, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "serviceAccountName")
			// The node form reads pools and endpoints and writes
			// EgressPolicy status, nothing else.
			waitAccess(ctx, t, kc, namespace, nodeSA,
				access{"watch", "discovery.k8s.io", "endpointslices", true},
				access{"list", "vipd.io", "ipallocations", true},
				access{"patch", "vipd.io", "egresspolicies/status", true},
				access{"create", "vipd.io", "ipallocations", false},
				access{"update", "", "services", false},
				access{"list", "", "secrets", false},
			)
		}
	}

	// A second release with services and ipam runs. It replaces the
	// first one's controllers (one Lease per namespace): the first's
	// Deployment would need DigitalOcean tokens.
	objs := render(t, "--set", "controllers.ipam=true", "--set", "controllers.replicas=1")
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatalf("apply the chart: %v", err)
	}
	d := find(t, objs, "Deployment", "-controllers")
	sa, _, _ := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName")
	waitAccess(ctx, t, kc, namespace, sa,
		access{"update", "", "services", true},
		access{"create", "ipam.cluster.x-k8s.io", "ipaddresses", true},
		access{"update", "flipop.digitalocean.com", "floatingippools", false}, // no longer enabled
		access{"patch", "", "nodes", false},
		access{"get", "", "secrets", false},
	)

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipd.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "helm-test"},
		"spec":     map[string]any{"addresses": []any{"198.18.40.10-198.18.40.20"}, "mode": "l2", "gateway": "198.18.40.1", "prefixLength": int64(24)},
	}}
	if err := kubetest.Apply(ctx, srv.Config(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Resource(ippools).Delete(context.Background(), "helm-test", metav1.DeleteOptions{}) })

	out := runDeployment(t, srv, d)

	class := "vipd.io/lb"
	svc, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "helm-test"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	testenv.Eventually(ctx, t, 60*time.Second, "the LoadBalancer Service gets an address from the pool", func() error {
		s, err := kc.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			if strings.HasPrefix(in.IP, "198.18.40.") {
				return nil
			}
		}
		return fmt.Errorf("status.loadBalancer %+v", s.Status.LoadBalancer)
	})

	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddressClaim",
		"metadata": map[string]any{"name": "helm-test-m1", "namespace": "default"},
		"spec":     map[string]any{"poolRef": map[string]any{"apiGroup": "vipd.io", "kind": "IPPool", "name": "helm-test"}},
	}}
	if _, err := dyn.Resource(claims).Namespace("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(claims).Namespace("default").Delete(context.Background(), "helm-test-m1", metav1.DeleteOptions{})
	})
	testenv.Eventually(ctx, t, 60*time.Second, "the IPAddressClaim gets an IPAddress", func() error {
		a, err := dyn.Resource(ipaddresses).Namespace("default").Get(ctx, "helm-test-m1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ip, _, _ := unstructured.NestedString(a.Object, "spec", "address"); !strings.HasPrefix(ip, "198.18.40.") {
			return fmt.Errorf("IPAddress spec.address %q", ip)
		}
		return nil
	})
	if s := out.String(); strings.Contains(s, "forbidden") {
		t.Errorf("the controllers hit a permission error with the chart's RBAC:\n%s", s)
	}
}

// The settings the DaemonSet gives vipd (default node values, and every
// value set) are a configuration `vipd check-config` accepts, with the
// mounted files (kubeconfig, gossip key) where the pod would have them.
func TestNodeSettingsAccepted(t *testing.T) {
	testenv.Short(t)
	bin := vipdBuild.Path(t)
	for name, args := range map[string][]string{
		"default": {"--set", "node.enabled=true"},
		"full":    {"-f", fullValues(t)},
		"bgp":     {"--set", "node.enabled=true,node.mode=bgp", "--set-string", "node.env.VIPD_BGP_LOCAL_AS=65001,node.env.VIPD_BGP_PEERS=192.0.2.1:65000"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, args...)
			ds := find(t, objs, "DaemonSet", "-node")
			dir := t.TempDir()
			// The volumes as the kubelet mounts them.
			kc := find(t, objs, "ConfigMap", "-node-kubeconfig")
			content, _, _ := unstructured.NestedString(kc.Object, "data", "kubeconfig")
			files := map[string]string{"/etc/vipd/kubeconfig/kubeconfig": content}
			for _, o := range objs {
				if o.GetKind() == "Secret" {
					key, _, _ := unstructured.NestedString(o.Object, "stringData", "gossip.key")
					files["/etc/vipd/gossip/gossip.key"] = key
				}
			}
			mapped := map[string]string{}
			for p, c := range files {
				local := filepath.Join(dir, filepath.Base(p))
				if err := os.WriteFile(local, []byte(c), 0o600); err != nil {
					t.Fatal(err)
				}
				mapped[p] = local
			}
			var env []string
			for k, v := range containerEnv(t, ds) {
				s, ok := v.(string)
				switch {
				case k == "VIPD_NODE_NAME":
					s = "node-a" // spec.nodeName
				case !ok:
					t.Fatalf("env %s: %v not resolved by the test", k, v)
				case mapped[s] != "":
					s = mapped[s]
				case k == "VIPD_STATE_DIR":
					s = dir
				}
				env = append(env, k+"="+s)
			}
			cmd := exec.Command(bin, "check-config")
			cmd.Env = append(baseEnvWithout(), env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("vipd check-config with the DaemonSet's settings: %v\n%s\nenv %v", err, out, env)
			}
		})
	}
}
