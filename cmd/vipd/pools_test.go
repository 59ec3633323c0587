package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/pools"
)

// TestPrintPoolsFeed: `vipd status` names the feed's skipped lines only
// when there are some.
func TestPrintPoolsFeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		feed pools.FeedStatus
		want string
	}{
		{"clean", pools.FeedStatus{Running: true, Snapshots: 3}, "feed running, 3 snapshots, 0 restarts\n"},
		{"bad lines", pools.FeedStatus{Running: true, Snapshots: 3, Restarts: 1, BadLines: 2, LastError: "exit status 3"},
			"feed running, 3 snapshots, 1 restarts, 2 unreadable lines skipped, last error: exit status 3\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := printPools(&b, PoolsStatus{Feed: tc.feed}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), tc.want) {
				t.Fatalf("printed %q, want a line with %q", b.String(), tc.want)
			}
		})
	}
}

// The lease election places each l2 pool or egress address only on the
// nodes that may hold it: the pool's node selector / the Service's local
// traffic policy (pools.Address.Nodes) become the lease address's allowed
// nodes; bgp and excluded (VIPD_ADDRESS) addresses are not placed.
func TestLeaseAddrsCarryEligibleNodes(t *testing.T) {
	as := []pools.Address{
		{Addr: netip.MustParseAddr("10.0.1.1"), Mode: pools.ModeL2, All: true},
		{Addr: netip.MustParseAddr("10.0.1.2"), Mode: pools.ModeL2, Nodes: []string{"b", "c"}},
		{Addr: netip.MustParseAddr("10.0.1.3"), Mode: pools.ModeL2},
		{Addr: netip.MustParseAddr("10.0.1.4"), Mode: pools.ModeBGP, All: true},
		{Addr: netip.MustParseAddr("10.0.0.100"), Mode: pools.ModeL2, All: true},
		{Addr: netip.MustParseAddr("fd00::1"), Mode: pools.ModeL2, Nodes: []string{"a"}},
	}
	got := leaseAddrs(as, map[netip.Addr]bool{netip.MustParseAddr("10.0.0.100"): true})
	want := []lease.Address{
		{Key: "10.0.1.1/32"},
		{Key: "10.0.1.2/32", Restricted: true, Nodes: []string{"b", "c"}},
		{Key: "10.0.1.3/32", Restricted: true},
		{Key: "fd00::1/128", Restricted: true, Nodes: []string{"a"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
