package kubetest

import (
	"context"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/internal/fakedo"
)

// Clients are the typed and dynamic clients of the server, as admin.
func (s *Server) Clients(t testing.TB) (*kubernetes.Clientset, dynamic.Interface) {
	t.Helper()
	kc, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return kc, dyn
}

// DropletNode creates a Ready Node of the DOKS node pool "work" backed by
// droplet id (registered with the fake under name, with the external
// address), running a ready ingress pod (app=nginx-ingress,
// component=controller in namespace "ingress") that the FLIPOP examples'
// match selects. Cleanup deletes both. It returns name.
func DropletNode(ctx context.Context, t testing.TB, kc kubernetes.Interface, fake *fakedo.Server, name string, id int, external string) string {
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
	// The admission plugin TaintNodesByCondition gives a new node the
	// not-ready taint; no node lifecycle controller runs here to lift it.
	n.Spec.Taints = nil
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
