package kube

import (
	"fmt"
	"net"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// matcher decides which nodes a FloatingIPPool or NodeDNSRecordSet selects.
// It is FLIPOP's rule set: a node matches when it is Ready, has a
// providerID, is not being deleted, matches nodeLabel and tolerates every
// one of its taints; with podNamespace or podLabel set it also needs at
// least one matching pod that is Running and Ready on it.
type matcher struct {
	nodeSel     labels.Selector
	podSel      labels.Selector // nil when the match has no pod criteria
	podNS       string
	tolerations []corev1.Toleration
}

func newMatcher(m Match) (*matcher, error) {
	ns, err := labels.Parse(m.NodeLabel)
	if err != nil {
		return nil, fmt.Errorf("Error parsing node selector: %w", err) //nolint:staticcheck // FLIPOP's status text
	}
	mt := &matcher{nodeSel: ns, podNS: m.PodNamespace, tolerations: m.Tolerations}
	if m.PodLabel != "" || m.PodNamespace != "" {
		ps, err := labels.Parse(m.PodLabel)
		if err != nil {
			return nil, fmt.Errorf("Error parsing pod selector: %w", err) //nolint:staticcheck // FLIPOP's status text
		}
		mt.podSel = ps
	}
	return mt, nil
}

// nodeMatches applies the node-only rules.
func (m *matcher) nodeMatches(n *corev1.Node) bool {
	if n.Spec.ProviderID == "" || n.DeletionTimestamp != nil {
		return false
	}
	if !nodeReady(n) {
		return false
	}
	if !m.nodeSel.Matches(labels.Set(n.Labels)) {
		return false
	}
	for i := range n.Spec.Taints {
		if !m.tolerates(&n.Spec.Taints[i]) {
			return false
		}
	}
	return true
}

func (m *matcher) tolerates(t *corev1.Taint) bool {
	for i := range m.tolerations {
		if m.tolerations[i].ToleratesTaint(t) {
			return true
		}
	}
	return false
}

// podMatches reports whether the pod counts for its node.
func (m *matcher) podMatches(p *corev1.Pod) bool {
	if m.podSel == nil || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		return false
	}
	if m.podNS != "" && p.Namespace != m.podNS {
		return false
	}
	if !m.podSel.Matches(labels.Set(p.Labels)) {
		return false
	}
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// enabledNodes returns the matching nodes sorted by name. podsOnNode lists
// the pods bound to a node (only consulted with pod criteria).
func (m *matcher) enabledNodes(nodes []*corev1.Node, podsOnNode func(node string) []*corev1.Pod) []*corev1.Node {
	var out []*corev1.Node
	for _, n := range nodes {
		if !m.nodeMatches(n) {
			continue
		}
		if m.podSel != nil {
			found := false
			for _, p := range podsOnNode(n.Name) {
				if m.podMatches(p) {
					found = true
					break
				}
			}
			if !found {
				continue
			}
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// nodeAddresses returns the IPv4 addresses of the node that addressType
// selects: "" or ExternalIP, InternalIP (or any other address type) from
// status.addresses, or the reserved-IP annotation.
func nodeAddresses(n *corev1.Node, addressType corev1.NodeAddressType) []string {
	if addressType == "" {
		addressType = corev1.NodeExternalIP
	}
	var out []string
	if addressType == ReservedIPAnnotation {
		if v := n.Annotations[ReservedIPAnnotation]; isIPv4(v) {
			out = append(out, v)
		}
		return out
	}
	for _, a := range n.Status.Addresses {
		if a.Type == addressType && isIPv4(a.Address) {
			out = append(out, a.Address)
		}
	}
	return out
}

func isIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil
}
