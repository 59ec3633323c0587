package main

import (
	"testing"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/vip"
)

// TestLeaseHolder: who the l2 verification is told holds a core address
// under the lease election: this node when it holds it; for a
// control-plane VIP the leader (the VIPs follow it), nobody while this
// node leads without holding (a handover under way); for a static egress
// address a node not named, once there is a leader.
func TestLeaseHolder(t *testing.T) {
	cp := lease.Address{Key: "10.0.0.100/32", Kind: lease.ControlPlane}
	eg := lease.Address{Key: "10.0.0.200/32", Kind: lease.Egress}
	for _, tc := range []struct {
		name string
		d    cluster.LeaseDecision
		want string
	}{
		{"held here", cluster.LeaseDecision{Address: cp, Holder: true, Leader: "n2"}, "n1"},
		{"control plane, another leader", cluster.LeaseDecision{Address: cp, Leader: "n2"}, "n2"},
		{"control plane, this node leads without holding", cluster.LeaseDecision{Address: cp, Leader: "n1"}, ""},
		{"control plane, no leader", cluster.LeaseDecision{Address: cp}, ""},
		{"egress held elsewhere", cluster.LeaseDecision{Address: eg, Leader: "n1"}, vip.UnknownHolder},
		{"egress, no leader", cluster.LeaseDecision{Address: eg}, ""},
		{"egress held here", cluster.LeaseDecision{Address: eg, Holder: true}, "n1"},
	} {
		if got := leaseHolder(tc.d, "n1"); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
