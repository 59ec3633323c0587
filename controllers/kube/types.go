package kube

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API group and objects are FLIPOP's (github.com/digitalocean/flipop), so
// existing FloatingIPPool and NodeDNSRecordSet objects work unchanged.
const (
	Group   = "flipop.digitalocean.com"
	Version = "v1alpha1"

	// ReservedIPAnnotation is set on a node to the reserved IPv4 address a
	// FloatingIPPool assigned to it, and removed when the node stops matching.
	// NodeDNSRecordSet's addressType may name it.
	ReservedIPAnnotation = "flipop.digitalocean.com/ipv4-reserved-ip"
)

// Resources served by the CRDs in deploy/crds.
var (
	FloatingIPPoolResource   = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "floatingippools"}
	NodeDNSRecordSetResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "nodednsrecordsets"}
)

// IPState is the state of one reserved IP in FloatingIPPool status.
type IPState string

// FLIPOP's IP states, shown in status.ips[ip].state.
const (
	IPStateActive     IPState = "active"      // assigned to a matching node
	IPStateInProgress IPState = "in-progress" // an assignment is being made or verified
	IPStateError      IPState = "error"       // the last provider call for it failed
	IPStateNoMatch    IPState = "no-match"    // assigned to a droplet that is not a matching node
	IPStateUnassigned IPState = "unassigned"  // assigned to nothing
	IPStateDisabled   IPState = "disabled"    // beyond desiredIPs: left alone
)

// NodeDNSRecordState is the state of a NodeDNSRecordSet.
type NodeDNSRecordState string

// FLIPOP's NodeDNSRecordSet states.
const (
	DNSStateActive     NodeDNSRecordState = "active"
	DNSStateInProgress NodeDNSRecordState = "in-progress"
	DNSStateError      NodeDNSRecordState = "error"
)

// FloatingIPPool assigns a set of reserved IPs to the nodes that match.
type FloatingIPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FloatingIPPoolSpec   `json:"spec"`
	Status FloatingIPPoolStatus `json:"status,omitempty"`
}

// FloatingIPPoolSpec is FLIPOP's spec, field for field.
type FloatingIPPoolSpec struct {
	IPs                      []string      `json:"ips"`
	DesiredIPs               int           `json:"desiredIPs,omitempty"`
	Provider                 string        `json:"provider,omitempty"`
	Region                   string        `json:"region,omitempty"`
	Match                    Match         `json:"match"`
	DNSRecordSet             *DNSRecordSet `json:"dnsRecordSet,omitempty"`
	AssignmentCoolOffSeconds float64       `json:"assignmentCoolOffSeconds,omitempty"`
}

// Match selects nodes (and optionally the pods that must run on them).
type Match struct {
	NodeLabel    string              `json:"nodeLabel,omitempty"`
	PodLabel     string              `json:"podLabel,omitempty"`
	PodNamespace string              `json:"podNamespace,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
}

// DNSRecordSet names an A record set kept in step with the chosen addresses.
type DNSRecordSet struct {
	Provider   string `json:"provider,omitempty"`
	Zone       string `json:"zone"`
	RecordName string `json:"recordName"`
	TTL        int    `json:"ttl"`
}

// FloatingIPPoolStatus is FLIPOP's status shape.
type FloatingIPPoolStatus struct {
	IPs             map[string]IPStatus `json:"ips,omitempty"`
	NodeErrors      []string            `json:"nodeErrors,omitempty"`
	AssignableNodes []string            `json:"assignableNodes,omitempty"`
	Error           string              `json:"error,omitempty"`
}

// IPStatus is one entry of FloatingIPPoolStatus.IPs.
type IPStatus struct {
	State      IPState `json:"state"`
	NodeName   string  `json:"nodeName,omitempty"`
	ProviderID string  `json:"providerID,omitempty"`
	Error      string  `json:"error,omitempty"`
}

// NodeDNSRecordSet keeps an A record set holding an address of each matching node.
type NodeDNSRecordSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeDNSRecordSetSpec   `json:"spec"`
	Status NodeDNSRecordSetStatus `json:"status,omitempty"`
}

// NodeDNSRecordSetSpec is FLIPOP's spec. Provider is the spec-level field
// FLIPOP's README and example use although FLIPOP's CRD prunes it; vipd's CRD
// keeps it and uses it when dnsRecordSet.provider is empty.
type NodeDNSRecordSetSpec struct {
	Match        Match                  `json:"match"`
	DNSRecordSet DNSRecordSet           `json:"dnsRecordSet"`
	AddressType  corev1.NodeAddressType `json:"addressType,omitempty"`
	Provider     string                 `json:"provider,omitempty"`
}

// NodeDNSRecordSetStatus is FLIPOP's status shape.
type NodeDNSRecordSetStatus struct {
	Error string             `json:"error,omitempty"`
	State NodeDNSRecordState `json:"state"`
}

// fromUnstructured converts an informer object into one of the types above.
func fromUnstructured(obj any, into any) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("unexpected object type %T", obj)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		return fmt.Errorf("decode %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

func metav1ObjectMeta(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}
