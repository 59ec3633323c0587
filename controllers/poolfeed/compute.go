// Package poolfeed is the pool feed: run on every vipd node with
// VIPD_POOLS=on as `vipd-controllers pools-feed` (a child of vipd, not
// leader-elected), it watches IPPools, IPAllocations, Nodes and, for
// Services with externalTrafficPolicy Local, their EndpointSlices, and
// writes the desired view (package pools' Snapshot) as one JSON line on its
// standard output each time it changes.
//
// It runs as a child so that vipd itself does not link client-go (which
// doubles its memory); client-go's informers give it list+watch with
// resumption, relists after a watch expires (410 Gone) and reconnection
// after an apiserver restart. A relist replaces the cache in one step, so
// the feed never writes a transient empty view.
package poolfeed

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/wire"
)

// State is what the feed has seen.
type State struct {
	Pools       []v1alpha1.IPPool
	Allocations []v1alpha1.IPAllocation
	Nodes       []corev1.Node
	// Services by "namespace/name".
	Services map[string]*corev1.Service
	// EndpointSlices by "namespace/service-name".
	Slices map[string][]*discoveryv1.EndpointSlice
}

// Problem is an object the feed skipped, with why (logged by the caller).
type Problem struct {
	Object string
	Reason string
}

// Compute returns the desired view: one Address per allocation whose pool
// exists and still contains the address, with the nodes that may announce
// it. Sorted by address.
func Compute(s State) ([]wire.PoolAddress, []Problem) {
	var probs []Problem
	type poolInfo struct {
		mode   string
		ranges []addrRange
		all    bool
		nodes  []string // when !all: nodes matching the selector
	}
	byName := map[string]poolInfo{}
	for _, p := range s.Pools {
		pi := poolInfo{mode: p.Spec.Mode}
		if pi.mode == "" {
			pi.mode = v1alpha1.ModeL2
		}
		for _, r := range p.Spec.Addresses {
			ar, err := parseRange(r)
			if err != nil {
				probs = append(probs, Problem{Object: "IPPool/" + p.Name, Reason: err.Error()})
				continue
			}
			pi.ranges = append(pi.ranges, ar)
		}
		sel := p.Spec.NodeSelector
		if sel == nil || len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
			pi.all = true
		} else {
			ls, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil {
				probs = append(probs, Problem{Object: "IPPool/" + p.Name, Reason: "spec.nodeSelector: " + err.Error() + ": no node may announce it"})
				ls = labels.Nothing()
			}
			for _, n := range s.Nodes {
				if ls.Matches(labels.Set(n.Labels)) {
					pi.nodes = append(pi.nodes, n.Name)
				}
			}
			slices.Sort(pi.nodes)
		}
		byName[p.Name] = pi
	}
	var out []wire.PoolAddress
	for _, al := range s.Allocations {
		addr, err := netip.ParseAddr(al.Spec.Address)
		if err != nil {
			probs = append(probs, Problem{Object: "IPAllocation/" + al.Name, Reason: "spec.address: " + err.Error()})
			continue
		}
		addr = addr.Unmap()
		if named, err := v1alpha1.AddressOfName(al.Name); err != nil || named != addr {
			probs = append(probs, Problem{Object: "IPAllocation/" + al.Name, Reason: fmt.Sprintf("name does not match spec.address %s", addr)})
			continue
		}
		pi, ok := byName[al.Spec.Pool]
		if !ok {
			continue // pool deleted: nothing to announce
		}
		if !slices.ContainsFunc(pi.ranges, func(r addrRange) bool { return r.contains(addr) }) {
			continue // removed from the pool: withdrawn
		}
		ref := al.Spec.ClaimRef
		if ref.Kind == "IPAddressClaim" {
			// A Cluster API machine's own address: the machine configures
			// it on its interface. Announcing it would take its traffic.
			continue
		}
		if ref.Kind == "EgressPolicy" && ref.APIGroup == v1alpha1.Group {
			// An EgressPolicy's egress IP: vipd's egress part holds it on
			// a node of the policy's nodeSelector (docs/egress.md).
			continue
		}
		a := wire.PoolAddress{Addr: addr, Pool: al.Spec.Pool, Mode: pi.mode, All: pi.all, Nodes: pi.nodes}
		if ref.Kind == "Service" && ref.APIGroup == "" {
			key := ref.Namespace + "/" + ref.Name
			a.Service = key
			if svc := s.Services[key]; svc != nil && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal &&
				(ref.UID == "" || string(svc.UID) == ref.UID) {
				local := readyNodes(s.Slices[key])
				if !a.All {
					local = slices.DeleteFunc(local, func(n string) bool { return !slices.Contains(pi.nodes, n) })
				}
				a.All, a.Nodes = false, local
			}
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b wire.PoolAddress) int { return a.Addr.Compare(b.Addr) })
	return out, probs
}

// readyNodes returns the nodes with at least one ready endpoint, sorted.
func readyNodes(eps []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, sl := range eps {
		for _, ep := range sl.Endpoints {
			if ep.NodeName == nil || *ep.NodeName == "" {
				continue
			}
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue // nil means ready (API semantics)
			}
			if !slices.Contains(out, *ep.NodeName) {
				out = append(out, *ep.NodeName)
			}
		}
	}
	slices.Sort(out)
	if out == nil {
		out = []string{}
	}
	return out
}

// addrRange is an inclusive range of addresses.
type addrRange struct{ first, last netip.Addr }

func (r addrRange) contains(a netip.Addr) bool {
	return a.BitLen() == r.first.BitLen() && r.first.Compare(a) <= 0 && a.Compare(r.last) <= 0
}

// parseRange reads a CIDR or "first-last".
func parseRange(s string) (addrRange, error) {
	s = strings.TrimSpace(s)
	if first, last, ok := strings.Cut(s, "-"); ok {
		f, err1 := netip.ParseAddr(strings.TrimSpace(first))
		l, err2 := netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil || f.Unmap().BitLen() != l.Unmap().BitLen() || l.Unmap().Less(f.Unmap()) {
			return addrRange{}, fmt.Errorf("spec.addresses: %q is not a range first-last of one family", s)
		}
		return addrRange{f.Unmap(), l.Unmap()}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return addrRange{}, fmt.Errorf("spec.addresses: %q is neither a CIDR nor a range first-last", s)
	}
	p = p.Masked()
	first := p.Addr().Unmap()
	b := first.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	last, _ := netip.AddrFromSlice(b)
	return addrRange{first, last}, nil
}
