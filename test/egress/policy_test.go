package egress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/lab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

var env kubetest.Env

func TestMain(m *testing.M) {
	klog.SetLogger(logr.Discard())
	os.Exit(env.Main(m))
}

// proxyAPIServer makes the test's kube-apiserver (on the host's loopback)
// reachable on the same loopback address and port inside the node's
// namespace: a listener there, each connection relayed by this process.
// Nothing else crosses between the namespaces.
func proxyAPIServer(t *testing.T, l *egressLab, n *lab.Host, apiURL string) {
	t.Helper()
	u, err := url.Parse(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := n.Run(func() error {
		var err error
		ln, err = net.Listen("tcp", u.Host)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	l.OnClose(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", u.Host) // from the host namespace
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}

// TestEgressPolicies runs the Kubernetes form end to end: EgressPolicy
// objects in a real kube-apiserver, vipd with VIPD_EGRESS_POLICIES=on on
// every node (its vipd-controllers child resolves them), and the server
// beyond the router seeing the egress IPs for the selected pod only.
func TestEgressPolicies(t *testing.T) {
	srv := env.Require(t)
	l := newEgressLab(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(l.bin), "vipd-controllers")); err != nil {
		t.Fatalf("vipd-controllers must be next to %s (make builds both): %v", l.bin, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/egresspolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), crd...); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := srv.Kubeconfig(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := "shop-" + l.ID
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pods of node n3 as the API knows them (the test plays kubelet).
	for _, p := range []struct{ name, app, ip4, ip6 string }{
		{"billing", "billing", pod4(3, 1), pod6(3, 1)},
		{"web", "web", pod4(3, 2), pod6(3, 2)},
	} {
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: "n3", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}
		obj, err := cs.CoreV1().Pods(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		obj.Status.Phase = corev1.PodRunning
		obj.Status.PodIPs = []corev1.PodIP{{IP: p.ip4}, {IP: p.ip6}}
		obj.Status.PodIP = p.ip4
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gvr := schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "egresspolicies"}
	for name, spec := range map[string]map[string]any{
		"billing-v4": {"egressIP": l.e4.String(), "podSelector": map[string]any{"matchLabels": map[string]any{"app": "billing"}}, "destinations": []any{"203.0.113.0/24"}},
		"billing-v6": {"egressIP": l.e6.String(), "podSelector": map[string]any{"matchLabels": map[string]any{"app": "billing"}}},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "EgressPolicy",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	for _, n := range l.Nodes {
		proxyAPIServer(t, l, n, srv.URL)
		p, err := n.StartVipd(l.bin, append([]string{"VIPD_PEERS=" + l.Peers(n), "VIPD_PRIORITY=" + l.prio[n.Name],
			"VIPD_ADDRESS=" + l.e4.String() + "/32," + l.e6.String() + "/128",
			"VIPD_EGRESS_POLICIES=on", "VIPD_KUBECONFIG=" + kubeconfig,
			"VIPD_EGRESS_CLUSTER_CIDRS=" + podCIDR4 + "," + podCIDR6}, fastHealth...)...)
		if err != nil {
			t.Fatal(err)
		}
		l.vipd[n.Name] = p
	}
	gw := l.holder(l.e4)

	// The selected pod leaves with the egress IPs; its neighbour and a pod
	// no policy names keep their node's address.
	l.waitSource(l.podNS(3, 1), server4, l.e4.String(), 30*time.Second)
	l.waitSource(l.podNS(3, 1), server6, l.e6.String(), 10*time.Second)
	l.waitSource(l.podNS(3, 2), server4, l.Node("n3").IPv4.String(), 5*time.Second)
	l.waitSource(l.podNS(1, 1), server4, l.Node("n1").IPv4.String(), 5*time.Second)

	// The gateway reports itself in the policy's status.
	waitFor(t, 15*time.Second, "policy status", func() error {
		u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, "billing-v4", metav1.GetOptions{})
		if err != nil {
			return err
		}
		node, _, _ := unstructured.NestedString(u.Object, "status", "gatewayNode")
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		if node != gw || len(conds) != 1 || conds[0].(map[string]any)["status"] != "True" {
			return errorString("status " + strings.TrimSpace(toJSON(u.Object["status"])))
		}
		return nil
	})

	// The pod goes away: its address stops matching (here the next pod
	// with that address would get the node's address).
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "billing", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	l.waitSource(l.podNS(3, 1), server4, l.Node("n3").IPv4.String(), 10*time.Second)
	l.waitSource(l.podNS(3, 1), server6, l.Node("n3").IPv6.String(), 10*time.Second)

	for name, p := range l.vipd {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(10 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s: exit %d, %v", name, code, err)
		}
	}
	for _, n := range l.Nodes {
		if err := l.kernelClean(n); err != nil {
			t.Error(err)
		}
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestEgressPolicyNodeSelector: the CRD form with an egress IP that is in
// neither VIPD_ADDRESS nor VIPD_EGRESS, held at run time through the pools
// machine by one of the two nodes the policy's nodeSelector allows (n1,
// n2), never by n3. The selected pod on n3 leaves with the egress IP; the
// gateway dies (vipd killed, node cut off): the other selected node takes
// over and the server sees the egress IP again; the crashed node comes
// back clean; deleting the policy releases the address everywhere.
func TestEgressPolicyNodeSelector(t *testing.T) {
	srv := env.Require(t)
	l := newEgressLab(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(l.bin), "vipd-controllers")); err != nil {
		t.Fatalf("vipd-controllers must be next to %s (make builds both): %v", l.bin, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/egresspolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), crd...); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := srv.Kubeconfig(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	// The Node objects: n1 and n2 may be egress gateways, n3 may not.
	// (Node names are the apiserver's, shared by the tests of this run:
	// the lab's ID keeps them apart from another test's.)
	selected := map[string]bool{"n1": true, "n2": true}
	for _, n := range l.Nodes {
		lbl := map[string]string{"lab": l.ID}
		if selected[n.Name] {
			lbl["egress-gateway"] = "yes"
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: lbl}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := n.Name
		t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	ns := "sel-" + l.ID
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ name, app, ip4 string }{{"billing", "billing", pod4(3, 1)}, {"web", "web", pod4(3, 2)}} {
		obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: "n3", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}
		obj, err := cs.CoreV1().Pods(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		obj.Status.Phase = corev1.PodRunning
		obj.Status.PodIPs = []corev1.PodIP{{IP: p.ip4}}
		obj.Status.PodIP = p.ip4
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gvr := schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "egresspolicies"}
	pol := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "EgressPolicy",
		"metadata": map[string]any{"name": "billing", "namespace": ns},
		"spec": map[string]any{"egressIP": l.e4.String(), "podSelector": map[string]any{"matchLabels": map[string]any{"app": "billing"}},
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"egress-gateway": "yes", "lab": l.ID}}}}}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cpVIP := l.VIP4(60) // the control-plane VIP; the egress IP is not in it
	start := func(n *lab.Host) {
		t.Helper()
		p, err := n.StartVipd(l.bin, append([]string{"VIPD_PEERS=" + l.Peers(n), "VIPD_PRIORITY=" + l.prio[n.Name],
			"VIPD_ADDRESS=" + cpVIP.String() + "/32",
			"VIPD_EGRESS_POLICIES=on", "VIPD_KUBECONFIG=" + kubeconfig,
			"VIPD_EGRESS_CLUSTER_CIDRS=" + podCIDR4 + "," + podCIDR6}, fastHealth...)...)
		if err != nil {
			t.Fatal(err)
		}
		l.vipd[n.Name] = p
	}
	began := time.Now()
	mark := func(what string) { t.Logf("%6.1fs %s", time.Since(began).Seconds(), what) }
	for _, n := range l.Nodes {
		proxyAPIServer(t, l, n, srv.URL)
		start(n)
	}
	n3 := l.Node("n3")
	neverN3 := func() {
		t.Helper()
		if ok, _ := n3.HasAddr(ctx, l.e4); ok {
			t.Fatalf("n3, which the nodeSelector leaves out, holds %s", l.e4)
		}
	}
	l.waitSource(l.podNS(3, 1), server4, l.e4.String(), 30*time.Second)
	l.waitSource(l.podNS(3, 2), server4, n3.IPv4.String(), 5*time.Second)
	gw := l.holder(l.e4)
	if !selected[gw] {
		t.Fatalf("the gateway is %s, which the nodeSelector leaves out", gw)
	}
	mark("the selected pod leaves with the egress IP through " + gw)
	statusGateway := func(want string) func() error {
		return func() error {
			u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, "billing", metav1.GetOptions{})
			if err != nil {
				return err
			}
			node, _, _ := unstructured.NestedString(u.Object, "status", "gatewayNode")
			addr, _, _ := unstructured.NestedString(u.Object, "status", "address")
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			if node != want || addr != l.e4.String() || len(conds) != 1 || conds[0].(map[string]any)["status"] != "True" {
				return errorString("status " + strings.TrimSpace(toJSON(u.Object["status"])))
			}
			return nil
		}
	}
	waitFor(t, 15*time.Second, "policy status", statusGateway(gw))

	// The gateway dies: vipd killed and the node cut off at once.
	p := startProber(l.podNS(3, 1), server4)
	time.Sleep(200 * time.Millisecond)
	old := l.Node(gw)
	t0 := time.Now()
	l.vipd[gw].Kill()
	if err := old.SetLink(ctx, false, false); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	waitFor(t, 8*time.Second, "egress recovered", func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := recovered(p.res, t0, cut, l.e4.String()); !ok {
			return errorString("no answer with the egress IP yet")
		}
		return nil
	})
	res := p.Stop()
	gap, _ := recovered(res, t0, cut, l.e4.String())
	newGW := l.holder(l.e4, gw)
	if !selected[newGW] || newGW == gw {
		t.Fatalf("after %s died, %s holds %s", gw, newGW, l.e4)
	}
	neverN3()
	for _, r := range res {
		if r.src != "" && r.src != l.e4.String() {
			t.Fatalf("the server saw %s from the selected pod", r.src)
		}
	}
	t.Logf("policy egress failover: gateway %s killed and cut off, %s took over, the pod on n3 saw the egress IP again after %v",
		gw, newGW, gap.Round(time.Millisecond))
	fmt.Printf("EGRESS POLICY FAILOVER (runtime address, nodeSelector): %v\n", gap.Round(time.Millisecond))
	waitFor(t, 15*time.Second, "status after failover", statusGateway(newGW))
	mark("failed over; status updated")

	// The crashed node comes back (as systemd restarts vipd): what its
	// crash left (the address, a gateway table) is cleaned up; one node
	// holds the address and the pod's traffic still leaves with it.
	start(old)
	time.Sleep(300 * time.Millisecond)
	if err := old.SetLink(ctx, true, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "one holder after the restart", func() error {
		h, err := l.Holders(ctx, l.e4)
		if err != nil || len(h) != 1 || !selected[h[0]] {
			return fmt.Errorf("holders %v (%v)", h, err)
		}
		if src, err := probeOnce(l.podNS(3, 1), server4, 300*time.Millisecond); err != nil || src != l.e4.String() {
			return fmt.Errorf("the server saw %q (%v)", src, err)
		}
		return nil
	})
	neverN3()
	mark("the crashed node is back; one holder")

	// The policy is deleted: the address is released on every node and
	// the pod leaves with its node's address again.
	if err := dyn.Resource(gvr).Namespace(ns).Delete(ctx, "billing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "address released", func() error {
		h, err := l.Holders(ctx, l.e4)
		if err != nil || len(h) != 0 {
			return fmt.Errorf("holders %v (%v)", h, err)
		}
		return nil
	})
	l.waitSource(l.podNS(3, 1), server4, n3.IPv4.String(), 10*time.Second)
	mark("policy deleted: address released")

	for name, p := range l.vipd {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(10 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s: exit %d, %v", name, code, err)
		}
	}
	for _, n := range l.Nodes {
		if err := l.kernelClean(n); err != nil {
			t.Error(err)
		}
	}
}
