package kube

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ipsOn returns, for each IP of the pool status, the node it is active on.
func activeNodes(p *FloatingIPPool) map[string]string {
	out := map[string]string{}
	for ip, st := range p.Status.IPs {
		if st.State == IPStateActive {
			out[ip] = st.NodeName
		}
	}
	return out
}

// TestFloatingIPPoolLifecycle walks FLIPOP's example pool through the
// cases that matter, against the real apiserver and the DO fake: creation
// of the desired IPs, initial assignment sorted by node name, a taint that
// is not tolerated moves the IP, a tolerated one does not, a pod turning
// unready moves the IP, and a controller restart makes no assign call.
func TestFloatingIPPoolLifecycle(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	// Created out of name order on purpose.
	nc := h.node("c", 103, "198.51.100.3")
	na := h.node("a", 101, "198.51.100.1")
	nb := h.node("b", 102, "198.51.100.2")
	h.pod("ingress-c", nc, true)
	h.pod("ingress-a", na, true)
	h.pod("ingress-b", nb, true)
	h.apply(h.example("floatingippool.yaml", func(spec map[string]any) {
		spec["desiredIPs"] = int64(2)
		spec["assignmentCoolOffSeconds"] = int64(0)
	}))
	ctl := h.start("one")

	var ips []string
	t.Run("creates desiredIPs and writes them to spec.ips", func(t *testing.T) {
		eventually(t, 30*time.Second, "spec.ips has 2 IPs", func() error {
			p := h.pool("ingress-pool")
			if len(p.Spec.IPs) != 2 {
				return fmt.Errorf("spec.ips = %v", p.Spec.IPs)
			}
			// In FLIPOP's order: the IP created last goes out first, so
			// ips[0] is a's and ips[1] is b's.
			ips = []string{p.Spec.IPs[1], p.Spec.IPs[0]}
			return nil
		})
		if n := h.do.Count("POST", "/v2/reserved_ips"); n < 2 {
			t.Fatalf("POST /v2/reserved_ips made %d times", n)
		}
		if n := h.do.Count("POST", "/v2/reserved_ips") - h.assignCalls(); n != 2 {
			t.Fatalf("created %d reserved IPs, want exactly 2", n)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("initial assignment sorted by node name", func(t *testing.T) {
		eventually(t, 30*time.Second, "both IPs active", func() error {
			p := h.pool("ingress-pool")
			got := activeNodes(p)
			if got[ips[0]] != na || got[ips[1]] != nb {
				return fmt.Errorf("active: %v, status %+v", got, p.Status)
			}
			if !slices.Equal(p.Status.AssignableNodes, []string{nc}) {
				return fmt.Errorf("assignableNodes = %v, want [%s]", p.Status.AssignableNodes, nc)
			}
			return nil
		})
		if d, _ := h.do.Holder(ips[0]); d != 101 {
			t.Errorf("%s on droplet %d, want 101", ips[0], d)
		}
		if d, _ := h.do.Holder(ips[1]); d != 102 {
			t.Errorf("%s on droplet %d, want 102", ips[1], d)
		}
		if got := h.annotation(na); got != ips[0] {
			t.Errorf("annotation of %s = %q, want %s", na, got, ips[0])
		}
		if got := h.annotation(nb); got != ips[1] {
			t.Errorf("annotation of %s = %q, want %s", nb, got, ips[1])
		}
		if got := h.annotation(nc); got != "" {
			t.Errorf("annotation of %s = %q, want none", nc, got)
		}
		if n := h.assignCalls(); n != 2 {
			t.Errorf("assign calls = %d, want 2", n)
		}
		want := sortedUnique([]string{ips[0] + "/120", ips[1] + "/120"})
		eventually(t, 10*time.Second, "DNS hello-world holds the active IPs", func() error {
			if got := h.doRecords("hello-world"); !slices.Equal(got, want) {
				return fmt.Errorf("records %v, want %v", got, want)
			}
			return nil
		})
		eventually(t, 5*time.Second, "metrics", func() error {
			v, err := metricValue(ctl.reg, "flipop_floatingippoolcontroller_ip_node",
				map[string]string{"ip": ips[0], "node": na, "provider_id": "digitalocean://101", "namespace": h.ns, "name": "ingress-pool"})
			if err != nil || v != 1 {
				return fmt.Errorf("ip_node = %v, %v", v, err)
			}
			v, err = metricValue(ctl.reg, "flipop_providers_calls_total",
				map[string]string{"provider": "digitalocean", "call": "AssignIP", "outcome": "success", "kind": "FloatingIPPool"})
			if err != nil || v != 2 {
				return fmt.Errorf("AssignIP success calls = %v, %v", v, err)
			}
			return nil
		})
	})
	if t.Failed() {
		return
	}

	t.Run("tolerated unschedulable taint keeps the IP", func(t *testing.T) {
		before := h.assignCalls()
		h.updateNode(na, func(n *corev1.Node) {
			n.Spec.Unschedulable = true
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule})
		})
		never(t, 3*time.Second, "IP stays on tolerated node", func() error {
			if n := h.assignCalls(); n != before {
				return fmt.Errorf("assign calls went from %d to %d", before, n)
			}
			if got := h.annotation(na); got != ips[0] {
				return fmt.Errorf("annotation of %s = %q", na, got)
			}
			return nil
		})
	})

	t.Run("taint not tolerated moves the IP", func(t *testing.T) {
		before := h.assignCalls()
		h.updateNode(na, func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoExecute})
		})
		eventually(t, 30*time.Second, "IP moved from a to c", func() error {
			p := h.pool("ingress-pool")
			got := activeNodes(p)
			if got[ips[0]] != nc || got[ips[1]] != nb {
				return fmt.Errorf("active: %v", got)
			}
			if h.annotation(na) != "" || h.annotation(nc) != ips[0] {
				return fmt.Errorf("annotations a=%q c=%q", h.annotation(na), h.annotation(nc))
			}
			return nil
		})
		if d, _ := h.do.Holder(ips[0]); d != 103 {
			t.Errorf("%s on droplet %d, want 103", ips[0], d)
		}
		if n := h.assignCalls() - before; n != 1 {
			t.Errorf("assign calls for the move = %d, want 1 (never an unassign)", n)
		}
		if n := h.do.Count("DELETE", "/v2/reserved_ips"); n != 0 {
			t.Errorf("reserved IPs deleted %d times", n)
		}
	})

	t.Run("pod unready moves the IP back to a", func(t *testing.T) {
		h.updateNode(na, func(n *corev1.Node) { n.Spec.Taints = nil; n.Spec.Unschedulable = false })
		eventually(t, 10*time.Second, "a is assignable again", func() error {
			if p := h.pool("ingress-pool"); !slices.Equal(p.Status.AssignableNodes, []string{na}) {
				return fmt.Errorf("assignableNodes = %v", p.Status.AssignableNodes)
			}
			return nil
		})
		before := h.assignCalls()
		h.setPodReady("ingress-b", false)
		eventually(t, 30*time.Second, "b's IP moved to a", func() error {
			got := activeNodes(h.pool("ingress-pool"))
			if got[ips[1]] != na || got[ips[0]] != nc {
				return fmt.Errorf("active: %v", got)
			}
			if h.annotation(nb) != "" || h.annotation(na) != ips[1] {
				return fmt.Errorf("annotations b=%q a=%q", h.annotation(nb), h.annotation(na))
			}
			return nil
		})
		if n := h.assignCalls() - before; n != 1 {
			t.Errorf("assign calls = %d, want 1", n)
		}
		want := sortedUnique([]string{ips[0] + "/120", ips[1] + "/120"})
		eventually(t, 10*time.Second, "DNS unchanged set", func() error {
			if got := h.doRecords("hello-world"); !slices.Equal(got, want) {
				return fmt.Errorf("records %v, want %v", got, want)
			}
			return nil
		})
	})

	t.Run("restart makes no assign call", func(t *testing.T) {
		ctl.stop(t)
		before := h.assignCalls()
		readsBefore := h.do.Count("GET", "/v2/reserved_ips/")
		ctl = h.start("two")
		eventually(t, 30*time.Second, "new controller read both IPs", func() error {
			if n := h.do.Count("GET", "/v2/reserved_ips/") - readsBefore; n < 2 {
				return fmt.Errorf("%d reads", n)
			}
			return nil
		})
		never(t, 3*time.Second, "no assign after restart", func() error {
			if n := h.assignCalls(); n != before {
				return fmt.Errorf("assign calls went from %d to %d", before, n)
			}
			got := activeNodes(h.pool("ingress-pool"))
			if got[ips[1]] != na || got[ips[0]] != nc {
				return fmt.Errorf("active: %v", got)
			}
			return nil
		})
	})
}
