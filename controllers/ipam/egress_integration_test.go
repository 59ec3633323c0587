package ipam

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vipd/vipd/internal/kubetest"
)

// TestEgressPolicyPoolRef: an EgressPolicy with spec.poolRef gets one
// address of the pool as an IPAllocation it claims; a full pool leaves the
// next policy waiting (a warning event) until an address comes free; a
// policy deleted, or changed to a fixed egressIP, gives its address back.
func TestEgressPolicyPoolRef(t *testing.T) {
	h := newHarness(t, false)
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/egresspolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(h.ctx, h.srv.Config(), crd...); err != nil {
		t.Fatal(err)
	}
	// Discovery may lag the CRD by a moment: Run looks once at start.
	h.eventually(15*time.Second, "EgressPolicy served", func() string {
		if !egressServed(h.kc) {
			return "not yet"
		}
		return ""
	})
	h.pool("egress-pool", nil, "203.0.113.240-203.0.113.241")
	h.run(Options{Services: true}, nil)
	policies := h.dyn.Resource(EgressPolicyResource).Namespace(h.ns)
	mk := func(name string, spec map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "EgressPolicy",
			"metadata": map[string]any{"name": name, "namespace": h.ns}, "spec": spec}}
		if _, err := policies.Create(h.ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// holders: address -> policy name, for this test's allocations.
	holders := func() map[string]string {
		out := map[string]string{}
		for a, al := range h.allocations() {
			if al.Spec.ClaimRef.Kind == kindEgress && al.Spec.ClaimRef.Namespace == h.ns {
				out[a] = al.Spec.ClaimRef.Name + "/" + al.Spec.Pool
			}
		}
		return out
	}
	want := func(what string, w map[string]string) {
		t.Helper()
		h.eventually(15*time.Second, what, func() string {
			got := holders()
			if fmt.Sprint(got) != fmt.Sprint(w) {
				return fmt.Sprintf("allocations %v, want %v", got, w)
			}
			return ""
		})
	}
	pool := map[string]any{"poolRef": map[string]any{"name": "egress-pool"}}
	mk("p1", pool)
	want("first policy", map[string]string{"203.0.113.240": "p1/egress-pool"})
	mk("p2", pool)
	want("second policy", map[string]string{"203.0.113.240": "p1/egress-pool", "203.0.113.241": "p2/egress-pool"})
	// Exhausted: p3 waits, with a warning.
	mk("p3", pool)
	h.waitEvent("p3", corev1.EventTypeWarning, ReasonEgressPoolExhausted, "egress-pool")
	if got := holders(); len(got) != 2 {
		t.Fatalf("a full pool gave out %v", got)
	}
	// p1 deleted: its address is released and the waiting p3 gets it.
	if err := policies.Delete(h.ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("p1 deleted", map[string]string{"203.0.113.240": "p3/egress-pool", "203.0.113.241": "p2/egress-pool"})
	// p2 changes to a fixed egressIP: it gives its address back.
	u, err := policies.Get(h.ctx, "p2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"] = map[string]any{"egressIP": "10.0.0.99"}
	if _, err := policies.Update(h.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("p2 fixed", map[string]string{"203.0.113.240": "p3/egress-pool"})
	if err := policies.Delete(h.ctx, "p3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("all deleted", map[string]string{})
	if logs := h.logs.String(); strings.Contains(logs, "orphan check failed") || strings.Contains(logs, "unknown claimer kind") {
		t.Fatalf("the orphan collector does not know EgressPolicy claimers:\n%s", logs)
	}
}
