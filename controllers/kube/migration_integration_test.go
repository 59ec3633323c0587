package kube

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipd/vipd/internal/fakecf"
	"github.com/vipd/vipd/internal/fakedo"
)

// writeStatus sets an object's status subresource as another controller
// (FLIPOP) would have.
func (h *harness) writeStatus(res string, name string, status any) {
	h.t.Helper()
	gvr := FloatingIPPoolResource
	if res == NodeDNSRecordSetResource.Resource {
		gvr = NodeDNSRecordSetResource
	}
	u, err := h.dyn.Resource(gvr).Namespace(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	b, err := json.Marshal(status)
	if err != nil {
		h.t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		h.t.Fatal(err)
	}
	u.Object["status"] = st
	if _, err := h.dyn.Resource(gvr).Namespace(h.ns).UpdateStatus(h.ctx, u, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestMigrationFromFLIPOP is the migration guide's promise (see
// docs/kubernetes.md): a cluster where FLIPOP ran (reserved IPs assigned,
// nodes annotated, status written, DNS records in place at DigitalOcean and
// Cloudflare) is taken over by vipd's controllers with no assign call, no
// DNS write, no annotation change and the same status.
func TestMigrationFromFLIPOP(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	na := h.node("a", 801, "198.51.100.81")
	nb := h.node("b", 802, "198.51.100.82")
	nc := h.node("c", 803, "198.51.100.83")
	for _, n := range []string{na, nb, nc} {
		h.pod("ingress-"+strings.TrimPrefix(n, h.id+"-"), n, true)
	}

	// What FLIPOP left: its pairing (the last IP listed to the first node
	// by name), annotations, status, records.
	h.do.AddReservedIP("192.0.2.81", 802)
	h.do.AddReservedIP("192.0.2.82", 801)
	h.annotate(na, "192.0.2.82")
	h.annotate(nb, "192.0.2.81")
	h.apply(h.example("floatingippool.yaml", func(spec map[string]any) {
		spec["ips"] = []any{"192.0.2.81", "192.0.2.82"}
		spec["desiredIPs"] = int64(2)
	}))
	poolStatus := FloatingIPPoolStatus{
		IPs: map[string]IPStatus{
			"192.0.2.81": {State: IPStateActive, NodeName: nb, ProviderID: "digitalocean://802"},
			"192.0.2.82": {State: IPStateActive, NodeName: na, ProviderID: "digitalocean://801"},
		},
		AssignableNodes: []string{nc},
	}
	h.writeStatus(FloatingIPPoolResource.Resource, "ingress-pool", poolStatus)
	for _, ip := range []string{"192.0.2.81", "192.0.2.82"} {
		h.do.AddRecord("example.com", fakedo.Record{Type: "A", Name: "hello-world", Data: ip, TTL: 120})
	}
	// FLIPOP's NodeDNSRecordSet as FLIPOP's CRD requires it
	// (dnsRecordSet.provider set), external addresses of the pod nodes.
	nodes := h.example("nodednsrecordset.yaml", func(spec map[string]any) {
		delete(spec, "provider")
		spec["dnsRecordSet"].(map[string]any)["provider"] = "digitalocean"
	})
	h.apply(nodes)
	h.writeStatus(NodeDNSRecordSetResource.Resource, "ingress-nodes", NodeDNSRecordSetStatus{State: DNSStateActive})
	for _, ip := range []string{"198.51.100.81", "198.51.100.82", "198.51.100.83"} {
		h.do.AddRecord("example.com", fakedo.Record{Type: "A", Name: "nodes", Data: ip, TTL: 120})
	}
	// The reserved IPs published with Cloudflare, zone given by its ID as
	// FLIPOP requires; the user proxies one of the records.
	reserved := h.example("nodednsrecordset-reserved-ip.yaml", func(spec map[string]any) {
		spec["dnsRecordSet"].(map[string]any)["zone"] = h.cfZ
	})
	h.apply(reserved)
	h.writeStatus(NodeDNSRecordSetResource.Resource, "ingress-reserved", NodeDNSRecordSetStatus{State: DNSStateActive})
	h.cf.AddRecord(h.cfZ, fakecf.Record{Type: "A", Name: "ingress.example.com", Content: "192.0.2.81", TTL: 120})
	h.cf.AddRecord(h.cfZ, fakecf.Record{Type: "A", Name: "ingress.example.com", Content: "192.0.2.82", Proxied: true})
	cfBefore := h.cf.Records(h.cfZ)
	doBefore := h.do.Records("example.com")
	rv := map[string]string{}
	for _, n := range []string{na, nb, nc} {
		node, err := h.kc.CoreV1().Nodes().Get(h.ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv[n] = node.ResourceVersion
	}

	// FLIPOP's Deployment is gone; vipd-controllers start.
	ctl := h.start("vipd")
	eventually(t, 30*time.Second, "vipd read the IPs and every record set", func() error {
		if n := h.do.Count(http.MethodGet, "/v2/reserved_ips/"); n < 2 {
			return fmt.Errorf("%d reserved IP reads", n)
		}
		if n := h.do.Count(http.MethodGet, "/v2/domains/example.com/records"); n < 2 {
			return fmt.Errorf("%d DigitalOcean record lists", n)
		}
		if n := h.cf.Count(http.MethodGet, "/zones/"+h.cfZ+"/dns_records"); n < 1 {
			return fmt.Errorf("%d Cloudflare record lists", n)
		}
		_, err := metricValue(ctl.reg, "flipop_nodednsrecordset_records", map[string]string{"name": "ingress-reserved"})
		return err
	})
	never(t, 3*time.Second, "nothing moves", func() error {
		if n := h.assignCalls(); n != 0 {
			return fmt.Errorf("%d assign calls", n)
		}
		for _, r := range h.do.Requests() {
			if r.Method != http.MethodGet {
				return fmt.Errorf("DigitalOcean write %s %s", r.Method, r.Path)
			}
		}
		for _, r := range h.cf.Requests() {
			if r.Method != http.MethodGet {
				return fmt.Errorf("Cloudflare write %s %s %s", r.Method, r.Path, r.Body)
			}
		}
		for n, want := range rv {
			node, err := h.kc.CoreV1().Nodes().Get(h.ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if node.ResourceVersion != want {
				return fmt.Errorf("node %s written (annotations %v)", n, node.Annotations)
			}
		}
		return nil
	})
	got := h.pool("ingress-pool").Status
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(poolStatus)
	if string(a) != string(b) {
		t.Errorf("pool status changed:\n%s\nFLIPOP wrote:\n%s", a, b)
	}
	for _, name := range []string{"ingress-nodes", "ingress-reserved"} {
		if st := h.recordSet(name).Status; st != (NodeDNSRecordSetStatus{State: DNSStateActive}) {
			t.Errorf("%s status %+v", name, st)
		}
	}
	if fmt.Sprint(h.cf.Records(h.cfZ)) != fmt.Sprint(cfBefore) || fmt.Sprint(h.do.Records("example.com")) != fmt.Sprint(doBefore) {
		t.Errorf("records changed")
	}
	for _, ip := range []string{"192.0.2.81", "192.0.2.82"} {
		v, err := metricValue(ctl.reg, "flipop_floatingippoolcontroller_ip_assignments", map[string]string{"ip": ip})
		if err != nil || v != 0 {
			t.Errorf("ip_assignments{ip=%s} = %v (%v), want a 0 series", ip, v, err)
		}
	}
}
