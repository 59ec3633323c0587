package election

import (
	"context"
	"crypto/rand"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// firstBind is the bound from the first node's apiserver answering
// to the VIP bound and announced (DESIGN.md's "first node" target).
const firstBind = 200 * time.Millisecond

// Build 3 / "Done when" of issue 26: the kubeadm first node. The same env
// file on all three machines (VIPD_PEERS lists all three, the node's own
// address included), only node 1 running while `kubeadm init` brings its
// apiserver up: the VIP is bound and announced at most 200 ms after the
// apiserver first answers 200. Then nodes 2 and 3 start (`kubeadm join`)
// and the VIP does not move.
func TestKubeadmFirstNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	ctx := ctxT(t, 60*time.Second)
	if err := c.apis["n1"].SetMode(lab.Down); err != nil {
		t.Fatal(err)
	}
	capt, err := c.Client.StartCapture(ctx, "arp")
	if err != nil {
		t.Fatal(err)
	}
	peers := c.addrs("n1", "n2", "n3")
	c.run(c.bin, "n1", peers)
	// vipd is up (its metrics answer) and checking a dead apiserver.
	if err := waitFor(ctx, "vipd on n1 to report its apiserver down", func() bool {
		return c.metrics(ctx, "n1")["vipd_health_up"] == "0"
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.procs["n1"].Output())
	}
	// kubeadm init writes certificates and manifests and the kubelet starts
	// the static pod before the apiserver first answers: seconds after
	// vipd.service started. vipd with VIPD_PEERS set first looks for an
	// existing cluster for a discovery window (1 s) and then bootstraps
	// alone; the 200 ms bound runs from the apiserver's answer once that is
	// done (an apiserver answering within vipd's first second waits for the
	// rest of the window: docs/lease.md).
	if err := waitFor(ctx, "vipd on n1 to bootstrap its cluster of one", func() bool {
		return c.metrics(ctx, "n1")["vipd_election_leader"] == "1"
	}); err != nil {
		t.Fatalf("%v\n%s", err, c.procs["n1"].Output())
	}
	if err := c.apis["n1"].SetMode(lab.OK); err != nil {
		t.Fatal(err)
	}
	vip := c.vip.String()
	mac := c.node("n1").MAC.String()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	frames, err := capt.WaitFrames(wctx, 1, "Reply "+vip+" is-at "+mac)
	cancel()
	if err != nil {
		t.Fatalf("n1 never announced the VIP: %v", err)
	}
	first := c.apis["n1"].FirstOK()
	var bound time.Time
	for _, s := range c.mon.Samples() {
		if len(s.Holders) == 1 && s.Holders[0] == "n1" {
			bound = s.At
			break
		}
	}
	if first.IsZero() || bound.IsZero() {
		t.Fatalf("apiserver first 200 at %v, VIP bound at %v", first, bound)
	}
	t.Logf("apiserver answered 200 at 0; VIP bound %v, first announcement %v later", bound.Sub(first).Round(time.Millisecond), frames[0].At.Sub(first).Round(time.Millisecond))
	if d := bound.Sub(first); d > firstBind {
		t.Errorf("VIP bound %v after the apiserver answered, want <= %v", d.Round(time.Millisecond), firstBind)
	}
	if d := frames[0].At.Sub(first); d > firstBind {
		t.Errorf("VIP announced %v after the apiserver answered, want <= %v", d.Round(time.Millisecond), firstBind)
	}
	if _, err := c.mon.WaitStable(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Node 1, alone and holding, meets a scan of its gossip port from a
	// host that is not a peer (a security scanner, a stray packet). None
	// of it is gossip under another key: the VIP stays. Before, one
	// undecryptable packet took the VIP from a node alone in its cluster
	// for a minute (KeyVeto).
	scanned := time.Now()
	if err := scanGossipPort(c.Client, netip.AddrPortFrom(c.node("n1").IPv4, 7950)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if v := c.requireOneHolder(scanned, time.Now(), 0, maxOutage); len(v.moves) != 1 || v.moves[0] != "n1" || v.noneBound > 0 {
		t.Errorf("the VIP moved or was released after a scan of n1's gossip port: %s", v)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = waitFor(sctx, "vipd on n1 to count the scan as vipd_cluster_gossip_rejected_total{sender=\"other\"}", func() bool {
		n, _ := strconv.ParseFloat(c.metrics(sctx, "n1")[`vipd_cluster_gossip_rejected_total{sender="other"}`], 64)
		return n >= 3
	})
	cancel()
	if err != nil {
		t.Errorf("%v\n%s", err, tail(c.procs["n1"].Output(), 20))
	}
	joined := time.Now()
	c.run(c.bin, "n2", peers)
	c.run(c.bin, "n3", peers)
	for _, name := range []string{"n1", "n2", "n3"} {
		c.waitMember(ctx, name, 3)
	}
	c.formed(ctx, formWithin, []string{"n1", "n2", "n3"}, nil)
	// Settle past the joins' election timeouts before judging.
	time.Sleep(3 * time.Second)
	v := c.requireOneHolder(joined, time.Now(), 0, maxOutage)
	if len(v.moves) != 1 || v.moves[0] != "n1" || v.noneBound > 0 || len(v.answered) != 1 || v.answered[0] != "n1" {
		t.Errorf("the VIP moved or was released while nodes 2 and 3 joined: %s", v)
	}
}

// scanGossipPort sends from h what a port scan sends to a gossip port:
// UDP junk, an empty datagram, a datagram framed like encrypted gossip
// (version byte 1) under no key, and an HTTP request over TCP.
func scanGossipPort(h *lab.Host, to netip.AddrPort) error {
	return h.Run(func() error {
		framed := make([]byte, 64)
		_, _ = rand.Read(framed)
		framed[0] = 1
		u, err := net.Dial("udp", to.String())
		if err != nil {
			return err
		}
		defer u.Close()
		for _, p := range [][]byte{[]byte("hello, is anybody there?"), {}, framed} {
			if _, err := u.Write(p); err != nil {
				return err
			}
		}
		c, err := net.DialTimeout("tcp", to.String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Read(make([]byte, 512))
		return nil
	})
}
