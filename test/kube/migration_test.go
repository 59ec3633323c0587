package kube

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/vipd/vipd/internal/fakecf"
	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
)

var poolGVR = schema.GroupVersionResource{Group: "flipop.digitalocean.com", Version: "v1alpha1", Resource: "floatingippools"}

// TestMigrationWithVipdBinary replaces FLIPOP by the real `vipd run` in
// controllers-only mode, with FLIPOP's Secret names (DIGITALOCEAN_ACCESS_TOKEN,
// CLOUDFLARE_TOKEN): the reserved IPs FLIPOP assigned, its annotations,
// status and records are in place; vipd-controllers take over with no
// assign call and no DNS write. (kube.TestMigrationFromFLIPOP covers the
// same with both controllers in-process, Cloudflare records included.)
func TestMigrationWithVipdBinary(t *testing.T) {
	srv := env.Require(t)
	bin := vipdBuild.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc, dyn := srv.Clients(t)
	kubeconfig := install(ctx, t, srv, kc)
	// Pools left by other tests would be reconciled too.
	if err := dyn.Resource(poolGVR).Namespace(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	fake, err := fakedo.New(fakedo.Options{Token: doToken, ActionDuration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	fake.AddDomain("example.com")
	cf := fakecf.New("cf-e2e-token")
	t.Cleanup(cf.Close)

	// FLIPOP's state: the last IP listed on the first node by name.
	nodeA := kubetest.DropletNode(ctx, t, kc, fake, "e2e-mig-a", 1101, "198.51.100.11")
	nodeB := kubetest.DropletNode(ctx, t, kc, fake, "e2e-mig-b", 1102, "198.51.100.12")
	fake.AddReservedIP("192.0.2.111", 1102)
	fake.AddReservedIP("192.0.2.112", 1101)
	for node, ip := range map[string]string{nodeA: "192.0.2.112", nodeB: "192.0.2.111"} {
		patch := []byte(`{"metadata":{"annotations":{"` + annotation + `":"` + ip + `"}}}`)
		if _, err := kc.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []string{"192.0.2.111", "192.0.2.112"} {
		fake.AddRecord("example.com", fakedo.Record{Type: "A", Name: "hello-world", Data: ip, TTL: 120})
	}
	objs, err := kubetest.ReadObjects(repoPath(t, "deploy/kube/examples/floatingippool.yaml"))
	if err != nil || len(objs) != 1 {
		t.Fatalf("read the example pool: %v", err)
	}
	pool := objs[0]
	pool.SetName("migrated-pool")
	_ = unstructured.SetNestedStringSlice(pool.Object, []string{"192.0.2.111", "192.0.2.112"}, "spec", "ips")
	_ = unstructured.SetNestedField(pool.Object, int64(2), "spec", "desiredIPs")
	if err := kubetest.Apply(ctx, srv.Config(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(poolGVR).Namespace(namespace).Delete(context.Background(), "migrated-pool", metav1.DeleteOptions{})
	})
	u, err := dyn.Resource(poolGVR).Namespace(namespace).Get(ctx, "migrated-pool", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]any{"ips": map[string]any{
		"192.0.2.111": map[string]any{"state": "active", "nodeName": nodeB, "providerID": "digitalocean://1102"},
		"192.0.2.112": map[string]any{"state": "active", "nodeName": nodeA, "providerID": "digitalocean://1101"},
	}}
	u.Object["status"] = status
	u, err = dyn.Resource(poolGVR).Namespace(namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	statusRV := u.GetResourceVersion()
	nodeRV := map[string]string{}
	for _, n := range []string{nodeA, nodeB} {
		node, err := kc.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeRV[n] = node.ResourceVersion
	}

	d := startVipd(t, bin,
		"VIPD_CONTROLLERS=floatingippool",
		"VIPD_KUBECONFIG="+kubeconfig,
		"VIPD_METRICS_ADDRESS="+testenv.FreeAddr(t),
		"VIPD_STATE_DIR="+t.TempDir(),
		"VIPD_NODE_NAME="+nodeName,
		"VIPD_DO_API_URL="+fake.URL(),
		"DIGITALOCEAN_ACCESS_TOKEN="+doToken,
		"CLOUDFLARE_TOKEN=cf-e2e-token", // FLIPOP's name
		"VIPD_CLOUDFLARE_API_URL="+cf.URL(),
	)
	d.waitChild(ctx, 0)
	eventually(ctx, t, 45*time.Second, "both IPs read and the record set listed", d, func() error {
		if n := fake.Count(http.MethodGet, "/v2/reserved_ips/"); n < 2 {
			return fmt.Errorf("%d reserved IP reads", n)
		}
		if n := fake.Count(http.MethodGet, "/v2/domains/example.com/records"); n < 1 {
			return fmt.Errorf("%d record lists", n)
		}
		return nil
	})
	if err := d.waitOutput(ctx, 5*time.Second, "providers=\"[cloudflare digitalocean]\""); err != nil {
		t.Errorf("CLOUDFLARE_TOKEN did not enable the cloudflare provider: %v", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range fake.Requests() {
			if r.Method != http.MethodGet {
				t.Fatalf("DigitalOcean write after the migration: %s %s\n%s", r.Method, r.Path, d.output())
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	for n, rv := range nodeRV {
		node, err := kc.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.ResourceVersion != rv {
			t.Errorf("node %s written (annotations %v)", n, node.Annotations)
		}
	}
	if u, err := dyn.Resource(poolGVR).Namespace(namespace).Get(ctx, "migrated-pool", metav1.GetOptions{}); err != nil || u.GetResourceVersion() != statusRV {
		t.Errorf("pool status rewritten (FLIPOP's was already right): %v %v", err, u.Object["status"])
	}
}
