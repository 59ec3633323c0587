package poolfeed

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/child"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/wire"
)

var env kubetest.Env

func TestMain(m *testing.M) {
	klog.SetLogger(logr.Discard())
	os.Exit(env.Main(m))
}

// TestRunAgainstAPIServer runs the feed against a real apiserver: the
// first snapshot once synced, a new one per change, node selectors from
// Node labels, and nothing written while etcd is down (no empty view),
// then the changes made after it came back.
func TestRunAgainstAPIServer(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/ippool.yaml"), filepath.Join(root, "deploy/kube/crds/ipallocation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), crds...); err != nil {
		t.Fatal(err)
	}
	kcfg, err := srv.Kubeconfig(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(srv.Config())
	dyn := dynamic.NewForConfigOrDie(srv.Config())

	pr, pw := io.Pipe()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(rctx, Config{Kubeconfig: kcfg, UserAgent: "poolfeed-test"}, pw, slog.New(slog.NewTextHandler(io.Discard, nil)))
		_ = pw.Close()
	}()
	snaps := make(chan wire.PoolSnapshot, 16)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), child.DefaultMaxLine)
		for sc.Scan() {
			var s wire.PoolSnapshot
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Errorf("unreadable line %q: %v", sc.Text(), err)
			}
			snaps <- s
		}
		close(snaps)
	}()
	next := func(what string) wire.PoolSnapshot {
		t.Helper()
		select {
		case s := <-snaps:
			return s
		case <-time.After(20 * time.Second):
			t.Fatalf("no snapshot: %s", what)
		}
		return wire.PoolSnapshot{}
	}
	if s := next("first, once synced"); len(s.Addresses) != 0 || s.Generation != 1 {
		t.Fatalf("first snapshot %+v", s)
	}
	create(ctx, t, dyn, v1alpha1.IPPoolResource, &v1alpha1.IPPool{TypeMeta: tm("IPPool"), ObjectMeta: metav1.ObjectMeta{Name: "feed-a"},
		Spec: v1alpha1.IPPoolSpec{Addresses: []string{"192.0.2.0/28"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"feed": "yes"}}}})
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "feed-n1", Labels: map[string]string{"feed": "yes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.CoreV1().Nodes().Delete(context.Background(), "feed-n1", metav1.DeleteOptions{}) })
	allocate := func(addr string) {
		create(ctx, t, dyn, v1alpha1.IPAllocationResource, &v1alpha1.IPAllocation{TypeMeta: tm("IPAllocation"), ObjectMeta: metav1.ObjectMeta{Name: addr},
			Spec: v1alpha1.IPAllocationSpec{Address: addr, Pool: "feed-a", ClaimedAt: metav1.Now(), ClaimRef: v1alpha1.ClaimRef{Kind: "Service", Namespace: "default", Name: "s"}}})
	}
	allocate("192.0.2.3")
	var s wire.PoolSnapshot
	for len(s.Addresses) == 0 {
		s = next("after the allocation")
	}
	if a := s.Addresses[0]; a.Addr != netip.MustParseAddr("192.0.2.3") || a.Mode != "l2" || a.All || len(a.Nodes) != 1 || a.Nodes[0] != "feed-n1" {
		t.Fatalf("snapshot %+v", s.Addresses)
	}

	// etcd down: the apiserver fails every request and the watches break.
	srv.KillEtcd()
	select {
	case s := <-snaps:
		t.Fatalf("a snapshot while etcd was down: %+v", s)
	case <-time.After(4 * time.Second):
	}
	if err := srv.StartEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	// The apiserver may take a moment to serve again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kc.CoreV1().Nodes().Get(ctx, "feed-n1", metav1.GetOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	allocate("192.0.2.4")
	for len(s.Addresses) < 2 {
		s = next("after etcd came back")
		if len(s.Addresses) == 0 {
			t.Fatalf("empty snapshot after the outage")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func tm(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: v1alpha1.Group + "/" + v1alpha1.Version, Kind: kind}
}

func create(ctx context.Context, t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj any) {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	res := dyn.Resource(gvr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = res.Create(ctx, u, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the apiserver recovering from the etcd outage
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
}
