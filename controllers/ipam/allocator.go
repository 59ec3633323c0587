package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// LabelClaimUID is set on every IPAllocation to the primary claimer's UID,
// so the allocations of one claimer can be listed from the API server.
const LabelClaimUID = "vipd.io/claim-uid"

// ErrExhausted: no pool offered a free address of the family.
var ErrExhausted = errors.New("no free address")

// errTooManyCollisions: every candidate tried was taken meanwhile (another
// replica is allocating from a stale view); the caller retries later.
var errTooManyCollisions = errors.New("too many addresses were taken while trying them")

// TakenError is returned when an address is held by someone else.
type TakenError struct {
	Address netip.Addr
	Holder  v1alpha1.ClaimRef
	Alloc   *v1alpha1.IPAllocation
}

func (e *TakenError) Error() string {
	return fmt.Sprintf("%s is held by %s", e.Address, DescribeRef(e.Holder))
}

// DescribeRef renders a claimer for messages: "Service default/web".
func DescribeRef(r v1alpha1.ClaimRef) string {
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

// Allocator takes and releases addresses through the API server: an
// address is taken by creating the IPAllocation named after it, and only
// the API server's answer counts (no in-memory state is trusted).
type Allocator struct {
	// Client serves ipallocations.vipd.io.
	Client dynamic.NamespaceableResourceInterface
	// Now stamps claimedAt. Default time.Now.
	Now func() time.Time
	// MaxAttempts bounds the candidates tried per FirstFree call that turn
	// out to be taken. Default 64.
	MaxAttempts int
}

// NewAllocator returns an allocator over the dynamic client.
func NewAllocator(dyn dynamic.Interface) *Allocator {
	return &Allocator{Client: dyn.Resource(v1alpha1.IPAllocationResource)}
}

func (a *Allocator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Take creates the allocation of addr from pool for ref. An address held by
// another claimer is a *TakenError; held by ref already, it is returned.
func (a *Allocator) Take(ctx context.Context, addr netip.Addr, pool string, ref v1alpha1.ClaimRef, sharingKey string) (*v1alpha1.IPAllocation, error) {
	addr = addr.Unmap()
	name, err := v1alpha1.AllocationName(addr)
	if err != nil {
		return nil, err
	}
	obj := &v1alpha1.IPAllocation{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.Group + "/" + v1alpha1.Version, Kind: "IPAllocation"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		Spec: v1alpha1.IPAllocationSpec{
			Address: addr.String(), Pool: pool, ClaimRef: ref,
			ClaimedAt: metav1.NewTime(a.now()), SharingKey: sharingKey,
		},
	}
	if ref.UID != "" {
		obj.Labels[LabelClaimUID] = ref.UID
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		created, err := a.Client.Create(ctx, u, metav1.CreateOptions{})
		if err == nil {
			return FromUnstructured(created)
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create IPAllocation %s: %w", name, err)
		}
		cur, gerr := a.Get(ctx, addr)
		if apierrors.IsNotFound(gerr) && attempt < 3 {
			continue // released between the create and the get
		}
		if gerr != nil {
			return nil, gerr
		}
		if SameClaimer(cur.Spec.ClaimRef, ref) {
			return cur, nil
		}
		return nil, &TakenError{Address: addr, Holder: cur.Spec.ClaimRef, Alloc: cur}
	}
}

// Get reads the allocation of addr from the API server.
func (a *Allocator) Get(ctx context.Context, addr netip.Addr) (*v1alpha1.IPAllocation, error) {
	name, err := v1alpha1.AllocationName(addr)
	if err != nil {
		return nil, err
	}
	u, err := a.Client.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return FromUnstructured(u)
}

// FirstFree takes the first free address of family f from the pools, in
// order. taken is a hint (an informer's view) that saves round trips; the
// create decides. Addresses found taken are skipped and the next candidate
// is tried, up to MaxAttempts. ErrExhausted when no pool has one.
func (a *Allocator) FirstFree(ctx context.Context, pools []*Pool, f Family, ref v1alpha1.ClaimRef, sharingKey string, taken func(netip.Addr) bool) (*v1alpha1.IPAllocation, error) {
	limit := a.MaxAttempts
	if limit <= 0 {
		limit = 64
	}
	seen := map[netip.Addr]bool{}
	isTaken := func(x netip.Addr) bool { return seen[x] || (taken != nil && taken(x)) }
	attempts := 0
	for _, p := range pools {
		if p.Err != nil {
			continue
		}
		for cand := range p.Ranges.Candidates(f, p.Spec.AvoidBuggyIPs, isTaken) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			alloc, err := a.Take(ctx, cand, p.Name, ref, sharingKey)
			if err == nil {
				return alloc, nil
			}
			var te *TakenError
			if !errors.As(err, &te) {
				return nil, err
			}
			seen[cand] = true
			attempts++
			if attempts >= limit {
				return nil, errTooManyCollisions
			}
		}
	}
	return nil, ErrExhausted
}

// Release gives up ref's hold on the allocation: the record is deleted,
// with a precondition on its UID so that a record re-created meanwhile for
// someone else survives; a shared address passes to the next sharer
// instead. Already gone is not an error.
func (a *Allocator) Release(ctx context.Context, alloc *v1alpha1.IPAllocation, ref v1alpha1.ClaimRef) error {
	spec := alloc.Spec
	switch {
	case SameClaimer(spec.ClaimRef, ref) && len(spec.Shares) == 0:
		return a.Delete(ctx, alloc)
	case SameClaimer(spec.ClaimRef, ref):
		next := cloneAlloc(alloc)
		next.Spec.ClaimRef = spec.Shares[0]
		next.Spec.Shares = slices.Clone(spec.Shares[1:])
		if next.Labels == nil {
			next.Labels = map[string]string{}
		}
		next.Labels[LabelClaimUID] = next.Spec.ClaimRef.UID
		return a.update(ctx, next)
	default:
		next := cloneAlloc(alloc)
		next.Spec.Shares = slices.DeleteFunc(slices.Clone(spec.Shares), func(r v1alpha1.ClaimRef) bool { return SameClaimer(r, ref) })
		if len(next.Spec.Shares) == len(spec.Shares) {
			return nil
		}
		return a.update(ctx, next)
	}
}

// Delete removes the record if it is still the one read (same UID).
func (a *Allocator) Delete(ctx context.Context, alloc *v1alpha1.IPAllocation) error {
	uid := alloc.UID
	err := a.Client.Delete(ctx, alloc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	if apierrors.IsConflict(err) {
		return nil // a new record of the same address: not ours to delete
	}
	return fmt.Errorf("delete IPAllocation %s: %w", alloc.Name, err)
}

// AddShare adds ref to the sharers of alloc (optimistic: fails with a
// conflict when the record changed since it was read).
func (a *Allocator) AddShare(ctx context.Context, alloc *v1alpha1.IPAllocation, ref v1alpha1.ClaimRef) (*v1alpha1.IPAllocation, error) {
	next := cloneAlloc(alloc)
	next.Spec.Shares = append(next.Spec.Shares, ref)
	u, err := toUnstructured(next)
	if err != nil {
		return nil, err
	}
	out, err := a.Client.Update(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("share IPAllocation %s: %w", alloc.Name, err)
	}
	return FromUnstructured(out)
}

func (a *Allocator) update(ctx context.Context, next *v1alpha1.IPAllocation) error {
	u, err := toUnstructured(next)
	if err != nil {
		return err
	}
	if _, err := a.Client.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("update IPAllocation %s: %w", next.Name, err)
	}
	return nil
}

// ListByClaimer lists, from the API server, the allocations whose primary
// claimer has uid.
func (a *Allocator) ListByClaimer(ctx context.Context, uid types.UID) ([]*v1alpha1.IPAllocation, error) {
	l, err := a.Client.List(ctx, metav1.ListOptions{LabelSelector: LabelClaimUID + "=" + string(uid)})
	if err != nil {
		return nil, fmt.Errorf("list IPAllocations of %s: %w", uid, err)
	}
	out := make([]*v1alpha1.IPAllocation, 0, len(l.Items))
	for i := range l.Items {
		al, err := FromUnstructured(&l.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, al)
	}
	return out, nil
}

// SameClaimer compares two claim references: kind, namespace and name, and
// the UID when both have one.
func SameClaimer(a, b v1alpha1.ClaimRef) bool {
	if a.Kind != b.Kind || a.Namespace != b.Namespace || a.Name != b.Name {
		return false
	}
	return a.UID == "" || b.UID == "" || a.UID == b.UID
}

// Holds reports whether ref holds alloc, as its claimer or a sharer.
func Holds(alloc *v1alpha1.IPAllocation, ref v1alpha1.ClaimRef) bool {
	if SameClaimer(alloc.Spec.ClaimRef, ref) {
		return true
	}
	return slices.ContainsFunc(alloc.Spec.Shares, func(r v1alpha1.ClaimRef) bool { return SameClaimer(r, ref) })
}

// Address parses the allocation's address.
func Address(alloc *v1alpha1.IPAllocation) (netip.Addr, error) {
	a, err := netip.ParseAddr(alloc.Spec.Address)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("IPAllocation %s: address %q: %w", alloc.Name, alloc.Spec.Address, err)
	}
	return a.Unmap(), nil
}

// FromUnstructured converts an IPAllocation read through a dynamic client.
func FromUnstructured(u *unstructured.Unstructured) (*v1alpha1.IPAllocation, error) {
	var out v1alpha1.IPAllocation
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		return nil, fmt.Errorf("decode IPAllocation %s: %w", u.GetName(), err)
	}
	return &out, nil
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// cloneAlloc copies what Release and AddShare change.
func cloneAlloc(a *v1alpha1.IPAllocation) *v1alpha1.IPAllocation {
	out := *a
	out.Labels = maps.Clone(a.Labels)
	out.Spec.Shares = slices.Clone(a.Spec.Shares)
	return &out
}
