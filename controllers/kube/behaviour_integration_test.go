package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipd/vipd/internal/fakecf"
	"github.com/vipd/vipd/internal/fakedo"
)

// staticPool is FLIPOP's example pool with fixed IPs and no pod criteria.
func (h *harness) staticPool(name string, ips ...string) *unstructured.Unstructured {
	u := h.example("floatingippool.yaml", func(spec map[string]any) {
		list := make([]any, 0, len(ips))
		for _, ip := range ips {
			list = append(list, ip)
			h.do.AddReservedIP(ip, 0)
		}
		spec["ips"] = list
		delete(spec, "desiredIPs")
		spec["assignmentCoolOffSeconds"] = int64(0)
		m := spec["match"].(map[string]any)
		delete(m, "podNamespace")
		delete(m, "podLabel")
	})
	u.SetName(name)
	return u
}

func TestProviderErrorsAndRecovery(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	na := h.node("a", 201, "198.51.100.21")
	nb := h.node("b", 202, "198.51.100.22")
	// Three assign attempts fail with 500 (retried after 1s, 1s, 5s);
	// reads keep working.
	h.do.AddFault(fakedo.Fault{Method: "POST", Path: "/v2/reserved_ips/192.0.2.21/actions", Status: 500, Count: 3})
	h.apply(h.staticPool("static", "192.0.2.21", "192.0.2.22"))
	ctl := h.start("one")

	eventually(t, 15*time.Second, "error is reported in status", func() error {
		p := h.pool("static")
		st := p.Status.IPs["192.0.2.21"]
		if st.State != IPStateError || !strings.Contains(st.Error, "assigning IP to node") {
			return fmt.Errorf("192.0.2.21 status %+v", st)
		}
		if len(p.Status.NodeErrors) != 1 {
			return fmt.Errorf("nodeErrors %v", p.Status.NodeErrors)
		}
		return nil
	})
	// Recovery: the fault is used up; fast backoff retries; both nodes end
	// up with an IP (no node left behind after the error).
	eventually(t, 30*time.Second, "both nodes active after recovery", func() error {
		p := h.pool("static")
		got := activeNodes(p)
		nodes := []string{got["192.0.2.21"], got["192.0.2.22"]}
		slices.Sort(nodes)
		if !slices.Equal(nodes, []string{na, nb}) {
			return fmt.Errorf("active %v, status %+v", got, p.Status)
		}
		if len(p.Status.NodeErrors) != 0 || p.Status.IPs["192.0.2.21"].Error != "" {
			return fmt.Errorf("errors remain: %+v", p.Status)
		}
		return nil
	})
	if n := h.assignCalls(); n != 5 {
		t.Errorf("assign calls = %d, want 5 (3 failed + 2 good)", n)
	}
	v, err := metricValue(ctl.reg, "flipop_providers_calls_total",
		map[string]string{"provider": "digitalocean", "call": "AssignIP", "outcome": "error"})
	if err != nil || v != 3 {
		t.Errorf("AssignIP error calls metric = %v (%v), want 3", v, err)
	}
	v, err = metricValue(ctl.reg, "flipop_floatingippoolcontroller_ip_assignment_errors", map[string]string{"ip": "192.0.2.21"})
	if err != nil || v != 3 {
		t.Errorf("ip_assignment_errors = %v (%v), want 3", v, err)
	}

	// DNS errors: a record write failing is reported and retried.
	h.do.AddFault(fakedo.Fault{Method: "POST", Path: "/v2/domains/example.com/records", Status: 503, Count: 1})
	set := h.example("nodednsrecordset.yaml", func(spec map[string]any) {
		m := spec["match"].(map[string]any)
		delete(m, "podNamespace")
		delete(m, "podLabel")
	})
	h.apply(set)
	eventually(t, 30*time.Second, "records written after the 503", func() error {
		got := h.doRecords("nodes")
		if !slices.Equal(got, []string{"198.51.100.21/120", "198.51.100.22/120"}) {
			return fmt.Errorf("records %v", got)
		}
		if s := h.recordSet("ingress-nodes"); s.Status.State != DNSStateActive || s.Status.Error != "" {
			return fmt.Errorf("status %+v", s.Status)
		}
		return nil
	})
	// The 503 hit whichever record set wrote first; both end up right.
	eventually(t, 30*time.Second, "pool record set recovered", func() error {
		if got := h.doRecords("hello-world"); !slices.Equal(got, []string{"192.0.2.21/120", "192.0.2.22/120"}) {
			return fmt.Errorf("records %v", got)
		}
		if e := h.pool("static").Status.Error; e != "" {
			return fmt.Errorf("pool status.error %q", e)
		}
		return nil
	})
	var dnsErrors float64
	for _, kind := range []string{"FloatingIPPool", "NodeDNSRecordSet"} {
		v, _ := metricValue(ctl.reg, "flipop_providers_calls_total",
			map[string]string{"provider": "digitalocean", "call": "EnsureDNSARecordSet", "outcome": "error", "kind": kind})
		dnsErrors += v
	}
	if dnsErrors != 1 {
		t.Errorf("EnsureDNSARecordSet error calls = %v, want 1", dnsErrors)
	}
}

func TestOnlyTheLeaderActs(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	na := h.node("a", 301, "198.51.100.31")
	h.apply(h.staticPool("static", "192.0.2.31", "192.0.2.32"))
	first := h.start("first")
	// FLIPOP's order: the last IP listed goes out first.
	eventually(t, 20*time.Second, "first instance assigns", func() error {
		if got := activeNodes(h.pool("static")); got["192.0.2.32"] != na {
			return fmt.Errorf("active %v", got)
		}
		return nil
	})
	second := h.start("second")
	lease := func() string {
		l, err := h.kc.CoordinationV1().Leases("flipop").Get(context.Background(), "lease-"+h.id, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	if got := lease(); got != "first" {
		t.Fatalf("lease held by %q, want first", got)
	}
	// A new node: only the leader assigns, exactly once.
	before := h.assignCalls()
	nb := h.node("b", 302, "198.51.100.32")
	eventually(t, 20*time.Second, "new node gets the second IP", func() error {
		if got := activeNodes(h.pool("static")); got["192.0.2.31"] != nb {
			return fmt.Errorf("active %v", got)
		}
		return nil
	})
	never(t, 2*time.Second, "one assign for one node", func() error {
		if n := h.assignCalls() - before; n != 1 {
			return fmt.Errorf("assign calls %d, want 1", n)
		}
		return nil
	})
	if _, err := metricValue(second.reg, "flipop_floatingippoolcontroller_ip_state", nil); err == nil {
		t.Errorf("standby instance exports pool metrics; it must not run controllers")
	}

	// The leader stops (releasing the lease); the standby takes over and
	// acts on the next change without re-assigning what is in place.
	first.stop(t)
	eventually(t, 15*time.Second, "second takes the lease", func() error {
		if got := lease(); got != "second" {
			return fmt.Errorf("lease holder %q", got)
		}
		return nil
	})
	before = h.assignCalls()
	h.setNodeReady(na, false)
	h.node("c", 303, "198.51.100.33")
	nc := h.id + "-c"
	eventually(t, 20*time.Second, "IP of the unready node moves to c", func() error {
		if got := activeNodes(h.pool("static")); got["192.0.2.32"] != nc || got["192.0.2.31"] != nb {
			return fmt.Errorf("active %v", got)
		}
		return nil
	})
	if n := h.assignCalls() - before; n != 1 {
		t.Errorf("assign calls after takeover = %d, want 1", n)
	}
}

func TestBadObjectsGetStatusErrors(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	h.node("a", 401, "198.51.100.41")
	mk := func(name string, edit func(spec map[string]any)) {
		u := h.staticPool(name, "192.0.2.41")
		spec := u.Object["spec"].(map[string]any)
		edit(spec)
		h.apply(u)
	}
	mk("unknown-provider", func(s map[string]any) { s["provider"] = "nope" })
	mk("dns-only-provider", func(s map[string]any) { s["provider"] = "cloudflare" })
	mk("no-ips", func(s map[string]any) { s["ips"] = []any{} })
	mk("bad-selector", func(s map[string]any) { s["match"].(map[string]any)["nodeLabel"] = "a=b=c" })
	// FLIPOP's CRD accepts IPv6 and leading zeros; vipd runs the pool and
	// reports such an entry as an error of that IP.
	mk("ipv6", func(s map[string]any) { s["ips"] = []any{"2001:db8::1", "010.0.0.1"} })
	badSet := h.example("nodednsrecordset.yaml", func(spec map[string]any) {
		spec["dnsRecordSet"].(map[string]any)["zone"] = ""
	})
	badSet.SetName("no-zone")
	h.apply(badSet)
	badProv := h.example("nodednsrecordset.yaml", func(spec map[string]any) { spec["provider"] = "route53" })
	badProv.SetName("bad-provider")
	h.apply(badProv)
	// A good pool next to them still works.
	h.apply(h.staticPool("good", "192.0.2.42"))
	h.start("one")

	want := map[string]string{
		"unknown-provider":  `unknown provider "nope"`,
		"dns-only-provider": `provider "cloudflare" does not provide floating IPs`,
		"no-ips":            "ips or desiredIPs must be provided",
		"bad-selector":      "Error parsing node selector",
	}
	eventually(t, 20*time.Second, "status errors", func() error {
		for name, msg := range want {
			if got := h.pool(name).Status.Error; !strings.Contains(got, msg) {
				return fmt.Errorf("%s: status.error %q, want %q", name, got, msg)
			}
		}
		for _, ip := range []string{"2001:db8::1", "010.0.0.1"} {
			if st := h.pool("ipv6").Status.IPs[ip]; st.State != IPStateError || !strings.Contains(st.Error, "not an IPv4 address") {
				return fmt.Errorf("ipv6 pool: %s status %+v", ip, st)
			}
		}
		if s := h.recordSet("no-zone").Status; s.State != DNSStateError || s.Error != "invalid dnsRecordSet specification" {
			return fmt.Errorf("no-zone status %+v", s)
		}
		if s := h.recordSet("bad-provider").Status; s.State != DNSStateError || s.Error != `unknown provider "route53"` {
			return fmt.Errorf("bad-provider status %+v", s)
		}
		if got := activeNodes(h.pool("good")); got["192.0.2.42"] != h.id+"-a" {
			return fmt.Errorf("good pool active %v", got)
		}
		return nil
	})
	// Only the good pool made calls.
	if n := h.assignCalls(); n != 1 {
		t.Errorf("assign calls = %d, want 1", n)
	}
}

func TestNodeDNSRecordSet(t *testing.T) {
	h := newHarness(t)
	t.Parallel() // after the serial setup in newHarness
	na := h.node("a", 501, "198.51.100.51")
	nb := h.node("b", 502, "198.51.100.52")
	h.pod("ingress-a", na, true)
	h.pod("ingress-b", nb, true)
	annotate := func(node, ip string) {
		t.Helper()
		if _, err := h.kc.CoreV1().Nodes().Patch(h.ctx, node, types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+ReservedIPAnnotation+`":"`+ip+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(na, "192.0.2.51")
	// FLIPOP's README form: spec.provider at the top level.
	h.apply(h.example("nodednsrecordset.yaml", nil))
	// Reserved-IP addresses, with Cloudflare, zone given by name.
	h.apply(h.example("nodednsrecordset-reserved-ip.yaml", nil))
	// Existing Cloudflare records: a proxied one for a wanted IP (the
	// user's choice: kept as it is) and a stale one.
	keepID := h.cf.AddRecord(h.cfZ, fakecf.Record{Type: "A", Name: "ingress.example.com", Content: "192.0.2.51", TTL: 300, Proxied: true})
	h.cf.AddRecord(h.cfZ, fakecf.Record{Type: "A", Name: "ingress.example.com", Content: "192.0.2.99", TTL: 120})
	ctl := h.start("one", ControllerNodeDNSRecordSet)

	eventually(t, 20*time.Second, "external IPv4 of ready nodes with ready pods", func() error {
		if got := h.doRecords("nodes"); !slices.Equal(got, []string{"198.51.100.51/120", "198.51.100.52/120"}) {
			return fmt.Errorf("records %v", got)
		}
		if s := h.recordSet("ingress-nodes").Status; s.State != DNSStateActive {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	cfSet := func(want ...string) func() error {
		return func() error {
			var got []string
			for _, r := range h.cf.Records(h.cfZ) {
				proxied := r.ID == keepID
				if r.Proxied != proxied || (!proxied && r.TTL != 120) || r.Name != "ingress.example.com" {
					return fmt.Errorf("record %+v", r)
				}
				got = append(got, r.Content)
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("records %v, want %v", got, want)
			}
			return nil
		}
	}
	eventually(t, 20*time.Second, "cloudflare set from annotations", cfSet("192.0.2.51"))
	if recs := h.cf.Records(h.cfZ); recs[0].ID != keepID {
		t.Errorf("record for a wanted IP was replaced (id %s, want %s kept)", recs[0].ID, keepID)
	}
	// The status is written right after the records.
	eventually(t, 5*time.Second, "cloudflare set active", func() error {
		if s := h.recordSet("ingress-reserved").Status; s.State != DNSStateActive {
			return fmt.Errorf("cloudflare set status %+v", s)
		}
		return nil
	})
	annotate(nb, "192.0.2.52")
	eventually(t, 20*time.Second, "annotation change reaches DNS", cfSet("192.0.2.51", "192.0.2.52"))

	h.setPodReady("ingress-b", false)
	eventually(t, 20*time.Second, "unready pod drops b", func() error {
		if got := h.doRecords("nodes"); !slices.Equal(got, []string{"198.51.100.51/120"}) {
			return fmt.Errorf("records %v", got)
		}
		return nil
	})
	h.setNodeReady(na, false)
	eventually(t, 20*time.Second, "empty set deletes the records", func() error {
		if got := h.doRecords("nodes"); len(got) != 0 {
			return fmt.Errorf("records %v", got)
		}
		return nil
	})
	eventually(t, 5*time.Second, "records metric", func() error {
		v, err := metricValue(ctl.reg, "flipop_nodednsrecordset_records", map[string]string{"name": "ingress-nodes", "dns": "nodes.example.com"})
		if err != nil || v != 0 {
			return fmt.Errorf("records metric = %v (%v), want 0", v, err)
		}
		v, err = metricValue(ctl.reg, "flipop_providers_calls_total",
			map[string]string{"provider": "cloudflare", "call": "EnsureDNSARecordSet", "outcome": "success", "kind": "NodeDNSRecordSet", "name": "ingress-reserved"})
		if err != nil || v < 2 {
			return fmt.Errorf("cloudflare calls = %v (%v)", v, err)
		}
		return nil
	})
	// Cloudflare's set only needs ready nodes: a is unready now.
	eventually(t, 20*time.Second, "unready node leaves the cloudflare set", cfSet("192.0.2.52"))
}
