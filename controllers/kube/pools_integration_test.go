package kube

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// VIPD_CONTROLLERS=services through Run: no provider token, the shipped
// RBAC is enough (the controllers run as the restricted test user), only
// the Lease holder acts, and --default-class serves a classless
// LoadBalancer.
func TestServicesControllerThroughRun(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.Group + "/" + v1alpha1.Version, "kind": "IPPool",
		"metadata": map[string]any{"name": "run-" + h.id},
		"spec": map[string]any{
			"addresses":         []any{"198.18.90.1-198.18.90.3"},
			"serviceAllocation": map[string]any{"namespaces": []any{h.ns}},
		},
	}}
	if _, err := h.dyn.Resource(v1alpha1.IPPoolResource).Create(h.ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.dyn.Resource(v1alpha1.IPPoolResource).Delete(h.ctx, pool.GetName(), metav1.DeleteOptions{})
	})
	var ctrls []*controller
	for _, id := range []string{"a", "b"} {
		ctrls = append(ctrls, h.startWith(id, func(c *Config) {
			c.Controllers = []string{ControllerServices}
			c.ServicesDefaultClass = true
			c.DOToken, c.CloudflareToken = "", ""
		}))
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: h.ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := h.kc.CoreV1().Services(h.ns).Create(h.ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "address allocated", func() error {
		s, err := h.kc.CoreV1().Services(h.ns).Get(h.ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Status.LoadBalancer.Ingress) != 1 || s.Status.LoadBalancer.Ingress[0].IP != "198.18.90.1" {
			return fmt.Errorf("status %+v", s.Status)
		}
		return nil
	})
	eventually(t, 15*time.Second, "pool status", func() error {
		u, err := h.dyn.Resource(v1alpha1.IPPoolResource).Get(h.ctx, pool.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		alloc, _, _ := unstructured.NestedInt64(u.Object, "status", "allocated")
		free, _, _ := unstructured.NestedInt64(u.Object, "status", "free")
		if alloc != 1 || free != 2 {
			return fmt.Errorf("status %v", u.Object["status"])
		}
		return nil
	})
	// The leader's metrics: the pool's counts and one allocation.
	eventually(t, 10*time.Second, "pool metrics", func() error {
		var got []string
		for _, c := range ctrls {
			fams, err := c.reg.Gather()
			if err != nil {
				return err
			}
			for _, f := range fams {
				for _, m := range f.GetMetric() {
					labels := ""
					for _, l := range m.GetLabel() {
						labels += l.GetName() + "=" + l.GetValue() + ","
					}
					v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
					got = append(got, fmt.Sprintf("%s{%s}=%g", f.GetName(), labels, v))
				}
			}
		}
		for _, want := range []string{
			"vipd_ippool_addresses{pool=run-" + h.id + ",state=allocated,}=1",
			"vipd_ippool_addresses{pool=run-" + h.id + ",state=free,}=2",
			"vipd_ipam_allocations_total{kind=Service,outcome=allocated,}=1",
		} {
			if !slices.Contains(got, want) {
				return fmt.Errorf("no %s in %v", want, got)
			}
		}
		return nil
	})
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "released", func() error {
		if _, err := h.dyn.Resource(v1alpha1.IPAllocationResource).Get(h.ctx, "198.18.90.1", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("198.18.90.1 still allocated")
		}
		return nil
	})
}
