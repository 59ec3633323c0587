// Package v1alpha1 holds vipd's own API (group vipd.io, version v1alpha1):
// IPPool, the pools of addresses vipd hands out and announces, and
// IPAllocation, the record of one address taken from a pool.
//
// Taking an address is creating the cluster-scoped IPAllocation named after
// it (AllocationName): the API server's uniqueness of names makes the claim
// exclusive, AlreadyExists means the address is taken. Nothing else (no
// in-memory bitmap, no status field) is the source of truth.
//
// The CRDs are in deploy/kube/crds/ippool.yaml and ipallocation.yaml.
package v1alpha1

import (
	"fmt"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of vipd's API.
const (
	Group   = "vipd.io"
	Version = "v1alpha1"
)

// Resources served by the CRDs.
var (
	IPPoolResource       = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ippools"}
	IPAllocationResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "ipallocations"}
)

// Pool modes: how the addresses of a pool are announced.
const (
	ModeL2  = "l2"  // one elected holder per address answers ARP/NDP
	ModeBGP = "bgp" // every eligible node advertises the address
)

// IPPool is a cluster-scoped pool of addresses.
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPPoolSpec   `json:"spec"`
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolSpec is what an IPPool holds and who may draw from and announce it.
type IPPoolSpec struct {
	// Addresses are CIDRs ("192.0.2.0/28", "2001:db8::/120") and inclusive
	// ranges ("192.0.2.10-192.0.2.20"), IPv4 and IPv6.
	Addresses []string `json:"addresses"`
	// Mode is l2 (default) or bgp.
	Mode string `json:"mode,omitempty"`
	// Gateway and PrefixLength are returned in Cluster API IPAM answers.
	Gateway      string `json:"gateway,omitempty"`
	PrefixLength *int32 `json:"prefixLength,omitempty"`
	// NodeSelector selects the nodes that may announce the pool's
	// addresses; empty: every vipd node with VIPD_POOLS=on.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// ServiceAllocation restricts which Services may draw from the pool;
	// nil: all.
	ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`
	// AvoidBuggyIPs skips addresses ending in .0 and .255 (IPv4).
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`
	// AutoAssign: when false, only Services that request an address of
	// this pool (by annotation) get one. Default true.
	AutoAssign *bool `json:"autoAssign,omitempty"`
}

// ServiceAllocation restricts the Services a pool serves.
type ServiceAllocation struct {
	// Namespaces lists the namespaces whose Services may draw from the pool.
	Namespaces []string `json:"namespaces,omitempty"`
	// NamespaceSelector selects such namespaces by label.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// ServiceSelector selects the Services by label.
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// Priority orders pools that all match a Service: higher first, then by name.
	Priority int32 `json:"priority,omitempty"`
}

// IPPoolStatus counts the pool's addresses. Counts saturate at the int64
// maximum (large IPv6 pools).
type IPPoolStatus struct {
	Total      int64              `json:"total"`
	Allocated  int64              `json:"allocated"`
	Free       int64              `json:"free"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// IPPoolList is a list of IPPools.
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}

// IPAllocation records that one address is taken. It is cluster-scoped and
// named AllocationName(address).
type IPAllocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPAllocationSpec `json:"spec"`
}

// IPAllocationSpec says which address, from which pool, for whom.
type IPAllocationSpec struct {
	// Address is the address in canonical form (netip.Addr.String()).
	Address string `json:"address"`
	// Pool is the IPPool's name.
	Pool string `json:"pool"`
	// ClaimRef is the claimer: a Service, an IPAddressClaim or an EgressPolicy.
	ClaimRef ClaimRef `json:"claimRef"`
	// ClaimedAt is when the address was taken.
	ClaimedAt metav1.Time `json:"claimedAt"`
	// SharingKey is set when Services with the same key (annotation
	// vipd.io/sharing-key) and disjoint ports share the address.
	SharingKey string `json:"sharingKey,omitempty"`
	// Shares are the other claimers sharing the address (Services only).
	Shares []ClaimRef `json:"shares,omitempty"`
}

// ClaimRef names the object an address is allocated to.
type ClaimRef struct {
	APIGroup  string `json:"apiGroup,omitempty"` // "" for core (Service)
	Kind      string `json:"kind"`               // Service, IPAddressClaim or EgressPolicy
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// IPAllocationList is a list of IPAllocations.
type IPAllocationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAllocation `json:"items"`
}

// AllocationName is the name of the IPAllocation of addr: the dotted quad
// for IPv4 ("192.0.2.7"); for IPv6 the eight groups in full, joined by
// dashes ("2001-0db8-0000-0000-0000-0000-0000-0007"), because ':' is not
// allowed in object names and the compressed form may start with '-'.
// IPv4-mapped IPv6 addresses are named as their IPv4 address. Zones are
// refused.
func AllocationName(addr netip.Addr) (string, error) {
	if !addr.IsValid() {
		return "", fmt.Errorf("invalid address")
	}
	if addr.Zone() != "" {
		return "", fmt.Errorf("address %s has a zone", addr)
	}
	addr = addr.Unmap()
	if addr.Is4() {
		return addr.String(), nil
	}
	b := addr.As16()
	groups := make([]string, 8)
	for i := range groups {
		groups[i] = fmt.Sprintf("%02x%02x", b[2*i], b[2*i+1])
	}
	return strings.Join(groups, "-"), nil
}

// AddressOfName is the inverse of AllocationName.
func AddressOfName(name string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil && a.Is4() {
		return a, nil
	}
	parts := strings.Split(name, "-")
	if len(parts) != 8 {
		return netip.Addr{}, fmt.Errorf("%q is not an IPAllocation name (a dotted IPv4 address or eight dash-separated 4-digit hex groups)", name)
	}
	for _, p := range parts {
		if len(p) != 4 {
			return netip.Addr{}, fmt.Errorf("%q is not an IPAllocation name (a dotted IPv4 address or eight dash-separated 4-digit hex groups)", name)
		}
	}
	a, err := netip.ParseAddr(strings.Join(parts, ":"))
	if err != nil || !a.Is6() || a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%q is not an IPAllocation name (a dotted IPv4 address or eight dash-separated 4-digit hex groups)", name)
	}
	return a, nil
}
