package ipam

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

func (h *harness) claim(name, pool string, mutate func(*unstructured.Unstructured)) *unstructured.Unstructured {
	h.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": IPAddressClaimResource.GroupVersion().String(),
		"kind":       "IPAddressClaim",
		"metadata":   map[string]any{"name": name, "namespace": h.ns},
		"spec": map[string]any{
			"poolRef": map[string]any{"apiGroup": v1alpha1.Group, "kind": "IPPool", "name": pool},
		},
	}}
	if mutate != nil {
		mutate(u)
	}
	out, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Create(h.ctx, u, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatalf("create IPAddressClaim %s: %v", name, err)
	}
	return out
}

func (h *harness) getClaim(name string) *unstructured.Unstructured {
	h.t.Helper()
	u, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return u
}

func readyCondition(u *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			return m
		}
	}
	return nil
}

// waitAddress waits for the claim's IPAddress and returns it.
func (h *harness) waitAddress(name string) *unstructured.Unstructured {
	h.t.Helper()
	var addr *unstructured.Unstructured
	h.eventually(15*time.Second, "IPAddress for claim "+name, func() string {
		c := h.getClaim(name)
		ref := unstructuredString(c, "status", "addressRef", "name")
		rc := readyCondition(c)
		if ref == "" || rc == nil || rc["status"] != "True" {
			return fmt.Sprintf("claim status %v", c.Object["status"])
		}
		var err error
		addr, err = h.dyn.Resource(IPAddressResource).Namespace(h.ns).Get(h.ctx, ref, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return ""
	})
	return addr
}

// Cluster API's own IPAM CRDs (from the cluster-api module): a claim gets
// an IPAddress with address, prefix, gateway, claimRef, poolRef, owner
// references and finalizers; paused claims and paused Clusters are left
// alone; exhaustion is a Ready=False PoolExhausted; deleting the claim
// frees the address.
func TestCAPIClaims(t *testing.T) {
	h := newHarness(t, true)
	h.pool("capi", func(s *v1alpha1.IPPoolSpec) {
		s.Gateway = "198.18.5.1"
		p := int32(24)
		s.PrefixLength = &p
		s.ServiceAllocation = nil
		no := false
		s.AutoAssign = &no // not for Services
	}, "198.18.5.10-198.18.5.12")
	h.pool("capi6", func(s *v1alpha1.IPPoolSpec) { no := false; s.AutoAssign = &no }, "2001:db8:20::/126")
	h.run(Options{CAPI: true}, nil)

	claim := h.claim("m1", "capi", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{LabelClusterName: "c1"}) })
	addr := h.waitAddress("m1")
	for path, want := range map[string]string{
		"spec.address": "198.18.5.10", "spec.gateway": "198.18.5.1", "spec.claimRef.name": "m1",
		"spec.poolRef.apiGroup": "vipd.io", "spec.poolRef.kind": "IPPool", "spec.poolRef.name": "capi",
	} {
		if got := unstructuredString(addr, splitPath(path)...); got != want {
			t.Errorf("IPAddress %s = %q, want %q", path, got, want)
		}
	}
	if p, _, _ := unstructured.NestedInt64(addr.Object, "spec", "prefix"); p != 24 {
		t.Errorf("prefix %d, want 24", p)
	}
	if addr.GetName() != "m1" || addr.GetLabels()[LabelClusterName] != "c1" || !slices.Contains(addr.GetFinalizers(), FinalizerAddress) {
		t.Errorf("IPAddress meta: name %s labels %v finalizers %v", addr.GetName(), addr.GetLabels(), addr.GetFinalizers())
	}
	owners := addr.GetOwnerReferences()
	if len(owners) != 2 || owners[0].Kind != "IPAddressClaim" || owners[0].UID != claim.GetUID() || owners[0].Controller == nil || !*owners[0].Controller ||
		owners[1].Kind != "IPPool" || owners[1].Name != "capi" || owners[1].UID == "" {
		t.Errorf("owner references %+v", owners)
	}
	if c := h.getClaim("m1"); !slices.Contains(c.GetFinalizers(), FinalizerClaim) {
		t.Errorf("claim finalizers %v", c.GetFinalizers())
	}
	al := h.allocations()["198.18.5.10"]
	if al == nil || al.Spec.ClaimRef.Kind != "IPAddressClaim" || al.Spec.ClaimRef.UID != string(claim.GetUID()) || al.Spec.Pool != "capi" {
		t.Fatalf("allocation %+v", al)
	}
	// IPv6 pool without prefixLength: /128.
	h.claim("v6", "capi6", nil)
	a6 := h.waitAddress("v6")
	if p, _, _ := unstructured.NestedInt64(a6.Object, "spec", "prefix"); p != 128 || unstructuredString(a6, "spec", "address") != "2001:db8:20::" {
		t.Errorf("IPv6 IPAddress spec %v", a6.Object["spec"])
	}

	// Paused: by annotation on the claim, and by its Cluster's
	// spec.paused (Cluster API's Cluster CRD; m1's Cluster c1 does not
	// exist, which pauses nothing).
	h.claim("paused", "capi", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{AnnotationPaused: ""})
	})
	cluster := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ClusterResource.GroupVersion().String(), "kind": "Cluster",
		"metadata": map[string]any{"name": "frozen", "namespace": h.ns},
		"spec":     map[string]any{"paused": true},
	}}
	if _, err := h.dyn.Resource(ClusterResource).Namespace(h.ns).Create(h.ctx, cluster, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.claim("frozen-m", "capi", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "frozen", "spec", "clusterName")
	})
	h.claim("m2", "capi", nil)
	h.waitAddress("m2")
	time.Sleep(2500 * time.Millisecond) // past a resync
	for _, n := range []string{"paused", "frozen-m"} {
		if c := h.getClaim(n); c.Object["status"] != nil || len(c.GetFinalizers()) > 0 {
			t.Errorf("paused claim %s was reconciled: %v %v", n, c.Object["status"], c.GetFinalizers())
		}
	}
	if err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Delete(h.ctx, "frozen-m", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Exhaustion: m2 took .11, unpausing takes .12, the next is refused.
	c := h.getClaim("paused")
	c.SetAnnotations(nil)
	if _, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Update(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := unstructuredString(h.waitAddress("paused"), "spec", "address"); got != "198.18.5.12" {
		t.Errorf("unpaused claim got %s, want 198.18.5.12", got)
	}
	h.claim("m3", "capi", nil)
	h.eventually(10*time.Second, "m3 exhausted", func() string {
		rc := readyCondition(h.getClaim("m3"))
		if rc == nil || rc["status"] != "False" || rc["reason"] != ReasonPoolExhausted {
			return fmt.Sprintf("Ready %v", rc)
		}
		return ""
	})
	h.waitEvent("m3", corev1.EventTypeWarning, ReasonPoolExhausted, "capi")
	// A claim on a pool that does not exist.
	h.claim("nopool", "missing", nil)
	h.eventually(10*time.Second, "nopool not ready", func() string {
		rc := readyCondition(h.getClaim("nopool"))
		if rc == nil || rc["status"] != "False" || rc["reason"] != ReasonPoolNotReady {
			return fmt.Sprintf("Ready %v", rc)
		}
		return ""
	})
	// Another provider's claim is not touched.
	h.claim("foreign", "capi", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "ipam.cluster.x-k8s.io", "spec", "poolRef", "apiGroup")
		_ = unstructured.SetNestedField(u.Object, "InClusterIPPool", "spec", "poolRef", "kind")
	})

	// Deleting m1 frees .10 (finalizers removed, IPAddress gone) and the
	// waiting m3 gets it.
	if err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Delete(h.ctx, "m1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitGone(func() error {
		_, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Get(h.ctx, "m1", metav1.GetOptions{})
		return err
	}, "claim m1")
	h.waitGone(func() error {
		_, err := h.dyn.Resource(IPAddressResource).Namespace(h.ns).Get(h.ctx, "m1", metav1.GetOptions{})
		return err
	}, "IPAddress m1")
	if got := unstructuredString(h.waitAddress("m3"), "spec", "address"); got != "198.18.5.10" {
		t.Errorf("m3 got %s after m1 went, want 198.18.5.10", got)
	}
	if c := h.getClaim("foreign"); c.Object["status"] != nil || len(c.GetFinalizers()) > 0 {
		t.Errorf("another provider's claim was touched: %v", c.Object)
	}
	if _, err := h.dyn.Resource(IPAddressResource).Namespace(h.ns).Get(h.ctx, "foreign", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("IPAddress for another provider's claim: %v", err)
	}
	// The pool counts all three.
	h.eventually(10*time.Second, "pool capi counted", func() string {
		p := h.getPool("capi")
		if p.Status.Total != 3 || p.Status.Allocated != 3 || p.Status.Free != 0 {
			return fmt.Sprintf("%+v", p.Status)
		}
		return ""
	})
}

func splitPath(p string) []string {
	var out []string
	start := 0
	for i := range len(p) {
		if p[i] == '.' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return append(out, p[start:])
}
