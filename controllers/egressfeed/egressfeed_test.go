package egressfeed

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/wire"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

var env kubetest.Env

func TestMain(m *testing.M) { os.Exit(env.Main(m)) }

func pod(ns, name string, lbl map[string]string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func TestResolve(t *testing.T) {
	elected := []netip.Addr{netip.MustParseAddr("10.0.0.200"), netip.MustParseAddr("fd00::200")}
	mk := func(ns, name, ip string, sel, nsSel map[string]string, dst ...string) egressPolicy {
		p := egressPolicy{Namespace: ns, Name: name}
		p.Spec.EgressIP = ip
		if sel != nil {
			p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: sel}
		}
		if nsSel != nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSel}
		}
		p.Spec.Destinations = dst
		return p
	}
	pods := []*corev1.Pod{
		pod("a", "billing-1", map[string]string{"app": "billing"}, "10.244.1.5", "fd00:10:244:1::5"),
		pod("a", "billing-2", map[string]string{"app": "billing"}, "10.244.2.9"),
		pod("a", "web", map[string]string{"app": "web"}, "10.244.1.6"),
		pod("b", "billing-b", map[string]string{"app": "billing"}, "10.244.3.4"),
		pod("c", "billing-c", map[string]string{"app": "billing"}, "10.244.3.7"),
	}
	done := pod("a", "billing-done", map[string]string{"app": "billing"}, "10.244.9.9")
	done.Status.Phase = corev1.PodSucceeded
	host := pod("a", "billing-host", map[string]string{"app": "billing"}, "10.0.0.11")
	host.Spec.HostNetwork = true
	pods = append(pods, done, host)
	nss := []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"team": "pay"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{"team": "pay"}}},
	}
	poolRef := func(name, pool string) egressPolicy {
		p := mk("a", name, "", map[string]string{"app": "web"}, nil)
		p.Spec.PoolRef = &struct {
			Name string `json:"name"`
		}{Name: pool}
		return p
	}
	pool := poolRef("pool", "missing")
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"egress": "yes"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"egress": "yes"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n3"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n4", Labels: map[string]string{"egress": "yes"}, DeletionTimestamp: &metav1.Time{}}},
	}
	sel := func(p egressPolicy, lbl map[string]string) egressPolicy {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: lbl}
		return p
	}
	older := func(p egressPolicy) egressPolicy {
		p.Created = time.Unix(1000, 0)
		return p
	}
	t0 := time.Unix(2000, 0)
	pols := []egressPolicy{
		mk("a", "v4", "10.0.0.200", map[string]string{"app": "billing"}, nil, "203.0.113.0/24"),
		mk("a", "v6", "fd00::200", map[string]string{"app": "billing"}, nil),
		mk("a", "teams", "10.0.0.200", map[string]string{"app": "billing"}, map[string]string{"team": "pay"}),
		// Not elected: a runtime address held by the selected nodes.
		sel(mk("a", "stranger", "10.0.0.99", map[string]string{"app": "web"}, nil), map[string]string{"egress": "yes"}),
		mk("a", "anywhere", "10.0.0.98", map[string]string{"app": "none"}, nil),
		sel(mk("a", "nowhere", "10.0.0.97", nil, nil), map[string]string{"egress": "never"}),
		// The same runtime egress IP twice: the older policy has it.
		older(sel(mk("b", "first", "10.0.0.96", nil, nil), map[string]string{"egress": "yes"})),
		{Namespace: "a", Name: "second", Created: t0, Spec: mk("a", "x", "10.0.0.96", nil, nil).Spec},
		mk("a", "nobody", "10.0.0.200", map[string]string{"app": "none"}, nil),
		mk("a", "baddst", "10.0.0.200", nil, nil, "fd00::/64"),
		mk("a", "multicast", "224.0.0.5", nil, nil),
		pool,
		poolRef("from-pool", "egress"), poolRef("full", "full"), poolRef("pending", "egress"),
	}
	pv := poolView{Addr: map[string]netip.Addr{"a/from-pool": netip.MustParseAddr("10.0.0.50")},
		Pools: map[string]poolCount{"egress": {Total: 4, Free: 2}, "full": {Total: 2, Free: 0}}}
	rules, addrs, res := resolve(pols, pods, nss, nodes, pv, elected)
	want := []wire.EgressRule{
		{Policy: "a/from-pool", EgressIP: "10.0.0.50", From: []string{"10.244.1.6/32"}, To: []string{"0.0.0.0/0"}},
		{Policy: "a/stranger", EgressIP: "10.0.0.99", From: []string{"10.244.1.6/32"}, To: []string{"0.0.0.0/0"}},
		{Policy: "a/teams", EgressIP: "10.0.0.200", From: []string{"10.244.3.4/32", "10.244.3.7/32"}, To: []string{"0.0.0.0/0"}},
		{Policy: "a/v4", EgressIP: "10.0.0.200", From: []string{"10.244.1.5/32", "10.244.2.9/32"}, To: []string{"203.0.113.0/24"}},
		{Policy: "a/v6", EgressIP: "fd00::200", From: []string{"fd00:10:244:1::5/128"}, To: []string{"::/0"}},
		{Policy: "b/first", EgressIP: "10.0.0.96", From: []string{"10.244.3.4/32"}, To: []string{"0.0.0.0/0"}},
	}
	wantAddrs := []wire.EgressAddress{
		{Policy: "a/anywhere", EgressIP: "10.0.0.98", Nodes: []string{"n1", "n2", "n3"}},
		{Policy: "a/from-pool", EgressIP: "10.0.0.50", Nodes: []string{"n1", "n2", "n3"}},
		{Policy: "a/stranger", EgressIP: "10.0.0.99", Nodes: []string{"n1", "n2"}},
		{Policy: "b/first", EgressIP: "10.0.0.96", Nodes: []string{"n1", "n2"}},
	}
	if len(addrs) != len(wantAddrs) {
		t.Fatalf("addresses %+v", addrs)
	}
	for i := range wantAddrs {
		if addrs[i].Policy != wantAddrs[i].Policy || addrs[i].EgressIP != wantAddrs[i].EgressIP || !slices.Equal(addrs[i].Nodes, wantAddrs[i].Nodes) {
			t.Errorf("address %d: %+v, want %+v", i, addrs[i], wantAddrs[i])
		}
	}
	if len(rules) != len(want) {
		t.Fatalf("rules %+v", rules)
	}
	for i := range want {
		if rules[i].Policy != want[i].Policy || !slices.Equal(rules[i].From, want[i].From) || !slices.Equal(rules[i].To, want[i].To) || rules[i].EgressIP != want[i].EgressIP {
			t.Errorf("rule %d: %+v, want %+v", i, rules[i], want[i])
		}
	}
	for key, want := range map[string]struct {
		reason string
		ready  bool
	}{
		"a/stranger": {"Programmed", true}, "a/anywhere": {"NoPodsSelected", true}, "a/nowhere": {"NoEligibleNode", false},
		"b/first": {"Programmed", true}, "a/second": {"EgressIPInUse", false},
		"a/nobody": {"NoPodsSelected", true}, "a/baddst": {"InvalidDestination", false}, "a/pool": {"PoolNotFound", false},
		"a/from-pool": {"Programmed", true}, "a/full": {"PoolExhausted", false}, "a/pending": {"AddressPending", false},
		"a/multicast": {"InvalidEgressIP", false}, "a/v4": {"Programmed", true},
	} {
		if res[key].Reason != want.reason || res[key].Ready != want.ready {
			t.Errorf("%s: reason %q ready %v (%s), want %s %v", key, res[key].Reason, res[key].Ready, res[key].Message, want.reason, want.ready)
		}
	}
	if !strings.Contains(res["a/second"].Message, "b/first") {
		t.Errorf("the refused policy does not name the owner: %s", res["a/second"].Message)
	}
	// Every node writes the status of a policy that cannot be programmed;
	// only the gateway that of one that can.
	gw := map[netip.Addr]bool{netip.MustParseAddr("10.0.0.99"): true}
	if st := desiredStatus(pols[5], res["a/nowhere"], nil, "n3"); st == nil || st.Conditions[0].Reason != "NoEligibleNode" || st.Conditions[0].Status != metav1.ConditionFalse {
		t.Errorf("NoEligibleNode status: %+v", st)
	}
	if st := desiredStatus(pols[3], res["a/stranger"], gw, "n1"); st == nil || st.GatewayNode != "n1" || st.Address != "10.0.0.99" {
		t.Errorf("gateway status: %+v", st)
	}
	if st := desiredStatus(pols[3], res["a/stranger"], nil, "n2"); st != nil {
		t.Errorf("a director wrote the status: %+v", st)
	}
}

// syncWriter is a feed output the test reads line by line.
type lineSink struct {
	mu    sync.Mutex
	lines []string
	pw    *io.PipeWriter
}

func newLineSink() *lineSink {
	pr, pw := io.Pipe()
	s := &lineSink{pw: pw}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, sc.Text())
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *lineSink) Write(b []byte) (int, error) { return s.pw.Write(b) }

func (s *lineSink) last() wire.EgressDoc {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d wire.EgressDoc
	if len(s.lines) > 0 {
		_ = json.Unmarshal([]byte(s.lines[len(s.lines)-1]), &d)
	}
	return d
}

func waitUntil(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type errf string

func (e errf) Error() string { return string(e) }

// TestEgressFeedAgainstAPIServer runs the feed against a real
// kube-apiserver: CRD validation, selection, pods coming and going, and
// the status the gateway writes.
func TestEgressFeedAgainstAPIServer(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/egresspolicy.yaml"), filepath.Join(root, "deploy/kube/egresspolicy-rbac.yaml"),
		filepath.Join(root, "deploy/kube/crds/ippool.yaml"), filepath.Join(root, "deploy/kube/crds/ipallocation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	// The documented example applies as it is.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	example, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/examples/egresspolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), example...); err != nil {
		t.Fatalf("deploy/kube/examples/egresspolicy.yaml: %v", err)
	}
	for _, ns := range []string{"egress-a", "egress-b"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkPod := func(ns, name, app, ip string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}
		p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No kubelet here: the test plays it and reports the pod's address.
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	policies := dyn.Resource(egressPolicyGVR)
	mkPolicy := func(ns, name string, spec map[string]any) error {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "EgressPolicy",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
		_, err := policies.Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		return err
	}

	// The CRD refuses what vipd could not use.
	for _, spec := range []map[string]any{
		{"egressIP": "banana"},
		{"egressIP": "10.0.0.200", "poolRef": map[string]any{"name": "p"}},
		{},
		{"egressIP": "10.0.0.200", "destinations": []any{"203.0.113.0/33"}},
	} {
		if err := mkPolicy("egress-a", "bad", spec); err == nil || !strings.Contains(err.Error(), "Invalid") {
			t.Errorf("spec %v accepted (err %v)", spec, err)
		}
	}

	mkPod("egress-a", "billing-1", "billing", "10.244.1.5")
	mkPod("egress-a", "web-1", "web", "10.244.1.6")
	if err := mkPolicy("egress-a", "billing", map[string]any{"egressIP": "10.0.0.200",
		"podSelector": map[string]any{"matchLabels": map[string]any{"app": "billing"}}, "destinations": []any{"203.0.113.0/24"}}); err != nil {
		t.Fatal(err)
	}
	// Not elected: held at run time by a node its nodeSelector matches;
	// none matches yet.
	if err := mkPolicy("egress-b", "elsewhere", map[string]any{"egressIP": "10.0.0.99",
		"nodeSelector": map[string]any{"matchLabels": map[string]any{"egress": "yes"}}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setNodeLabel := func(name, v string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"egress":null}}}`
		if v != "" {
			patch = `{"metadata":{"labels":{"egress":"` + v + `"}}}`
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The feed runs with the documented RBAC only (deploy/kube/egresspolicy-rbac.yaml).
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vipd-egress-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "vipd-egress"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubetest.User}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ucs, err := kubernetes.NewForConfig(srv.UserConfig())
	if err != nil {
		t.Fatal(err)
	}
	udyn, err := dynamic.NewForConfig(srv.UserConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The gateway roles come over the daemon's endpoint (the handler
	// vipd mounts, internal/wire).
	gwsrv := httptest.NewServer(wire.EgressGatewaysHandler(func() []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("10.0.0.200"), netip.MustParseAddr("10.0.0.99"), netip.MustParseAddr("10.0.0.150")}
	}))
	defer gwsrv.Close()
	c := &config.Config{NodeName: "n1", Addresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.200/32")},
		MetricsAddress: strings.TrimPrefix(gwsrv.URL, "http://")}
	sink := newLineSink()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &egressFeed{cfg: c, log: log, dyn: udyn, cs: ucs, out: sink, statusOf: localGatewayOf(c, log)}
	fctx, fcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(fctx) }()
	defer func() {
		fcancel()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	}()

	fromIs := func(want ...string) func() error {
		return func() error {
			d := sink.last()
			if len(d.Rules) != 1 || !slices.Equal(d.Rules[0].From, want) || d.Rules[0].EgressIP != "10.0.0.200" || !slices.Equal(d.Rules[0].To, []string{"203.0.113.0/24"}) {
				return errf("feed says " + strings.TrimSpace(sink.lines0()))
			}
			return nil
		}
	}
	waitUntil(t, "first rule", fromIs("10.244.1.5/32"))
	// A new pod with the label matches; a relabelled one stops matching;
	// a deleted one is gone.
	mkPod("egress-a", "billing-2", "billing", "10.244.2.9")
	waitUntil(t, "second pod", fromIs("10.244.1.5/32", "10.244.2.9/32"))
	p, err := cs.CoreV1().Pods("egress-a").Get(ctx, "billing-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["app"] = "web"
	if _, err := cs.CoreV1().Pods("egress-a").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "relabelled pod", fromIs("10.244.1.5/32"))
	mkPod("egress-a", "billing-3", "billing", "10.244.3.3")
	waitUntil(t, "third pod", fromIs("10.244.1.5/32", "10.244.3.3/32"))
	if err := cs.CoreV1().Pods("egress-a").Delete(ctx, "billing-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "deleted pod", fromIs("10.244.3.3/32"))

	// Status: this node is the gateway of 10.0.0.200; the other policy's
	// egress IP is elected by nobody.
	status := func(ns, name string) (map[string]any, error) {
		u, err := policies.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status")
		return st, nil
	}
	waitUntil(t, "gateway status", func() error {
		st, err := status("egress-a", "billing")
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(st, "conditions")
		if st["gatewayNode"] != "n1" || st["address"] != "10.0.0.200" || len(conds) != 1 ||
			conds[0].(map[string]any)["status"] != "True" || st["selectedPods"] != int64(1) {
			return errf("status " + toJSON(st))
		}
		return nil
	})
	condIs := func(ns, name, reason, want, gateway string) func() error {
		return func() error {
			st, err := status(ns, name)
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(st, "conditions")
			gw, _ := st["gatewayNode"].(string)
			if len(conds) != 1 || conds[0].(map[string]any)["reason"] != reason || conds[0].(map[string]any)["status"] != want || gw != gateway {
				return errf("status " + toJSON(st))
			}
			return nil
		}
	}
	addrsAre := func(want ...string) func() error {
		return func() error {
			d := sink.last()
			var got []string
			for _, a := range d.Addresses {
				got = append(got, a.Policy+" "+a.EgressIP+" "+strings.Join(a.Nodes, ","))
			}
			if !slices.Equal(got, want) {
				return errf("feed says " + sink.lines0())
			}
			return nil
		}
	}
	// The selector matches no node: no address, Ready=False from every node.
	waitUntil(t, "no eligible node", condIs("egress-b", "elsewhere", "NoEligibleNode", "False", ""))
	if err := addrsAre()(); err != nil {
		t.Fatal(err)
	}
	// Two nodes get the label: the address is held by one of them; this
	// node holds it and reports itself as the gateway.
	setNodeLabel("n1", "yes")
	setNodeLabel("n2", "yes")
	waitUntil(t, "eligible nodes", addrsAre("egress-b/elsewhere 10.0.0.99 n1,n2"))
	waitUntil(t, "runtime gateway status", condIs("egress-b", "elsewhere", "NoPodsSelected", "True", "n1"))
	// The label moves: the eligible nodes follow.
	setNodeLabel("n1", "")
	setNodeLabel("n3", "yes")
	waitUntil(t, "selector change", addrsAre("egress-b/elsewhere 10.0.0.99 n2,n3"))
	// A second policy with the same runtime egress IP is refused.
	// (Created in the same second, the first by namespace/name wins.)
	if err := mkPolicy("egress-b", "zcopy", map[string]any{"egressIP": "10.0.0.99"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "duplicate refused", condIs("egress-b", "zcopy", "EgressIPInUse", "False", ""))
	if err := addrsAre("egress-b/elsewhere 10.0.0.99 n2,n3")(); err != nil {
		t.Fatal(err)
	}
	// The selector matches nothing any more: the address goes, and the
	// former gateway's name leaves the status.
	for _, n := range []string{"n2", "n3"} {
		setNodeLabel(n, "")
	}
	waitUntil(t, "no eligible node again", condIs("egress-b", "elsewhere", "NoEligibleNode", "False", ""))
	// The owner is deleted: the copy gets the address (every node).
	if err := policies.Namespace("egress-b").Delete(ctx, "elsewhere", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "copy takes over", addrsAre("egress-b/zcopy 10.0.0.99 n1,n2,n3"))
	// spec.poolRef: the address comes from the IPAllocation the policy
	// claims (the ipam controller's; here the test writes it), pending
	// until then.
	pol := map[string]any{"poolRef": map[string]any{"name": "egress-pool"}}
	if err := mkPolicy("egress-a", "pooled", pol); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "pool missing", condIs("egress-a", "pooled", "PoolNotFound", "False", ""))
	pu := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "egress-pool"}, "spec": map[string]any{"addresses": []any{"10.0.0.150-10.0.0.151"}}}}
	if _, err := dyn.Resource(ipPoolGVR).Create(ctx, pu, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "address pending", condIs("egress-a", "pooled", "AddressPending", "False", ""))
	pooled, err := policies.Namespace("egress-a").Get(ctx, "pooled", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	au := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "vipd.io/v1alpha1", "kind": "IPAllocation",
		"metadata": map[string]any{"name": "10.0.0.150"},
		"spec": map[string]any{"address": "10.0.0.150", "pool": "egress-pool", "claimedAt": "2026-01-01T00:00:00Z",
			"claimRef": map[string]any{"apiGroup": "vipd.io", "kind": "EgressPolicy", "namespace": "egress-a", "name": "pooled", "uid": string(pooled.GetUID())}}}}
	if _, err := dyn.Resource(ipAllocationGVR).Create(ctx, au, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "pooled address", addrsAre("egress-a/pooled 10.0.0.150 n1,n2,n3", "egress-b/zcopy 10.0.0.99 n1,n2,n3"))
	waitUntil(t, "pooled status", func() error {
		st, err := status("egress-a", "pooled")
		if err != nil {
			return err
		}
		if st["address"] != "10.0.0.150" {
			return errf("status " + toJSON(st))
		}
		return nil
	})
	if err := policies.Namespace("egress-a").Delete(ctx, "pooled", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Deleting the policies empties the rule set and the addresses.
	for _, name := range []string{"egress-a/billing", "egress-b/zcopy"} {
		ns, n, _ := strings.Cut(name, "/")
		if err := policies.Namespace(ns).Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "policy deleted", func() error {
		if d := sink.last(); len(d.Rules) != 0 || len(d.Addresses) != 0 {
			return errf("feed says " + sink.lines0())
		}
		return nil
	})
}

func (s *lineSink) lines0() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lines) == 0 {
		return "(nothing)"
	}
	return s.lines[len(s.lines)-1]
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestPoolViewOf: a policy's allocated address is the lowest one it
// claims with its own UID; other claimers' and a former namesake's
// allocations do not count.
func TestPoolViewOf(t *testing.T) {
	al := func(addr, kind, ns, name, uid string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"address": addr, "pool": "p",
			"claimRef": map[string]any{"kind": kind, "namespace": ns, "name": name, "uid": uid}}}}
	}
	pols := []egressPolicy{{Namespace: "a", Name: "x", UID: "u1"}, {Namespace: "a", Name: "y", UID: "u2"}}
	pool := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "p"}, "status": map[string]any{"total": int64(8), "free": int64(0)}}}
	pv := poolViewOf(pols, []*unstructured.Unstructured{
		al("10.0.0.9", "EgressPolicy", "a", "x", "u1"),
		al("10.0.0.7", "EgressPolicy", "a", "x", "u1"),
		al("10.0.0.5", "Service", "a", "x", "u1"),
		al("10.0.0.4", "EgressPolicy", "a", "y", "old-uid"),
		al("10.0.0.3", "EgressPolicy", "a", "gone", "u9"),
		al("bogus", "EgressPolicy", "a", "y", "u2"),
	}, []*unstructured.Unstructured{pool})
	if len(pv.Addr) != 1 || pv.Addr["a/x"] != netip.MustParseAddr("10.0.0.7") {
		t.Fatalf("addresses %v", pv.Addr)
	}
	if pv.Pools["p"] != (poolCount{Total: 8, Free: 0}) {
		t.Fatalf("pools %v", pv.Pools)
	}
}
