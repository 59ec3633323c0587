package kube

import (
	"bytes"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vipd/vipd/internal/fakedo"
)

// FLIPOP's test fixtures (pkg/k8stest): matching nodes carry
// system=bajor,quadrant=alpha; matching pods run in namespace star-fleet
// (here: the test's namespace) labelled vessel=runabout,class=danube; the
// pool tolerates shields=down:NoExecute and alert=red:NoSchedule, not the
// unschedulable taint.
var (
	flipNodeLabels = map[string]string{"system": "bajor", "quadrant": "alpha"}
	flipPodLabels  = map[string]string{"vessel": "runabout", "class": "danube"}
	flipNoSchedule = []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}
)

// flipNode creates a node like FLIPOP's kt.MakeNode: droplet id, Ready or
// not, FLIPOP's matching labels or not, and taints.
func (h *harness) flipNode(name string, droplet int, ready, matching bool, taints []corev1.Taint) string {
	h.t.Helper()
	full := h.id + "-" + name
	labels := map[string]string{caseLabel: h.id, "vessel": "starship", "class": "galaxy"}
	if matching {
		for k, v := range flipNodeLabels {
			labels[k] = v
		}
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: full, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: fmt.Sprintf("digitalocean://%d", droplet)},
	}
	if _, err := h.kc.CoreV1().Nodes().Create(h.ctx, n, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.do.AddDroplet(fakedo.Droplet{ID: droplet, Name: full, PublicIPv4: fmt.Sprintf("198.51.100.%d", droplet)})
	h.setNodeReady(full, ready)
	h.updateNode(full, func(n *corev1.Node) { n.Spec.Taints = taints })
	return full
}

// flipPod creates a Running pod on the node; matching gives it FLIPOP's
// matching labels.
func (h *harness) flipPod(name, node string, ready, matching bool) {
	h.t.Helper()
	labels := map[string]string{"vessel": "starship", "class": "galaxy"}
	if matching {
		labels = flipPodLabels
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/x"}}},
	}
	if _, err := h.kc.CoreV1().Pods(h.ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	cur, err := h.kc.CoreV1().Pods(h.ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	cur.Status.Phase = corev1.PodRunning
	cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	if _, err := h.kc.CoreV1().Pods(h.ns).UpdateStatus(h.ctx, cur, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// deepSpaceNine is FLIPOP's makeFloatingIPPool: IPs 192.168.1.1 and
// 172.16.2.2, record deep-space-nine.example.com with TTL 120.
func (h *harness) deepSpaceNine(edit func(spec map[string]any)) *unstructured.Unstructured {
	spec := map[string]any{
		"provider": "digitalocean",
		"region":   "alpha-quadrant",
		"ips":      []any{"192.168.1.1", "172.16.2.2"},
		"match": map[string]any{
			"nodeLabel":    "system=bajor," + caseLabel + "=" + h.id,
			"podNamespace": h.ns,
			"podLabel":     "vessel=runabout,class=danube",
			"tolerations": []any{
				map[string]any{"key": "shields", "value": "down", "operator": "Equal", "effect": "NoExecute"},
				map[string]any{"key": "alert", "value": "red", "operator": "Equal", "effect": "NoSchedule"},
			},
		},
		"dnsRecordSet": map[string]any{"zone": "example.com", "recordName": "deep-space-nine", "ttl": int64(120)},
	}
	if edit != nil {
		edit(spec)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "FloatingIPPool",
		"metadata": map[string]any{"name": "deep-space-nine", "namespace": h.ns},
		"spec":     spec,
	}}
}

// renderPoolMetrics renders the flipop_floatingippoolcontroller_* families
// as FLIPOP's tests do (renderMetrics): text format without comments, only
// the families with at least one non-zero value.
func renderPoolMetrics(reg *prometheus.Registry) (string, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "flipop_floatingippoolcontroller_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var v float64
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			}
			if v != 0 {
				if err := enc.Encode(mf); err != nil {
					return "", err
				}
				break
			}
		}
	}
	var out []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + "\n", nil
}

// TestFLIPOPControllerCases ports FLIPOP's FloatingIPPool controller cases
// (pkg/floatingip/floatingippool_controller_test.go) to the real apiserver
// and the DigitalOcean fake: the same nodes, pods, IPs and expected
// pairings, IP states, assign calls and metric texts. FLIPOP's mock
// provider ("mock", provider IDs mock://N, namespace "") becomes
// digitalocean (digitalocean://N, the test's namespace); node names carry
// the test's prefix, which keeps their order.
func TestFLIPOPControllerCases(t *testing.T) {
	type tc struct {
		name       string
		setup      func(h *harness)
		initial    map[string]int // ip -> droplet holding it at start
		created    string         // fake's pool for created IPs
		edit       func(h *harness, spec map[string]any)
		wantStates map[IPState]int
		wantPairs  map[string]string // ip -> node (short name)
		assignable int
		assigns    int
		metrics    string // FLIPOP's expected text, with {ns} {p} for the namespace and node prefix
	}
	happy := func(h *harness) {
		rio := h.flipNode("rio-grande", 1, true, true, nil)
		h.flipNode("ganges", 2, false, false, nil) // ignored
		ori := h.flipNode("orinoco", 3, true, true, flipNoSchedule)
		h.flipPod("benjamin-sisko", rio, true, true)
		h.flipPod("worf", ori, true, true)
	}
	cases := []tc{
		{
			name:       "happy path",
			setup:      happy,
			wantStates: map[IPState]int{IPStateActive: 1, IPStateUnassigned: 1},
			wantPairs:  map[string]string{"172.16.2.2": "rio-grande"},
			assigns:    1,
			metrics: `flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 1
flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 0
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",node="{p}rio-grande",provider="digitalocean",provider_id="digitalocean://1"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="unassigned"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="assigned"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="available"} 0
`,
		},
		{
			// FLIPOP's mock creates 10.0.1.1 then 10.0.2.2; the fake hands
			// out 10.0.1.1 then 10.0.1.2. The second created goes active.
			name: "create new ips",
			setup: func(h *harness) {
				rio := h.flipNode("rio-grande", 1, true, true, nil)
				h.flipPod("benjamin-sisko", rio, true, true)
			},
			created: "10.0.1.0/24",
			edit: func(h *harness, spec map[string]any) {
				spec["ips"] = []any{}
				spec["desiredIPs"] = int64(2)
			},
			wantStates: map[IPState]int{IPStateActive: 1, IPStateUnassigned: 1},
			wantPairs:  map[string]string{"10.0.1.2": "rio-grande"},
			assigns:    1,
			metrics: `flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="10.0.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 0
flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="10.0.1.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 1
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="10.0.1.2",name="deep-space-nine",namespace="{ns}",node="{p}rio-grande",provider="digitalocean",provider_id="digitalocean://1"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="10.0.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="unassigned"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="10.0.1.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="assigned"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="available"} 0
`,
		},
		{
			name:       "already has ip",
			setup:      happy,
			initial:    map[string]int{"172.16.2.2": 1},
			wantStates: map[IPState]int{IPStateActive: 1, IPStateUnassigned: 1},
			wantPairs:  map[string]string{"172.16.2.2": "rio-grande"},
			metrics: `flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",node="{p}rio-grande",provider="digitalocean",provider_id="digitalocean://1"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="unassigned"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="assigned"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="available"} 0
`,
		},
		{
			name: "no node selector",
			setup: func(h *harness) {
				rio := h.flipNode("rio-grande", 1, true, true, nil)
				gan := h.flipNode("ganges", 2, true, false, nil)
				h.flipPod("benjamin-sisko", rio, true, true)
				h.flipPod("worf", gan, true, true)
			},
			edit: func(h *harness, spec map[string]any) {
				spec["match"].(map[string]any)["nodeLabel"] = caseLabel + "=" + h.id // FLIPOP: ""
			},
			wantStates: map[IPState]int{IPStateActive: 2},
			wantPairs:  map[string]string{"172.16.2.2": "ganges", "192.168.1.1": "rio-grande"},
			assigns:    2,
			metrics: `flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 1
flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 1
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",node="{p}ganges",provider="digitalocean",provider_id="digitalocean://2"} 1
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",node="{p}rio-grande",provider="digitalocean",provider_id="digitalocean://1"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="assigned"} 2
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="available"} 0
`,
		},
		{
			name: "IP needs to be reassigned",
			setup: func(h *harness) {
				h.flipNode("rio-grande", 1, true, true, nil)
				h.flipNode("ganges", 2, false, false, nil)
				h.flipNode("orinoco", 3, true, true, flipNoSchedule)
				h.flipNode("rubicon", 4, true, true, nil)
				h.flipNode("shenandoah", 5, true, true, nil)
			},
			initial: map[string]int{"192.168.1.1": 3, "172.16.2.2": 5},
			edit: func(h *harness, spec map[string]any) {
				m := spec["match"].(map[string]any)
				delete(m, "podNamespace")
				delete(m, "podLabel")
				spec["assignmentCoolOffSeconds"] = 1.0
			},
			wantStates: map[IPState]int{IPStateActive: 2},
			wantPairs:  map[string]string{"192.168.1.1": "rio-grande", "172.16.2.2": "shenandoah"},
			assignable: 1,
			assigns:    1,
			metrics: `flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 0
flipop_floatingippoolcontroller_ip_assignments{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean"} 1
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",node="{p}shenandoah",provider="digitalocean",provider_id="digitalocean://5"} 1
flipop_floatingippoolcontroller_ip_node{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",node="{p}rio-grande",provider="digitalocean",provider_id="digitalocean://1"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="172.16.2.2",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_ip_state{dns="deep-space-nine.example.com",ip="192.168.1.1",name="deep-space-nine",namespace="{ns}",provider="digitalocean",state="active"} 1
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="assigned"} 2
flipop_floatingippoolcontroller_node_status{dns="deep-space-nine.example.com",name="deep-space-nine",namespace="{ns}",provider="digitalocean",status="available"} 1
`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			t.Parallel() // after the serial setup in newHarness
			if c.created != "" {
				do, err := fakedo.New(fakedo.Options{Token: doToken, ActionDuration: 300 * time.Millisecond, IPPool: netip.MustParsePrefix(c.created)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(do.Close)
				do.AddDomain("example.com")
				h.do = do
			}
			c.setup(h)
			for _, ip := range []string{"192.168.1.1", "172.16.2.2"} {
				if c.created == "" {
					h.do.AddReservedIP(ip, c.initial[ip])
				}
			}
			h.apply(h.deepSpaceNine(func(spec map[string]any) {
				if c.edit != nil {
					c.edit(h, spec)
				}
			}))
			ctl := h.start("one", ControllerFloatingIPPool)
			eventually(t, 30*time.Second, "FLIPOP's expected states and pairings", func() error {
				p := h.pool("deep-space-nine")
				states := map[IPState]int{}
				for _, st := range p.Status.IPs {
					states[st.State]++
				}
				if fmt.Sprint(states) != fmt.Sprint(c.wantStates) {
					return fmt.Errorf("states %v, want %v (status %+v)", states, c.wantStates, p.Status)
				}
				for ip, node := range c.wantPairs {
					if got := p.Status.IPs[ip].NodeName; got != h.id+"-"+node {
						return fmt.Errorf("%s on %q, want %s (status %+v)", ip, got, node, p.Status)
					}
				}
				if len(p.Status.AssignableNodes) != c.assignable {
					return fmt.Errorf("assignableNodes %v, want %d", p.Status.AssignableNodes, c.assignable)
				}
				return nil
			})
			if n := h.assignCalls(); n != c.assigns {
				t.Errorf("assign calls = %d, want %d", n, c.assigns)
			}
			want := strings.NewReplacer("{ns}", h.ns, "{p}", h.id+"-").Replace(c.metrics)
			eventually(t, 10*time.Second, "FLIPOP's metric text", func() error {
				got, err := renderPoolMetrics(ctl.reg)
				if err != nil {
					return err
				}
				if got != want {
					return fmt.Errorf("metrics:\n%s\nwant:\n%s", got, want)
				}
				return nil
			})
			// The DNS record set holds the active IPs, TTL 120.
			var active []string
			for ip, st := range h.pool("deep-space-nine").Status.IPs {
				if st.State == IPStateActive {
					active = append(active, ip+"/120")
				}
			}
			sort.Strings(active)
			eventually(t, 10*time.Second, "DNS written", func() error {
				if got := h.doRecords("deep-space-nine"); fmt.Sprint(got) != fmt.Sprint(active) {
					return fmt.Errorf("records %v, want %v", got, active)
				}
				return nil
			})
		})
	}
}
