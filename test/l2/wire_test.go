package l2

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// releases counts the times vipd gave a VIP up (released or failed), from
// its log.
func releases(p *lab.Proc) int {
	return strings.Count(p.Output(), `msg="VIP released"`) + strings.Count(p.Output(), `msg="VIP failed"`)
}

// TestSecondInterfaceOnSegment: a node with a second interface on the VIP's
// segment (two NICs in one VLAN). Linux answers ARP for any local address
// on every interface, so the lone holder's probe hears its own second MAC;
// that MAC is this host's and never another holder: the VIP is held
// steadily, never released, and no conflict is counted (IPv4 and IPv6).
func TestSecondInterfaceOnSegment(t *testing.T) {
	l := newLoneLab(t)
	ctx := ctxT(t, 40*time.Second)
	second := netip.PrefixFrom(l.VIP4(90), 24)
	mac2, err := l.node.AddLink(ctx, "eth1", second)
	if err != nil {
		t.Fatal(err)
	}
	// What the node itself receives: its second interface's answers are
	// unicast to it, the client never sees them.
	own, err := l.node.StartCapture(ctx, "arp")
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := l.VIP4(1), l.VIP6(1)
	p := l.start(t, "VIPD_ADDRESS="+v4.String()+"/32,"+v6.String()+"/128")
	for _, v := range []netip.Addr{v4, v6} {
		if err := l.node.WaitAddr(ctx, v, true); err != nil {
			t.Fatal(err)
		}
	}
	// Three lone probes (every 2 s) and the first one 250 ms after binding.
	time.Sleep(6 * time.Second)
	if n := releases(p); n != 0 {
		t.Fatalf("the lone node released its VIPs %d times in 6 s (its own second interface %s taken for another holder)", n, mac2)
	}
	if strings.Contains(p.Output(), "VIP conflict") {
		t.Fatalf("a conflict was reported with only this node's own interfaces on the segment")
	}
	// The probes really were answered by the second interface (IPv4): the
	// test would pass vacuously otherwise.
	if got := own.Frames("Reply " + v4.String() + " is-at " + mac2.String()); len(got) == 0 {
		t.Fatalf("the second interface never answered for %s: the test does not show the case", v4)
	}
	for _, v := range []netip.Addr{v4, v6} {
		if ok, err := l.node.HasAddr(ctx, v); err != nil || !ok {
			t.Fatalf("%s not held after 6 s: %v", v, err)
		}
	}
	if !metric(ctx, t, l.node, `vipd_conflicts_total{vip="`+v4.String()+`/32"} 0`) && metric(ctx, t, l.node, `vipd_conflicts_total{vip="`+v4.String()+`/32"}`) {
		t.Fatalf("vipd_conflicts_total for %s is not 0", v4)
	}
}

// TestSecondInterfaceInCluster: the same node in a two-node cluster holds
// the VIP steadily; its own second MAC is never taken for a stray holder
// (no conflicts, no defending announcements beyond the burst and refresh).
func TestSecondInterfaceInCluster(t *testing.T) {
	c := newClusterLab(t, 2)
	ctx := ctxT(t, 60*time.Second)
	for _, n := range c.Nodes {
		if _, err := n.AddLink(ctx, "eth1", netip.PrefixFrom(c.VIP4(80+n.Index), 24)); err != nil {
			t.Fatal(err)
		}
	}
	c.start()
	h := c.holder(ctx)
	time.Sleep(5 * time.Second)
	if now := c.mon.Now(); len(now) != 1 || now[0] != h {
		t.Fatalf("holder %s, now %v:\n%s", h, now, c.mon)
	}
	for name, p := range c.vipd {
		if n := releases(p); n != 0 {
			t.Errorf("%s released or failed %d times", name, n)
		}
		if strings.Contains(p.Output(), "VIP conflict") || strings.Contains(p.Output(), "another holder answers") {
			t.Errorf("%s reported a conflict with only cluster nodes on the segment", name)
		}
	}
}

func waitFor(ctx context.Context, every time.Duration, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(every):
		}
	}
	return true
}
