package helm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// apiPort is where each lab node reaches the real apiserver (a forwarder
// on the node's loopback).
const apiPort = 16443

// TestNodeFormAnnounces runs both halves of the chart together: the
// controllers Deployment on this host and the per-node DaemonSet's vipd in
// two lab network namespaces, each with exactly the DaemonSet's settings and
// ServiceAccount (only the apiserver's address, the health probe's target
// and the mounted files' paths are the lab's). A LoadBalancer Service gets
// an address from an IPPool, one node binds it, and a client namespace
// reaches it.
func TestNodeFormAnnounces(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "ping")
	srv := env.Require(t)
	bin := vipdBuild.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc, dyn := srv.Clients(t)
	ensureNamespace(ctx, t, kc, namespace)

	l := lab.New(t, lab.Options{Nodes: 2, Client: true})
	var peers []string
	for _, n := range l.Nodes {
		peers = append(peers, n.IPv4.String())
	}
	keyFile, err := l.GossipKey()
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, "--set", "controllers.replicas=1", "--set", "node.enabled=true", "--set", "node.interface=eth0",
		"--set", "node.peers="+strings.Join(peers, "\\,"), "--set", "node.gossipKey.value="+strings.TrimSpace(string(key)))
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatalf("apply the chart: %v", err)
	}
	ds := find(t, objs, "DaemonSet", "-node")
	nodeSA, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "serviceAccountName")
	waitAccess(ctx, t, kc, namespace, nodeSA, access{"watch", "vipd.io", "ipallocations", true})

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipd.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "lab-lb"},
		"spec":     map[string]any{"addresses": []any{l.VIP4(60).String() + "-" + l.VIP4(69).String()}, "mode": "l2"},
	}}
	if err := kubetest.Apply(ctx, srv.Config(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dyn.Resource(ippools).Delete(context.Background(), "lab-lb", metav1.DeleteOptions{}) })

	// The DaemonSet's settings, the mounted files where the pod has them.
	dir := t.TempDir()
	gossip := filepath.Join(dir, "gossip.key")
	sec := find(t, objs, "Secret", "-gossip")
	value, _, _ := unstructured.NestedString(sec.Object, "stringData", "gossip.key")
	if err := os.WriteFile(gossip, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	procs := map[string]*lab.Proc{}
	target := strings.TrimPrefix(srv.URL, "https://")
	for _, n := range l.Nodes {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := n.Name
		t.Cleanup(func() { _ = kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
		testenv.Relay(t, n.Listen, fmt.Sprintf("127.0.0.1:%d", apiPort), target)
		var env []string
		for k, v := range containerEnv(t, ds) {
			switch k {
			case "VIPD_NODE_NAME": // spec.nodeName
				v = n.Name
			case "VIPD_KUBECONFIG":
				v = saKubeconfigVia(t, srv, fmt.Sprintf("https://127.0.0.1:%d", apiPort), namespace, nodeSA)
			case "VIPD_GOSSIP_KEY_FILE":
				v = gossip
			case "VIPD_HEALTH_URL": // the lab's stand-in for the cluster's apiserver
				v = "https://127.0.0.1:6443/livez"
			case "VIPD_HEALTH_CA_FILE":
				v = ""
			case "VIPD_STATE_DIR":
				continue // the lab's own per node
			}
			s, ok := v.(string)
			if !ok {
				t.Fatalf("env %s: %v not resolved by the test", k, v)
			}
			env = append(env, k+"="+s)
		}
		p, err := n.StartVipd(bin, env...)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipd %s:\n%s", name, p.Output())
			}
		}
	})
	syncCtx, syncCancel := context.WithTimeout(ctx, 45*time.Second)
	defer syncCancel()
	for name, p := range procs {
		if err := p.WaitOutput(syncCtx, "pool feed synced"); err != nil {
			t.Fatalf("vipd %s: %v", name, err)
		}
	}

	out := runDeployment(t, srv, find(t, objs, "Deployment", "-controllers"))
	class := "vipd.io/lb"
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lab-web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "api", Port: 6443, Protocol: corev1.ProtocolTCP}}}}
	if _, err := kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Services("default").Delete(context.Background(), "lab-web", metav1.DeleteOptions{})
	})
	want := l.VIP4(60)
	testenv.Eventually(ctx, t, 30*time.Second, "the Service's address from the pool", func() error {
		s, err := kc.CoreV1().Services("default").Get(ctx, "lab-web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if in := s.Status.LoadBalancer.Ingress; len(in) != 1 || in[0].IP != want.String() {
			return fmt.Errorf("status.loadBalancer %+v, want %s\n%s", s.Status.LoadBalancer, want, out.String())
		}
		return nil
	})
	testenv.Eventually(ctx, t, 30*time.Second, "one node binds the address and the client reaches it", func() error {
		holders, err := l.Holders(ctx, want)
		if err != nil {
			return err
		}
		if len(holders) != 1 {
			return fmt.Errorf("%s bound on %v, want one node", want, holders)
		}
		if b, err := l.Client.Output(ctx, "ping", "-c", "1", "-W", "1", want.String()); err != nil {
			return fmt.Errorf("ping %s from the client: %v: %s", want, err, b)
		}
		return nil
	})
}
