package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// Pool is an IPPool as the allocator sees it: parsed, and checked against
// the other pools.
type Pool struct {
	Name    string
	Created time.Time
	Spec    v1alpha1.IPPoolSpec
	Ranges  Ranges
	// Err is why the pool is invalid (a bad entry, a range starting after
	// it ends, an overlap with another pool); nil: usable.
	Err    error
	Reason string // the condition reason for Err
}

// Condition reasons of an invalid pool.
const (
	ReasonBadAddresses = "BadAddresses"
	ReasonOverlap      = "OverlapsPool"
)

// AutoAssign reports whether the pool serves Services that do not name it.
func (p *Pool) AutoAssign() bool { return p.Spec.AutoAssign == nil || *p.Spec.AutoAssign }

// Priority orders pools that all match a Service: higher first.
func (p *Pool) Priority() int32 {
	if p.Spec.ServiceAllocation == nil {
		return 0
	}
	return p.Spec.ServiceAllocation.Priority
}

// BuildPools parses every pool and marks the invalid ones. Of two
// overlapping pools the older one (then the one with the smaller name)
// stays valid and the other is invalid, so an address belongs to at most
// one valid pool. The result is sorted by name.
func BuildPools(specs []v1alpha1.IPPool) []*Pool {
	out := make([]*Pool, 0, len(specs))
	for i := range specs {
		s := &specs[i]
		p := &Pool{Name: s.Name, Created: s.CreationTimestamp.Time, Spec: s.Spec}
		p.Ranges, p.Err = ParseRanges(s.Spec.Addresses)
		if p.Err != nil {
			p.Reason = ReasonBadAddresses
		}
		out = append(out, p)
	}
	// Seniority: older first, then by name.
	slices.SortFunc(out, func(a, b *Pool) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for i, p := range out {
		if p.Err != nil {
			continue
		}
		for _, q := range out[:i] {
			if q.Err != nil {
				continue
			}
			if a, b, ok := q.Ranges.Overlaps(p.Ranges); ok {
				if !q.Ranges.Contains(a.First) || !p.Ranges.Contains(b.First) {
					a, b = b, a
				}
				p.Err = fmt.Errorf("%s overlaps %s of pool %s", b, a, q.Name)
				p.Reason = ReasonOverlap
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b *Pool) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// PoolOf returns the valid pool containing a, if any.
func PoolOf(pools []*Pool, a netip.Addr) *Pool {
	for _, p := range pools {
		if p.Err == nil && p.Ranges.Contains(a) {
			return p
		}
	}
	return nil
}

// ServiceFacts is what pool matching needs to know about a Service.
type ServiceFacts struct {
	Namespace       string
	Labels          map[string]string
	NamespaceLabels map[string]string
	// PoolNames are the pools the Service names (annotation
	// vipd.io/ip-pool); empty: any pool that assigns automatically.
	PoolNames []string
}

// Allows reports whether the pool's serviceAllocation admits the Service
// (nil: every Service). A malformed selector admits nothing.
func (p *Pool) Allows(s ServiceFacts) bool {
	sa := p.Spec.ServiceAllocation
	if sa == nil {
		return true
	}
	if len(sa.Namespaces) > 0 && !slices.Contains(sa.Namespaces, s.Namespace) {
		return false
	}
	match := func(sel *metav1.LabelSelector, l map[string]string) bool {
		if sel == nil {
			return true
		}
		ls, err := metav1.LabelSelectorAsSelector(sel)
		return err == nil && ls.Matches(labels.Set(l))
	}
	return match(sa.NamespaceSelector, s.NamespaceLabels) && match(sa.ServiceSelector, s.Labels)
}

// MatchPools returns the valid pools a Service may draw from, best first:
// the named pools when it names some (autoAssign does not matter then),
// otherwise the pools that assign automatically; in both cases only those
// whose serviceAllocation admits it, ordered by priority (higher first),
// then by name.
func MatchPools(pools []*Pool, s ServiceFacts) []*Pool {
	var out []*Pool
	for _, p := range pools {
		if p.Err != nil {
			continue
		}
		if len(s.PoolNames) > 0 {
			if !slices.Contains(s.PoolNames, p.Name) {
				continue
			}
		} else if !p.AutoAssign() {
			continue
		}
		if p.Allows(s) {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, func(a, b *Pool) int {
		if c := cmp.Compare(b.Priority(), a.Priority()); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// Port is one Service port as sharing sees it.
type Port struct {
	Protocol string // TCP, UDP, SCTP
	Port     int32
}

func (p Port) String() string { return fmt.Sprintf("%d/%s", p.Port, p.Protocol) }

// Sharer is a Service that asks to share its address.
type Sharer struct {
	Key   string // annotation vipd.io/sharing-key
	Ports []Port
}

// CanShare reports whether a Service may join the holders of an address:
// the same non-empty sharing key and no port/protocol pair in common with
// any of them. The error says why not.
func CanShare(s Sharer, holders []Sharer) error {
	if s.Key == "" {
		return fmt.Errorf("the Service has no sharing key")
	}
	for _, h := range holders {
		if h.Key != s.Key {
			if h.Key == "" {
				return fmt.Errorf("the address is held without a sharing key")
			}
			return fmt.Errorf("the address is shared under another key")
		}
		for _, p := range s.Ports {
			for _, q := range h.Ports {
				if p.Port == q.Port && strings.EqualFold(p.Protocol, q.Protocol) {
					return fmt.Errorf("port %s is already used on the address", p)
				}
			}
		}
	}
	return nil
}
