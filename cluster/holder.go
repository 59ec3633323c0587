package cluster

import (
	"net/netip"

	"github.com/hashicorp/memberlist"
)

// Holder returns the member that holds vip as this node sees it, and that
// member's gossip (node) address: the live member whose metadata claims
// vip, else the member the election picked to take it; a member whose
// heartbeats stopped is not one (member heartbeats). It returns "" when
// nobody holds or is about to hold vip. Read-only; safe to call from any
// goroutine (egress directors poll it to route to the holder).
func (n *Node) Holder(vip string) (name string, addr netip.Addr) {
	var leader string
	n.mu.Lock()
	if d, ok := n.status.Election.Elections[vip]; ok {
		leader = d.Leader
	}
	n.mu.Unlock()
	var leaderAddr netip.Addr
	silent := n.hb.silentMembers() // gone for the election, not yet for memberlist
	for _, m := range n.ml.Members() {
		if m.State != memberlist.StateAlive && m.State != memberlist.StateSuspect || silent[m.Name] {
			continue
		}
		a, ok := netip.AddrFromSlice(m.Addr)
		if !ok {
			continue
		}
		a = a.Unmap()
		if meta, err := decodeMeta(m.Meta); err == nil && meta.Holds(vip) {
			return m.Name, a
		}
		if m.Name == leader {
			leaderAddr = a
		}
	}
	if leader != "" && leaderAddr.IsValid() {
		return leader, leaderAddr
	}
	return "", netip.Addr{}
}
