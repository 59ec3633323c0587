package poolfeed

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/wire"
)

func pool(name, mode string, sel map[string]string, addrs ...string) v1alpha1.IPPool {
	p := v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.IPPoolSpec{Addresses: addrs, Mode: mode}}
	if sel != nil {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: sel}
	}
	return p
}

func alloc(addr, pool, svc string) v1alpha1.IPAllocation {
	a := v1alpha1.IPAllocation{Spec: v1alpha1.IPAllocationSpec{Address: addr, Pool: pool,
		ClaimRef: v1alpha1.ClaimRef{Kind: "Service", Namespace: "default", Name: svc}}}
	a.Name = addr
	return a
}

func node(name string, labels map[string]string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestCompute(t *testing.T) {
	f, tr := false, true
	n2 := "n2"
	n3 := "n3"
	st := State{
		Pools: []v1alpha1.IPPool{
			pool("lan", "", nil, "192.0.2.0/28", "2001:db8::10-2001:db8::20"),
			pool("edge", "bgp", map[string]string{"edge": "true"}, "198.51.100.1-198.51.100.9"),
		},
		Allocations: []v1alpha1.IPAllocation{
			alloc("192.0.2.5", "lan", "web"),
			alloc("192.0.2.99", "lan", "gone"),      // no longer in the pool
			alloc("198.51.100.3", "edge", "local"),  // ETP Local, selector
			alloc("198.51.100.4", "missing", "x"),   // pool deleted
			alloc("192.0.2.6", "lan", "local-none"), // ETP Local, no ready endpoint
			{ObjectMeta: metav1.ObjectMeta{Name: "192.0.2.7"}, Spec: v1alpha1.IPAllocationSpec{Address: "192.0.2.8", Pool: "lan"}}, // name mismatch
			{ObjectMeta: metav1.ObjectMeta{Name: "192.0.2.9"}, Spec: v1alpha1.IPAllocationSpec{Address: "192.0.2.9", Pool: "lan", // a machine's address
				ClaimRef: v1alpha1.ClaimRef{APIGroup: "ipam.cluster.x-k8s.io", Kind: "IPAddressClaim", Namespace: "default", Name: "m1"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "192.0.2.10"}, Spec: v1alpha1.IPAllocationSpec{Address: "192.0.2.10", Pool: "lan", // an EgressPolicy's egress IP
				ClaimRef: v1alpha1.ClaimRef{APIGroup: "vipd.io", Kind: "EgressPolicy", Namespace: "default", Name: "billing"}}},
		},
		Nodes: []corev1.Node{node("n1", map[string]string{"edge": "true"}), node("n2", map[string]string{"edge": "true"}), node("n3", nil)},
		Services: map[string]*corev1.Service{
			"default/local":      {Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal}},
			"default/local-none": {Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal}},
			"default/web":        {Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster}},
		},
		Slices: map[string][]*discoveryv1.EndpointSlice{
			"default/local": {{Endpoints: []discoveryv1.Endpoint{
				{NodeName: &n2, Conditions: discoveryv1.EndpointConditions{Ready: &tr}},
				{NodeName: &n3, Conditions: discoveryv1.EndpointConditions{}},          // nil: ready, but n3 lacks the label
				{NodeName: &n2, Conditions: discoveryv1.EndpointConditions{Ready: &f}}, // not ready
			}}},
			"default/local-none": {{Endpoints: []discoveryv1.Endpoint{{NodeName: &n3, Conditions: discoveryv1.EndpointConditions{Ready: &f}}}}},
		},
	}
	got, probs := Compute(st)
	want := []wire.PoolAddress{
		{Addr: mustAddr("192.0.2.5"), Pool: "lan", Mode: "l2", All: true, Service: "default/web"},
		{Addr: mustAddr("192.0.2.6"), Pool: "lan", Mode: "l2", Nodes: []string{}, Service: "default/local-none"},
		{Addr: mustAddr("198.51.100.3"), Pool: "edge", Mode: "bgp", Nodes: []string{"n2"}, Service: "default/local"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Addr != w.Addr || g.Pool != w.Pool || g.Mode != w.Mode || g.All != w.All || g.Service != w.Service || len(g.Nodes) != len(w.Nodes) ||
			len(w.Nodes) > 0 && g.Nodes[0] != w.Nodes[0] {
			t.Errorf("address %d: got %+v, want %+v", i, g, w)
		}
	}
	if len(probs) != 1 || probs[0].Object != "IPAllocation/192.0.2.7" {
		t.Fatalf("problems %+v", probs)
	}
}

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in, in2, out string
		ok           bool
	}{
		{"10.0.0.0/30", "10.0.0.3", "10.0.0.4", true},
		{"10.0.0.5-10.0.0.7", "10.0.0.7", "10.0.0.8", true},
		{"fd00::/126", "fd00::3", "fd00::4", true},
		{"10.0.0.7-10.0.0.5", "", "", false},
		{"10.0.0.1-fd00::1", "", "", false},
		{"nonsense", "", "", false},
	} {
		r, err := parseRange(tc.in)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: err %v", tc.in, err)
		}
		if !tc.ok {
			continue
		}
		if !r.contains(mustAddr(tc.in2)) || r.contains(mustAddr(tc.out)) {
			t.Fatalf("%s: contains(%s)=%v contains(%s)=%v", tc.in, tc.in2, r.contains(mustAddr(tc.in2)), tc.out, r.contains(mustAddr(tc.out)))
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
