package kube

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

func TestDNSSyncDebounceResyncAndRetry(t *testing.T) {
	timing := dnsTiming{Debounce: 2 * time.Second, MaxDelay: 10 * time.Second, Resync: time.Minute}
	var s dnsSync
	a := []string{"1.1.1.1"}
	ab := []string{"1.1.1.1", "2.2.2.2"}

	if w, at := s.decide(a, t0, timing); w || !at.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("first change: write=%v at=%v, want wait for the debounce", w, at)
	}
	// Churn: the set keeps changing every second; the write waits, but
	// never beyond MaxDelay.
	for i := 1; i < 10; i++ {
		want := a
		if i%2 == 1 {
			want = ab
		}
		if w, _ := s.decide(want, t0.Add(time.Duration(i)*time.Second), timing); w {
			t.Fatalf("wrote during churn at %ds", i)
		}
	}
	if w, _ := s.decide(ab, t0.Add(10*time.Second), timing); !w {
		t.Fatal("no write at MaxDelay despite churn")
	}
	s.done(nil, t0.Add(10*time.Second))
	// Unchanged: nothing until the resync.
	if w, at := s.decide(ab, t0.Add(20*time.Second), timing); w || !at.Equal(t0.Add(70*time.Second)) {
		t.Fatalf("unchanged: write=%v at=%v, want resync at +70s", w, at)
	}
	if w, _ := s.decide(ab, t0.Add(70*time.Second), timing); !w {
		t.Fatal("no resync write")
	}
	// A failed write backs off (fast ladder: 1s) and is retried even
	// though the set is unchanged.
	s.done(&apiError{Status: 503}, t0.Add(70*time.Second))
	if w, at := s.decide(ab, t0.Add(70500*time.Millisecond), timing); w || !at.Equal(t0.Add(71*time.Second)) {
		t.Fatalf("after error: write=%v at=%v", w, at)
	}
	if w, _ := s.decide(ab, t0.Add(71*time.Second), timing); !w {
		t.Fatal("no retry after the backoff")
	}
	s.done(nil, t0.Add(71*time.Second))
	if s.lastErr != nil || s.retry.attempts != 0 {
		t.Fatal("success did not reset the backoff")
	}
	// A stable change is written after the debounce.
	if w, _ := s.decide(a, t0.Add(80*time.Second), timing); w {
		t.Fatal("wrote a change immediately")
	}
	if w, _ := s.decide(a, t0.Add(82*time.Second), timing); !w {
		t.Fatal("stable change not written after the debounce")
	}
}

func TestPlanRecords(t *testing.T) {
	tests := []struct {
		name     string
		existing []dnsRecord
		want     []string
		plan     recordPlan
	}{
		{"create all", nil, []string{"1.1.1.1", "2.2.2.2"}, recordPlan{Create: []string{"1.1.1.1", "2.2.2.2"}}},
		{"nothing to do", []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 60}}, []string{"1.1.1.1"}, recordPlan{}},
		{"ttl fix", []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 300}}, []string{"1.1.1.1"},
			recordPlan{Update: []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 60}}}},
		{"proxied record kept (its TTL is automatic)", []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 1, Proxied: true}}, []string{"1.1.1.1"},
			recordPlan{}},
		{"reuse stale record", []dnsRecord{{ID: "1", IP: "9.9.9.9", TTL: 60}}, []string{"1.1.1.1"},
			recordPlan{Update: []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 60}}}},
		{"delete leftovers and duplicates", []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 60}, {ID: "2", IP: "1.1.1.1", TTL: 60}, {ID: "3", IP: "8.8.8.8", TTL: 60}},
			[]string{"1.1.1.1"}, recordPlan{Delete: []string{"2", "3"}}},
		{"empty set deletes all", []dnsRecord{{ID: "1", IP: "1.1.1.1", TTL: 60}}, nil, recordPlan{Delete: []string{"1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planRecords(tt.existing, tt.want, 60)
			if !slices.Equal(got.Update, tt.plan.Update) || !slices.Equal(got.Create, tt.plan.Create) || !slices.Equal(got.Delete, tt.plan.Delete) {
				t.Fatalf("plan %+v, want %+v", got, tt.plan)
			}
		})
	}
}

func TestParseControllers(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{"", nil, false},
		{"none", nil, false},
		{"floatingippool", []string{"floatingippool"}, false},
		{" FloatingIPPool , nodednsrecordset,floatingippool", []string{"floatingippool", "nodednsrecordset"}, false},
		{"floatingippool,dns", nil, true},
		{"services,ipam", []string{"services", "ipam"}, false},
		{"nodednsrecordset, services", []string{"nodednsrecordset", "services"}, false},
		{"service", nil, true},
		{"cordon", []string{"cordon"}, false},
		{"services,cordon", []string{"services", "cordon"}, false},
	}
	for _, tt := range tests {
		got, err := ParseControllers(tt.in)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("ParseControllers(%q) = %v, %v", tt.in, got, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "VIPD_CONTROLLERS") || !strings.Contains(err.Error(), "nodednsrecordset")) {
			t.Errorf("error %q must name the variable and the accepted values", err)
		}
	}
}

func readyNode(name string, mut func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "work"}},
		Spec:       corev1.NodeSpec{ProviderID: "digitalocean://1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "198.51.100.1"}, {Type: corev1.NodeExternalIP, Address: "2001:db8::1"},
				{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}},
	}
	if mut != nil {
		mut(n)
	}
	return n
}

func TestMatcherNodes(t *testing.T) {
	m, err := newMatcher(Match{NodeLabel: "pool=work", Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	tests := []struct {
		name string
		mut  func(*corev1.Node)
		want bool
	}{
		{"ready", nil, true},
		{"not ready", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, false},
		{"no ready condition", func(n *corev1.Node) { n.Status.Conditions = nil }, false},
		{"no provider id", func(n *corev1.Node) { n.Spec.ProviderID = "" }, false},
		{"deleting", func(n *corev1.Node) { n.DeletionTimestamp = &now }, false},
		{"label mismatch", func(n *corev1.Node) { n.Labels["pool"] = "other" }, false},
		{"tolerated cordon", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}
		}, true},
		{"untolerated PreferNoSchedule", func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, false},
	}
	for _, tt := range tests {
		if got := m.nodeMatches(readyNode("n", tt.mut)); got != tt.want {
			t.Errorf("%s: match = %v, want %v", tt.name, got, tt.want)
		}
	}
	if _, err := newMatcher(Match{NodeLabel: "a=b=c"}); err == nil || !strings.HasPrefix(err.Error(), "Error parsing node selector") {
		t.Errorf("bad selector error %v", err)
	}
}

func TestMatcherPods(t *testing.T) {
	m, err := newMatcher(Match{PodNamespace: "ingress", PodLabel: "app=nginx"})
	if err != nil {
		t.Fatal(err)
	}
	pod := func(node string, mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ingress", Labels: map[string]string{"app": "nginx"}},
			Spec:       corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
		if mut != nil {
			mut(p)
		}
		return p
	}
	now := metav1.Now()
	pods := map[string][]*corev1.Pod{
		"a": {pod("a", nil)},
		"b": {pod("b", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse })},
		"c": {pod("c", func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })},
		"d": {pod("d", func(p *corev1.Pod) { p.DeletionTimestamp = &now })},
		"e": {pod("e", func(p *corev1.Pod) { p.Namespace = "other" })},
		"f": {pod("f", func(p *corev1.Pod) { p.Labels["app"] = "x" }), pod("f", nil)},
	}
	var nodes []*corev1.Node
	for _, n := range []string{"f", "e", "d", "c", "b", "a", "g"} {
		nodes = append(nodes, readyNode(n, nil))
	}
	got := m.enabledNodes(nodes, func(n string) []*corev1.Pod { return pods[n] })
	var names []string
	for _, n := range got {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{"a", "f"}) {
		t.Fatalf("enabled %v, want [a f] sorted", names)
	}
}

func TestNodeAddresses(t *testing.T) {
	n := readyNode("n", func(n *corev1.Node) {
		n.Annotations = map[string]string{ReservedIPAnnotation: "192.0.2.7"}
	})
	tests := []struct {
		at   corev1.NodeAddressType
		want []string
	}{
		{"", []string{"198.51.100.1"}},
		{corev1.NodeExternalIP, []string{"198.51.100.1"}},
		{corev1.NodeInternalIP, []string{"10.0.0.1"}},
		{ReservedIPAnnotation, []string{"192.0.2.7"}},
	}
	for _, tt := range tests {
		if got := nodeAddresses(n, tt.at); !slices.Equal(got, tt.want) {
			t.Errorf("addressType %q: %v, want %v", tt.at, got, tt.want)
		}
	}
}

func TestRunConfigErrors(t *testing.T) {
	ctx := t.Context()
	if err := Run(ctx, Config{}, nil, nil); err != nil {
		t.Fatalf("no controllers: %v, want nil (nothing to do)", err)
	}
	bad := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(bad, []byte("{not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(ctx, Config{Controllers: []string{"floatingippool"}, Kubeconfig: bad, DOToken: "x"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "VIPD_KUBECONFIG") {
		t.Fatalf("bad kubeconfig: %v", err)
	}
	// A kubeconfig that does not exist yet is waited for until ctx ends.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := Run(short, Config{Controllers: []string{"floatingippool"}, Kubeconfig: t.TempDir() + "/later", DOToken: "x"}, nil, nil); err != nil {
		t.Fatalf("missing kubeconfig: %v, want a wait then nil", err)
	}
	// So is an API that does not answer yet.
	short2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if err := Run(short2, Config{Controllers: []string{"floatingippool"}, RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, DOToken: "x"}, nil, nil); err != nil {
		t.Fatalf("unreachable API: %v, want a wait then nil", err)
	}
	err = Run(ctx, Config{Controllers: []string{"floatingippool"}, RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "DIGITALOCEAN_ACCESS_TOKEN") {
		t.Fatalf("no provider token: %v", err)
	}
	err = Run(ctx, Config{Controllers: []string{"dns"}, RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, DOToken: "x"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "VIPD_CONTROLLERS") {
		t.Fatalf("unknown controller: %v", err)
	}
	err = Run(ctx, Config{Controllers: []string{"nodednsrecordset"}, RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"},
		CloudflareToken: "x", CloudflareAPIURL: "ftp://example.com"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "cloudflare API URL") {
		t.Fatalf("bad Cloudflare URL: %v", err)
	}
}

func TestKubeconfigNamespace(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/kubeconfig"
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: flipop}}]
current-context: x
`
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, ns, err := Config{Kubeconfig: p}.restConfig()
	if err != nil || ns != "flipop" || rc.Host != "https://127.0.0.1:6443" {
		t.Fatalf("restConfig: %v %q %v", rc, ns, err)
	}
	if _, _, err := (Config{}).restConfig(); err == nil || !strings.Contains(err.Error(), "VIPD_KUBECONFIG") {
		t.Fatalf("outside a pod without kubeconfig: %v", err)
	}
}
