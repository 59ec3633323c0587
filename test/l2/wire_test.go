package l2

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// wireEnv: the wire checks run under the lease election (set explicitly,
// so that the tests hold before and after it became the default).
var wireEnv = []string{"VIPD_ELECTION=lease"}

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
// the VIPs (IPv4 and IPv6) steadily; its own second MAC is never taken for
// a stray holder, by itself or by the other node's verification (no
// conflicts, no duplicates, no defending announcements beyond the burst
// and refresh).
func TestSecondInterfaceInCluster(t *testing.T) {
	c, v6 := newWireLab(t, 2, nil)
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
	if hs, err := c.Holders(ctx, v6); err != nil || len(hs) != 1 || hs[0] != h {
		t.Fatalf("%s held by %v (%v), want %s alone", v6, hs, err, h)
	}
	for name, p := range c.vipd {
		if n := releases(p); n != 0 {
			t.Errorf("%s released or failed %d times", name, n)
		}
		for _, bad := range []string{"VIP conflict", "another holder answers", "VIP unreachable through its holder"} {
			if strings.Contains(p.Output(), bad) {
				t.Errorf("%s logged %q with only cluster nodes on the segment", name, bad)
			}
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

// newWireLab is a cluster lab with extra hosts on the segment (a foreign
// host "x"), holding one IPv4 and one IPv6 VIP.
func newWireLab(t *testing.T, nodes int, extra []string, env ...string) (*clusterLab, netip.Addr) {
	t.Helper()
	bin := prerequisites(t)
	l := lab.New(t, lab.Options{Nodes: nodes, Client: true, Extra: extra})
	c := &clusterLab{Lab: l, t: t, bin: bin, vip: l.VIP4(50), apis: map[string]*lab.APIServer{}, vipd: map[string]*lab.Proc{}}
	v6 := l.VIP6(50)
	c.env = append(append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32," + v6.String() + "/128"}, wireEnv...), env...)
	for _, n := range l.Nodes {
		api, err := n.StartAPIServer("[::]:6443", lab.OK)
		if err != nil {
			t.Fatal(err)
		}
		c.apis[n.Name] = api
	}
	mon, err := l.Monitor(c.vip)
	if err != nil {
		t.Fatal(err)
	}
	c.mon = mon
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("holder timeline:\n%s", c.mon)
			for name, p := range c.vipd {
				t.Logf("--- vipd %s:\n%s", name, tail(p.Output(), 80))
			}
		}
	})
	return c, v6
}

// hostPort is addr:port with IPv6 in brackets.
func hostPort(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }

// logLine waits for a line of p's log holding every one of parts.
func logLine(ctx context.Context, p *lab.Proc, parts ...string) bool {
	return waitFor(ctx, 20*time.Millisecond, func() bool {
		for _, line := range strings.Split(p.Output(), "\n") {
			all := true
			for _, s := range parts {
				all = all && strings.Contains(line, s)
			}
			if all {
				return true
			}
		}
		return false
	})
}

// TestForeignHostClaimsVIP (issue 27, Found 2): a foreign host on the
// segment binds the VIP and announces it, again and again for 2 s (a
// misconfigured server, a leftover kube-vip). The holder reports it within
// 2 s with the foreign MAC (log, metric, /status), defends the address at
// most once a second, and clients are served by the holder again within
// 2 s after the foreign host lets the address go. IPv4 and IPv6 in one lab.
func TestForeignHostClaimsVIP(t *testing.T) {
	c, v6 := newWireLab(t, 2, []string{"x"})
	x := c.Extra["x"]
	ctx := ctxT(t, 90*time.Second)
	c.start()
	c.holder(ctx)
	// Past the holders' announcement burst (5 x 1.1 s): from then on only
	// the defence can bring a client back before the 30 s refresh.
	time.Sleep(5 * time.Second)
	for _, v := range []netip.Addr{c.vip, v6} {
		holders, err := c.Holders(ctx, v)
		for err == nil && len(holders) != 1 {
			time.Sleep(50 * time.Millisecond)
			holders, err = c.Holders(ctx, v)
		}
		if err != nil {
			t.Fatal(err)
		}
		h := holders[0]
		p := c.vipd[h]
		bits := "/32"
		if v.Is6() {
			bits = "/128"
		}
		prober := c.Client.StartProber(hostPort(v, 6443), 50*time.Millisecond, 500*time.Millisecond)
		if !waitFor(ctx, 20*time.Millisecond, func() bool {
			a := prober.Answers()
			return len(a) > 0 && a[len(a)-1].Node == h
		}) {
			t.Fatalf("%s: client never served by %s", v, h)
		}
		if v.Is6() {
			// DAD: a host that adds the address the usual way (duplicate
			// address detection on) finds the holder answering and
			// leaves it dadfailed: it never answers for it.
			if _, err := x.Output(ctx, "ip", "-6", "addr", "add", v.String()+bits, "dev", x.Link); err != nil {
				t.Fatal(err)
			}
			if !waitFor(ctxT(t, 5*time.Second), 50*time.Millisecond, func() bool {
				out, err := x.Output(ctx, "ip", "-6", "addr", "show", "dev", x.Link, "dadfailed")
				return err == nil && strings.Contains(string(out), v.String())
			}) {
				t.Fatalf("%s: the foreign host's duplicate address detection did not fail while %s holds it", v, h)
			}
			if _, err := x.Output(ctx, "ip", "-6", "addr", "del", v.String()+bits, "dev", x.Link); err != nil {
				t.Fatal(err)
			}
		}
		// The foreign host takes the address and claims it every 400 ms.
		add := []string{"addr", "add", v.String() + bits, "dev", x.Link}
		if v.Is6() {
			add = []string{"-6", "addr", "add", v.String() + bits, "dev", x.Link, "nodad"}
		}
		if _, err := x.Output(ctx, "ip", add...); err != nil {
			t.Fatal(err)
		}
		claimed := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		stopClaims := make(chan struct{})
		claimsDone := make(chan struct{})
		go func() {
			defer close(claimsDone)
			for {
				if err := x.Announce(v); err != nil {
					t.Errorf("foreign announce: %v", err)
				}
				select {
				case <-stopClaims:
					return
				case <-time.After(400 * time.Millisecond):
				}
			}
		}()
		if !logLine(rctx, p, "VIP conflict: another host claims", "vip="+v.String(), "mac="+x.MAC.String()) {
			cancel()
			close(stopClaims)
			t.Fatalf("%s: the holder %s did not report the foreign host %s within 2 s", v, h, x.MAC)
		}
		cancel()
		t.Logf("%s: the holder reported the foreign MAC %s %v after its first claim", v, x.MAC, time.Since(claimed).Round(time.Millisecond))
		if !metric(ctx, t, c.node(h), `vipd_address_conflicts_total{vip="`+v.String()+bits+`"} 1`) {
			t.Errorf("%s: vipd_address_conflicts_total is not 1 on %s", v, h)
		}
		// Every node: the other node's verification round is answered by
		// both the holder and the foreign host (which bound the address).
		for name, op := range c.vipd {
			if name == h {
				continue
			}
			dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
			if !logLine(dctx, op, "VIP conflict: more than one host answers", "vip="+v.String(), x.MAC.String()) {
				t.Errorf("%s: the non-holder %s did not report two hosts answering within 3 s", v, name)
			}
			dcancel()
			if !metric(ctx, t, c.node(name), `vipd_duplicate_answers_total{vip="`+v.String()+bits+`"} 1`) {
				t.Errorf("%s: vipd_duplicate_answers_total is not 1 on %s", v, name)
			}
		}
		st, err := c.node(h).Output(ctx, c.bin, "status", "--json")
		if err != nil || !strings.Contains(strings.ReplaceAll(string(st), " ", ""), `"mac":"`+x.MAC.String()+`"`) {
			t.Errorf("%s: /status of %s does not name the foreign MAC %s: %v\n%s", v, h, x.MAC, err, st)
		}
		time.Sleep(2 * time.Second)
		close(stopClaims)
		<-claimsDone
		// A last claim right before letting the address go: the clients
		// follow it, and only the holder's defence brings them back.
		if err := x.Announce(v); err != nil {
			t.Fatal(err)
		}
		if mac, err := c.Client.Neigh(ctx, v); err == nil {
			t.Logf("%s: after the last foreign claim the client's neighbour entry is %s (foreign %s)", v, mac, x.MAC)
		}
		del := append([]string{}, add...)
		del[slicesIndex(del, "add")] = "del"
		if v.Is6() {
			del = del[:len(del)-1] // no nodad
		}
		if _, err := x.Output(ctx, "ip", del...); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		time.Sleep(2500 * time.Millisecond)
		prober.Stop()
		ans := prober.Answers()
		// Back: the first probe after the stop that the holder answered;
		// from then on the holder answers (a probe lost to a loaded
		// machine now and then is not the foreign host).
		var back time.Time
		after, served := 0, 0
		for _, a := range ans {
			if a.Sent.Before(stopped) {
				continue
			}
			if back.IsZero() && a.Node == h {
				back = a.Sent
			}
			if !back.IsZero() {
				after++
				if a.Node == h {
					served++
				}
			}
		}
		if back.IsZero() || back.Sub(stopped) > 2*time.Second {
			t.Fatalf("%s: clients not served by %s within 2 s after the foreign host stopped (answers %v)", v, h, ans)
		}
		if served*10 < after*8 {
			t.Fatalf("%s: after the holder served the client again, it answered only %d of %d probes", v, served, after)
		}
		t.Logf("%s: clients served by the holder %v after the foreign host stopped", v, max(back.Sub(stopped), 0).Round(time.Millisecond))
	}
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestFilteredAnnouncementMoves (issue 27, Found 3): the switch stops
// forwarding the holder's ARP answers and announcements for the VIP (an
// nftables bridge filter on its port) while gossip still flows. The other
// nodes find they cannot resolve the VIP, report it, and the holder gives
// it up to a node whose announcements arrive: a client that resolves the
// VIP afresh is served again within 5 s. IPv4, then IPv6 (neighbour
// advertisements), in one lab.
func TestFilteredAnnouncementMoves(t *testing.T) {
	c, v6 := newWireLab(t, 3, nil)
	ctx := ctxT(t, 120*time.Second)
	c.start()
	c.holder(ctx)
	for i, v := range []netip.Addr{c.vip, v6} {
		var holders []string
		var err error
		for holders, err = c.Holders(ctx, v); err == nil && len(holders) != 1; holders, err = c.Holders(ctx, v) {
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		h := c.node(holders[0])
		bits := "/32"
		if v.Is6() {
			bits = "/128"
		}
		// The holder's port drops its answers for the VIP: ARP with the VIP
		// as sender (replies, gratuitous), or every neighbour advertisement.
		rule := fmt.Sprintf(`iifname "%s" arp saddr ip %s drop`, h.Peer, v)
		if v.Is6() {
			rule = fmt.Sprintf(`iifname "%s" icmpv6 type nd-neighbor-advert drop`, h.Peer)
		}
		table := fmt.Sprintf("vipdlab%d", i)
		if err := c.BridgeNft(ctx, fmt.Sprintf("table bridge %s {\n chain port {\n  type filter hook forward priority 0; policy accept;\n  %s\n }\n}\n", table, rule)); err != nil {
			t.Fatal(err)
		}
		filtered := time.Now()
		// A client that resolves the VIP afresh.
		if _, err := c.Client.Output(ctx, "ip", "neigh", "flush", "dev", c.Client.Link); err != nil {
			t.Fatal(err)
		}
		prober := c.Client.StartProber(hostPort(v, 6443), 50*time.Millisecond, 300*time.Millisecond)
		var served lab.Answer
		if !waitFor(ctxT(t, 8*time.Second), 50*time.Millisecond, func() bool {
			for _, a := range prober.Answers() {
				if a.Node != "" && a.Node != h.Name && a.Sent.After(filtered) {
					served = a
					return true
				}
			}
			return false
		}) {
			prober.Stop()
			t.Fatalf("%s: no other node serves the client 8 s after %s's announcements were filtered (answers %v)", v, h.Name, prober.Answers())
		}
		prober.Stop()
		took := served.Sent.Add(served.RTT).Sub(filtered)
		t.Logf("%s: %s's announcements filtered; the client was served by %s %v later", v, h.Name, served.Node, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("%s: the client was served again %v after the filter, want within 5 s", v, took)
		}
		p := c.vipd[h.Name]
		// The lease election moves it; the holder does not step aside by
		// itself (that would move every address it holds for a while).
		if strings.Contains(p.Output(), "stepping aside") {
			t.Errorf("%s: %s stepped aside instead of letting the election move the VIP", v, h.Name)
		}
		if !logLine(ctx, p, "the other nodes cannot reach a VIP this node holds", "vip="+v.String()) {
			t.Errorf("%s: %s did not log that the others cannot reach the VIP", v, h.Name)
		}
		if !metric(ctx, t, h, `vipd_vip_unverified_total{vip="`+v.String()+bits+`"} 1`) {
			t.Errorf("%s: vipd_vip_unverified_total is not 1 on %s", v, h.Name)
		}
		// The lease election keeps the holder from the VIP for a while,
		// and says so in /status (components.unverified).
		if st, err := h.Output(ctx, c.bin, "status", "--json"); err != nil || !strings.Contains(string(st), v.String()+bits+"@"+h.Name+" until") {
			t.Errorf("%s: /status of %s does not list its exclusion from the VIP: %v\n%s", v, h.Name, err, st)
		}
		t.Logf("holder timeline of %s:\n%s", c.vip, c.mon)
	}
}

// TestGuardAfterInterfaceReplaced: the VIP interface is deleted and
// created again under its name (a re-created bond or VLAN: a new index).
// The VIP is bound on the new interface, and the conflict guard reads the
// new one: a foreign claim is still reported.
func TestGuardAfterInterfaceReplaced(t *testing.T) {
	bin := prerequisites(t)
	l := lab.New(t, lab.Options{Nodes: 1, Extra: []string{"x"}})
	n, x := l.Nodes[0], l.Extra["x"]
	if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	v := l.VIP4(7)
	p, err := n.StartVipd(bin, "VIPD_ADDRESS="+v.String()+"/32")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vipd output:\n%s", tail(p.Output(), 80))
		}
	})
	if err := n.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	if err := n.ReplaceLink(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitAddr(ctx, v, true); err != nil {
		t.Fatalf("VIP not bound again on the re-created interface: %v", err)
	}
	// The foreign host claims the VIP now and then (it does not bind it:
	// the lone holder's probe would give the VIP up to it).
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		logLine(wctx, p, "VIP conflict: another host claims", "vip="+v.String(), "mac="+x.MAC.String())
	}()
	for done := false; !done; {
		if err := x.Announce(v); err != nil {
			t.Fatal(err)
		}
		select {
		case <-reported:
			done = true
		case <-time.After(500 * time.Millisecond):
		}
	}
	if wctx.Err() != nil {
		t.Fatalf("no conflict reported on the re-created interface within 15 s")
	}
	if !strings.Contains(p.Output(), "conflict guard: reading the VIP interface again") {
		t.Errorf("the guard did not say it reads the re-created interface")
	}
	t.Logf("guard after the replacement:\n%s", grepLines(p.Output(), "conflict guard"))
}
