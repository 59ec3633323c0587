package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

var env Env

func TestMain(m *testing.M) { os.Exit(env.Main(m)) }

func TestServerAuthenticatesAndAuthorizes(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin cannot list nodes: %v", err)
	}
	user, err := kubernetes.NewForConfig(srv.UserConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = user.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("user without RBAC listing nodes: got %v, want Forbidden (RBAC must be enforced)", err)
	}

	// The kubeconfig file works like the rest.Config.
	path, err := srv.Kubeconfig(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("kubeconfig client: %v", err)
	}
}

func TestApplyCRDAndObject(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.kubetest.example.com}
spec:
  group: kubetest.example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
---
apiVersion: kubetest.example.com/v1
kind: Widget
metadata: {name: w1, namespace: default}
spec: {size: 3}
`
	p := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(p, []byte(crd), 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := ReadObjects(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("decoded %d objects, want 2", len(objs))
	}
	if err := Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	// Applying again updates in place.
	if err := Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatalf("second apply: %v", err)
	}
}

// A ServiceAccount kubeconfig reaches the apiserver where it is told, as
// the admin impersonating the ServiceAccount with a pod token's groups,
// in the ServiceAccount's namespace; the RBAC bound to the ServiceAccount
// alone decides (a ServiceAccount without bindings is forbidden).
func TestServiceAccountKubeconfig(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := ServiceAccount("kube-system", "nobody")
	o.Server = srv.URL
	path, err := srv.WriteKubeconfig(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cur := loaded.Contexts[loaded.CurrentContext]
	auth := loaded.AuthInfos[cur.AuthInfo]
	if cur.Namespace != "kube-system" || auth.Impersonate != "system:serviceaccount:kube-system:nobody" ||
		len(auth.ImpersonateGroups) != 3 || loaded.Clusters[cur.Cluster].Server != srv.URL {
		t.Fatalf("kubeconfig: context %+v, user %+v", cur, auth)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("an unbound ServiceAccount reading a namespace: %v, want Forbidden", err)
	}
}
