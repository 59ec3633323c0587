package pools

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// TestPoolAddressFilteredMoves (issue 27, pool addresses): the switch
// stops forwarding a pool address's holder's ARP answers (then its
// neighbour advertisements) while gossip still flows. The other nodes'
// verification (batched with every other address) reports the address
// unreachable through the lease metadata, without naming the holder; the
// lease leader makes that holder ineligible for it and the address moves:
// a client that resolves it afresh is served by another node. IPv4, then
// IPv6, under the lease election, in one lab.
func TestPoolAddressFilteredMoves(t *testing.T) {
	p := newPoolLab(t)
	ctx := ctxT(t, 3*time.Minute)
	v4, v6 := p.VIP4(60), p.VIP6(60)
	p.pool(ctx, "wire", "l2", nil, v4.String()+"-"+p.VIP4(69).String())
	p.pool(ctx, "wire6", "l2", nil, v6.String()+"-"+p.VIP6(69).String())
	for _, n := range p.Nodes {
		p.start(n.Name, "VIPD_ELECTION=lease")
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, pr := range p.vipd {
				var keep []string
				for _, l := range strings.Split(pr.Output(), "\n") {
					if !strings.Contains(l, "level=DEBUG") {
						keep = append(keep, l)
					}
				}
				t.Logf("--- vipd %s without debug lines:\n%s", name, tail(strings.Join(keep, "\n"), 60))
			}
		}
	})
	for _, n := range p.Nodes {
		if err := p.vipd[n.Name].WaitOutput(ctx, "pool feed synced"); err != nil {
			t.Fatal(err)
		}
	}
	// Ten addresses of each family: the verification batches them.
	for i := range 10 {
		p.allocate(ctx, p.VIP4(60+i), "wire", fmt.Sprintf("w4-%d", i))
		p.allocate(ctx, p.VIP6(60+i), "wire6", fmt.Sprintf("w6-%d", i))
	}
	for i, a := range []netip.Addr{v4, v6} {
		var holders []string
		for holders = p.bound(ctx, a); len(holders) != 1; holders = p.bound(ctx, a) {
			select {
			case <-ctx.Done():
				t.Fatalf("%s bound on %v", a, holders)
			case <-time.After(50 * time.Millisecond):
			}
		}
		p.waitReach(ctx, a, "")
		// Past the reports' settling: the holder has held it a while. A
		// node that joined may have taken its share meanwhile (the
		// pools' settle): the holder is the one bound after the wait.
		time.Sleep(3 * time.Second)
		for holders = p.bound(ctx, a); len(holders) != 1; holders = p.bound(ctx, a) {
			select {
			case <-ctx.Done():
				t.Fatalf("%s bound on %v", a, holders)
			case <-time.After(50 * time.Millisecond):
			}
		}
		h := p.Node(holders[0])
		rule := fmt.Sprintf(`iifname "%s" arp saddr ip %s drop`, h.Peer, a)
		if a.Is6() {
			rule = fmt.Sprintf(`iifname "%s" icmpv6 type nd-neighbor-advert drop`, h.Peer)
		}
		if err := p.BridgeNft(ctx, fmt.Sprintf("table bridge vipdpool%d {\n chain port {\n  type filter hook forward priority 0; policy accept;\n  %s\n }\n}\n", i, rule)); err != nil {
			t.Fatal(err)
		}
		filtered := time.Now()
		if _, err := p.Client.Output(ctx, "ip", "neigh", "flush", "dev", p.Client.Link); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		name, at := p.waitReach(wctx, a, h.Name)
		wcancel()
		took := at.Sub(filtered)
		t.Logf("%s: %s's announcements filtered; the client was served by %s %v later", a, h.Name, name, took.Round(time.Millisecond))
		if took > 8*time.Second {
			t.Errorf("%s: served again %v after the filter, want within 8 s (2 rounds, the reports' 2.5 s settling, the move)", a, took)
		}
		// The move is a planned one (the holder is alive): make-before-break,
		// so the old holder lets go at most the agreed overlap later
		// (docs/lease.md); a pool address runs to that bound.
		cfg := lease.ProfileConfig("default")
		overlap := time.Duration(float64(cfg.Overlap) / (1 - cfg.Drift))
		var b []string
		for deadline := time.Now().Add(overlap + time.Second); ; time.Sleep(20 * time.Millisecond) {
			if b = p.bound(ctx, a); (len(b) == 1 && b[0] != h.Name) || time.Now().After(deadline) {
				break
			}
		}
		if len(b) != 1 || b[0] == h.Name {
			t.Errorf("%s bound on %v %v after the move, want one node other than %s", a, b, overlap+time.Second, h.Name)
		}
		// The others reported it, per kind; the holder said why it lost it.
		reported := false
		for _, n := range p.Nodes {
			if n.Name != h.Name && strings.Contains(p.vipd[n.Name].Output(), "address unreachable through its holder") {
				reported = true
			}
		}
		if !reported {
			t.Errorf("%s: no other node logged it unreachable", a)
		}
		lctx, lcancel := context.WithTimeout(ctx, 3*time.Second) // it lets go after the overlap
		err := p.vipd[h.Name].WaitOutput(lctx, "the election moved it to another node")
		lcancel()
		if err != nil {
			t.Errorf("%s: the holder %s did not log why it lost the address", a, h.Name)
		}
		out, err := h.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
		if err != nil || !strings.Contains(string(out), `vipd_addresses_unverified_total{kind="pool"}`) {
			t.Errorf("%s: %s has no vipd_addresses_unverified_total{kind=\"pool\"}: %v", a, h.Name, err)
		}
		if strings.Contains(string(out), `vipd_vip_unreachable{vip="`+p.VIP4(61).String()) {
			t.Errorf("per-address verification metrics for pool addresses on %s", h.Name)
		}
	}
}
