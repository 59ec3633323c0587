// Package egress tests the static egress IP (VIPD_EGRESS) in a
// network-namespace lab: three nodes with "pods" behind veths on a
// per-node pod subnet (routed between the nodes like a host-gateway CNI,
// masqueraded by an iptables-nft rule like a CNI's), a router and an
// external server beyond it that reports the source address it sees.
package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// The pod CIDRs (node i has x.x.i.0/24 and fd99:0:0:i::/64; pod .11 is
// selected by the egress rules, pod .12 is not) and the server beyond the
// router. None of them overlaps the lab's own 10.200-249.x.x range.
const (
	podCIDR4 = "100.64.0.0/16"
	podCIDR6 = "fd99::/56"
	server4  = "203.0.113.10"
	server6  = "2001:db8:5::10"
	router4  = "203.0.113.1"
	router6  = "2001:db8:5::1"
	port     = "8080"
)

// Health checks fast enough that the lab runs quickly.
var fastHealth = []string{"VIPD_HEALTH_INTERVAL=200ms", "VIPD_HEALTH_TIMEOUT=200ms", "VIPD_FAIL_THRESHOLD=3"}

type egressLab struct {
	*lab.Lab
	t        *testing.T
	bin      string
	router   *lab.Host
	serverNS string
	e4, e6   netip.Addr
	vipd     map[string]*lab.Proc
	prio     map[string]string
}

func pod4(node, j int) string { return fmt.Sprintf("100.64.%d.%d", node, 10+j) }
func pod6(node, j int) string { return fmt.Sprintf("fd99:0:0:%d::%d", node, 10+j) }

func (l *egressLab) podNS(node, j int) string { return fmt.Sprintf("vl%sn%dp%d", l.ID, node, j) }

// sh runs ip/sysctl/iptables commands inside a namespace.
func sh(t *testing.T, ns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		args := append([]string{"netns", "exec", ns}, strings.Fields(c)...)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %s: %v: %s", ns, c, err, out)
		}
	}
}

func out(t *testing.T, ns string, c string) string {
	t.Helper()
	b, err := exec.Command("ip", append([]string{"netns", "exec", ns}, strings.Fields(c)...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s: %v: %s", ns, c, err, b)
	}
	return string(b)
}

func newEgressLab(t *testing.T) *egressLab {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "iptables", "ip6tables", "sysctl")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := &egressLab{Lab: lab.New(t, lab.Options{Nodes: 3, Extra: []string{"r"}}), t: t, bin: bin, vipd: map[string]*lab.Proc{},
		prio: map[string]string{"n1": "10", "n2": "5", "n3": "0"}}
	l.router = l.Extra["r"]
	l.e4, l.e6 = l.VIP4(50), l.VIP6(50)

	// The server, beyond the router on its own link.
	l.serverNS = "vl" + l.ID + "s"
	run := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, b)
		}
	}
	run("netns", "add", l.serverNS)
	l.OnClose(func() { _ = exec.Command("ip", "netns", "del", l.serverNS).Run() })
	run("-n", l.router.NS, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", l.serverNS)
	sh(t, l.router.NS,
		"ip link set eth1 up", "ip addr add "+router4+"/24 dev eth1", "ip -6 addr add "+router6+"/64 dev eth1 nodad",
		"sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv6.conf.all.forwarding=1")
	sh(t, l.serverNS,
		"ip link set lo up", "ip link set eth0 up", "ip addr add "+server4+"/24 dev eth0", "ip -6 addr add "+server6+"/64 dev eth0 nodad",
		"ip route add default via "+router4, "ip -6 route add default via "+router6)

	for i, n := range l.Nodes {
		ni := i + 1
		sh(t, n.NS,
			"sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv6.conf.all.forwarding=1",
			"ip route add default via "+l.router.IPv4.String(), "ip -6 route add default via "+l.router.IPv6.String(),
			// The CNI's masquerade, installed as flannel or kube-router do
			// (iptables-nft): pod traffic leaving the cluster gets the
			// node's address.
			"iptables -t nat -A POSTROUTING -s "+podCIDR4+" ! -d "+podCIDR4+" -j MASQUERADE",
			"ip6tables -t nat -A POSTROUTING -s "+podCIDR6+" ! -d "+podCIDR6+" -j MASQUERADE")
		// Host-gateway routes to the other nodes' pod subnets.
		for k, m := range l.Nodes {
			if k != i {
				sh(t, n.NS, fmt.Sprintf("ip route add 100.64.%d.0/24 via %s", k+1, m.IPv4),
					fmt.Sprintf("ip -6 route add fd99:0:0:%d::/64 via %s", k+1, m.IPv6))
			}
		}
		for j := 1; j <= 2; j++ {
			pns := l.podNS(ni, j)
			run("netns", "add", pns)
			l.OnClose(func() { _ = exec.Command("ip", "netns", "del", pns).Run() })
			veth := fmt.Sprintf("p%d", j)
			run("-n", n.NS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pns)
			sh(t, n.NS, "ip link set "+veth+" up",
				fmt.Sprintf("ip addr add 100.64.%d.1/32 dev %s", ni, veth),
				fmt.Sprintf("ip -6 addr add fd99:0:0:%d::1/128 dev %s nodad", ni, veth),
				fmt.Sprintf("ip route add %s/32 dev %s", pod4(ni, j), veth),
				fmt.Sprintf("ip -6 route add %s/128 dev %s", pod6(ni, j), veth))
			sh(t, pns, "ip link set lo up", "ip link set eth0 up",
				fmt.Sprintf("ip addr add %s/24 dev eth0", pod4(ni, j)),
				fmt.Sprintf("ip -6 addr add %s/64 dev eth0 nodad", pod6(ni, j)),
				fmt.Sprintf("ip route add default via 100.64.%d.1 dev eth0 onlink", ni),
				fmt.Sprintf("ip -6 route add default via fd99:0:0:%d::1 dev eth0 onlink", ni))
		}
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	l.startServer()
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range l.vipd {
				t.Logf("--- vipd %s:\n%s", name, tail(p.Output(), 40))
			}
		}
	})
	return l
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startServer answers every connection with the source address it sees.
func (l *egressLab) startServer() {
	var ln net.Listener
	err := lab.RunInNS(l.serverNS, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+port)
		return err
	})
	if err != nil {
		l.t.Fatal(err)
	}
	l.OnClose(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = fmt.Fprintf(c, "%s\n", ap.Addr().Unmap())
			_ = c.Close()
		}
	}()
}

func (l *egressLab) egressEnv() string {
	var from4, from6 []string
	for i := 1; i <= len(l.Nodes); i++ {
		from4 = append(from4, pod4(i, 1)+"/32")
		from6 = append(from6, pod6(i, 1)+"/128")
	}
	return fmt.Sprintf("VIPD_EGRESS=%s from %s to 203.0.113.0/24; %s from %s to 2001:db8:5::/64",
		l.e4, strings.Join(from4, ","), l.e6, strings.Join(from6, ","))
}

func (l *egressLab) start(name string, egress bool) {
	l.t.Helper()
	n := l.Node(name)
	env := append([]string{"VIPD_PEERS=" + l.Peers(n), "VIPD_PRIORITY=" + l.prio[name],
		"VIPD_EGRESS_CLUSTER_CIDRS=" + podCIDR4 + "," + podCIDR6}, fastHealth...)
	if egress {
		env = append(env, l.egressEnv())
	} else {
		env = append(env, "VIPD_ADDRESS="+l.VIP4(60).String()+"/32")
	}
	p, err := n.StartVipd(l.bin, env...)
	if err != nil {
		l.t.Fatal(err)
	}
	l.vipd[name] = p
}

// probeOnce connects from the pod to the server and returns the source
// address the server saw.
func probeOnce(ns, server string, timeout time.Duration) (string, error) {
	var src string
	err := lab.RunInNS(ns, func() error {
		var err error
		src, err = dialServer(server, timeout)
		return err
	})
	return src, err
}

func dialServer(server string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(server, port), timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// waitSource waits until a connection from the pod reaches the server
// with the source want.
func (l *egressLab) waitSource(ns, server, want string, within time.Duration) {
	l.t.Helper()
	deadline := time.Now().Add(within)
	var got string
	var err error
	for time.Now().Before(deadline) {
		got, err = probeOnce(ns, server, 300*time.Millisecond)
		if err == nil && got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	l.t.Fatalf("from %s to %s: the server saw %q (err %v), want %s", ns, server, got, err, want)
}

func (l *egressLab) holder(a netip.Addr, except ...string) string {
	l.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var h []string
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, err = l.Holders(ctx, a)
		cancel()
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		h = slices.DeleteFunc(h, func(n string) bool { return slices.Contains(except, n) })
		if len(h) == 1 {
			return h[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.t.Fatalf("no single holder of %s (%v, %v)", a, h, err)
	return ""
}

func nodeIndex(name string) int { return int(name[1] - '0') }

// director returns a node that is the gateway of neither egress IP.
func (l *egressLab) director() *lab.Host {
	l.t.Helper()
	g4, g6 := l.holder(l.e4), l.holder(l.e6)
	for i := len(l.Nodes) - 1; i >= 0; i-- {
		if n := l.Nodes[i]; n.Name != g4 && n.Name != g6 {
			return n
		}
	}
	l.t.Fatalf("no director: gateways %s and %s", g4, g6)
	return nil
}

// prober connects from a pod to the server every 20 ms (or every) and records what
// the server saw.
type prober struct {
	mu   sync.Mutex
	res  []probeResult
	stop chan struct{}
	done chan struct{}
}

type probeResult struct {
	start, at time.Time // the connection was started, answered (or failed)
	src       string
}

func startProber(ns, server string) *prober { return startProberEvery(ns, server, 20*time.Millisecond) }

// startProberEvery is startProber with another pause between connections.
func startProberEvery(ns, server string, every time.Duration) *prober {
	p := &prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = lab.RunInNS(ns, func() error {
			for {
				select {
				case <-p.stop:
					return nil
				default:
				}
				start := time.Now()
				src, err := dialServer(server, 200*time.Millisecond)
				if err != nil {
					src = ""
				}
				p.mu.Lock()
				p.res = append(p.res, probeResult{start, time.Now(), src})
				p.mu.Unlock()
				time.Sleep(every)
			}
		})
	}()
	return p
}

func (p *prober) Stop() []probeResult {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

// recovered returns how long after t0 the first answer with src came to a
// connection started after cut (when the old gateway was cut off).
func recovered(res []probeResult, t0, cut time.Time, src string) (time.Duration, bool) {
	for _, r := range res {
		if r.start.After(cut) && r.src == src {
			return r.at.Sub(t0), true
		}
	}
	return 0, false
}

// kernelClean checks that nothing of vipd's egress is left in the node.
func (l *egressLab) kernelClean(n *lab.Host) error {
	if o := out(l.t, n.NS, "nft list tables"); strings.Contains(o, "vipd-egress") {
		return fmt.Errorf("%s: nftables table left: %s", n.Name, o)
	}
	for _, c := range []string{"ip -4 rule", "ip -6 rule"} {
		if o := out(l.t, n.NS, c); strings.Contains(o, "fwmark") || strings.Contains(o, "7950") {
			return fmt.Errorf("%s: ip rule left: %s", n.Name, o)
		}
	}
	for _, c := range []string{"ip -4 route show table all", "ip -6 route show table all"} {
		if o := out(l.t, n.NS, c); strings.Contains(o, "table 795") || strings.Contains(o, "table 796") {
			return fmt.Errorf("%s: route left: %s", n.Name, o)
		}
	}
	for _, a := range []netip.Addr{l.e4, l.e6} {
		if o := out(l.t, n.NS, "ip addr show dev eth0"); strings.Contains(o, " "+a.String()+"/") {
			return fmt.Errorf("%s: egress IP %s left bound", n.Name, a)
		}
	}
	return nil
}

func waitFor(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// role returns the roles the node's nftables table shows ("gateway" or
// "director" per egress IP, from the rules' comments).
func (l *egressLab) roles(n *lab.Host) string {
	o, err := n.Output(context.Background(), "nft", "list", "table", "inet", "vipd-egress")
	if err != nil {
		return "no table"
	}
	var r []string
	for _, ip := range []netip.Addr{l.e4, l.e6} {
		switch {
		case strings.Contains(string(o), "vipd gateway "+ip.String()+" snat"):
			r = append(r, "gateway")
		case strings.Contains(string(o), "vipd director "+ip.String()+" mark"):
			r = append(r, "director")
		default:
			r = append(r, "none")
		}
	}
	return strings.Join(r, ",")
}

func TestEgress(t *testing.T) {
	l := newEgressLab(t)
	// n1 first: it takes both egress IPs alone, and the others join it
	// (the incumbent keeps them), so one node is the gateway of both.
	l.start("n1", true)
	if gw, gw6 := l.holder(l.e4), l.holder(l.e6); gw != "n1" || gw6 != "n1" {
		t.Fatalf("egress IPs held by %s and %s, want n1", gw, gw6)
	}
	l.start("n2", true)
	l.start("n3", true)
	gw := l.holder(l.e4)
	t.Logf("gateway: %s", gw)

	t.Run("sources", func(t *testing.T) {
		// Selected pods on every node (gateway and directors) leave with the
		// egress IP; the others with their node's address (the CNI's
		// masquerade, which vipd bypasses for the selected ones only).
		for i, n := range l.Nodes {
			l.waitSource(l.podNS(i+1, 1), server4, l.e4.String(), 10*time.Second)
			l.waitSource(l.podNS(i+1, 2), server4, n.IPv4.String(), 5*time.Second)
			l.waitSource(l.podNS(i+1, 1), server6, l.e6.String(), 10*time.Second)
			l.waitSource(l.podNS(i+1, 2), server6, n.IPv6.String(), 5*time.Second)
		}
		for _, n := range l.Nodes {
			want := "director,director"
			if n.Name == gw {
				want = "gateway,gateway"
			}
			if r := l.roles(n); r != want {
				t.Errorf("%s: roles %s, want %s", n.Name, r, want)
			}
			// The CNI's masquerade rule is still there, untouched.
			if o := out(t, n.NS, "iptables -t nat -S POSTROUTING"); !strings.Contains(o, "MASQUERADE") {
				t.Errorf("%s: the CNI's masquerade rule is gone: %s", n.Name, o)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("pod-to-pod", func(t *testing.T) {
		// A selected pod reaching another node's pod keeps its own address.
		ln, err := listenIn(l.podNS(3, 2), "[::]:"+port)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		src, err := probeOnce(l.podNS(1, 1), pod4(3, 2), time.Second)
		if err != nil || src != pod4(1, 1) {
			t.Fatalf("pod to pod: the other pod saw %q (%v), want %s", src, err, pod4(1, 1))
		}
	})

	t.Run("failover", func(t *testing.T) {
		var gaps4, gaps6 []time.Duration
		for run := 1; run <= 5; run++ {
			gw := l.holder(l.e4)
			// n3 has the lowest priority: it stays a director, and its pod's
			// traffic is re-routed from the dead gateway to the new one.
			// The lowest-priority other node stays a director: its pod's
			// traffic is re-routed from the dead gateway to the new one.
			dir := l.Node("n3")
			if gw == dir.Name {
				dir = l.Node("n2")
			}
			di := nodeIndex(dir.Name)
			l.waitSource(l.podNS(di, 1), server4, l.e4.String(), 10*time.Second)
			l.waitSource(l.podNS(di, 1), server6, l.e6.String(), 10*time.Second)
			p4 := startProber(l.podNS(di, 1), server4)
			p6 := startProber(l.podNS(di, 1), server6)
			time.Sleep(200 * time.Millisecond)

			// The gateway dies: vipd killed and the node cut off at once.
			old := l.Node(gw)
			t0 := time.Now()
			l.vipd[gw].Kill()
			if err := old.SetLink(context.Background(), false, false); err != nil {
				t.Fatal(err)
			}
			cut := time.Now()
			waitFor(t, 6*time.Second, "egress recovered", func() error {
				p4.mu.Lock()
				_, ok4 := recovered(p4.res, t0, cut, l.e4.String())
				p4.mu.Unlock()
				p6.mu.Lock()
				_, ok6 := recovered(p6.res, t0, cut, l.e6.String())
				p6.mu.Unlock()
				if !ok4 || !ok6 {
					return fmt.Errorf("no answer with the egress IPs yet (v4 %v, v6 %v)", ok4, ok6)
				}
				return nil
			})
			r4, r6 := p4.Stop(), p6.Stop()
			g4, _ := recovered(r4, t0, cut, l.e4.String())
			g6, _ := recovered(r6, t0, cut, l.e6.String())
			gaps4, gaps6 = append(gaps4, g4), append(gaps6, g6)
			// The old node, cut off, still has the address bound (its vipd
			// was killed): the new gateway is the one other holder.
			newGW := l.holder(l.e4, gw)
			if newGW == dir.Name {
				// Only when the other node was not eligible at that moment
				// (a loaded machine): the pod was then on the gateway.
				t.Logf("run %d: the prober's node %s became the gateway", run, dir.Name)
			}
			t.Logf("run %d: gateway %s died; %s took over; director %s's pod saw the egress IP again after %v (IPv4), %v (IPv6)",
				run, gw, newGW, dir.Name, g4.Round(time.Millisecond), g6.Round(time.Millisecond))
			// Never the director's own address meanwhile: no leak past the
			// masquerade bypass while the gateway was unknown or dead.
			for _, r := range append(r4, r6...) {
				if r.src != "" && r.src != l.e4.String() && r.src != l.e6.String() {
					t.Fatalf("run %d: the server saw %s from a selected pod", run, r.src)
				}
			}

			// The old node comes back as systemd would restart vipd: its
			// crash left the egress IP and a gateway table behind; the
			// restarted vipd drops them and becomes a director.
			if r := l.roles(old); !strings.HasPrefix(r, "gateway,") {
				t.Fatalf("run %d: the killed gateway's table should still be there (crash), got %s", run, r)
			}
			l.start(gw, true)
			time.Sleep(300 * time.Millisecond)
			if err := old.SetLink(context.Background(), true, false); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, gw+" back as a director", func() error {
				if r := l.roles(old); r != "director,director" {
					return fmt.Errorf("roles %s", r)
				}
				if ok, _ := old.HasAddr(context.Background(), l.e4); ok {
					return fmt.Errorf("stale egress IP still bound")
				}
				return nil
			})
			oi := nodeIndex(gw)
			l.waitSource(l.podNS(oi, 1), server4, l.e4.String(), 10*time.Second)
			l.waitSource(l.podNS(oi, 1), server6, l.e6.String(), 10*time.Second)
		}
		med4, max4 := stats(gaps4)
		med6, max6 := stats(gaps6)
		t.Logf("egress failover (gateway killed and cut off, 5 runs): IPv4 median %v max %v; IPv6 median %v max %v",
			med4, max4, med6, max6)
		fmt.Printf("EGRESS FAILOVER: IPv4 median %v max %v; IPv6 median %v max %v (runs %v / %v)\n", med4, max4, med6, max6, gaps4, gaps6)
		// Target: detection (memberlist, ~0.8 s) + 1 s; generous under load.
		if max4 > 4*time.Second || max6 > 4*time.Second {
			t.Errorf("failover too slow: IPv4 max %v, IPv6 max %v", max4, max6)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("planned-stop", func(t *testing.T) {
		// systemctl stop on the gateway: it releases the egress IP and
		// removes its rules at once; the next gateway takes over within
		// a gossip round. The outage is the longest gap between answers.
		gw := l.holder(l.e4)
		dir := l.Node("n3")
		if gw == dir.Name {
			dir = l.Node("n2")
		}
		di := nodeIndex(dir.Name)
		l.waitSource(l.podNS(di, 1), server4, l.e4.String(), 10*time.Second)
		p4 := startProber(l.podNS(di, 1), server4)
		time.Sleep(300 * time.Millisecond)
		t0 := time.Now()
		if err := l.vipd[gw].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := l.vipd[gw].Wait(5 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s: exit %d, %v", gw, code, err)
		}
		stopped := time.Since(t0)
		if err := l.kernelClean(l.Node(gw)); err != nil {
			t.Errorf("after SIGTERM: %v", err)
		}
		waitFor(t, 5*time.Second, "egress back", func() error {
			p4.mu.Lock()
			defer p4.mu.Unlock()
			if _, ok := recovered(p4.res, t0, t0.Add(stopped), l.e4.String()); !ok {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		time.Sleep(200 * time.Millisecond)
		res := p4.Stop()
		var gap time.Duration
		last := t0
		for _, r := range res {
			if r.src == "" {
				continue
			}
			if r.src != l.e4.String() {
				t.Fatalf("the server saw %s from the selected pod", r.src)
			}
			if r.at.After(t0) && r.at.Sub(last) > gap {
				gap = r.at.Sub(last)
			}
			if r.at.After(last) {
				last = r.at
			}
		}
		newGW := l.holder(l.e4, gw)
		t.Logf("planned stop of gateway %s: %s took over; vipd exited after %v; longest gap between answers at director %s's pod: %v",
			gw, newGW, stopped.Round(time.Millisecond), dir.Name, gap.Round(time.Millisecond))
		fmt.Printf("EGRESS PLANNED STOP: longest gap %v\n", gap.Round(time.Millisecond))
		if gap > 2*time.Second {
			t.Errorf("planned stop outage %v", gap)
		}
		l.start(gw, true)
		waitFor(t, 10*time.Second, gw+" back as a director", func() error {
			if r := l.roles(l.Node(gw)); r != "director,director" {
				return fmt.Errorf("roles %s", r)
			}
			return nil
		})
	})

	t.Run("planned-stops", func(t *testing.T) {
		// Gateway after gateway stopped with SIGTERM (a rolling restart):
		// the selected pods on the two other nodes (IPv4 and IPv6) connect
		// to the server all along, and the server must never see anything
		// but the egress IPs. A stopping gateway hands the egress IPs over
		// and becomes a director before it stops; the directors' packets
		// still on their way to it must be dropped or passed on, never
		// masqueraded with its address (CI failure: the server saw the old
		// gateway's node address).
		const runs = 6
		for run := 1; run <= runs; run++ {
			gw := l.holder(l.e4)
			if g6 := l.holder(l.e6); g6 != gw {
				t.Fatalf("run %d: gateways %s and %s: want one node", run, gw, g6)
			}
			var probers []*prober
			var names []string
			for _, n := range l.Nodes {
				if n.Name == gw {
					continue
				}
				ni := nodeIndex(n.Name)
				l.waitSource(l.podNS(ni, 1), server4, l.e4.String(), 10*time.Second)
				l.waitSource(l.podNS(ni, 1), server6, l.e6.String(), 10*time.Second)
				// Often: the window in which a stopping gateway leaked was
				// a few tens of milliseconds.
				probers = append(probers, startProberEvery(l.podNS(ni, 1), server4, 5*time.Millisecond),
					startProberEvery(l.podNS(ni, 1), server6, 5*time.Millisecond))
				names = append(names, n.Name+" IPv4", n.Name+" IPv6")
			}
			time.Sleep(200 * time.Millisecond)
			t0 := time.Now()
			if err := l.vipd[gw].Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code, err := l.vipd[gw].Wait(5 * time.Second); err != nil || code != 0 {
				t.Fatalf("run %d: %s: exit %d, %v", run, gw, code, err)
			}
			stopped := time.Now()
			if err := l.kernelClean(l.Node(gw)); err != nil {
				t.Errorf("run %d: after SIGTERM: %v", run, err)
			}
			// Every prober sees its egress IP again after the stop.
			waitFor(t, 5*time.Second, "egress back at every director", func() error {
				for i, p := range probers {
					want := l.e4.String()
					if i%2 == 1 {
						want = l.e6.String()
					}
					p.mu.Lock()
					_, ok := recovered(p.res, t0, stopped, want)
					p.mu.Unlock()
					if !ok {
						return fmt.Errorf("%s: not yet", names[i])
					}
				}
				return nil
			})
			time.Sleep(100 * time.Millisecond)
			total := 0
			for i, p := range probers {
				res := p.Stop()
				total += len(res)
				for _, r := range res {
					if r.src != "" && r.src != l.e4.String() && r.src != l.e6.String() {
						t.Errorf("run %d: stop of gateway %s: the server saw %s from %s's selected pod (connection at %v after the SIGTERM)",
							run, gw, r.src, names[i], r.start.Sub(t0).Round(time.Millisecond))
					}
				}
			}
			var drain []string
			for _, line := range strings.Split(l.vipd[gw].Output(), "\n") {
				if strings.Contains(line, "egress: stop") || strings.Contains(line, "egress: kernel state removed") {
					drain = append(drain, strings.TrimSpace(line))
				}
			}
			t.Logf("run %d: gateway %s stopped in %v, %d connections seen; its stop:\n%s", run, gw,
				stopped.Sub(t0).Round(time.Millisecond), total, strings.Join(drain, "\n"))
			if t.Failed() {
				return
			}
			l.start(gw, true)
			waitFor(t, 10*time.Second, gw+" back as a director", func() error {
				if r := l.roles(l.Node(gw)); r != "director,director" {
					return fmt.Errorf("roles %s", r)
				}
				return nil
			})
		}
	})

	t.Run("gateway-vipd-crash", func(t *testing.T) {
		// Only vipd dies on the gateway (SIGKILL), the node stays up and
		// systemd restarts vipd a second later: the kernel keeps the egress
		// IP and the SNAT until the restarted vipd removes them; the next
		// gateway binds once nobody answers for the address any more.
		gw := l.holder(l.e4)
		dir := l.director()
		di := nodeIndex(dir.Name)
		l.waitSource(l.podNS(di, 1), server4, l.e4.String(), 10*time.Second)
		p4 := startProber(l.podNS(di, 1), server4)
		time.Sleep(300 * time.Millisecond)
		t0 := time.Now()
		l.vipd[gw].Kill()
		time.Sleep(time.Second)
		l.start(gw, true)
		waitFor(t, 10*time.Second, "egress through a gateway again", func() error {
			g, err := l.Holders(context.Background(), l.e4)
			if err != nil || len(g) != 1 {
				return fmt.Errorf("holders %v %v", g, err)
			}
			if src, err := probeOnce(l.podNS(di, 1), server4, 300*time.Millisecond); err != nil || src != l.e4.String() {
				return fmt.Errorf("server saw %q %v", src, err)
			}
			return nil
		})
		res := p4.Stop()
		var gap time.Duration
		last := t0
		for _, r := range res {
			if r.src == "" {
				continue
			}
			if r.src != l.e4.String() {
				t.Fatalf("the server saw %s from the selected pod", r.src)
			}
			if r.at.After(t0) && r.at.Sub(last) > gap {
				gap = r.at.Sub(last)
			}
			if r.at.After(last) {
				last = r.at
			}
		}
		t.Logf("gateway %s's vipd killed, restarted 1 s later: gateway now %s; longest gap at %s's pod: %v",
			gw, l.holder(l.e4), dir.Name, gap.Round(time.Millisecond))
		fmt.Printf("EGRESS GATEWAY VIPD CRASH (restart after 1 s): longest gap %v\n", gap.Round(time.Millisecond))
		if gap > 8*time.Second {
			t.Errorf("outage %v", gap)
		}
		waitFor(t, 10*time.Second, "two directors and one gateway", func() error {
			n := 0
			for _, h := range l.Nodes {
				if strings.HasPrefix(l.roles(h), "gateway") {
					n++
				}
			}
			if n != 1 {
				return fmt.Errorf("%d gateways of the IPv4 egress IP", n)
			}
			return nil
		})
	})

	t.Run("crash-restart-without-egress", func(t *testing.T) {
		// A director's vipd crashes; its rules stay (nobody removes them)
		// until vipd starts again, now without VIPD_EGRESS: it removes
		// every stale rule, route and the table at start.
		dir := l.director()
		l.vipd[dir.Name].Kill()
		if r := l.roles(dir); r != "director,director" {
			t.Fatalf("after the crash: %s", r)
		}
		l.start(dir.Name, false)
		waitFor(t, 5*time.Second, "stale egress state removed at start", func() error { return l.kernelClean(dir) })
		if !strings.Contains(l.vipd[dir.Name].Output(), "removed the egress state an earlier run left behind") {
			t.Errorf("no log line about the stale state")
		}
		// And back with egress for the last part.
		l.vipd[dir.Name].Kill()
		l.start(dir.Name, true)
		waitFor(t, 10*time.Second, "director again", func() error {
			if r := l.roles(dir); r != "director,director" {
				return fmt.Errorf("roles %s", r)
			}
			return nil
		})
	})

	t.Run("repair", func(t *testing.T) {
		// Someone deletes a director's rule, route and table: vipd puts them
		// back within a tick and counts the repair.
		gw := l.holder(l.e4)
		dir := l.director()
		sh(t, dir.NS, "nft delete table inet vipd-egress", "ip rule del priority 7950 table 7950")
		waitFor(t, 3*time.Second, "repaired", func() error {
			if r := l.roles(dir); r != "director,director" {
				return fmt.Errorf("roles %s", r)
			}
			if o := out(t, dir.NS, "ip -4 rule"); !strings.Contains(o, "lookup 7950") {
				return fmt.Errorf("rule not back: %s", o)
			}
			return nil
		})
		l.waitSource(l.podNS(nodeIndex(dir.Name), 1), server4, l.e4.String(), 5*time.Second)
		m, err := dir.Output(context.Background(), "curl", "-s", "http://127.0.0.1:9469/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(m), `vipd_egress_repairs_total{what="table"}`) {
			t.Errorf("no repair counted:\n%s", grep(string(m), "vipd_egress"))
		}
		st, err := dir.Output(context.Background(), l.bin, "status")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(st), `"role": "director"`) || !strings.Contains(string(st), `"gateway_node": "`+gw+`"`) {
			t.Errorf("vipd status lacks the egress section:\n%s", st)
		}
	})

	t.Run("stop-leaves-nothing", func(t *testing.T) {
		for name, p := range l.vipd {
			if p.Exited() {
				continue
			}
			if err := p.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code, err := p.Wait(5 * time.Second); err != nil || code != 0 {
				t.Fatalf("%s: exit %d, %v", name, code, err)
			}
		}
		for _, n := range l.Nodes {
			if err := l.kernelClean(n); err != nil {
				t.Error(err)
			}
			// The CNI's own rules are left alone.
			if o := out(t, n.NS, "iptables -t nat -S POSTROUTING"); !strings.Contains(o, "MASQUERADE") {
				t.Errorf("%s: the CNI's masquerade rule was removed", n.Name)
			}
		}
	})
}

func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := lab.RunInNS(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			_, _ = fmt.Fprintf(c, "%s\n", ap.Addr().Unmap())
			_ = c.Close()
		}
	}()
	return ln, nil
}

func stats(d []time.Duration) (median, maximum time.Duration) {
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0, 0
	}
	return s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond)
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
