// Package bgp_test runs vipd in bgp mode against a real FRR router (zebra,
// bgpd, bfdd) in network namespaces: three node namespaces each running
// `vipd run` with a fake apiserver, and a router namespace "r" on the same
// bridge, so every session is single-hop.
package bgp_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

const (
	routerAS = 65000
	nodeAS   = 65001
)

var (
	vip4 = netip.MustParsePrefix("198.51.100.10/32")
	vip6 = netip.MustParsePrefix("2001:db8:ffff::10/128")
)

// routerVIPs are the prefixes the lab routers accept from the nodes (their
// import prefix lists), as docs/bgp.md recommends.
var routerVIPs = []netip.Prefix{vip4, ab4, vip6, ab6}

// vipdPath is the vipd binary built once by TestMain.
var vipdPath string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			return m.Run() // every test skips (or fails in CI) on its own
		}
		dir, err := os.MkdirTemp("", "vipd-bgp-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		vipdPath, err = lab.VipdBinary(ctx, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "build vipd:", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func requirePrereqs(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "vtysh", "nft")
	if _, err := os.Stat(lab.FRRDir + "/bfdd"); err != nil {
		testenv.Missing(t, "FRR daemons in %s (Debian package frr)", lab.FRRDir)
	}
}

// env is a lab with a router and three nodes running vipd.
type env struct {
	t      testing.TB
	l      *lab.Lab
	r      *lab.Host
	frr    *lab.FRR
	nodes  []*node
	router lab.BGPRouter
	// b and bird are the BIRD router (setup.bird), peered like FRR.
	b    *lab.Host
	bird *lab.BIRD
}

type node struct {
	h    *lab.Host
	api  *lab.APIServer
	vipd *lab.Proc
	env  []string
}

type setup struct {
	nodes    int
	bfd      *lab.BFDProfile // router side; nil: BFD off at the router
	password string          // router side MD5
	// bird adds a BIRD 2 router "b" on the same bridge, with the same
	// policy as FRR (dynamic eBGP neighbours, ECMP, password, BFD).
	bird bool
	// acceptAll: the routers accept any prefix (no VIP prefix lists).
	acceptAll bool
	// quiet: no router debug logs (thousands of routes).
	quiet bool
	// multihop > 0: the FRR neighbours are eBGP multihop (BFD multihop).
	multihop int
	// ibgp: the nodes are in the router's AS (FRR only).
	ibgp bool
	// vipdEnv is added to every node's environment (after the defaults).
	vipdEnv []string
}

func newEnv(t testing.TB, s setup) *env {
	t.Helper()
	requirePrereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	extra := []string{"r"}
	if s.bird {
		testenv.RequireCommands(t, lab.BIRDPath, "birdc")
		extra = append(extra, "b")
	}
	l := lab.New(t, lab.Options{Nodes: s.nodes, Extra: extra})
	e := &env{t: t, l: l, r: l.Extra["r"], b: l.Extra["b"]}
	e.router = lab.BGPRouter{AS: routerAS, RouterID: e.r.IPv4, Ranges: []netip.Prefix{l.Prefix4, l.Prefix6},
		Password: s.password, BFD: s.bfd, Debug: true, VIPs: routerVIPs}
	if s.acceptAll {
		e.router.VIPs = nil
	}
	e.router.Debug = !s.quiet
	e.router.Multihop = s.multihop
	e.router.IBGP = s.ibgp
	conf, err := e.router.Render()
	if err != nil {
		t.Fatal(err)
	}
	// Fake apiservers first: their listeners are opened through
	// lab.Host.Run, whose OS thread exits afterwards (before lab 6c7081f
	// that could SIGKILL, through Pdeathsig, processes forked from it).
	for _, h := range l.Nodes {
		api, err := h.StartAPIServer("0.0.0.0:6443", lab.OK)
		if err != nil {
			t.Fatal(err)
		}
		n := &node{h: h, api: api}
		n.env = append(e.baseEnv(h), s.vipdEnv...)
		e.nodes = append(e.nodes, n)
	}
	if err := e.r.Sysctl(ctx, "net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if e.frr, err = e.r.StartFRR(ctx, conf); err != nil {
		t.Fatal(err)
	}
	if s.bird {
		br := lab.BIRDRouter{AS: routerAS, RouterID: e.b.IPv4, Ranges: []netip.Prefix{l.Prefix4, l.Prefix6},
			Password: s.password, BFD: s.bfd, Debug: !s.quiet, VIPs: e.router.VIPs}
		bconf, err := br.Render()
		if err != nil {
			t.Fatal(err)
		}
		if e.bird, err = e.b.StartBIRD(ctx, bconf); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs(t)
		}
	})
	return e
}

// baseEnv is the vipd environment for node h: both VIPs, peering with the
// router over IPv4 and IPv6.
func (e *env) baseEnv(h *lab.Host) []string {
	state, err := os.MkdirTemp("", "vipd-state-")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { os.RemoveAll(state) })
	return []string{
		"VIPD_MODE=bgp",
		"VIPD_ADDRESS=" + vip4.String() + "," + vip6.String(),
		"VIPD_NODE_NAME=" + h.Name,
		"VIPD_HEALTH_URL=https://127.0.0.1:6443/livez",
		"VIPD_HEALTH_INTERVAL=200ms",
		"VIPD_HEALTH_TIMEOUT=500ms",
		"VIPD_FAIL_THRESHOLD=2",
		"VIPD_SA_TOKEN_PATH=" + state + "/no-token",
		"VIPD_STATE_DIR=" + state,
		"VIPD_METRICS_ADDRESS=127.0.0.1:9469",
		"VIPD_LOG_LEVEL=info",
		fmt.Sprintf("VIPD_BGP_LOCAL_AS=%d", nodeAS),
		"VIPD_BGP_ROUTER_ID=" + h.IPv4.String(),
		fmt.Sprintf("VIPD_BGP_PEERS=%s:%d,[%s]:%d", e.r.IPv4, routerAS, e.r.IPv6, routerAS),
	}
}

func (e *env) startVipd(n *node, extra ...string) {
	e.t.Helper()
	p, err := n.h.Start("vipd-"+n.h.Name, append(append([]string(nil), n.env...), extra...), vipdPath, "run")
	if err != nil {
		e.t.Fatal(err)
	}
	n.vipd = p
}

func (e *env) startAll() {
	e.t.Helper()
	for _, n := range e.nodes {
		e.startVipd(n)
	}
}

func (e *env) dumpLogs(t testing.TB) {
	for _, n := range e.nodes {
		if n.vipd != nil {
			t.Logf("=== vipd %s (exited: %v)\n%s", n.h.Name, n.vipd.Exited(), tail(n.vipd.Output(), 80))
		}
	}
	t.Logf("=== frr\n%s", tail(e.frr.Logs(), 120))
	if e.bird != nil {
		t.Logf("=== bird\n%s", tail(e.bird.Logs(), 60))
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (e *env) nodeAddrs(v6 bool, ns ...*node) []netip.Addr {
	var out []netip.Addr
	for _, n := range ns {
		if v6 {
			out = append(out, n.h.IPv6)
		} else {
			out = append(out, n.h.IPv4)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// waitKernel waits until the router's kernel route to vip has exactly the
// next hops of the given nodes (none: no route).
func (e *env) waitKernel(vip netip.Prefix, timeout time.Duration, ns ...*node) {
	e.t.Helper()
	e.waitKernelAt(e.r, vip, timeout, ns...)
}

// waitKernelAt is waitKernel at router host r (FRR's or BIRD's).
func (e *env) waitKernelAt(r *lab.Host, vip netip.Prefix, timeout time.Duration, ns ...*node) {
	e.t.Helper()
	want := e.nodeAddrs(vip.Addr().Is6(), ns...)
	var got []netip.Addr
	ok := poll(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		got, err = r.KernelNextHops(ctx, vip)
		return err == nil && slices.Equal(got, want)
	})
	if !ok {
		e.t.Fatalf("router %s kernel route to %s: next hops %v, want %v (after %v)", r.Name, vip, got, want, timeout)
	}
}

// waitBGP waits until bgpd's table has exactly these next hops for vip.
func (e *env) waitBGP(vip netip.Prefix, timeout time.Duration, ns ...*node) {
	e.t.Helper()
	want := e.nodeAddrs(vip.Addr().Is6(), ns...)
	var got []netip.Addr
	var err error
	ok := poll(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err = e.frr.BGPNextHops(ctx, vip)
		return err == nil && slices.Equal(got, want)
	})
	if !ok {
		e.t.Fatalf("router BGP table for %s: next hops %v (%v), want %v (after %v)", vip, got, err, want, timeout)
	}
}

func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// silence drops every packet in and out of the node's namespace except on
// lo (the link stays up, so only BFD or the BGP hold timer can notice; the
// node's own health check keeps passing, as on a node cut off upstream).
func silence(ctx context.Context, h *lab.Host, on bool) error {
	if !on {
		_, err := h.Output(ctx, "nft", "delete", "table", "inet", "vipdsilence")
		return err
	}
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`table inet vipdsilence {
  chain in  { type filter hook input  priority -300; policy drop; iifname "lo" accept; }
  chain out { type filter hook output priority -300; policy drop; oifname "lo" accept; }
}
`)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft in %s: %w: %s", h.NS, err, out)
	}
	return nil
}

// metrics fetches the node's /metrics from inside its namespace.
func metrics(ctx context.Context, h *lab.Host) (string, error) {
	out, err := h.Output(ctx, "curl", "-s", "--max-time", "3", "http://127.0.0.1:9469/metrics")
	return string(out), err
}

// statusJSON fetches the node's /status.
func statusJSON(ctx context.Context, h *lab.Host) (string, error) {
	out, err := h.Output(ctx, "curl", "-s", "--max-time", "3", "http://127.0.0.1:9469/status")
	return string(out), err
}

// runVipd runs a vipd subcommand to completion with env (not in a lab).
func runVipd(ctx context.Context, env []string, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, vipdPath, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil {
		return string(out), -1, err
	}
	return string(out), cmd.ProcessState.ExitCode(), nil
}

func testenvShort(t testing.TB) {
	t.Helper()
	testenv.Short(t)
}

// probeVIP asks whoever answers on vip:6443 for its name, from inside h's
// namespace, with curl (a fresh process and connection each time).
func probeVIP(ctx context.Context, h *lab.Host, vip netip.Prefix) (string, error) {
	host := vip.Addr().String()
	if vip.Addr().Is6() {
		host = "[" + host + "]"
	}
	out, err := h.Output(ctx, "curl", "-sk", "--max-time", "2", "https://"+host+":6443/probe")
	return strings.TrimSpace(string(out)), err
}
