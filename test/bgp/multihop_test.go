package bgp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// TestMultihopBFD runs a multihop eBGP session with multihop BFD (RFC 5883,
// UDP 4784) against FRR's bfdd: the session comes Up with FRR seeing a
// multihop peer, a silent node is dropped from the router's FIB by BFD
// (not the hold timer) and vipd resets its BGP session at once, and
// packets below vipd's minimum TTL do not keep the session Up.
func TestMultihopBFD(t *testing.T) {
	testenvShort(t)
	e := newEnv(t, setup{nodes: 1, multihop: 2,
		bfd:     &lab.BFDProfile{ReceiveInterval: 300, TransmitInterval: 300, DetectMultiplier: 3, MinimumTTL: 250},
		vipdEnv: []string{"VIPD_BFD_ENABLED=true", "VIPD_BFD_MULTIHOP_MIN_TTL=250"}})
	n1 := e.nodes[0]
	n1.env = append(n1.env, fmt.Sprintf("VIPD_BGP_PEERS=%s:%d:multihop=2", e.r.IPv4, routerAS), "VIPD_ADDRESS="+vip4.String())
	e.startVipd(n1)
	e.waitKernel(vip4, 30*time.Second, n1)

	bfdUp := func(timeout time.Duration) lab.BFDPeer {
		t.Helper()
		var got lab.BFDPeer
		ok := poll(timeout, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			peers, err := e.frr.BFDPeers(ctx)
			if err != nil || len(peers) != 1 {
				return false
			}
			got = peers[0]
			return got.Status == "up"
		})
		if !ok {
			t.Fatalf("FRR BFD session not up: %+v", got)
		}
		return got
	}
	p := bfdUp(15 * time.Second)
	if !p.Multihop || p.RemoteReceiveInterval != 300 || p.RemoteDetectMultiplier != 3 {
		t.Errorf("FRR sees %+v, want a multihop session at 300 ms x 3", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if st, err := statusJSON(ctx, n1.h); err != nil || !strings.Contains(st, `"multihop": true`) || !strings.Contains(st, `"min_ttl": 250`) {
		t.Errorf("/status does not show a multihop BFD session with min TTL 250 (%v):\n%s", err, st)
	}

	t.Run("silent-node-dropped-by-bfd", func(t *testing.T) {
		e.t = t
		start := time.Now()
		if err := silence(ctx, n1.h, true); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 4*time.Second) // BFD 0.9 s; the hold timer would take 9 s
		t.Logf("silent node's path gone from the router's FIB after %v", time.Since(start).Round(time.Millisecond))
		if !poll(5*time.Second, func() bool {
			out := n1.vipd.Output()
			return strings.Contains(out, "bgp peer reset") && strings.Contains(out, "BFD down")
		}) {
			t.Errorf("vipd did not reset its BGP session on multihop BFD Down:\n%s", tail(n1.vipd.Output(), 20))
		}
		if err := silence(ctx, n1.h, false); err != nil {
			t.Fatal(err)
		}
		e.waitKernel(vip4, 30*time.Second, n1)
		bfdUp(15 * time.Second)
	})

	t.Run("below-min-ttl-dropped", func(t *testing.T) {
		e.t = t
		// Packets from the router now arrive with TTL 249, below vipd's 250:
		// vipd must stop accepting them and its session must go Down.
		cmd := n1.h.Command(ctx, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(`table ip vipdttl {
  chain pre { type filter hook prerouting priority -300; udp dport 4784 ip ttl set 249; }
}
`)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
		if !poll(5*time.Second, func() bool {
			m, err := metrics(ctx, n1.h)
			return err == nil && strings.Contains(m, fmt.Sprintf(`vipd_bfd_session_up{peer="%s"} 0`, e.r.IPv4))
		}) {
			t.Errorf("vipd's BFD session stayed up with packets below the minimum TTL")
		}
		if out, err := n1.h.Output(ctx, "nft", "delete", "table", "ip", "vipdttl"); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
		e.waitKernel(vip4, 30*time.Second, n1)
		bfdUp(15 * time.Second)
	})
}
