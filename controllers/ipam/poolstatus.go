package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

type typesUID = types.UID

func metav1Now() metav1.Time { return metav1.Now() }

// Pool condition types and reasons.
const (
	PoolReady     = "Ready"
	PoolInvalid   = "Invalid"
	PoolExhausted = "Exhausted"

	ReasonValid         = "Valid"
	ReasonFree          = "AddressesFree"
	ReasonNoneFree      = "NoAddressesFree"
	ReasonNotApplicable = "Invalid"
)

// PoolStatus computes a pool's status: total usable addresses, the
// allocations of the pool whose address is still in it (an address shared
// by several Services counts once), free = total - allocated; all
// saturating. Conditions Ready, Invalid (with the reason) and Exhausted keep
// their transition times from prev.
func PoolStatus(p *Pool, allocs []*v1alpha1.IPAllocation, prev v1alpha1.IPPoolStatus, generation int64, now metav1.Time) v1alpha1.IPPoolStatus {
	st := v1alpha1.IPPoolStatus{Conditions: append([]metav1.Condition(nil), prev.Conditions...)}
	set := func(typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: generation, LastTransitionTime: now})
	}
	if p.Err != nil {
		set(PoolReady, false, p.Reason, p.Err.Error())
		set(PoolInvalid, true, p.Reason, p.Err.Error())
		set(PoolExhausted, false, ReasonNotApplicable, "the pool is invalid")
		for _, al := range allocs {
			if al.Spec.Pool == p.Name {
				st.Allocated = AddSat(st.Allocated, 1)
			}
		}
		return st
	}
	st.Total = p.Ranges.Size(p.Spec.AvoidBuggyIPs)
	seen := map[netip.Addr]bool{}
	for _, al := range allocs {
		a, err := Address(al)
		if err != nil || al.Spec.Pool != p.Name || !p.Ranges.Contains(a) || seen[a] {
			continue
		}
		seen[a] = true
		st.Allocated = AddSat(st.Allocated, 1)
	}
	st.Free = max(st.Total-st.Allocated, 0)
	set(PoolReady, true, ReasonValid, "")
	set(PoolInvalid, false, ReasonValid, "")
	if st.Free == 0 {
		set(PoolExhausted, true, ReasonNoneFree, fmt.Sprintf("all %d addresses are allocated", st.Total))
	} else {
		set(PoolExhausted, false, ReasonFree, fmt.Sprintf("%d of %d addresses free", st.Free, st.Total))
	}
	return st
}

func (c *controller) syncPool(ctx context.Context, name string) error {
	obj, ok, err := c.poolInf.GetStore().GetByKey(name)
	if err != nil || !ok {
		return err
	}
	u := obj.(*unstructured.Unstructured)
	var pool *Pool
	for _, p := range c.pools() {
		if p.Name == name {
			pool = p
		}
	}
	if pool == nil {
		return nil
	}
	var cur v1alpha1.IPPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cur); err != nil {
		return nil
	}
	next := PoolStatus(pool, c.allAllocs(), cur.Status, u.GetGeneration(), metav1.NewTime(c.opts.Now()))
	if statusEqual(cur.Status, next) {
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&next)
	if err != nil {
		return err
	}
	out := u.DeepCopy()
	out.Object["status"] = m
	if _, err := c.dyn.Resource(v1alpha1.IPPoolResource).UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("update status of IPPool %s: %w", name, err)
	}
	return nil
}

func statusEqual(a, b v1alpha1.IPPoolStatus) bool {
	if a.Total != b.Total || a.Allocated != b.Allocated || a.Free != b.Free || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, x := range a.Conditions {
		y := meta.FindStatusCondition(b.Conditions, x.Type)
		if y == nil || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}

func equalJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		return reflect.DeepEqual(a, b)
	}
	return string(ja) == string(jb)
}
