// Package egressfeed is `vipd-controllers egressfeed`: it resolves the cluster's EgressPolicy objects
// (vipd.io/v1alpha1) to concrete egress rules (egress IP, pod addresses,
// destinations) and prints them to stdout as NDJSON, one complete rule set
// per line, whenever it changes. `vipd run` starts it when
// VIPD_EGRESS_POLICIES=on and programs the rules (cmd/vipd/egressfeed.go):
// vipd itself does not link client-go.
//
// Egress IPs that are not among the nodes' elected addresses are listed
// with the nodes their policy's nodeSelector matches (Node objects): vipd
// holds them at run time (cmd/vipd/egressaddrs.go). A spec.poolRef takes
// the address of the IPAllocation that claims the policy (allocated by
// the ipam controller, controllers/ipam/egress.go).
//
// On the node that is the gateway of a policy's egress IP (asked from the
// local vipd, internal/wire.EgressGatewaysPath), it writes the policy's
// status: gateway node, address, selected pods and the Ready condition. Policies that cannot be
// programmed on any node (no eligible node, an egress IP another policy
// has, a pool without an address for it, an invalid spec) get Ready=False
// with the reason from every node.
package egressfeed

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/wire"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// egressPolicyGVR is the EgressPolicy resource; IPAllocation and IPPool
// give spec.poolRef its address.
var (
	egressPolicyGVR = schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "egresspolicies"}
	ipAllocationGVR = schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "ipallocations"}
	ipPoolGVR       = schema.GroupVersionResource{Group: "vipd.io", Version: "v1alpha1", Resource: "ippools"}
)

// served reports whether the API server serves the resource.
func served(cs kubernetes.Interface, gvr schema.GroupVersionResource) bool {
	rl, err := cs.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		return false
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource })
}

// listUnstructured lists a dynamic informer's objects.
func listUnstructured(l cache.GenericLister) []*unstructured.Unstructured {
	objs, err := l.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// egressPolicy is the part of an EgressPolicy the feed reads.
type egressPolicy struct {
	Namespace, Name string
	UID             string
	Generation      int64
	Created         time.Time
	Spec            struct {
		EgressIP string `json:"egressIP"`
		PoolRef  *struct {
			Name string `json:"name"`
		} `json:"poolRef"`
		PodSelector       *metav1.LabelSelector `json:"podSelector"`
		NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`
		Destinations      []string              `json:"destinations"`
		NodeSelector      *metav1.LabelSelector `json:"nodeSelector"`
	}
	Status policyStatus
}

type policyStatus struct {
	GatewayNode  string             `json:"gatewayNode,omitempty"`
	Address      string             `json:"address,omitempty"`
	SelectedPods int                `json:"selectedPods"`
	Conditions   []metav1.Condition `json:"conditions,omitempty"`
}

func (p egressPolicy) key() string { return p.Namespace + "/" + p.Name }

func policyFromUnstructured(u *unstructured.Unstructured) (egressPolicy, error) {
	p := egressPolicy{Namespace: u.GetNamespace(), Name: u.GetName(), UID: string(u.GetUID()), Generation: u.GetGeneration(), Created: u.GetCreationTimestamp().Time}
	if spec, ok := u.Object["spec"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &p.Spec); err != nil {
			return p, fmt.Errorf("spec: %w", err)
		}
	}
	if st, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(st, &p.Status)
	}
	return p, nil
}

// policyResult is what resolve found for one policy.
type policyResult struct {
	Rule     *wire.EgressRule
	Address  *wire.EgressAddress // a runtime egress address (not elected)
	IP       netip.Addr
	Selected int
	Ready    bool
	Reason   string
	Message  string
}

// resolve turns policies, pods, namespaces and nodes into rules and
// runtime egress addresses. elected is the set of addresses vipd elects
// (VIPD_ADDRESS, VIPD_EGRESS): their gateway is the election's holder. Any
// other egress IP is a runtime address held by one of the nodes matching
// the policy's nodeSelector. Two policies naming the same runtime egress
// IP: the older one (then the first by namespace/name) has it, the other
// gets Ready=False EgressIPInUse. It is a pure function.
func resolve(pols []egressPolicy, pods []*corev1.Pod, nss []*corev1.Namespace, nodes []*corev1.Node, pv poolView, elected []netip.Addr) ([]wire.EgressRule, []wire.EgressAddress, map[string]policyResult) {
	results := map[string]policyResult{}
	var rules []wire.EgressRule
	var addrs []wire.EgressAddress
	sort.Slice(pols, func(i, j int) bool {
		if !pols[i].Created.Equal(pols[j].Created) {
			return pols[i].Created.Before(pols[j].Created)
		}
		return pols[i].key() < pols[j].key()
	})
	owner := map[netip.Addr]string{}
	for _, p := range pols {
		res := resolvePolicy(p, pods, nss, nodes, pv, elected)
		if res.IP.IsValid() && !slices.Contains(elected, res.IP) {
			// A runtime address has one set of eligible nodes: one
			// policy. (Elected addresses may serve several policies:
			// their gateway is the election's holder either way.)
			if o, ok := owner[res.IP]; ok {
				res = policyResult{IP: res.IP, Selected: res.Selected, Reason: "EgressIPInUse",
					Message: fmt.Sprintf("egress IP %s is already the egress IP of policy %s (older); each egress IP belongs to one policy", res.IP, o)}
			} else if res.Rule != nil || res.Address != nil || res.Ready {
				owner[res.IP] = p.key()
			}
		}
		if res.Rule != nil {
			rules = append(rules, *res.Rule)
		}
		if res.Address != nil {
			addrs = append(addrs, *res.Address)
		}
		results[p.key()] = res
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].Policy < rules[j].Policy })
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Policy < addrs[j].Policy })
	return rules, addrs, results
}

// poolView is what the feed knows of IPPools and their allocations for
// spec.poolRef: the address each policy was allocated (by the ipam
// controller of vipd-controllers), and each pool's free count.
type poolView struct {
	Addr  map[string]netip.Addr // policy key -> allocated address
	Pools map[string]poolCount  // pool name -> counts from its status
}

type poolCount struct {
	Total, Free int64
}

// poolViewOf reads the allocations claimed by EgressPolicy objects (with
// the policy's UID when the allocation records one) and the pools' counts.
func poolViewOf(pols []egressPolicy, allocs, ippools []*unstructured.Unstructured) poolView {
	pv := poolView{Addr: map[string]netip.Addr{}, Pools: map[string]poolCount{}}
	uid := map[string]string{}
	for _, p := range pols {
		uid[p.key()] = p.UID
	}
	for _, u := range allocs {
		kind, _, _ := unstructured.NestedString(u.Object, "spec", "claimRef", "kind")
		if kind != "EgressPolicy" {
			continue
		}
		ns, _, _ := unstructured.NestedString(u.Object, "spec", "claimRef", "namespace")
		name, _, _ := unstructured.NestedString(u.Object, "spec", "claimRef", "name")
		cuid, _, _ := unstructured.NestedString(u.Object, "spec", "claimRef", "uid")
		key := ns + "/" + name
		if want, ok := uid[key]; !ok || cuid != "" && want != "" && cuid != want {
			continue // another (deleted and re-created) policy's
		}
		s, _, _ := unstructured.NestedString(u.Object, "spec", "address")
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		// One address a policy: the lowest, as long as the controller
		// settles an extra one.
		if old, ok := pv.Addr[key]; !ok || a.Less(old) {
			pv.Addr[key] = a
		}
	}
	for _, u := range ippools {
		total, _, _ := unstructured.NestedInt64(u.Object, "status", "total")
		free, _, _ := unstructured.NestedInt64(u.Object, "status", "free")
		pv.Pools[u.GetName()] = poolCount{Total: total, Free: free}
	}
	return pv
}

func resolvePolicy(p egressPolicy, pods []*corev1.Pod, nss []*corev1.Namespace, nodes []*corev1.Node, pv poolView, elected []netip.Addr) policyResult {
	fail := func(reason, format string, args ...any) policyResult {
		return policyResult{Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	egressIP := p.Spec.EgressIP
	if p.Spec.PoolRef != nil {
		name := p.Spec.PoolRef.Name
		a, ok := pv.Addr[p.key()]
		pc, exists := pv.Pools[name]
		switch {
		case ok:
			egressIP = a.String()
		case !exists:
			return fail("PoolNotFound", "IPPool %s (spec.poolRef) does not exist", name)
		case pc.Total > 0 && pc.Free == 0:
			return fail("PoolExhausted", "no free address in IPPool %s", name)
		default:
			return fail("AddressPending", "waiting for an address from IPPool %s (allocated by vipd-controllers with the services or ipam controller)", name)
		}
	}
	ip, err := netip.ParseAddr(egressIP)
	if err != nil || ip.Zone() != "" {
		return fail("InvalidEgressIP", "spec.egressIP %q is not an IP address", egressIP)
	}
	ip = ip.Unmap()
	if !ip.IsGlobalUnicast() {
		return fail("InvalidEgressIP", "spec.egressIP %s is not a unicast address", ip)
	}
	isElected := slices.Contains(elected, ip)
	var eligible []string
	if !isElected {
		nodeSel := labels.Everything()
		if p.Spec.NodeSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
			if err != nil {
				return fail("InvalidSelector", "spec.nodeSelector: %v", err)
			}
			nodeSel = s
		}
		for _, n := range nodes {
			if n.DeletionTimestamp == nil && nodeSel.Matches(labels.Set(n.Labels)) {
				eligible = append(eligible, n.Name)
			}
		}
		sort.Strings(eligible)
		if len(eligible) == 0 {
			res := fail("NoEligibleNode", "no node matches spec.nodeSelector: nobody may hold %s", ip)
			res.IP = ip
			return res
		}
	}
	var to []string
	for _, d := range p.Spec.Destinations {
		pf, err := netip.ParsePrefix(d)
		if err != nil || pf != pf.Masked() || pf.Addr().Is4() != ip.Is4() {
			return fail("InvalidDestination", "destination %q is not a CIDR (network address) of the egress IP's family", d)
		}
		to = append(to, pf.String())
	}
	if len(to) == 0 {
		to = []string{"0.0.0.0/0"}
		if ip.Is6() {
			to = []string{"::/0"}
		}
	}
	podSel := labels.Everything()
	if p.Spec.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.PodSelector)
		if err != nil {
			return fail("InvalidSelector", "spec.podSelector: %v", err)
		}
		podSel = s
	}
	namespaces := map[string]bool{}
	if p.Spec.NamespaceSelector == nil {
		namespaces[p.Namespace] = true
	} else {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.NamespaceSelector)
		if err != nil {
			return fail("InvalidSelector", "spec.namespaceSelector: %v", err)
		}
		for _, ns := range nss {
			if s.Matches(labels.Set(ns.Labels)) {
				namespaces[ns.Name] = true
			}
		}
	}
	var from []string
	for _, pod := range pods {
		if !namespaces[pod.Namespace] || pod.Spec.HostNetwork || !podSel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, pip := range pod.Status.PodIPs {
			a, err := netip.ParseAddr(pip.IP)
			if err != nil || a.Unmap().Is4() != ip.Is4() {
				continue
			}
			a = a.Unmap()
			from = append(from, netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
	sort.Strings(from)
	from = slices.Compact(from)
	res := policyResult{IP: ip, Selected: len(from), Ready: true, Reason: "Programmed",
		Message: fmt.Sprintf("%d pod addresses leave with %s", len(from), ip)}
	if isElected {
		if p.Spec.NodeSelector != nil {
			res.Message += "; it is one of the nodes' VIPD_ADDRESS/VIPD_EGRESS, so their election picks the gateway and spec.nodeSelector does not apply"
		}
	} else {
		res.Address = &wire.EgressAddress{Policy: p.key(), EgressIP: ip.String(), Nodes: eligible}
		res.Message += fmt.Sprintf("; gateway: one of %d eligible nodes", len(eligible))
	}
	if len(from) == 0 {
		res.Reason = "NoPodsSelected"
		return res
	}
	res.Rule = &wire.EgressRule{Policy: p.key(), EgressIP: ip.String(), From: from, To: to}
	return res
}

// desiredStatus is the status this node writes for a policy, or nil when
// it writes none: only the gateway of an egress IP reports it, and every
// node reports a policy that cannot be programmed.
func desiredStatus(p egressPolicy, res policyResult, gatewayOf map[netip.Addr]bool, node string) *policyStatus {
	var st policyStatus
	st.Conditions = slices.Clone(p.Status.Conditions)
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: res.Reason, Message: res.Message, ObservedGeneration: p.Generation}
	switch {
	case !res.Ready:
		// Cannot be programmed: every node says so (the same status).
		cond.Status = metav1.ConditionFalse
		st.SelectedPods = res.Selected
	case res.IP.IsValid() && gatewayOf[res.IP]:
		st.GatewayNode, st.Address, st.SelectedPods = node, res.IP.String(), res.Selected
	default:
		return nil // another node is (or will be) the gateway and reports
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return &st
}

func statusEqual(a, b policyStatus) bool {
	if a.GatewayNode != b.GatewayNode || a.Address != b.Address || a.SelectedPods != b.SelectedPods || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}

// egressFeed runs the resolver against the API.
type egressFeed struct {
	cfg      *config.Config
	log      *slog.Logger
	dyn      dynamic.Interface
	cs       kubernetes.Interface
	out      io.Writer
	statusOf func(ctx context.Context) map[netip.Addr]bool // egress IPs this node is the gateway of
}

// Run is `vipd-controllers egressfeed`: it talks to the API with rc and
// writes the rule sets to out until ctx is done.
func Run(ctx context.Context, c *config.Config, rc *rest.Config, out io.Writer, log *slog.Logger) error {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	f := &egressFeed{cfg: c, log: log, dyn: dyn, cs: cs, out: out, statusOf: localGatewayOf(c, log)}
	return f.Run(ctx)
}

// localGatewayOf asks the local vipd which egress IPs this node is the
// gateway of (wire.EgressGatewaysPath on VIPD_METRICS_ADDRESS); nil when
// it cannot tell (no status address, vipd not answering): this node then
// writes no gateway status.
func localGatewayOf(c *config.Config, log *slog.Logger) func(ctx context.Context) map[netip.Addr]bool {
	client := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) map[netip.Addr]bool {
		if c.MetricsAddress == "" {
			return nil
		}
		gw, err := wire.GetEgressGateways(ctx, client, c.MetricsAddress)
		if err != nil {
			log.Debug("egress feed: cannot ask vipd for its gateway roles", "err", err)
			return nil
		}
		return gw
	}
}

// Run watches policies, pods and namespaces and prints the rule set
// whenever it changes, until ctx is done.
func (f *egressFeed) Run(ctx context.Context) error {
	poke := make(chan struct{}, 1)
	wake := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { wake() },
		UpdateFunc: func(any, any) { wake() },
		DeleteFunc: func(any) { wake() },
	}
	inf := informers.NewSharedInformerFactory(f.cs, 0)
	podInf, nsInf, nodeInf := inf.Core().V1().Pods(), inf.Core().V1().Namespaces(), inf.Core().V1().Nodes()
	if _, err := podInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := nodeInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	if _, err := nsInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	dinf := dynamicinformer.NewDynamicSharedInformerFactory(f.dyn, 0)
	polInf := dinf.ForResource(egressPolicyGVR)
	if _, err := polInf.Informer().AddEventHandler(handler); err != nil {
		return err
	}
	synced := []cache.InformerSynced{podInf.Informer().HasSynced, nsInf.Informer().HasSynced, nodeInf.Informer().HasSynced, polInf.Informer().HasSynced}
	// spec.poolRef: only when the IPPool API is installed (the informers
	// of a resource the server does not serve never sync).
	var allocInf, ippoolInf informers.GenericInformer
	if served(f.cs, ipAllocationGVR) && served(f.cs, ipPoolGVR) {
		allocInf, ippoolInf = dinf.ForResource(ipAllocationGVR), dinf.ForResource(ipPoolGVR)
		for _, i := range []informers.GenericInformer{allocInf, ippoolInf} {
			if _, err := i.Informer().AddEventHandler(handler); err != nil {
				return err
			}
			synced = append(synced, i.Informer().HasSynced)
		}
	}
	inf.Start(ctx.Done())
	dinf.Start(ctx.Done())
	defer inf.Shutdown()
	defer dinf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	f.log.Info("egress feed: watching EgressPolicy objects, pods, namespaces and nodes")
	elected := f.cfg.Addresses
	var elect []netip.Addr
	for _, p := range elected {
		elect = append(elect, p.Addr())
	}
	w := bufio.NewWriter(f.out)
	last := ""
	tick := time.NewTicker(2 * time.Second) // the gateway role may change
	defer tick.Stop()
	for {
		objs, err := polInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		var pols []egressPolicy
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			p, err := policyFromUnstructured(u)
			if err != nil {
				f.log.Warn("egress feed: unreadable EgressPolicy", "policy", u.GetNamespace()+"/"+u.GetName(), "err", err)
				continue
			}
			pols = append(pols, p)
		}
		pods, err := podInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		nss, err := nsInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		nodes, err := nodeInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		var allocs, ippools []*unstructured.Unstructured
		if allocInf != nil {
			allocs, ippools = listUnstructured(allocInf.Lister()), listUnstructured(ippoolInf.Lister())
		}
		rules, addrs, results := resolve(pols, pods, nss, nodes, poolViewOf(pols, allocs, ippools), elect)
		b, err := json.Marshal(wire.EgressDoc{Rules: rules, Addresses: addrs})
		if err != nil {
			return err
		}
		if line := string(b); line != last {
			if _, err := fmt.Fprintln(w, line); err != nil {
				return fmt.Errorf("feed: %w", err)
			}
			if err := w.Flush(); err != nil {
				return fmt.Errorf("feed: %w", err)
			}
			last = line
			f.log.Info("egress feed: rules changed", "rules", len(rules), "addresses", len(addrs))
		}
		f.writeStatuses(ctx, pols, results)
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
			// Let a burst of events settle into one pass.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		case <-tick.C:
		}
	}
}

func (f *egressFeed) writeStatuses(ctx context.Context, pols []egressPolicy, results map[string]policyResult) {
	gw := f.statusOf(ctx)
	for _, p := range pols {
		st := desiredStatus(p, results[p.key()], gw, f.cfg.NodeName)
		if st == nil || statusEqual(*st, p.Status) {
			continue
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
		if err != nil {
			continue
		}
		// A merge patch keeps absent keys: clear a former gateway's.
		for _, k := range []string{"gatewayNode", "address"} {
			if _, ok := obj[k]; !ok {
				obj[k] = nil
			}
		}
		patch, _ := json.Marshal(map[string]any{"status": obj})
		_, err = f.dyn.Resource(egressPolicyGVR).Namespace(p.Namespace).Patch(ctx, p.Name, "application/merge-patch+json", patch, metav1.PatchOptions{}, "status")
		if err != nil {
			f.log.Warn("egress feed: writing the status", "policy", p.key(), "err", err)
		}
	}
}
