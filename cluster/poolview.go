package cluster

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/hashicorp/memberlist"
)

// PoolMember is one member as the pool announcer needs it: alive or
// suspect members only.
type PoolMember struct {
	Name     string
	Suspect  bool
	Eligible bool // Meta.Eligible: healthy, quorum, unique name
	Pools    bool // Meta.Pools: announces pool addresses
	// Addr is its gossip address (the egress directors route to a
	// gateway member through it).
	Addr netip.Addr
}

// PoolMembers returns the alive and suspect members, this node included,
// with the metadata each gossips (this node's as last published). A member
// whose heartbeats stopped (member heartbeats, the default profile) is
// left out, as the election leaves it out: memberlist's own detector takes
// about 25 s there. It is a read-only view for package pools, which
// decides per address from it without gossiping anything per address.
func (n *Node) PoolMembers() []PoolMember {
	var out []PoolMember
	silent := n.hb.silentMembers()
	for _, m := range n.ml.Members() {
		if m.State != memberlist.StateAlive && m.State != memberlist.StateSuspect || silent[m.Name] {
			continue
		}
		meta, err := decodeMeta(m.Meta)
		if err != nil {
			continue
		}
		addr, _ := netip.AddrFromSlice(m.Addr)
		out = append(out, PoolMember{Name: m.Name, Suspect: m.State == memberlist.StateSuspect, Eligible: meta.Eligible, Pools: meta.Pools,
			Addr: addr.Unmap()})
	}
	slices.SortFunc(out, func(a, b PoolMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}
