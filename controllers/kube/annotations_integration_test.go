package kube

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

func (h *harness) annotate(node, ip string) {
	h.t.Helper()
	if _, err := h.kc.CoreV1().Nodes().Patch(h.ctx, node, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+ReservedIPAnnotation+`":"`+ip+`"}}}`), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestStaleAnnotationRemoved is the bug of issue 15: a node that leaves the
// pool's nodeLabel selector (label removed) loses the reserved-IP
// annotation as the IP moves on, so a NodeDNSRecordSet publishing the
// annotation stops publishing it; likewise when a node stops being Ready.
// An annotation naming an IP of no pool of ours is never touched.
func TestStaleAnnotationRemoved(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	na := h.node("a", 601, "198.51.100.61")
	nb := h.node("b", 602, "198.51.100.62")
	nc := h.node("c", 603, "198.51.100.63")
	foreign := h.node("foreign", 604, "198.51.100.64")
	h.annotate(foreign, "192.0.2.250") // set by someone else
	// c and foreign are not in the pool's selector.
	h.updateNode(nc, func(n *corev1.Node) { delete(n.Labels, workLabel) })
	h.updateNode(foreign, func(n *corev1.Node) { delete(n.Labels, workLabel) })
	h.apply(h.staticPool("static", "192.0.2.61"))
	set := h.example("nodednsrecordset.yaml", func(spec map[string]any) {
		m := spec["match"].(map[string]any)
		delete(m, "podNamespace")
		delete(m, "podLabel")
		m["nodeLabel"] = caseLabel + "=" + h.id // every node of the test
		spec["addressType"] = ReservedIPAnnotation
	})
	h.apply(set)
	h.start("one")
	// a is first by name.
	eventually(t, 20*time.Second, "a holds the IP, DNS publishes it", func() error {
		if got := activeNodes(h.pool("static")); got["192.0.2.61"] != na {
			return fmt.Errorf("active %v", got)
		}
		if got := h.doRecords("nodes"); !slices.Equal(got, []string{"192.0.2.250/120", "192.0.2.61/120"}) {
			return fmt.Errorf("records %v", got)
		}
		return nil
	})
	// a's label is removed: the IP moves to b, a's annotation goes, DNS
	// follows.
	h.updateNode(na, func(n *corev1.Node) { delete(n.Labels, workLabel) })
	eventually(t, 20*time.Second, "annotation left a with the IP", func() error {
		if got := activeNodes(h.pool("static")); got["192.0.2.61"] != nb {
			return fmt.Errorf("active %v", got)
		}
		if a, b := h.annotation(na), h.annotation(nb); a != "" || b != "192.0.2.61" {
			return fmt.Errorf("annotations a=%q b=%q", a, b)
		}
		if got := h.doRecords("nodes"); !slices.Equal(got, []string{"192.0.2.250/120", "192.0.2.61/120"}) {
			return fmt.Errorf("records %v", got)
		}
		return nil
	})
	// b stops being Ready and nobody else may take the IP (a and c are
	// outside the selector): the IP stays on b's droplet (never
	// unassigned), but b loses the annotation and DNS drops it.
	h.setNodeReady(nb, false)
	eventually(t, 20*time.Second, "annotation left the unready node", func() error {
		if b := h.annotation(nb); b != "" {
			return fmt.Errorf("annotation of b %q", b)
		}
		if st := h.pool("static").Status.IPs["192.0.2.61"]; st.State != IPStateNoMatch || st.ProviderID != "digitalocean://602" {
			return fmt.Errorf("status %+v", st)
		}
		if got := h.doRecords("nodes"); !slices.Equal(got, []string{"192.0.2.250/120"}) {
			return fmt.Errorf("records %v", got)
		}
		return nil
	})
	if d, _ := h.do.Holder("192.0.2.61"); d != 602 {
		t.Errorf("IP on droplet %d, want it left on 602", d)
	}
	if got := h.annotation(foreign); got != "192.0.2.250" {
		t.Errorf("foreign annotation changed to %q", got)
	}
}

// TestSharedIPReportedOnBothPools: two pools listing the same IP get a
// status error each, neither acts on that IP nor removes an annotation
// naming it, and both carry on with their other IPs; fixing one list ends
// the error.
func TestSharedIPReportedOnBothPools(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	// Pool one serves a and b, pool two c.
	na := h.nodeIn("a", 701, "198.51.100.71", "one")
	h.nodeIn("b", 702, "198.51.100.72", "one")
	h.nodeIn("c", 703, "198.51.100.73", "two")
	inGroup := func(u *unstructured.Unstructured, group string) *unstructured.Unstructured {
		m := u.Object["spec"].(map[string]any)["match"].(map[string]any)
		m["nodeLabel"] = m["nodeLabel"].(string) + ",bench/group=" + group
		return u
	}
	h.apply(inGroup(h.staticPool("one", "192.0.2.70", "192.0.2.71"), "one"))
	two := inGroup(h.staticPool("two", "192.0.2.72", "192.0.2.70"), "two")
	h.apply(two)
	// FLIPOP left the shared IP on a with its annotation (staticPool
	// registered the IPs unassigned).
	h.do.AddReservedIP("192.0.2.70", 701)
	h.annotate(na, "192.0.2.70")
	h.start("one", ControllerFloatingIPPool)
	eventually(t, 20*time.Second, "both pools report the shared IP", func() error {
		for name, other := range map[string]string{"one": "two", "two": "one"} {
			p := h.pool(name)
			want := "ip 192.0.2.70 is also listed by FloatingIPPool " + h.ns + "/" + other
			if !strings.Contains(p.Status.Error, want) {
				return fmt.Errorf("%s status.error %q, want %q", name, p.Status.Error, want)
			}
			if st := p.Status.IPs["192.0.2.70"]; st.State != IPStateError {
				return fmt.Errorf("%s shared IP status %+v", name, st)
			}
		}
		if got := activeNodes(h.pool("one")); got["192.0.2.71"] == "" {
			return fmt.Errorf("pool one's other IP not active: %v", got)
		}
		if got := activeNodes(h.pool("two")); got["192.0.2.72"] == "" {
			return fmt.Errorf("pool two's other IP not active: %v", got)
		}
		return nil
	})
	never(t, 2*time.Second, "the shared IP is left alone", func() error {
		if got := h.annotation(na); got != "192.0.2.70" {
			return fmt.Errorf("annotation of a %q", got)
		}
		for _, r := range h.do.Requests() {
			if r.Method != "GET" && strings.HasPrefix(r.Path, "/v2/reserved_ips/192.0.2.70") {
				return fmt.Errorf("shared IP used: %s %s", r.Method, r.Path)
			}
		}
		if got := activeNodes(h.pool("one")); got["192.0.2.71"] != h.id+"-b" {
			return fmt.Errorf("pool one gave its IP to %v, want b (a holds the shared IP)", got)
		}
		return nil
	})
	// Pool two drops it: pool one manages it again, the error is gone.
	two.Object["spec"].(map[string]any)["ips"] = []any{"192.0.2.72"}
	h.apply(two)
	eventually(t, 20*time.Second, "error cleared, IP managed", func() error {
		for _, name := range []string{"one", "two"} {
			if e := h.pool(name).Status.Error; e != "" {
				return fmt.Errorf("%s status.error %q", name, e)
			}
		}
		if st := h.pool("one").Status.IPs["192.0.2.70"]; st.State != IPStateActive || st.NodeName != na {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
}
