package helm

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
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

	nodeA := kubetest.DropletNode(ctx, t, kc, fake, "helm-node-a", 2001, "198.51.100.11")
	kubetest.DropletNode(ctx, t, kc, fake, "helm-node-b", 2002, "198.51.100.12")
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
	testenv.Eventually(ctx, t, 60*time.Second, "node annotated with the reserved IP", func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ip = n.Annotations["flipop.digitalocean.com/ipv4-reserved-ip"]; ip == "" {
			return fmt.Errorf("no reserved-IP annotation on %s", nodeA)
		}
		return nil
	})
	testenv.Eventually(ctx, t, 30*time.Second, "DNS records of both record sets", func() error {
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
