package cluster

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"

	"github.com/vipd/vipd/cluster/lease"
)

// TestLeaseVerifyUnverifiedBy: the holder reads, from the members'
// lease metadata, who reports a VIP unreachable through it: reports
// naming it or no holder count, reports naming another holder do not;
// dead members, witnesses and members without lease metadata are not
// among the others.
func TestLeaseVerifyUnverifiedBy(t *testing.T) {
	const vip = "10.0.0.100/32"
	n := &LeaseNode{cfg: LeaseConfig{Cluster: Config{Name: "n1"}},
		members: map[string]lease.Member{}, reports: map[string]memberReports{}, addrs: map[string]string{}}
	for _, m := range []struct {
		lease.Member
		addr string
	}{
		{lease.Member{Name: "n2", Alive: true, Meta: []byte(`{"lv":1,"ur":["10.0.0.100/32 n1"]}`)}, "10.1.0.2:7950"},
		{lease.Member{Name: "n3", Alive: true, Meta: []byte(`{"lv":1,"ur":["10.0.0.100/32"]}`)}, "[fd00::3]:7950"},
		{lease.Member{Name: "n4", Alive: true, Meta: []byte(`{"lv":1,"ur":["10.0.0.100/32 n9"]}`)}, ""},
		{lease.Member{Name: "n5", Alive: false, Meta: []byte(`{"lv":1,"ur":["10.0.0.100/32 n1"]}`)}, ""},
		{lease.Member{Name: "w", Alive: true, Meta: []byte(`{"lv":1,"r":1}`)}, ""},
		{lease.Member{Name: "old", Alive: true, Meta: []byte(`{"v":["10.0.0.100/32"],"u":["10.0.0.100/32"]}`)}, ""},
		{lease.Member{Name: "n6", Alive: true, Meta: []byte(`{"lv":1}`)}, ""},
		{lease.Member{Name: "bad", Alive: false}, "nonsense"},
	} {
		n.putMember(m.Member, m.addr)
	}
	v := NewLeaseVerify(n)
	rep, others := v.UnverifiedBy(vip)
	if !slices.Equal(rep, []string{"n2", "n3"}) || others != 4 {
		t.Fatalf("UnverifiedBy = %v, %d; want [n2 n3], 4 (n2, n3, n4, n6)", rep, others)
	}
	if rep, _ := v.UnverifiedBy("10.0.0.101/32"); len(rep) != 0 {
		t.Fatalf("reports for another VIP: %v", rep)
	}
	if all, others := v.Reported(); !slices.Equal(all[vip], []string{"n2", "n3"}) || len(all) != 1 || others != 4 {
		t.Fatalf("Reported = %v, %d; want %s: [n2 n3], 4", all, others, vip)
	}
	// The reports are decoded when a member's metadata changes: n2
	// withdraws its report, n5 comes back alive with its own.
	n.putMember(lease.Member{Name: "n2", Alive: true, Meta: []byte(`{"lv":1}`)}, "10.1.0.2:7950")
	n.putMember(lease.Member{Name: "n5", Alive: true, Meta: []byte(`{"lv":1,"ur":["10.0.0.100/32 n1"]}`)}, "")
	if rep, others := v.UnverifiedBy(vip); !slices.Equal(rep, []string{"n3", "n5"}) || others != 5 {
		t.Fatalf("after n2 withdrew and n5 came back: UnverifiedBy = %v, %d; want [n3 n5], 5", rep, others)
	}
	if all, others := v.Reported(); !slices.Equal(all[vip], []string{"n3", "n5"}) || others != 5 {
		t.Fatalf("after n2 withdrew and n5 came back: Reported = %v, %d", all, others)
	}
	for _, tc := range []struct {
		name string
		want netip.Addr
		ok   bool
	}{{"n2", netip.MustParseAddr("10.1.0.2"), true}, {"n3", netip.MustParseAddr("fd00::3"), true}, {"bad", netip.Addr{}, false}, {"none", netip.Addr{}, false}} {
		if a, ok := v.MemberAddr(tc.name); a != tc.want || ok != tc.ok {
			t.Errorf("MemberAddr(%s) = %v, %v; want %v, %v", tc.name, a, ok, tc.want, tc.ok)
		}
	}
}

// TestLeaseVerifyResync: a report set the election's queue dropped is
// posted again at the next round (a lost withdrawal would stay in the
// metadata and count against the next holder).
func TestLeaseVerifyResync(t *testing.T) {
	loop := &leaseLoop{events: make(chan lease.Event), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	v := NewLeaseVerify(&LeaseNode{loop: loop})
	v.SetUnverified("10.0.0.100/32", "n2", true) // nobody reads: dropped
	if !v.pending {
		t.Fatal("a dropped post is not pending")
	}
	loop.events = make(chan lease.Event, 1)
	v.Resync()
	select {
	case ev := <-loop.events:
		u, ok := ev.(lease.Unreachable)
		if !ok || !slices.Equal(u.Reports, []lease.Report{{Key: "10.0.0.100/32", Holder: "n2"}}) {
			t.Fatalf("posted %#v", ev)
		}
	default:
		t.Fatal("Resync posted nothing")
	}
	v.Resync() // nothing pending: nothing posted
	select {
	case ev := <-loop.events:
		t.Fatalf("posted again without need: %#v", ev)
	default:
	}
}

// TestLeaseVerifyExcluded: the exclusion of this node, as its machine's
// status lists it, for another address or node it is not.
func TestLeaseVerifyExcluded(t *testing.T) {
	loop := &leaseLoop{}
	loop.status = lease.Status{Unverified: []string{"10.0.0.100/32@n1 until 2026-01-01T00:00:30Z", "10.0.0.101/32@n2 until 2026-01-01T00:00:30Z"}}
	v := NewLeaseVerify(&LeaseNode{cfg: LeaseConfig{Cluster: Config{Name: "n1"}}, loop: loop})
	for vip, want := range map[string]bool{"10.0.0.100/32": true, "10.0.0.101/32": false, "10.0.0.10/32": false} {
		if got := v.Excluded(vip); got != want {
			t.Errorf("Excluded(%s) = %v, want %v", vip, got, want)
		}
	}
}
