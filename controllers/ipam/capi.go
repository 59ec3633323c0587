package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// The Cluster API IPAM contract as vipd implements it (docs/pools.md).
const (
	// FinalizerClaim holds an IPAddressClaim until its address is freed
	// (the name Cluster API's in-cluster provider uses).
	FinalizerClaim = "ipam.cluster.x-k8s.io/ip-claim-protection"
	// FinalizerAddress holds an IPAddress while its claim exists.
	FinalizerAddress = "ipam.cluster.x-k8s.io/ip-address-protection"
	// AnnotationPaused pauses reconciliation of a claim (or its Cluster).
	AnnotationPaused = "cluster.x-k8s.io/paused"
	// LabelClusterName names the claim's Cluster.
	LabelClusterName = "cluster.x-k8s.io/cluster-name"
	ipamGroup        = "ipam.cluster.x-k8s.io"
)

// Reasons of the claim's Ready condition (Cluster API's names).
const (
	ReasonPoolNotReady     = "PoolNotReady"
	ReasonPoolExhausted    = "PoolExhausted"
	ReasonAllocationFailed = "AllocationFailed"
)

func (c *controller) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	obj, exists, err := c.claimInf.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		c.setWaiting(kindClaim, key, false)
		if err := c.deleteAddress(ctx, ns, name, ""); err != nil {
			return err
		}
		return c.releaseGone(ctx, kindClaim, ns, name)
	}
	claim := obj.(*unstructured.Unstructured).DeepCopy()
	group, _, _ := unstructured.NestedString(claim.Object, "spec", "poolRef", "apiGroup")
	kind, _, _ := unstructured.NestedString(claim.Object, "spec", "poolRef", "kind")
	poolName, _, _ := unstructured.NestedString(claim.Object, "spec", "poolRef", "name")
	if group != v1alpha1.Group || kind != "IPPool" {
		return nil // another provider's claim
	}
	paused, err := c.paused(ctx, claim)
	if err != nil {
		return err
	}
	if paused {
		c.log.Debug("claim paused", "claim", key)
		return nil
	}
	ref := v1alpha1.ClaimRef{APIGroup: ipamGroup, Kind: kindClaim, Namespace: ns, Name: name, UID: string(claim.GetUID())}
	held := c.heldBy(ref)
	claims := c.dyn.Resource(IPAddressClaimResource).Namespace(ns)

	if claim.GetDeletionTimestamp() != nil {
		c.setWaiting(kindClaim, key, false)
		if err := c.deleteAddress(ctx, ns, name, claim.GetUID()); err != nil {
			return err
		}
		for _, al := range held {
			if err := c.alloc.Release(ctx, al, ref); err != nil {
				return err
			}
			c.opts.Metrics.count(kindClaim, OutcomeReleased)
		}
		if fins := claim.GetFinalizers(); slices.Contains(fins, FinalizerClaim) {
			claim.SetFinalizers(slices.DeleteFunc(fins, func(f string) bool { return f == FinalizerClaim }))
			if _, err := claims.Update(ctx, claim, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("remove finalizer of IPAddressClaim %s: %w", key, err)
			}
		}
		return nil
	}
	if !slices.Contains(claim.GetFinalizers(), FinalizerClaim) {
		claim.SetFinalizers(append(claim.GetFinalizers(), FinalizerClaim))
		up, err := claims.Update(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("add finalizer to IPAddressClaim %s: %w", key, err)
		}
		claim = up
	}

	// The IPAddress from the cache: one created meanwhile by another
	// replica makes this pass's create fail with AlreadyExists, and the
	// next pass sees it.
	addresses := c.dyn.Resource(IPAddressResource).Namespace(ns)
	var existing *unstructured.Unstructured
	err = apierrors.NewNotFound(IPAddressResource.GroupResource(), name)
	if obj, ok, gerr := c.addrInf.GetStore().GetByKey(key); gerr == nil && ok {
		existing, err = obj.(*unstructured.Unstructured), nil
	}
	if err == nil && ownedBy(existing, claim.GetUID()) {
		// The IPAddress is the claim's answer and the arbiter between
		// replicas: keep its address, give back any other.
		s, _, _ := unstructured.NestedString(existing.Object, "spec", "address")
		a, perr := netip.ParseAddr(s)
		if perr != nil {
			return fmt.Errorf("IPAddress %s: address %q: %w", key, s, perr)
		}
		a = a.Unmap()
		for _, al := range held {
			if al.Spec.Address != a.String() {
				if err := c.alloc.Release(ctx, al, ref); err != nil {
					return err
				}
			}
		}
		if cur := c.cachedAlloc(a); cur == nil || !holdsExactly(cur, ref) {
			// The record is missing (deleted by hand?): take it again; a
			// conflict means someone else has it now.
			cur, err := c.alloc.Get(ctx, a)
			if apierrors.IsNotFound(err) {
				_, err = c.alloc.Take(ctx, a, poolName, ref, "")
			} else if err == nil && !holdsExactly(cur, ref) {
				err = &TakenError{Address: a, Holder: cur.Spec.ClaimRef, Alloc: cur}
			}
			var te *TakenError
			if errors.As(err, &te) {
				return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, ReasonAllocationFailed, te.Error())
			}
			if err != nil {
				return err
			}
		}
		c.setWaiting(kindClaim, key, false)
		return c.claimStatus(ctx, claim, name, metav1.ConditionTrue, "", "")
	}
	if err == nil {
		return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, ReasonAllocationFailed,
			fmt.Sprintf("an IPAddress %s not owned by this claim exists", key))
	}

	var pool *Pool
	for _, p := range c.pools() {
		if p.Name == poolName {
			pool = p
		}
	}
	if pool == nil || pool.Err != nil {
		msg := fmt.Sprintf("IPPool %s does not exist", poolName)
		if pool != nil {
			msg = fmt.Sprintf("IPPool %s is invalid: %v", poolName, pool.Err)
		}
		c.setWaiting(kindClaim, key, true)
		return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, ReasonPoolNotReady, msg)
	}
	family := pool.Ranges.Families()[0]
	var al *v1alpha1.IPAllocation
	for _, h := range held {
		if h.Spec.Pool == pool.Name && pool.Ranges.Contains(mustAddr(h)) {
			al = h
			break
		}
	}
	if al == nil {
		al, err = c.alloc.FirstFree(ctx, []*Pool{pool}, family, ref, "", c.takenHint)
		if errors.Is(err, ErrExhausted) {
			c.setWaiting(kindClaim, key, true)
			if !claimReason(claim, ReasonPoolExhausted) {
				c.opts.Metrics.count(kindClaim, OutcomeExhausted)
				c.rec.Eventf(claim, corev1.EventTypeWarning, ReasonPoolExhausted, "no free address in IPPool %s", pool.Name)
			}
			return c.claimStatus(ctx, claim, "", metav1.ConditionFalse, ReasonPoolExhausted, fmt.Sprintf("no free address in IPPool %s", pool.Name))
		}
		if err != nil {
			return err
		}
	}
	addr := mustAddr(al)
	prefix := int64(addr.BitLen())
	if pool.Spec.PrefixLength != nil {
		prefix = int64(*pool.Spec.PrefixLength)
	}
	spec := map[string]any{
		"address":  addr.String(),
		"prefix":   prefix,
		"claimRef": map[string]any{"name": name},
		"poolRef":  map[string]any{"apiGroup": v1alpha1.Group, "kind": "IPPool", "name": pool.Name},
	}
	if pool.Spec.Gateway != "" {
		spec["gateway"] = pool.Spec.Gateway
	}
	ipaddr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": IPAddressResource.GroupVersion().String(),
		"kind":       "IPAddress",
		"metadata": map[string]any{
			"name":       name,
			"namespace":  ns,
			"finalizers": []any{FinalizerAddress},
		},
		"spec": spec,
	}}
	tru := true
	ipaddr.SetOwnerReferences([]metav1.OwnerReference{
		{APIVersion: IPAddressClaimResource.GroupVersion().String(), Kind: kindClaim, Name: name, UID: claim.GetUID(), Controller: &tru, BlockOwnerDeletion: &tru},
		{APIVersion: v1alpha1.Group + "/" + v1alpha1.Version, Kind: "IPPool", Name: pool.Name, UID: c.poolUID(pool.Name), BlockOwnerDeletion: &tru},
	})
	if cl := claim.GetLabels()[LabelClusterName]; cl != "" {
		ipaddr.SetLabels(map[string]string{LabelClusterName: cl})
	}
	if _, err := addresses.Create(ctx, ipaddr, metav1.CreateOptions{}); err != nil {
		// Another replica answered first (or the create failed): the
		// next pass keeps the address the IPAddress shows and gives back
		// any other. Nothing is released here: the other replica may have
		// answered with this very record (Take returns a record its
		// claimer already holds).
		return fmt.Errorf("create IPAddress %s: %w", key, err)
	}
	c.setWaiting(kindClaim, key, false)
	c.opts.Metrics.count(kindClaim, OutcomeAllocated)
	c.rec.Eventf(claim, corev1.EventTypeNormal, ReasonAllocated, "Allocated %s from IPPool %s", addr, pool.Name)
	return c.claimStatus(ctx, claim, name, metav1.ConditionTrue, "", "")
}

func (c *controller) poolUID(name string) (uid typesUID) {
	obj, ok, _ := c.poolInf.GetStore().GetByKey(name)
	if !ok {
		return ""
	}
	return obj.(*unstructured.Unstructured).GetUID()
}

func ownedBy(u *unstructured.Unstructured, uid typesUID) bool {
	for _, o := range u.GetOwnerReferences() {
		if o.UID == uid && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// deleteAddress removes the claim's IPAddress (our finalizer first). With
// uid set, only an IPAddress owned by that claim.
func (c *controller) deleteAddress(ctx context.Context, ns, name string, uid typesUID) error {
	addresses := c.dyn.Resource(IPAddressResource).Namespace(ns)
	cur, err := addresses.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if uid != "" && !ownedBy(cur, uid) {
		return nil
	}
	if uid == "" {
		// The claim is gone: only an IPAddress whose owning claim is gone
		// too (it may be a new claim's answer otherwise).
		if owner := controllerOf(cur); owner != "" {
			live, err := c.dyn.Resource(IPAddressClaimResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && live.GetUID() == owner {
				return nil
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	if fins := cur.GetFinalizers(); slices.Contains(fins, FinalizerAddress) {
		cur.SetFinalizers(slices.DeleteFunc(fins, func(f string) bool { return f == FinalizerAddress }))
		if cur, err = addresses.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("remove finalizer of IPAddress %s/%s: %w", ns, name, err)
		}
	}
	curUID := cur.GetUID()
	if err := addresses.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &curUID}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete IPAddress %s/%s: %w", ns, name, err)
	}
	return nil
}

func controllerOf(u *unstructured.Unstructured) typesUID {
	for _, o := range u.GetOwnerReferences() {
		if o.Controller != nil && *o.Controller {
			return o.UID
		}
	}
	return ""
}

// paused: the claim or its Cluster carries cluster.x-k8s.io/paused, or the
// Cluster has spec.paused. A Cluster API without Clusters (only the IPAM
// CRDs installed) pauses nothing.
func (c *controller) paused(ctx context.Context, claim *unstructured.Unstructured) (bool, error) {
	if _, ok := claim.GetAnnotations()[AnnotationPaused]; ok {
		return true, nil
	}
	cluster, _, _ := unstructured.NestedString(claim.Object, "spec", "clusterName")
	if cluster == "" {
		cluster = claim.GetLabels()[LabelClusterName]
	}
	if cluster == "" {
		return false, nil
	}
	u, err := c.dyn.Resource(ClusterResource).Namespace(claim.GetNamespace()).Get(ctx, cluster, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil // no such Cluster, or no Cluster CRD
	}
	if err != nil {
		return false, fmt.Errorf("read Cluster %s/%s: %w", claim.GetNamespace(), cluster, err)
	}
	if _, ok := u.GetAnnotations()[AnnotationPaused]; ok {
		return true, nil
	}
	p, _, _ := unstructured.NestedBool(u.Object, "spec", "paused")
	return p, nil
}

// claimStatus writes status.addressRef and the Ready condition when they
// changed.
func (c *controller) claimStatus(ctx context.Context, claim *unstructured.Unstructured, addressName string, status metav1.ConditionStatus, reason, msg string) error {
	next := claim.DeepCopy()
	if addressName != "" {
		_ = unstructured.SetNestedField(next.Object, addressName, "status", "addressRef", "name")
	} else {
		unstructured.RemoveNestedField(next.Object, "status", "addressRef")
	}
	conds, _, _ := unstructured.NestedSlice(next.Object, "status", "conditions")
	var out []any
	var prev map[string]any
	for _, ci := range conds {
		m, ok := ci.(map[string]any)
		if ok && m["type"] == "Ready" {
			prev = m
			continue
		}
		out = append(out, ci)
	}
	cond := map[string]any{"type": "Ready", "status": string(status),
		"lastTransitionTime": c.opts.Now().UTC().Truncate(time.Second).Format(time.RFC3339)}
	if reason != "" {
		cond["reason"] = reason
		cond["severity"] = "Warning"
	}
	if msg != "" {
		cond["message"] = msg
	}
	if prev != nil && prev["status"] == cond["status"] {
		cond["lastTransitionTime"] = prev["lastTransitionTime"]
	}
	out = append(out, cond)
	_ = unstructured.SetNestedSlice(next.Object, out, "status", "conditions")
	if equalJSON(claim.Object["status"], next.Object["status"]) {
		return nil
	}
	if _, err := c.dyn.Resource(IPAddressClaimResource).Namespace(claim.GetNamespace()).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of IPAddressClaim %s/%s: %w", claim.GetNamespace(), claim.GetName(), err)
	}
	if status == metav1.ConditionFalse && reason != ReasonPoolExhausted {
		c.rec.Event(claim, corev1.EventTypeWarning, reason, msg)
	}
	return nil
}

// claimReason reports whether the claim's Ready condition already has the
// reason (so an unchanged failure is not counted or announced again).
func claimReason(claim *unstructured.Unstructured, reason string) bool {
	conds, _, _ := unstructured.NestedSlice(claim.Object, "status", "conditions")
	for _, ci := range conds {
		if m, ok := ci.(map[string]any); ok && m["type"] == "Ready" && m["reason"] == reason {
			return true
		}
	}
	return false
}
