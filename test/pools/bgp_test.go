package pools

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// TestPoolsBGP: a bgp pool's address is advertised by every eligible node
// (ECMP at a real FRR router), withdrawn by a node that stops being
// eligible (label change) and by all when the allocation is deleted.
func TestPoolsBGP(t *testing.T) {
	testenv.RequireCommands(t, "vtysh")
	if _, err := os.Stat(lab.FRRDir + "/bgpd"); err != nil {
		testenv.Missing(t, "FRR daemons in %s (Debian package frr)", lab.FRRDir)
	}
	p := newPoolLab(t, "r")
	ctx := ctxT(t, 2*time.Minute)
	r := p.Extra["r"]
	router := lab.BGPRouter{AS: 65000, RouterID: r.IPv4, Ranges: []netip.Prefix{p.Prefix4}}
	conf, err := router.Render()
	if err != nil {
		t.Fatal(err)
	}
	frr, err := r.StartFRR(ctx, conf)
	if err != nil {
		t.Fatal(err)
	}
	p.pool(ctx, "edge", "bgp", map[string]string{"lab": "yes"}, "10.88.0.0/29")
	for _, n := range p.Nodes {
		p.start(n.Name, "VIPD_MODE=bgp", "VIPD_BGP_LOCAL_AS=65001", "VIPD_BGP_ROUTER_ID="+n.IPv4.String(),
			fmt.Sprintf("VIPD_BGP_PEERS=%s:65000", r.IPv4))
	}
	for _, n := range p.Nodes {
		if err := p.vipd[n.Name].WaitOutput(ctx, "pool feed synced"); err != nil {
			t.Fatal(err)
		}
	}
	a := netip.MustParseAddr("10.88.0.3")
	pfx := netip.PrefixFrom(a, 32)
	p.allocate(ctx, a, "edge", "bgp-svc")
	all := []netip.Addr{p.Nodes[0].IPv4, p.Nodes[1].IPv4, p.Nodes[2].IPv4}
	waitHops(ctx, t, frr, pfx, all)
	// n2 loses the label: it withdraws, the others stay.
	setLabel(ctx, t, p.kc, "n2", "lab", "")
	waitHops(ctx, t, frr, pfx, []netip.Addr{p.Nodes[0].IPv4, p.Nodes[2].IPv4})
	// The allocation is deleted: everybody withdraws.
	p.release(ctx, a)
	waitHops(ctx, t, frr, pfx, nil)
}

func waitHops(ctx context.Context, t *testing.T, frr *lab.FRR, pfx netip.Prefix, want []netip.Addr) {
	t.Helper()
	slices.SortFunc(want, func(a, b netip.Addr) int { return a.Compare(b) })
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []netip.Addr
	for {
		got, _ = frr.BGPNextHops(c, pfx)
		slices.SortFunc(got, func(a, b netip.Addr) int { return a.Compare(b) })
		if slices.Equal(got, want) {
			return
		}
		select {
		case <-c.Done():
			t.Fatalf("router's next hops for %s: %v, want %v", pfx, got, want)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
