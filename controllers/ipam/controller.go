package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// Cluster API IPAM resources (ipam.cluster.x-k8s.io/v1beta1) and Cluster.
var (
	IPAddressClaimResource = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddressclaims"}
	IPAddressResource      = schema.GroupVersionResource{Group: "ipam.cluster.x-k8s.io", Version: "v1beta1", Resource: "ipaddresses"}
	ClusterResource        = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}
)

// Options configure Run. Zero values take the documented defaults.
type Options struct {
	// Services runs the LoadBalancer Service controller; CAPI the Cluster
	// API IPAM provider. The pool status writer runs with either.
	Services, CAPI bool
	// DefaultClass also serves LoadBalancer Services without a
	// loadBalancerClass (VIPD_SERVICES_DEFAULT_CLASS, --default-class).
	DefaultClass bool
	// Workers per queue. Default 4.
	Workers int
	// Resync re-examines every object this often (and collects orphaned
	// allocations). Default 1m.
	Resync time.Duration
	// OrphanGrace is how old an extra allocation of a live claimer must be
	// before it is released (a replica may be between its claim and its
	// status write). Default 30s.
	OrphanGrace time.Duration
	// Component names the event source. Default "vipd".
	Component string
	Log       *slog.Logger
	Now       func() time.Time
	// Metrics, when set, counts outcomes and exposes the pools' counts
	// while Run runs.
	Metrics *Metrics
}

func (o Options) withDefaults() Options {
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	if o.OrphanGrace <= 0 {
		o.OrphanGrace = 30 * time.Second
	}
	if o.Component == "" {
		o.Component = "vipd"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// controller is one replica's running state. Everything it knows is read
// from the API server (informers); the allocator's creates decide.
type controller struct {
	opts  Options
	log   *slog.Logger
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	alloc *Allocator
	rec   record.EventRecorder

	svcLister corelisters.ServiceLister
	nsLister  corelisters.NamespaceLister
	svcInf    cache.SharedIndexInformer
	nsInf     cache.SharedIndexInformer
	poolInf   cache.SharedIndexInformer
	allocInf  cache.SharedIndexInformer
	claimInf  cache.SharedIndexInformer // nil unless CAPI
	addrInf   cache.SharedIndexInformer // nil unless CAPI
	egressInf cache.SharedIndexInformer // nil unless the EgressPolicy CRD is served (egress.go)

	svcQ, claimQ, poolQ workqueue.TypedRateLimitingInterface[string]
	egressQ             workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	waiting map[string]bool // queue-prefixed keys waiting for a free address
}

const (
	holderIndex  = "holder"  // "Kind/namespace/name" of the claimer and every sharer
	addressIndex = "address" // canonical address
)

// holderKey is the index key of a claimer.
func holderKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// Run runs the enabled controllers until ctx ends. It returns nil then, and
// an error only when the informers cannot be set up.
func Run(ctx context.Context, kc kubernetes.Interface, dc dynamic.Interface, opts Options) error {
	opts = opts.withDefaults()
	if !opts.Services && !opts.CAPI {
		return nil
	}
	c := &controller{opts: opts, log: opts.Log.With("component", "ipam"), kube: kc, dyn: dc,
		alloc: NewAllocator(dc), waiting: map[string]bool{}}
	c.alloc.Now = opts.Now

	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kc.CoreV1().Events("")})
	defer bc.Shutdown()
	c.rec = bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: opts.Component})

	factory := informers.NewSharedInformerFactory(kc, 0)
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	c.poolInf = dynFactory.ForResource(v1alpha1.IPPoolResource).Informer()
	c.allocInf = dynFactory.ForResource(v1alpha1.IPAllocationResource).Informer()
	if err := c.allocInf.AddIndexers(cache.Indexers{holderIndex: indexHolders, addressIndex: indexAddress}); err != nil {
		return fmt.Errorf("allocation index: %w", err)
	}
	limiter := func() workqueue.TypedRateLimiter[string] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 5*time.Second)
	}
	newQ := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(limiter(), workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	c.poolQ = newQ("vipd_ippool_status")
	defer c.poolQ.ShutDown()
	var queues []workqueue.TypedRateLimitingInterface[string]
	if opts.Services {
		c.svcInf = factory.Core().V1().Services().Informer()
		c.svcLister = factory.Core().V1().Services().Lister()
		c.nsInf = factory.Core().V1().Namespaces().Informer()
		c.nsLister = factory.Core().V1().Namespaces().Lister()
		c.svcQ = newQ("vipd_services")
		defer c.svcQ.ShutDown()
		queues = append(queues, c.svcQ)
		if _, err := c.svcInf.AddEventHandler(keyHandler(c.svcQ)); err != nil {
			return fmt.Errorf("service handler: %w", err)
		}
		if _, err := c.nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, b any) {
				if ns, ok := b.(*corev1.Namespace); ok {
					c.enqueueNamespace(ns.Name)
				}
			},
		}); err != nil {
			return fmt.Errorf("namespace handler: %w", err)
		}
	}
	if opts.CAPI {
		c.claimInf = dynFactory.ForResource(IPAddressClaimResource).Informer()
		c.addrInf = dynFactory.ForResource(IPAddressResource).Informer()
		c.claimQ = newQ("vipd_ipaddressclaims")
		defer c.claimQ.ShutDown()
		queues = append(queues, c.claimQ)
		if _, err := c.claimInf.AddEventHandler(keyHandler(c.claimQ)); err != nil {
			return fmt.Errorf("claim handler: %w", err)
		}
		if _, err := c.addrInf.AddEventHandler(keyHandler(c.claimQ)); err != nil { // an IPAddress is named after its claim
			return fmt.Errorf("address handler: %w", err)
		}
	}
	if egressServed(kc) && c.egressReadable(ctx) {
		// EgressPolicy spec.poolRef (egress.go).
		c.egressInf = dynFactory.ForResource(EgressPolicyResource).Informer()
		c.egressQ = newQ("vipd_egresspolicies")
		defer c.egressQ.ShutDown()
		queues = append(queues, c.egressQ)
		if _, err := c.egressInf.AddEventHandler(keyHandler(c.egressQ)); err != nil {
			return fmt.Errorf("egress policy handler: %w", err)
		}
	}
	if _, err := c.poolInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.poolChanged(obj) },
		DeleteFunc: func(obj any) { c.poolChanged(obj) },
		UpdateFunc: func(a, b any) {
			if specChanged(a, b) {
				c.poolChanged(b)
				return
			}
			c.enqueuePool(b)
		},
	}); err != nil {
		return fmt.Errorf("pool handler: %w", err)
	}
	if _, err := c.allocInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.allocChanged(obj, false) },
		UpdateFunc: func(_, b any) { c.allocChanged(b, false) },
		DeleteFunc: func(obj any) { c.allocChanged(obj, true) },
	}); err != nil {
		return fmt.Errorf("allocation handler: %w", err)
	}

	factory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	defer factory.Shutdown()
	defer dynFactory.Shutdown()
	syncs := []cache.InformerSynced{c.poolInf.HasSynced, c.allocInf.HasSynced}
	for _, inf := range []cache.SharedIndexInformer{c.svcInf, c.nsInf, c.claimInf, c.addrInf, c.egressInf} {
		if inf != nil {
			syncs = append(syncs, inf.HasSynced)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return nil
	}
	opts.Metrics.set(c)
	defer opts.Metrics.set(nil)
	c.log.Info("ipam controllers running", "services", opts.Services, "capi", opts.CAPI, "default_class", opts.DefaultClass)

	var wg sync.WaitGroup
	run := func(q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) {
		for range opts.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c.work(ctx, q, sync) {
				}
			}()
		}
	}
	run(c.poolQ, c.syncPool)
	if opts.Services {
		run(c.svcQ, c.syncService)
	}
	if opts.CAPI {
		run(c.claimQ, c.syncClaim)
	}
	if c.egressQ != nil {
		run(c.egressQ, c.syncEgress)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(opts.Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.collectOrphans(ctx)
				c.enqueueEverything()
			}
		}
	}()
	c.collectOrphans(ctx)
	<-ctx.Done()
	c.poolQ.ShutDown()
	for _, q := range queues {
		q.ShutDown()
	}
	wg.Wait()
	return nil
}

// work processes one key; false when the queue is shut down.
func (c *controller) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	err := sync(ctx, key)
	switch {
	case err == nil:
		q.Forget(key)
	case ctx.Err() != nil:
	default:
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !errors.Is(err, errTooManyCollisions) {
			c.log.Warn("sync failed; retrying", "key", key, "err", err)
		}
		q.AddRateLimited(key)
	}
	return true
}

func keyHandler(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandler {
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.Add(key)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: add, DeleteFunc: add, UpdateFunc: func(_, b any) { add(b) }}
}

func specChanged(a, b any) bool {
	ua, ok1 := a.(*unstructured.Unstructured)
	ub, ok2 := b.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return true
	}
	return ua.GetGeneration() != ub.GetGeneration()
}

func (c *controller) enqueuePool(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		c.poolQ.Add(key)
	}
}

// poolChanged: a pool's addresses or rules changed; every pool's status
// (overlaps) and every claimer may be affected.
func (c *controller) poolChanged(obj any) {
	c.enqueuePool(obj)
	c.enqueueEverything()
}

func (c *controller) allocChanged(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	pool, _, _ := unstructured.NestedString(u.Object, "spec", "pool")
	if pool != "" {
		// Counted after a second: a burst of allocations is one status
		// write, not one each.
		c.poolQ.AddAfter(pool, time.Second)
	}
	al, err := FromUnstructured(u)
	if err != nil {
		return
	}
	for _, r := range append([]v1alpha1.ClaimRef{al.Spec.ClaimRef}, al.Spec.Shares...) {
		c.enqueueHolder(r)
	}
	if deleted {
		// An address came free: whoever waits for one tries again.
		c.mu.Lock()
		waiting := c.waiting
		c.waiting = map[string]bool{}
		c.mu.Unlock()
		for k := range waiting {
			kind, key, _ := cutKind(k)
			c.enqueueKind(kind, key)
		}
	}
}

func cutKind(k string) (kind, key string, ok bool) {
	for i := range len(k) {
		if k[i] == ':' {
			return k[:i], k[i+1:], true
		}
	}
	return "", k, false
}

func (c *controller) setWaiting(kind, key string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if on {
		c.waiting[kind+":"+key] = true
	} else {
		delete(c.waiting, kind+":"+key)
	}
}

func (c *controller) enqueueKind(kind, key string) {
	switch {
	case kind == kindService && c.svcQ != nil:
		c.svcQ.Add(key)
	case kind == kindClaim && c.claimQ != nil:
		c.claimQ.Add(key)
	case kind == kindEgress && c.egressQ != nil:
		c.egressQ.Add(key)
	}
}

func (c *controller) enqueueHolder(r v1alpha1.ClaimRef) {
	c.enqueueKind(r.Kind, r.Namespace+"/"+r.Name)
}

func (c *controller) enqueueNamespace(ns string) {
	if c.svcLister == nil {
		return
	}
	svcs, _ := c.svcLister.Services(ns).List(labelsEverything())
	for _, s := range svcs {
		c.svcQ.Add(s.Namespace + "/" + s.Name)
	}
}

func (c *controller) enqueueEverything() {
	for _, key := range c.poolInf.GetStore().ListKeys() {
		c.poolQ.Add(key)
	}
	if c.svcInf != nil {
		for _, key := range c.svcInf.GetStore().ListKeys() {
			c.svcQ.Add(key)
		}
	}
	if c.claimInf != nil {
		for _, key := range c.claimInf.GetStore().ListKeys() {
			c.claimQ.Add(key)
		}
	}
	if c.egressInf != nil {
		for _, key := range c.egressInf.GetStore().ListKeys() {
			c.egressQ.Add(key)
		}
	}
}

const (
	kindService = "Service"
	kindClaim   = "IPAddressClaim"
)

func indexHolders(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	al, err := FromUnstructured(u)
	if err != nil {
		return nil, nil
	}
	var out []string
	for _, r := range append([]v1alpha1.ClaimRef{al.Spec.ClaimRef}, al.Spec.Shares...) {
		out = append(out, holderKey(r.Kind, r.Namespace, r.Name))
	}
	return out, nil
}

func indexAddress(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	a, _, _ := unstructured.NestedString(u.Object, "spec", "address")
	if p, err := netip.ParseAddr(a); err == nil {
		return []string{p.Unmap().String()}, nil
	}
	return nil, nil
}

// pools parses every IPPool in the cache.
func (c *controller) pools() []*Pool {
	objs := c.poolInf.GetStore().List()
	specs := make([]v1alpha1.IPPool, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var p v1alpha1.IPPool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
			// A pool the schema let through but Go cannot read: show it
			// as invalid rather than ignore it.
			p = v1alpha1.IPPool{}
			p.Name, p.CreationTimestamp = u.GetName(), u.GetCreationTimestamp()
		}
		specs = append(specs, p)
	}
	return BuildPools(specs)
}

// heldBy lists the cached allocations ref holds (as claimer or sharer),
// with the same UID.
func (c *controller) heldBy(ref v1alpha1.ClaimRef) []*v1alpha1.IPAllocation {
	objs, _ := c.allocInf.GetIndexer().ByIndex(holderIndex, holderKey(ref.Kind, ref.Namespace, ref.Name))
	var out []*v1alpha1.IPAllocation
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		al, err := FromUnstructured(u)
		if err != nil {
			continue
		}
		if holdsExactly(al, ref) {
			out = append(out, al)
		}
	}
	slices.SortFunc(out, func(a, b *v1alpha1.IPAllocation) int { return compareAddr(a.Spec.Address, b.Spec.Address) })
	return out
}

// holdsExactly: ref (with its UID) is the claimer or a sharer.
func holdsExactly(al *v1alpha1.IPAllocation, ref v1alpha1.ClaimRef) bool {
	same := func(r v1alpha1.ClaimRef) bool {
		return r.Kind == ref.Kind && r.Namespace == ref.Namespace && r.Name == ref.Name && r.UID == ref.UID
	}
	return same(al.Spec.ClaimRef) || slices.ContainsFunc(al.Spec.Shares, same)
}

func compareAddr(a, b string) int {
	pa, err1 := netip.ParseAddr(a)
	pb, err2 := netip.ParseAddr(b)
	if err1 != nil || err2 != nil {
		switch {
		case a < b:
			return -1
		case a > b:
			return 1
		}
		return 0
	}
	return pa.Compare(pb)
}

// cachedAlloc returns the cached allocation of addr, if any.
func (c *controller) cachedAlloc(addr netip.Addr) *v1alpha1.IPAllocation {
	objs, _ := c.allocInf.GetIndexer().ByIndex(addressIndex, addr.Unmap().String())
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			if al, err := FromUnstructured(u); err == nil {
				return al
			}
		}
	}
	return nil
}

// takenHint reports addresses the cache shows as taken.
func (c *controller) takenHint(a netip.Addr) bool {
	objs, _ := c.allocInf.GetIndexer().ByIndex(addressIndex, a.Unmap().String())
	return len(objs) > 0
}

// allAllocs lists the cached allocations.
func (c *controller) allAllocs() []*v1alpha1.IPAllocation {
	var out []*v1alpha1.IPAllocation
	for _, o := range c.allocInf.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			if al, err := FromUnstructured(u); err == nil {
				out = append(out, al)
			}
		}
	}
	return out
}

// claimerUID reads the claimer's current UID from the API server: "" and
// no error when it does not exist.
func (c *controller) claimerUID(ctx context.Context, r v1alpha1.ClaimRef) (string, error) {
	switch r.Kind {
	case kindService:
		s, err := c.kube.CoreV1().Services(r.Namespace).Get(ctx, r.Name, metav1GetOptions())
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		return string(s.UID), nil
	case kindClaim:
		u, err := c.dyn.Resource(IPAddressClaimResource).Namespace(r.Namespace).Get(ctx, r.Name, metav1GetOptions())
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		return string(u.GetUID()), nil
	case kindEgress:
		return c.egressPolicyUID(ctx, r.Namespace, r.Name)
	}
	return "", fmt.Errorf("unknown claimer kind %q", r.Kind)
}

// cachedClaimerUID is the claimer's UID in the informer cache ("" when
// the cache does not have it).
func (c *controller) cachedClaimerUID(r v1alpha1.ClaimRef) string {
	var inf cache.SharedIndexInformer
	switch r.Kind {
	case kindService:
		inf = c.svcInf
	case kindClaim:
		inf = c.claimInf
	case kindEgress:
		inf = c.egressInf
	}
	if inf == nil {
		return ""
	}
	obj, ok, err := inf.GetStore().GetByKey(r.Namespace + "/" + r.Name)
	if err != nil || !ok {
		return ""
	}
	if m, ok := obj.(interface{ GetUID() types.UID }); ok {
		return string(m.GetUID())
	}
	return ""
}

// collectOrphans releases the holds of claimers that no longer exist or
// whose UID changed (deleted and re-created: the new object claims anew).
// Only kinds whose controller runs here are examined; existence is checked
// against the API server, never the cache alone.
func (c *controller) collectOrphans(ctx context.Context) {
	for _, al := range c.allAllocs() {
		for _, r := range append([]v1alpha1.ClaimRef{al.Spec.ClaimRef}, al.Spec.Shares...) {
			if (r.Kind == kindService && !c.opts.Services) || (r.Kind == kindClaim && !c.opts.CAPI) || (r.Kind == kindEgress && c.egressInf == nil) {
				continue
			}
			if c.cachedClaimerUID(r) == r.UID && r.UID != "" {
				continue // the cache shows it alive; a stale cache only delays a release
			}
			uid, err := c.claimerUID(ctx, r)
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("orphan check failed", "allocation", al.Name, "claimer", DescribeRef(r), "err", err)
				}
				continue
			}
			if uid != "" && (r.UID == "" || uid == r.UID) {
				continue
			}
			// Re-read: the record may have changed since the cache saw it.
			cur, err := c.alloc.Get(ctx, mustAddr(al))
			if err != nil || cur.UID != al.UID {
				break
			}
			if err := c.alloc.Release(ctx, cur, r); err != nil {
				c.log.Warn("releasing an orphaned allocation failed", "allocation", al.Name, "claimer", DescribeRef(r), "err", err)
				break
			}
			c.opts.Metrics.count(r.Kind, OutcomeReleased)
			c.log.Info("released an orphaned allocation", "address", al.Spec.Address, "pool", al.Spec.Pool,
				"claimer", DescribeRef(r), "claimer_uid", r.UID, "current_uid", uid)
			break // the record changed: the next pass looks again
		}
	}
}

func mustAddr(al *v1alpha1.IPAllocation) netip.Addr {
	a, err := Address(al)
	if err != nil {
		n, _ := v1alpha1.AddressOfName(al.Name)
		return n
	}
	return a
}
