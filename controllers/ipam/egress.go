package ipam

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// EgressPolicyResource is vipd's EgressPolicy (docs/egress.md): one with
// spec.poolRef gets its egress IP from that IPPool, as an IPAllocation
// whose claimRef is the policy.
var EgressPolicyResource = schema.GroupVersionResource{Group: v1alpha1.Group, Version: "v1alpha1", Resource: "egresspolicies"}

// kindEgress is the claimRef kind of an EgressPolicy's allocation.
const kindEgress = "EgressPolicy"

// ReasonEgressPoolExhausted is the event reason when a pool has no free address
// for an EgressPolicy (the policy's Ready condition, written by the nodes'
// egress feed, says the same).
const ReasonEgressPoolExhausted = "PoolExhausted"

// egressServed reports whether the API server serves EgressPolicy objects
// (the CRD is installed): the EgressPolicy allocations run then.
func egressServed(kc kubernetes.Interface) bool {
	rl, err := kc.Discovery().ServerResourcesForGroupVersion(EgressPolicyResource.GroupVersion().String())
	if err != nil {
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == EgressPolicyResource.Resource {
			return true
		}
	}
	return false
}

// egressReadable reports whether this identity may list EgressPolicy
// objects: an informer on a forbidden resource never syncs and would hold
// up every controller (an older RBAC without egresspolicies).
func (c *controller) egressReadable(ctx context.Context) bool {
	_, err := c.dyn.Resource(EgressPolicyResource).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		c.log.Warn("EgressPolicy spec.poolRef is not served: cannot list EgressPolicy objects (deploy/kube/rbac.yaml grants it)", "err", err)
		return false
	}
	return true
}

// syncEgress gives an EgressPolicy with spec.poolRef one address of that
// pool (the family of the pool's first range) and releases what it holds
// when it is deleted, points at another pool, or has a fixed egressIP.
func (c *controller) syncEgress(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	obj, exists, err := c.egressInf.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		c.setWaiting(kindEgress, key, false)
		return c.releaseGone(ctx, kindEgress, ns, name)
	}
	pol := obj.(*unstructured.Unstructured)
	ref := v1alpha1.ClaimRef{APIGroup: v1alpha1.Group, Kind: kindEgress, Namespace: ns, Name: name, UID: string(pol.GetUID())}
	held := c.heldBy(ref)
	poolName, _, _ := unstructured.NestedString(pol.Object, "spec", "poolRef", "name")
	release := func(keep *v1alpha1.IPAllocation) error {
		for _, al := range held {
			if keep != nil && al.Name == keep.Name {
				continue
			}
			if err := c.alloc.Release(ctx, al, ref); err != nil {
				return err
			}
			c.opts.Metrics.count(kindEgress, OutcomeReleased)
			c.log.Info("released the address of an EgressPolicy", "policy", key, "address", al.Spec.Address, "pool", al.Spec.Pool)
		}
		return nil
	}
	if poolName == "" || pol.GetDeletionTimestamp() != nil {
		c.setWaiting(kindEgress, key, false)
		return release(nil)
	}
	var pool *Pool
	for _, p := range c.pools() {
		if p.Name == poolName {
			pool = p
		}
	}
	if pool == nil || pool.Err != nil || len(pool.Ranges.Families()) == 0 {
		// The feed reports the missing pool in the policy's status.
		c.setWaiting(kindEgress, key, true)
		return release(nil)
	}
	var keep *v1alpha1.IPAllocation
	for _, h := range held {
		if h.Spec.Pool == pool.Name && pool.Ranges.Contains(mustAddr(h)) {
			keep = h
			break
		}
	}
	if keep == nil {
		al, err := c.alloc.FirstFree(ctx, []*Pool{pool}, pool.Ranges.Families()[0], ref, "", c.takenHint)
		if errors.Is(err, ErrExhausted) {
			c.mu.Lock()
			already := c.waiting[kindEgress+":"+key]
			c.mu.Unlock()
			c.setWaiting(kindEgress, key, true)
			if !already {
				c.opts.Metrics.count(kindEgress, OutcomeExhausted)
				c.rec.Eventf(pol, corev1.EventTypeWarning, ReasonEgressPoolExhausted, "no free address in IPPool %s", pool.Name)
				c.log.Warn("no free address for an EgressPolicy", "policy", key, "pool", pool.Name)
			}
			return release(nil)
		}
		if err != nil {
			return err
		}
		keep = al
		c.opts.Metrics.count(kindEgress, OutcomeAllocated)
		c.log.Info("allocated the egress IP of an EgressPolicy", "policy", key, "address", al.Spec.Address, "pool", pool.Name)
	}
	c.setWaiting(kindEgress, key, false)
	return release(keep)
}

// egressPolicyUID reads an EgressPolicy's UID ("" when it is gone).
func (c *controller) egressPolicyUID(ctx context.Context, ns, name string) (string, error) {
	u, err := c.dyn.Resource(EgressPolicyResource).Namespace(ns).Get(ctx, name, metav1GetOptions())
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("EgressPolicy %s/%s: %w", ns, name, err)
	}
	return string(u.GetUID()), nil
}
