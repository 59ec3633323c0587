package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Controller names accepted in Config.Controllers (VIPD_CONTROLLERS).
const (
	ControllerFloatingIPPool   = "floatingippool"
	ControllerNodeDNSRecordSet = "nodednsrecordset"
)

// reconcilePeriod bounds how long a pool or record set goes without a pass.
const reconcilePeriod = time.Minute

// defaultDNSTTL is FLIPOP's TTL for a FloatingIPPool record set with ttl 0.
const defaultDNSTTL = 60

// operator runs the enabled controllers for one leadership term. All of
// its state is rebuilt from the API and the providers at the start of a
// term, which is what makes a restart (or a leader change) cause no calls
// beyond reads.
type operator struct {
	log    *slog.Logger
	kube   kubernetes.Interface
	dyn    dynamic.Interface
	prov   providers
	timing dnsTiming
	now    func() time.Time

	workers int

	factory    informers.SharedInformerFactory
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	nodes      corelisters.NodeLister
	nodeInf    cache.SharedIndexInformer
	podInf     cache.SharedIndexInformer
	poolInf    cache.SharedIndexInformer // nil when the controller is off
	dnsInf     cache.SharedIndexInformer // nil when the controller is off
	poolQueue  workqueue.TypedRateLimitingInterface[string]
	dnsQueue   workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	pools   map[string]*poolEntry
	dnsSets map[string]*dnsEntry
}

type poolEntry struct {
	core     *poolCore
	provider string
	region   string
	dns      dnsSync
	dnsKey   string
	warning  string // last logged dnsRecordSet warning
	shared   string // last logged shared-IP error
	metrics  poolSnapshot
}

type dnsEntry struct {
	dns     dnsSync
	dnsKey  string
	metrics dnsSnapshot
}

const podNodeIndex = "spec.nodeName"

func newOperator(log *slog.Logger, kube kubernetes.Interface, dyn dynamic.Interface, prov providers,
	namespace string, enabled map[string]bool, timing dnsTiming, workers int) (*operator, error) {
	o := &operator{
		log:     log,
		kube:    kube,
		dyn:     dyn,
		prov:    prov,
		timing:  timing,
		now:     time.Now,
		workers: workers,
		pools:   map[string]*poolEntry{},
		dnsSets: map[string]*dnsEntry{},
	}
	o.factory = informers.NewSharedInformerFactory(kube, 0)
	o.nodeInf = o.factory.Core().V1().Nodes().Informer()
	o.nodes = o.factory.Core().V1().Nodes().Lister()
	o.podInf = o.factory.Core().V1().Pods().Informer()
	if err := o.podInf.AddIndexers(cache.Indexers{podNodeIndex: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return nil, nil
		}
		return []string{p.Spec.NodeName}, nil
	}}); err != nil {
		return nil, fmt.Errorf("pod index: %w", err)
	}
	// Keep only what matching needs: a large cluster's pods are many.
	if err := o.podInf.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("pod transform: %w", err)
	}
	o.dynFactory = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, nil)
	limiter := func() workqueue.TypedRateLimiter[string] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, reconcilePeriod)
	}
	if enabled[ControllerFloatingIPPool] {
		o.poolInf = o.dynFactory.ForResource(FloatingIPPoolResource).Informer()
		o.poolQueue = workqueue.NewTypedRateLimitingQueueWithConfig(limiter(),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "vipd_floatingippool"})
		// A pool added, deleted or with other spec.ips requeues every
		// pool: which IPs another pool lists decides what a pool may act on
		// and which annotations it may remove. Other updates (status
		// writes) requeue only that pool.
		one := func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				o.poolQueue.Add(key) // a deleted pool is no longer listed
			}
		}
		all := func(obj any) { one(obj); o.enqueuePools() }
		if _, err := o.poolInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: all, DeleteFunc: all,
			UpdateFunc: func(a, b any) {
				if specIPs(a) != specIPs(b) {
					all(b)
					return
				}
				one(b)
			},
		}); err != nil {
			return nil, fmt.Errorf("pool handler: %w", err)
		}
	}
	if enabled[ControllerNodeDNSRecordSet] {
		o.dnsInf = o.dynFactory.ForResource(NodeDNSRecordSetResource).Informer()
		o.dnsQueue = workqueue.NewTypedRateLimitingQueueWithConfig(limiter(),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "vipd_nodednsrecordset"})
		if _, err := o.dnsInf.AddEventHandler(keyHandler(o.dnsQueue)); err != nil {
			return nil, fmt.Errorf("record set handler: %w", err)
		}
	}
	if _, err := o.nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { o.enqueueAll() },
		DeleteFunc: func(any) { o.enqueueAll() },
		UpdateFunc: func(a, b any) {
			if nodeChanged(a, b) {
				o.enqueueAll()
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("node handler: %w", err)
	}
	if _, err := o.podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { o.enqueueAll() },
		DeleteFunc: func(any) { o.enqueueAll() },
		UpdateFunc: func(a, b any) {
			if podChanged(a, b) {
				o.enqueueAll()
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("pod handler: %w", err)
	}
	return o, nil
}

func keyHandler(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandler {
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.Add(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: add, DeleteFunc: add, UpdateFunc: func(_, b any) { add(b) }}
}

// specIPs renders a pool object's spec.ips for comparison.
func specIPs(obj any) string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return ""
	}
	ips, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "ips")
	return strings.Join(ips, ",")
}

// enqueuePools schedules a pass of every pool.
func (o *operator) enqueuePools() {
	for _, k := range o.poolInf.GetStore().ListKeys() {
		o.poolQueue.Add(k)
	}
}

// enqueueAll schedules a pass of every pool and record set. Passes read
// only the informer caches unless something is due, so this is cheap.
func (o *operator) enqueueAll() {
	if o.poolInf != nil {
		for _, k := range o.poolInf.GetStore().ListKeys() {
			o.poolQueue.Add(k)
		}
	}
	if o.dnsInf != nil {
		for _, k := range o.dnsInf.GetStore().ListKeys() {
			o.dnsQueue.Add(k)
		}
	}
}

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase, Conditions: p.Status.Conditions},
	}, nil
}

// nodeChanged ignores updates that cannot change a decision (heartbeats).
func nodeChanged(a, b any) bool {
	x, ok1 := a.(*corev1.Node)
	y, ok2 := b.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	if x.Spec.ProviderID != y.Spec.ProviderID || nodeReady(x) != nodeReady(y) ||
		x.Annotations[ReservedIPAnnotation] != y.Annotations[ReservedIPAnnotation] ||
		(x.DeletionTimestamp == nil) != (y.DeletionTimestamp == nil) ||
		!labels.Equals(x.Labels, y.Labels) || len(x.Spec.Taints) != len(y.Spec.Taints) ||
		len(x.Status.Addresses) != len(y.Status.Addresses) {
		return true
	}
	for i := range x.Spec.Taints {
		if !x.Spec.Taints[i].MatchTaint(&y.Spec.Taints[i]) || x.Spec.Taints[i].Value != y.Spec.Taints[i].Value {
			return true
		}
	}
	for i := range x.Status.Addresses {
		if x.Status.Addresses[i] != y.Status.Addresses[i] {
			return true
		}
	}
	return false
}

func podChanged(a, b any) bool {
	x, ok1 := a.(*corev1.Pod)
	y, ok2 := b.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	ready := func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	return x.Spec.NodeName != y.Spec.NodeName || x.Status.Phase != y.Status.Phase || ready(x) != ready(y) ||
		(x.DeletionTimestamp == nil) != (y.DeletionTimestamp == nil) || !labels.Equals(x.Labels, y.Labels)
}

// run starts the informers and workers and blocks until ctx ends.
func (o *operator) run(ctx context.Context) error {
	o.factory.Start(ctx.Done())
	o.dynFactory.Start(ctx.Done())
	defer func() {
		if o.poolQueue != nil {
			o.poolQueue.ShutDown()
		}
		if o.dnsQueue != nil {
			o.dnsQueue.ShutDown()
		}
		o.factory.Shutdown()
		o.dynFactory.Shutdown()
	}()
	synced := []cache.InformerSynced{o.nodeInf.HasSynced, o.podInf.HasSynced}
	if o.poolInf != nil {
		synced = append(synced, o.poolInf.HasSynced)
	}
	if o.dnsInf != nil {
		synced = append(synced, o.dnsInf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("informer caches did not sync")
	}
	o.log.Info("kube controllers running", "floatingippool", o.poolInf != nil, "nodednsrecordset", o.dnsInf != nil)
	o.enqueueAll()
	var wg sync.WaitGroup
	for range o.workers {
		if o.poolQueue != nil {
			wg.Add(1)
			go func() { defer wg.Done(); o.work(ctx, o.poolQueue, o.syncPool) }()
		}
		if o.dnsQueue != nil {
			wg.Add(1)
			go func() { defer wg.Done(); o.work(ctx, o.dnsQueue, o.syncNodeDNS) }()
		}
	}
	<-ctx.Done()
	if o.poolQueue != nil {
		o.poolQueue.ShutDown()
	}
	if o.dnsQueue != nil {
		o.dnsQueue.ShutDown()
	}
	wg.Wait()
	return nil
}

// work processes keys: a pass returns when it wants to run again (always
// within reconcilePeriod); an error retries with the queue's backoff.
func (o *operator) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string],
	sync func(context.Context, string) (time.Time, error)) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		func() {
			defer q.Done(key)
			wake, err := sync(ctx, key)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				o.log.Warn("pass failed, retrying", "key", key, "err", err)
				q.AddRateLimited(key)
				return
			}
			q.Forget(key)
			if wake.IsZero() {
				return
			}
			d := wake.Sub(o.now())
			if d > reconcilePeriod {
				d = reconcilePeriod
			}
			if d < 0 {
				d = 0
			}
			q.AddAfter(key, d)
		}()
	}
}

// enabledNodes lists the nodes the matcher selects, sorted by name.
func (o *operator) enabledNodes(m *matcher) ([]*corev1.Node, error) {
	nodes, err := o.nodes.List(m.nodeSel)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return m.enabledNodes(nodes, func(node string) []*corev1.Pod {
		objs, err := o.podInf.GetIndexer().ByIndex(podNodeIndex, node)
		if err != nil {
			return nil
		}
		out := make([]*corev1.Pod, 0, len(objs))
		for _, obj := range objs {
			if p, ok := obj.(*corev1.Pod); ok {
				out = append(out, p)
			}
		}
		return out
	}), nil
}

// patchStatus replaces the object's status through the status subresource
// when it differs from the cached one.
func (o *operator) patchStatus(ctx context.Context, gvrRes string, u *unstructured.Unstructured, cached, want any) error {
	a, err := json.Marshal(cached)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	b, err := json.Marshal(want)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	if string(a) == string(b) {
		return nil
	}
	patch, err := json.Marshal([]map[string]any{{"op": "add", "path": "/status", "value": json.RawMessage(b)}})
	if err != nil {
		return fmt.Errorf("encode status patch: %w", err)
	}
	res := FloatingIPPoolResource
	if gvrRes == NodeDNSRecordSetResource.Resource {
		res = NodeDNSRecordSetResource
	}
	_, err = o.dyn.Resource(res).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of %s %s/%s: %w", res.Resource, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// setAnnotation sets (ip != "") or removes the reserved-IP annotation.
func (o *operator) setAnnotation(ctx context.Context, node, ip string) error {
	var v any
	if ip != "" {
		v = ip
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{ReservedIPAnnotation: v}}})
	if err != nil {
		return fmt.Errorf("encode annotation patch: %w", err)
	}
	_, err = o.kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("annotate node %s: %w", node, err)
	}
	return nil
}

func earliest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if !t.IsZero() && (out.IsZero() || t.Before(out)) {
			out = t
		}
	}
	return out
}

func sortedUnique(in []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
