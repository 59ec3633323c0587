package pools

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/kubetest"
)

var (
	claimRes   = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddressclaims"}
	addressRes = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddresses"}
)

// The whole path with nothing staged by the test: vipd on n1 runs the
// services and ipam controllers (its vipd-controllers child, leader-elected,
// with the shipped RBAC only); a LoadBalancer Service gets an address from
// an IPPool, which one of the three nodes announces and the client reaches;
// deleting the Service withdraws it. A Cluster API IPAddressClaim gets an
// IPAddress, which no node announces (it is a machine's own address).
func TestPoolsEndToEnd(t *testing.T) {
	p := newPoolLab(t)
	srv := env.Require(t)
	ctx := ctxT(t, 3*time.Minute)

	// The shipped RBAC, bound to the lab's user, and Cluster API's CRDs.
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flipop"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(append([]string{filepath.Join(root, "deploy/kube/rbac.yaml")}, kubetest.ClusterAPICRDs(t)...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	user := []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: kubetest.User}}
	if _, err := p.kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-lab"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "vipd-controllers"}, Subjects: user}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := p.kc.RbacV1().RoleBindings("flipop").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vipd-controllers-lab"},
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "vipd-controllers-leader-election"}, Subjects: user}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The nodes' kubeconfig, in the namespace of the leader-election Lease.
	kcfg, err := srv.WriteKubeconfig(t.TempDir(), kubetest.KubeconfigOptions{Server: fmt.Sprintf("https://127.0.0.1:%d", apiPort), User: true, Namespace: "flipop"})
	if err != nil {
		t.Fatal(err)
	}

	p.pool(ctx, "lb", "l2", nil, p.VIP4(60).String()+"-"+p.VIP4(69).String())
	p.pool(ctx, "machines", "l2", nil, p.VIP4(70).String()+"-"+p.VIP4(79).String())
	for _, n := range p.Nodes {
		extra := []string{"VIPD_KUBECONFIG=" + kcfg}
		if n.Name == "n1" {
			extra = append(extra, "VIPD_CONTROLLERS=services,ipam")
		}
		p.start(n.Name, extra...)
	}
	for _, n := range p.Nodes {
		if err := p.vipd[n.Name].WaitOutput(ctx, "pool feed synced"); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.vipd["n1"].WaitOutput(ctx, "leading: starting kube controllers"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the nodes count themselves for pools after start-up

	class := "vipd.io/lb"
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "api", Port: 6443, TargetPort: intstr.FromInt32(6443), Protocol: corev1.ProtocolTCP}}}}
	start := time.Now()
	if _, err := p.kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip string
	for ip == "" {
		s, err := p.kc.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if in := s.Status.LoadBalancer.Ingress; len(in) > 0 {
			ip = in[0].IP
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the Service got no address: status %+v\n%s", s.Status, tail(p.vipd["n1"].Output(), 40))
		case <-time.After(20 * time.Millisecond):
		}
	}
	assigned := time.Since(start)
	a := p.VIP4(60)
	if ip != a.String() {
		t.Fatalf("the Service got %s, want the pool's first address %s", ip, a)
	}
	holder, at := p.waitReach(ctx, a, "")
	t.Logf("Service address %s in status after %v, reachable on %s after %v", ip, assigned.Round(time.Millisecond), holder, at.Sub(start).Round(time.Millisecond))
	if took := at.Sub(start); took > 2*time.Second {
		t.Errorf("the client reached the Service's address %v after the Service was created, want <= 2 s", took)
	}
	if err := p.ping(ctx, a); err != nil {
		t.Error(err)
	}
	if b := p.bound(ctx, a); len(b) != 1 {
		t.Errorf("%s bound on %v, want one node", a, b)
	}

	// A Cluster API claim gets an IPAddress from "machines", not announced.
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": claimRes.GroupVersion().String(), "kind": "IPAddressClaim",
		"metadata": map[string]any{"name": "m1", "namespace": "default"},
		"spec":     map[string]any{"poolRef": map[string]any{"apiGroup": v1alpha1.Group, "kind": "IPPool", "name": "machines"}},
	}}
	if _, err := p.dyn.Resource(claimRes).Namespace("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var machineIP string
	for machineIP == "" {
		c, err := p.dyn.Resource(claimRes).Namespace("default").Get(ctx, "m1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ref, _, _ := unstructured.NestedString(c.Object, "status", "addressRef", "name"); ref != "" {
			addr, err := p.dyn.Resource(addressRes).Namespace("default").Get(ctx, ref, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			machineIP, _, _ = unstructured.NestedString(addr.Object, "spec", "address")
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the claim got no IPAddress: %v", c.Object["status"])
		case <-time.After(50 * time.Millisecond):
		}
	}
	if machineIP != p.VIP4(70).String() {
		t.Fatalf("the claim got %s, want %s", machineIP, p.VIP4(70))
	}
	time.Sleep(1500 * time.Millisecond) // time enough to bind it, were it announced
	if b := p.bound(ctx, p.VIP4(70)); len(b) != 0 {
		t.Errorf("the machine address %s is bound on %v: a claim's address must not be announced", p.VIP4(70), b)
	}

	// Deleting the Service frees and withdraws its address.
	if err := p.kc.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p.waitBound(c2, a)
	name, _ := v1alpha1.AllocationName(a)
	if _, err := p.dyn.Resource(v1alpha1.IPAllocationResource).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the allocation of the deleted Service's address: %v, want NotFound", err)
	}
}
