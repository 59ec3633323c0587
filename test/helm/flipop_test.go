package helm

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
)

const doToken = "helm-e2e-do-token"

// TestInstallFLIPOP installs the chart as a FLIPOP replacement (namespace
// flipop, FLIPOP's Secret, floatingippool and nodednsrecordset) and runs its
// Deployment as rendered under its ServiceAccount against the fake
// DigitalOcean API: a reserved IP is assigned and the node annotated (the
// only controller allowed to patch nodes), and both DNS record sets are
// written.
func TestInstallFLIPOP(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"flipop", "ingress"} {
		ensureNamespace(ctx, t, kc, ns)
	}
	fake, err := fakedo.New(fakedo.Options{Token: doToken, ActionDuration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddDomain("example.com")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "flipop", Namespace: "flipop"},
		StringData: map[string]string{"DIGITALOCEAN_ACCESS_TOKEN": doToken}}
	if _, err := kc.CoreV1().Secrets("flipop").Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Secrets("flipop").Delete(context.Background(), "flipop", metav1.DeleteOptions{})
	})

	objs := renderRelease(t, "flipop", "flipop", "--set", "controllers.services=false",
		"--set", "controllers.floatingippool=true", "--set", "controllers.nodednsrecordset=true",
		"--set", "controllers.providerSecret.name=flipop", "--set", "controllers.replicas=1",
		"--set", "controllers.env.VIPD_DO_API_URL="+fake.URL())
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatalf("apply the chart: %v", err)
	}
	d := find(t, objs, "Deployment", "-controllers")
	sa, _, _ := unstructured.NestedString(d.Object, "spec", "template", "spec", "serviceAccountName")
	waitAccess(ctx, t, kc, "flipop", sa,
		access{"patch", "", "nodes", true},
		access{"update", "flipop.digitalocean.com", "nodednsrecordsets/status", true},
		access{"update", "", "services", false},
		access{"create", "vipd.io", "ipallocations", false},
	)

	nodeA := flipopNode(ctx, t, kc, fake, "helm-node-a", 2001, "198.51.100.11")
	flipopNode(ctx, t, kc, fake, "helm-node-b", 2002, "198.51.100.12")
	examples, err := kubetest.ReadObjects(repoRoot(t)+"/deploy/kube/examples/floatingippool.yaml", repoRoot(t)+"/deploy/kube/examples/nodednsrecordset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range examples {
		if o.GetKind() == "FloatingIPPool" {
			if err := unstructured.SetNestedField(o.Object, int64(1), "spec", "desiredIPs"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := kubetest.Apply(ctx, srv.Config(), examples...); err != nil {
		t.Fatal(err)
	}

	out := runDeployment(t, srv, d)
	var ip string
	eventually(ctx, t, 60*time.Second, "node annotated with the reserved IP", func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ip = n.Annotations["flipop.digitalocean.com/ipv4-reserved-ip"]; ip == "" {
			return fmt.Errorf("no reserved-IP annotation on %s", nodeA)
		}
		return nil
	})
	eventually(ctx, t, 30*time.Second, "DNS records of both record sets", func() error {
		got := map[string][]string{}
		for _, r := range fake.Records("example.com") {
			if r.Type == "A" {
				got[r.Name] = append(got[r.Name], r.Data)
			}
		}
		sort.Strings(got["nodes"])
		if fmt.Sprint(got["hello-world"]) != "["+ip+"]" || fmt.Sprint(got["nodes"]) != "[198.51.100.11 198.51.100.12]" {
			return fmt.Errorf("A records %v, want hello-world [%s] and nodes [198.51.100.11 198.51.100.12]", got, ip)
		}
		return nil
	})
	if s := out.String(); strings.Contains(s, "forbidden") {
		t.Errorf("the FLIPOP controllers hit a permission error with the chart's RBAC:\n%s", s)
	}
}

// flipopNode adds a ready Node backed by a fake droplet, running a ready
// ingress pod that the examples' match selects.
func flipopNode(ctx context.Context, t *testing.T, kc kubernetes.Interface, fake *fakedo.Server, name string, id int, external string) string {
	t.Helper()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"doks.digitalocean.com/node-pool": "work"}},
		Spec:       corev1.NodeSpec{ProviderID: "digitalocean://" + strconv.Itoa(id)},
	}
	n, err := kc.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	fake.AddDroplet(fakedo.Droplet{ID: id, Name: name, PublicIPv4: external})
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: external}}
	if n, err = kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil // TaintNodesByCondition's not-ready taint; no lifecycle controller lifts it here
	if _, err := kc.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ingress-" + name, Namespace: "ingress",
			Labels: map[string]string{"app": "nginx-ingress", "component": "controller"}},
		Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/ingress"}}},
	}
	if p, err = kc.CoreV1().Pods("ingress").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Pods("ingress").Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := kc.CoreV1().Pods("ingress").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}
