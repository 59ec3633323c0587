package wire

import (
	"net/netip"
	"slices"
)

// PoolAddress is one allocated pool address as the pools feed
// (`vipd-controllers pools-feed`) describes it.
type PoolAddress struct {
	Addr netip.Addr `json:"address"`
	Pool string     `json:"pool"`
	Mode string     `json:"mode"`
	// All: every vipd node with pools may announce it (the pool has no
	// node selector and the Service no local traffic policy). Otherwise
	// only Nodes may (none when Nodes is empty).
	All   bool     `json:"all,omitempty"`
	Nodes []string `json:"nodes,omitempty"`
	// Service is the claimer ("namespace/name"), for status and logs.
	Service string `json:"service,omitempty"`
}

// Eligible reports whether node may announce a.
func (a PoolAddress) Eligible(node string) bool {
	return a.All || slices.Contains(a.Nodes, node)
}

// PoolSnapshot is one line of the pools feed: the complete desired view.
type PoolSnapshot struct {
	// Generation grows with every snapshot of one feed process.
	Generation uint64        `json:"generation"`
	Addresses  []PoolAddress `json:"addresses"`
}
