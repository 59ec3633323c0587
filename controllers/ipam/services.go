package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// The Service contract (docs/pools.md).
const (
	// LoadBalancerClass is the spec.loadBalancerClass vipd serves.
	LoadBalancerClass = "vipd.io/lb"
	// AnnotationLoadBalancerIPs requests addresses: a comma list, at most
	// one per family. spec.loadBalancerIP is honoured when it is absent.
	AnnotationLoadBalancerIPs = "vipd.io/loadBalancerIPs"
	// AnnotationIPPool names the pools to draw from (comma list).
	AnnotationIPPool = "vipd.io/ip-pool"
	// AnnotationSharingKey lets Services with the same key and disjoint
	// ports share one address.
	AnnotationSharingKey = "vipd.io/sharing-key"
	// FinalizerService keeps a Service until its addresses are released.
	FinalizerService = "vipd.io/load-balancer"
	// ConditionAllocated is the Service status condition: True with the
	// addresses, or False with why not (naming the holder of a requested
	// address that is taken).
	ConditionAllocated = "vipd.io/AddressAllocated"
)

// Reasons of the Service condition and events.
const (
	ReasonAllocated       = "Allocated"
	ReasonAddressInUse    = "AddressInUse"
	ReasonNotInPool       = "AddressNotInPool"
	ReasonBadRequest      = "InvalidRequest"
	ReasonNoPool          = "NoMatchingPool"
	ReasonExhausted       = "PoolExhausted"
	ReasonSharingRejected = "SharingRejected"
	ReasonReleased        = "AddressReleased"
)

func labelsEverything() labels.Selector   { return labels.Everything() }
func metav1GetOptions() metav1.GetOptions { return metav1.GetOptions{} }

// served reports whether the Service is one vipd allocates for.
func (c *controller) served(s *corev1.Service) bool {
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if s.Spec.LoadBalancerClass == nil {
		return c.opts.DefaultClass
	}
	return *s.Spec.LoadBalancerClass == LoadBalancerClass
}

// shortfall is why a family got no address.
type shortfall struct {
	reason, msg string
}

func (c *controller) syncService(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.svcLister.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.setWaiting(kindService, key, false)
		return c.releaseGone(ctx, kindService, ns, name)
	}
	if err != nil {
		return err
	}
	svc = svc.DeepCopy()
	ref := v1alpha1.ClaimRef{Kind: kindService, Namespace: ns, Name: name, UID: string(svc.UID)}
	held := c.heldBy(ref)

	if svc.DeletionTimestamp != nil || !c.served(svc) {
		c.setWaiting(kindService, key, false)
		return c.unserve(ctx, svc, ref, held)
	}
	if !slices.Contains(svc.Finalizers, FinalizerService) {
		svc.Finalizers = append(svc.Finalizers, FinalizerService)
		up, err := c.kube.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("add finalizer to Service %s: %w", key, err)
		}
		svc = up
	}

	// Addresses the status shows that the cache does not (yet) show as
	// ours: ask the API server, so a replica with a stale cache adopts
	// what another wrote instead of claiming a second address.
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		a, err := netip.ParseAddr(ing.IP)
		if err != nil || slices.ContainsFunc(held, func(al *v1alpha1.IPAllocation) bool { return al.Spec.Address == a.Unmap().String() }) {
			continue
		}
		cur, err := c.alloc.Get(ctx, a)
		if err == nil && holdsExactly(cur, ref) {
			held = append(held, cur)
		} else if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}

	pools := c.pools()
	facts := c.facts(svc)
	matched := MatchPools(pools, facts)
	sharer := sharerOf(svc)
	requested, reqErr := requestedAddresses(svc)
	families := wantedFamilies(svc, requested)

	// Keep one valid allocation per family; release the rest.
	inStatus := map[string]bool{}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		inStatus[ing.IP] = true
	}
	keep := map[Family]*v1alpha1.IPAllocation{}
	var drop, extra []*v1alpha1.IPAllocation
	valid := func(al *v1alpha1.IPAllocation) bool {
		a, err := Address(al)
		if err != nil || !slices.Contains(families, FamilyOf(a)) {
			return false
		}
		if len(requested) > 0 && !slices.Contains(requested, a) {
			return false
		}
		p := PoolOf(pools, a)
		if p == nil || p.Name != al.Spec.Pool {
			return false // outside its pool now: move (docs/pools.md)
		}
		if len(requested) > 0 {
			if !p.Allows(facts) || (len(facts.PoolNames) > 0 && !slices.Contains(facts.PoolNames, p.Name)) {
				return false
			}
		} else if !slices.Contains(matched, p) {
			return false
		}
		return al.Spec.SharingKey == sharer.Key
	}
	// Status addresses first, then the lowest.
	slices.SortStableFunc(held, func(a, b *v1alpha1.IPAllocation) int {
		ia, ib := inStatus[a.Spec.Address], inStatus[b.Spec.Address]
		switch {
		case ia && !ib:
			return -1
		case ib && !ia:
			return 1
		}
		return compareAddr(a.Spec.Address, b.Spec.Address)
	})
	for _, al := range held {
		a := mustAddr(al)
		if !valid(al) {
			drop = append(drop, al)
			continue
		}
		if keep[FamilyOf(a)] == nil {
			keep[FamilyOf(a)] = al
			continue
		}
		// A second one of the family: another replica's claim in flight,
		// the loser of a status race, or left by a crash. Released once
		// older than OrphanGrace, and only when the Service's status, read
		// from the API server, does not show it.
		if c.opts.Now().Sub(al.Spec.ClaimedAt.Time) > c.opts.OrphanGrace {
			extra = append(extra, al)
		}
	}
	if len(extra) > 0 {
		live, err := c.kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if live.UID != svc.UID {
			return nil // re-created meanwhile: the next event handles it
		}
		for _, al := range extra {
			if !slices.ContainsFunc(live.Status.LoadBalancer.Ingress, func(i corev1.LoadBalancerIngress) bool { return i.IP == al.Spec.Address }) {
				drop = append(drop, al)
			}
		}
	}
	for _, al := range drop {
		if err := c.alloc.Release(ctx, al, ref); err != nil {
			return err
		}
		c.rec.Eventf(svc, corev1.EventTypeNormal, ReasonReleased, "Released %s (pool %s)", al.Spec.Address, al.Spec.Pool)
		c.opts.Metrics.count(kindService, OutcomeReleased)
	}

	// Claim what is missing.
	var fresh []*v1alpha1.IPAllocation
	var short []shortfall
	if reqErr != nil {
		short = append(short, shortfall{ReasonBadRequest, reqErr.Error()})
	}
	for _, f := range families {
		if keep[f] != nil || reqErr != nil {
			continue // nothing new for a request that cannot be read
		}
		al, sf, err := c.claimFamily(ctx, svc, ref, f, requested, pools, matched, facts, sharer)
		if err != nil {
			return err
		}
		if sf != nil {
			short = append(short, *sf)
			continue
		}
		keep[f] = al
		fresh = append(fresh, al)
	}
	c.setWaiting(kindService, key, len(short) > 0)

	// Status: one ingress per family, in spec.ipFamilies order.
	var ingress []corev1.LoadBalancerIngress
	vip := corev1.LoadBalancerIPModeVIP
	var addrs []string
	for _, f := range families {
		if al := keep[f]; al != nil {
			ingress = append(ingress, corev1.LoadBalancerIngress{IP: al.Spec.Address, IPMode: &vip})
			addrs = append(addrs, al.Spec.Address)
		}
	}
	cond := metav1.Condition{Type: ConditionAllocated, ObservedGeneration: svc.Generation}
	if len(short) == 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonAllocated, strings.Join(addrs, ", ")
	} else {
		cond.Status, cond.Reason = metav1.ConditionFalse, short[0].reason
		var msgs []string
		for _, s := range short {
			msgs = append(msgs, s.msg)
		}
		cond.Message = strings.Join(msgs, "; ")
	}
	next := svc.DeepCopy()
	next.Status.LoadBalancer.Ingress = ingress
	meta.SetStatusCondition(&next.Status.Conditions, cond)
	if !equalStatus(svc.Status, next.Status) {
		if _, err := c.kube.CoreV1().Services(ns).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
			// Another replica wrote first (or the Service changed). What
			// this pass took is not given back here: the other replica may
			// have adopted the same record (Take returns a record its
			// claimer already holds). The next pass keeps one per family
			// and releases an extra one once it is older than OrphanGrace
			// and the Service's status does not show it.
			return fmt.Errorf("update status of Service %s: %w", key, err)
		}
		for _, al := range fresh {
			c.rec.Eventf(svc, corev1.EventTypeNormal, ReasonAllocated, "Allocated %s from pool %s", al.Spec.Address, al.Spec.Pool)
			c.opts.Metrics.count(kindService, OutcomeAllocated)
		}
		for _, s := range short {
			c.rec.Event(svc, corev1.EventTypeWarning, s.reason, s.msg)
			switch s.reason {
			case ReasonAddressInUse, ReasonSharingRejected:
				c.opts.Metrics.count(kindService, OutcomeConflict)
			case ReasonExhausted:
				c.opts.Metrics.count(kindService, OutcomeExhausted)
			}
		}
	}
	return nil
}

// claimFamily takes (or joins) an address of family f. A nil allocation
// with a shortfall means none could be had now.
func (c *controller) claimFamily(ctx context.Context, svc *corev1.Service, ref v1alpha1.ClaimRef, f Family,
	requested []netip.Addr, pools, matched []*Pool, facts ServiceFacts, sharer Sharer) (*v1alpha1.IPAllocation, *shortfall, error) {
	var want netip.Addr
	for _, a := range requested {
		if FamilyOf(a) == f {
			want = a
		}
	}
	if want.IsValid() {
		p := PoolOf(pools, want)
		if p == nil || !p.Allows(facts) || (len(facts.PoolNames) > 0 && !slices.Contains(facts.PoolNames, p.Name)) {
			return nil, &shortfall{ReasonNotInPool, fmt.Sprintf("requested %s is in no pool this Service may use", want)}, nil
		}
		al, err := c.alloc.Take(ctx, want, p.Name, ref, sharer.Key)
		var te *TakenError
		if errors.As(err, &te) {
			return c.join(ctx, te.Alloc, ref, sharer)
		}
		if err != nil {
			return nil, nil, err
		}
		return al, nil, nil
	}
	if len(matched) == 0 {
		return nil, &shortfall{ReasonNoPool, fmt.Sprintf("no valid pool with %s addresses admits this Service", f)}, nil
	}
	var fam []*Pool
	for _, p := range matched {
		if slices.Contains(p.Ranges.Families(), f) {
			fam = append(fam, p)
		}
	}
	if len(fam) == 0 {
		return nil, &shortfall{ReasonNoPool, fmt.Sprintf("no pool this Service may use has %s addresses", f)}, nil
	}
	// The address the status shows, if it is free again (its record was
	// deleted by hand): addresses stay put where they can.
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		a, err := netip.ParseAddr(ing.IP)
		if err != nil || FamilyOf(a) != f {
			continue
		}
		p := PoolOf(fam, a)
		if p == nil || c.takenHint(a) {
			continue
		}
		al, err := c.alloc.Take(ctx, a, p.Name, ref, sharer.Key)
		if err == nil {
			return al, nil, nil
		}
		var te *TakenError
		if !errors.As(err, &te) {
			return nil, nil, err
		}
	}
	if sharer.Key != "" {
		// Join a compatible address of the same key first.
		for _, al := range c.allAllocs() {
			a := mustAddr(al)
			if al.Spec.SharingKey != sharer.Key || FamilyOf(a) != f || !slices.ContainsFunc(fam, func(p *Pool) bool { return p.Name == al.Spec.Pool }) {
				continue
			}
			if CanShare(sharer, c.sharersOf(al)) != nil {
				continue
			}
			got, sf, err := c.join(ctx, al, ref, sharer)
			if err == nil && sf == nil {
				return got, nil, nil
			}
			if err != nil {
				return nil, nil, err
			}
		}
	}
	al, err := c.alloc.FirstFree(ctx, fam, f, ref, sharer.Key, c.takenHint)
	if errors.Is(err, ErrExhausted) {
		names := make([]string, 0, len(fam))
		for _, p := range fam {
			names = append(names, p.Name)
		}
		return nil, &shortfall{ReasonExhausted, fmt.Sprintf("no free %s address in pool %s", f, strings.Join(names, ", "))}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return al, nil, nil
}

// join adds the Service to the sharers of a taken address when the
// sharing rules allow it; otherwise it is a conflict naming the holder.
func (c *controller) join(ctx context.Context, al *v1alpha1.IPAllocation, ref v1alpha1.ClaimRef, sharer Sharer) (*v1alpha1.IPAllocation, *shortfall, error) {
	if holdsExactly(al, ref) {
		return al, nil, nil
	}
	holder := DescribeRef(al.Spec.ClaimRef)
	if sharer.Key == "" {
		return nil, &shortfall{ReasonAddressInUse, fmt.Sprintf("%s is held by %s", al.Spec.Address, holder)}, nil
	}
	if err := CanShare(sharer, c.sharersOf(al)); err != nil {
		return nil, &shortfall{ReasonSharingRejected, fmt.Sprintf("%s is held by %s and cannot be shared: %v", al.Spec.Address, holder, err)}, nil
	}
	out, err := c.alloc.AddShare(ctx, al, ref)
	if err != nil {
		return nil, nil, err
	}
	return out, nil, nil
}

// sharersOf describes the holders of an allocation for CanShare, reading
// their ports from the cache. The record's sharing key is theirs.
func (c *controller) sharersOf(al *v1alpha1.IPAllocation) []Sharer {
	var out []Sharer
	for _, r := range append([]v1alpha1.ClaimRef{al.Spec.ClaimRef}, al.Spec.Shares...) {
		s := Sharer{Key: al.Spec.SharingKey}
		if r.Kind == kindService && c.svcLister != nil {
			if svc, err := c.svcLister.Services(r.Namespace).Get(r.Name); err == nil {
				s.Ports = sharerOf(svc).Ports
			}
		}
		out = append(out, s)
	}
	return out
}

// unserve releases everything of a Service vipd no longer serves (deleted,
// another type or class), clears what vipd wrote and drops the finalizer.
func (c *controller) unserve(ctx context.Context, svc *corev1.Service, ref v1alpha1.ClaimRef, held []*v1alpha1.IPAllocation) error {
	had := slices.Contains(svc.Finalizers, FinalizerService)
	if !had && len(held) == 0 {
		return nil
	}
	// The status first: no Service may show an address after it has been
	// released (and handed to someone else). With the finalizer on, every
	// ingress entry is vipd's.
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		a, err := netip.ParseAddr(ing.IP)
		if err != nil || slices.ContainsFunc(held, func(al *v1alpha1.IPAllocation) bool { return al.Spec.Address == a.Unmap().String() }) {
			continue
		}
		if cur, err := c.alloc.Get(ctx, a); err == nil && holdsExactly(cur, ref) {
			held = append(held, cur)
		} else if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if had {
		next := svc.DeepCopy()
		next.Status.LoadBalancer.Ingress = nil
		meta.RemoveStatusCondition(&next.Status.Conditions, ConditionAllocated)
		if !equalStatus(svc.Status, next.Status) {
			up, err := c.kube.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
			if err != nil {
				return fmt.Errorf("clear status of Service %s/%s: %w", svc.Namespace, svc.Name, err)
			}
			svc = up
		}
	}
	for _, al := range held {
		cur, err := c.alloc.Get(ctx, mustAddr(al))
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if err := c.alloc.Release(ctx, cur, ref); err != nil {
			return err
		}
		c.opts.Metrics.count(kindService, OutcomeReleased)
	}
	if svc.DeletionTimestamp == nil && len(held) > 0 {
		c.rec.Event(svc, corev1.EventTypeNormal, ReasonReleased, "Released the load-balancer addresses: the Service is no longer a LoadBalancer of class "+LoadBalancerClass)
	}
	if had {
		svc = svc.DeepCopy()
		svc.Finalizers = slices.DeleteFunc(svc.Finalizers, func(f string) bool { return f == FinalizerService })
		if _, err := c.kube.CoreV1().Services(svc.Namespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizer of Service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
	}
	return nil
}

// releaseGone releases what a vanished claimer held, after the API server
// confirms it is gone.
func (c *controller) releaseGone(ctx context.Context, kind, ns, name string) error {
	objs, _ := c.allocInf.GetIndexer().ByIndex(holderIndex, holderKey(kind, ns, name))
	for _, o := range objs {
		u, ok := o.(interface{ GetName() string })
		if !ok {
			continue
		}
		addr, err := v1alpha1.AddressOfName(u.GetName())
		if err != nil {
			continue
		}
		cur, err := c.alloc.Get(ctx, addr)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		for _, r := range append([]v1alpha1.ClaimRef{cur.Spec.ClaimRef}, cur.Spec.Shares...) {
			if r.Kind != kind || r.Namespace != ns || r.Name != name {
				continue
			}
			uid, err := c.claimerUID(ctx, r)
			if err != nil {
				return err
			}
			if uid != "" && uid == r.UID {
				continue // it exists after all (cache behind)
			}
			if err := c.alloc.Release(ctx, cur, r); err != nil {
				return err
			}
			break
		}
	}
	return nil
}

func (c *controller) facts(svc *corev1.Service) ServiceFacts {
	f := ServiceFacts{Namespace: svc.Namespace, Labels: svc.Labels}
	if c.nsLister != nil {
		if ns, err := c.nsLister.Get(svc.Namespace); err == nil {
			f.NamespaceLabels = ns.Labels
		}
	}
	for _, n := range strings.Split(svc.Annotations[AnnotationIPPool], ",") {
		if n = strings.TrimSpace(n); n != "" {
			f.PoolNames = append(f.PoolNames, n)
		}
	}
	return f
}

func sharerOf(svc *corev1.Service) Sharer {
	s := Sharer{Key: strings.TrimSpace(svc.Annotations[AnnotationSharingKey])}
	for _, p := range svc.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = "TCP"
		}
		s.Ports = append(s.Ports, Port{Protocol: proto, Port: p.Port})
	}
	return s
}

// requestedAddresses reads vipd.io/loadBalancerIPs, else
// spec.loadBalancerIP. At most one address per family.
func requestedAddresses(svc *corev1.Service) ([]netip.Addr, error) {
	raw, ok := svc.Annotations[AnnotationLoadBalancerIPs]
	name := AnnotationLoadBalancerIPs
	if !ok || strings.TrimSpace(raw) == "" {
		raw, name = svc.Spec.LoadBalancerIP, "spec.loadBalancerIP"
	}
	var out []netip.Addr
	for _, s := range strings.Split(raw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%s=%q: %q is not an IP address (accepted: a comma list of addresses, one per family)", name, raw, s)
		}
		a = a.Unmap()
		if slices.ContainsFunc(out, func(b netip.Addr) bool { return FamilyOf(b) == FamilyOf(a) }) {
			return nil, fmt.Errorf("%s=%q: two %s addresses (accepted: at most one per family)", name, raw, FamilyOf(a))
		}
		out = append(out, a)
	}
	return out, nil
}

// wantedFamilies: the requested addresses' families, else spec.ipFamilies
// (IPv4 when empty).
func wantedFamilies(svc *corev1.Service, requested []netip.Addr) []Family {
	var out []Family
	if len(requested) > 0 {
		for _, a := range requested {
			out = append(out, FamilyOf(a))
		}
		return out
	}
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			out = append(out, IPv4)
		case corev1.IPv6Protocol:
			out = append(out, IPv6)
		}
	}
	if len(out) == 0 {
		out = []Family{IPv4}
	}
	return out
}

func equalStatus(a, b corev1.ServiceStatus) bool {
	if len(a.LoadBalancer.Ingress) != len(b.LoadBalancer.Ingress) || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.LoadBalancer.Ingress {
		x, y := a.LoadBalancer.Ingress[i], b.LoadBalancer.Ingress[i]
		if x.IP != y.IP || x.Hostname != y.Hostname || (x.IPMode == nil) != (y.IPMode == nil) || (x.IPMode != nil && *x.IPMode != *y.IPMode) {
			return false
		}
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}
