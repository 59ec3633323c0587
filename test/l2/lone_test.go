// Package l2 holds vipd's l2-mode integration tests: real vipd processes in
// network namespaces, with frames captured from a client namespace.
package l2

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

func prerequisites(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "tcpdump")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// loneLab is one node with a fake apiserver and a client capturing frames.
type loneLab struct {
	*lab.Lab
	node *lab.Host
	api  *lab.APIServer
	cap  *lab.Capture
	bin  string
}

func newLoneLab(t *testing.T) *loneLab {
	t.Helper()
	bin := prerequisites(t)
	l := lab.New(t, lab.Options{Nodes: 1, Client: true})
	api, err := l.Nodes[0].StartAPIServer("0.0.0.0:6443", lab.OK)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Client.StartCapture(ctx, "arp or icmp6")
	if err != nil {
		t.Fatal(err)
	}
	return &loneLab{Lab: l, node: l.Nodes[0], api: api, cap: c, bin: bin}
}

func (l *loneLab) start(t *testing.T, env ...string) *lab.Proc {
	t.Helper()
	p, err := l.node.StartVipd(l.bin, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vipd output:\n%s\nframes:\n%s", p.Output(), l.cap.All())
		}
	})
	return p
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestGratuitousARPBurst(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(1)
	l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	ctx := ctxT(t, 20*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	mac := l.node.MAC.String()
	// Five rounds of Request and Reply, spaced about 1.1 s apart.
	if _, err := l.cap.WaitFrames(ctx, 5, "Request who-has "+v.String(), "tell "+v.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.cap.WaitFrames(ctx, 5, "Reply "+v.String()+" is-at "+mac); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // nothing more until the 30 s refresh
	reqs := l.cap.Frames("Request who-has "+v.String(), "tell "+v.String())
	reps := l.cap.Frames("Reply " + v.String() + " is-at " + mac)
	if len(reqs) != 5 || len(reps) != 5 {
		t.Fatalf("want 5 GARP requests and 5 replies in the burst, got %d and %d", len(reqs), len(reps))
	}
	for i, f := range reqs {
		if f.Src != mac {
			t.Errorf("GARP %d sent from %s, want %s", i, f.Src, mac)
		}
		if i == 0 {
			continue
		}
		gap := f.At.Sub(reqs[i-1].At)
		// At least the kernel's 1 s locktime; the upper bound only catches a
		// broken schedule (a loaded CI machine delays timers a little).
		if gap < 1000*time.Millisecond || gap > 2500*time.Millisecond {
			t.Errorf("gap between GARP %d and %d is %v, want about 1.1 s (over the kernel's 1 s locktime)", i-1, i, gap)
		}
	}
	// The client's neighbour table learned the VIP at the node's MAC from
	// the gratuitous ARP alone (it never asked).
	got, err := l.Client.Neigh(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if got != "" && got != mac {
		t.Fatalf("client neighbour entry for %s is %s, want %s", v, got, mac)
	}
	if _, err := l.Client.Probe(ctx, v.String()+":6443", time.Second); err != nil {
		t.Fatalf("client cannot reach the apiserver through the VIP: %v", err)
	}
	if got, _ := l.Client.Neigh(ctx, v); got != mac {
		t.Fatalf("client neighbour entry for %s is %q, want %s", v, got, mac)
	}
	// The address is bound the way DESIGN.md says: /32, labelled, never a
	// source address (preferred_lft 0 shows as deprecated).
	addrs, err := l.node.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	flags := strings.Join(addrs[v], " ")
	for _, want := range []string{"/32", "label=eth0:vipd", "deprecated"} {
		if !strings.Contains(flags, want) {
			t.Errorf("VIP flags %q lack %q", flags, want)
		}
	}
}

func TestUnsolicitedNeighborAdvertisement(t *testing.T) {
	l := newLoneLab(t)
	v6 := l.VIP6(1)
	v4 := l.VIP4(2)
	l.start(t, "VIPD_ADDRESS="+v4.String()+"/32,"+v6.String()+"/128")
	ctx := ctxT(t, 20*time.Second)
	if err := l.node.WaitAddr(ctx, v6, true); err != nil {
		t.Fatal(err)
	}
	nas, err := l.cap.WaitFrames(ctx, 3, "neighbor advertisement", "tgt is "+v6.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range nas {
		if !strings.Contains(f.Line, "> ff02::1:") || !strings.Contains(f.Line, "override") || strings.Contains(f.Line, "solicited") {
			t.Fatalf("NA is not an unsolicited override to all nodes: %s", f.Line)
		}
		if !strings.Contains(f.Line, l.node.MAC.String()) || f.Src != l.node.MAC.String() {
			t.Fatalf("NA does not carry the node's MAC %s: %s", l.node.MAC, f.Line)
		}
	}
	// Dual stack: the IPv4 VIP is announced too.
	if _, err := l.cap.WaitFrames(ctx, 1, "Reply "+v4.String()+" is-at"); err != nil {
		t.Fatal(err)
	}
	// Never tentative or dadfailed; reachable from the client at once.
	addrs, err := l.node.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Join(addrs[v6], " "); !strings.Contains(f, "/128") || strings.Contains(f, "tentative") || strings.Contains(f, "dadfailed") {
		t.Fatalf("IPv6 VIP flags: %s", f)
	}
	if name, err := l.Client.Probe(ctx, "["+v6.String()+"]:6443", time.Second); err != nil || name != "n1" {
		t.Fatalf("client probe of the IPv6 VIP: %q %v", name, err)
	}
}

func TestFailThresholdAndRecovery(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(3)
	l.start(t, "VIPD_ADDRESS="+v.String()+"/32", "VIPD_HEALTH_INTERVAL=200ms", "VIPD_FAIL_THRESHOLD=3", "VIPD_HEALTH_TIMEOUT=150ms")
	ctx := ctxT(t, 90*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []lab.Mode{lab.Failing, lab.Hanging, lab.Down} {
		failAt := time.Now()
		if err := l.api.SetMode(mode); err != nil {
			t.Fatal(err)
		}
		// Two failures are not enough: the VIP stays for at least ~2 intervals.
		time.Sleep(300 * time.Millisecond)
		if ok, _ := l.node.HasAddr(ctx, v); !ok {
			t.Fatalf("%s: VIP released before the fail threshold (%v after the fault)", mode, time.Since(failAt))
		}
		if err := l.node.WaitAddr(ctx, v, false); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		took := time.Since(failAt)
		if took > 2*time.Second {
			t.Errorf("%s: VIP released %v after the fault, want about 3 x 200 ms", mode, took)
		}
		t.Logf("%s: released %v after the fault", mode, took.Round(time.Millisecond))
		before := len(l.cap.Frames("Reply " + v.String() + " is-at"))
		if err := l.api.SetMode(lab.OK); err != nil {
			t.Fatal(err)
		}
		if err := l.node.WaitAddr(ctx, v, true); err != nil {
			t.Fatalf("%s recovery: %v", mode, err)
		}
		if _, err := l.cap.WaitFrames(ctx, before+1, "Reply "+v.String()+" is-at"); err != nil {
			t.Fatalf("%s recovery: no new GARP: %v", mode, err)
		}
	}
}

func TestUnauthorizedCountsAsHealthyOnlyWithoutToken(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(4)
	if err := l.api.SetMode(lab.Unauthorized); err != nil {
		t.Fatal(err)
	}
	tokenDir := t.TempDir()
	token := tokenDir + "/token"
	l.start(t, "VIPD_ADDRESS="+v.String()+"/32", "VIPD_SA_TOKEN_PATH="+token, "VIPD_HEALTH_INTERVAL=100ms")
	ctx := ctxT(t, 20*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatalf("401 without a token must be healthy: %v", err)
	}
	// A token appears (kubeadm finished): 401 is now a failure.
	if err := os.WriteFile(token, []byte("test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.node.WaitAddr(ctx, v, false); err != nil {
		t.Fatalf("401 with a token must be unhealthy: %v", err)
	}
}

func TestSIGTERMReleasesWithinASecond(t *testing.T) {
	l := newLoneLab(t)
	v4, v6 := l.VIP4(5), l.VIP6(5)
	p := l.start(t, "VIPD_ADDRESS="+v4.String()+"/32,"+v6.String()+"/128")
	ctx := ctxT(t, 20*time.Second)
	for _, v := range []netip.Addr{v4, v6} {
		if err := l.node.WaitAddr(ctx, v, true); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(2 * time.Second)
	took := time.Since(start)
	if err != nil || code != 0 {
		t.Fatalf("exit code %d, %v; output:\n%s", code, err, p.Output())
	}
	if took > time.Second {
		t.Errorf("SIGTERM to exit took %v, want under 1 s", took)
	}
	addrs, err := l.node.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 0 {
		t.Fatalf("addresses left after SIGTERM: %v", addrs)
	}
	t.Logf("SIGTERM to exit with both VIPs released: %v", took.Round(time.Millisecond))
}

func TestSecondSignalExitsAtOnce(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(6)
	// The health URL hangs, so a graceful stop would wait for nothing in
	// particular; the point is that the second signal ends it.
	p := l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	ctx := ctxT(t, 20*time.Second)
	if err := p.WaitOutput(ctx, "vipd started"); err != nil {
		t.Fatal(err)
	}
	_ = p.Signal(syscall.SIGINT)
	_ = p.Signal(syscall.SIGINT)
	if _, err := p.Wait(2 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestStaleVIPRemovedAtStartWhenUnhealthy(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(7)
	ctx := ctxT(t, 20*time.Second)
	if err := l.api.SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	// As if a previous vipd crashed while holding it.
	if _, err := l.node.Output(ctx, "ip", "addr", "add", v.String()+"/32", "dev", "eth0", "label", "eth0:vipd"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	if err := l.node.WaitAddr(ctx, v, false); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stale VIP removed after %v, want at once", took)
	}
	if err := p.WaitOutput(ctx, "reconcile"); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileReaddsRemovedVIP(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(8)
	l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	ctx := ctxT(t, 20*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	if _, err := l.node.Output(ctx, "ip", "addr", "del", v.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(removed); took > 2500*time.Millisecond {
		t.Errorf("re-added after %v, want within a reconcile period (1 s)", took)
	}
}

func TestInvalidSettingBindsNothing(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(9)
	tests := []struct {
		env  []string
		want string
	}{
		{[]string{"VIPD_ADDRESS=" + v.String() + "/24"}, `invalid VIPD_ADDRESS="` + v.String() + `/24": want a host prefix`},
		{[]string{"VIPD_ADDRESS=" + v.String() + "/32", "VIPD_FAIL_THRESHOLD=zero"}, `invalid VIPD_FAIL_THRESHOLD="zero": want a whole number from 1 to 100`},
		{[]string{"VIPD_ADDRESS=" + v.String() + "/32", "VIPD_HEALTH_URL=https://10.1.1.1:6443/livez"}, "VIPD_HEALTH_CA_FILE"},
		{[]string{"VIPD_ADDRESS=" + v.String() + "/32", "VIPD_INTERFACE=nope0"}, `VIPD_INTERFACE "nope0"`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			p := l.start(t, tt.env...)
			code, err := p.Wait(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			out := strings.TrimSpace(p.Output())
			if code != 2 || !strings.Contains(out, tt.want) || strings.Count(out, "\n") != 0 {
				t.Fatalf("exit %d, output %q: want exit 2 and one line containing %q", code, out, tt.want)
			}
			if addrs, _ := l.node.Addrs(context.Background()); len(addrs) != 0 {
				t.Fatalf("bound despite the error: %v", addrs)
			}
		})
	}
	if n := len(l.cap.Frames(v.String())); n != 0 {
		t.Fatalf("%d frames about the VIP were sent", n)
	}
}

func TestStatusAndMetrics(t *testing.T) {
	l := newLoneLab(t)
	v := l.VIP4(10)
	l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	ctx := ctxT(t, 20*time.Second)
	if err := l.node.WaitAddr(ctx, v, true); err != nil {
		t.Fatal(err)
	}
	// The driver publishes its state right after the bind: poll briefly.
	var out []byte
	for {
		var err error
		out, err = l.node.Output(ctx, l.bin, "status")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "apiserver healthy") || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"node:", "n1", "mode l2", "interface eth0", "apiserver:", "healthy", v.String() + "/32", "yes", "apiserver healthy"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("vipd status lacks %q:\n%s", want, out)
		}
	}
	metrics, err := l.node.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`vipd_vip_held{mode="l2",vip="%s/32"} 1`, v),
		`vipd_health_up 1`,
		`vipd_health_checks_total{result="ok"}`,
		fmt.Sprintf(`vipd_transitions_total{to="held",vip="%s/32"} 1`, v),
		fmt.Sprintf(`vipd_announcements_total{kind="garp_reply",vip="%s/32"}`, v),
		`vipd_build_info{`, `go_goroutines`, `process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	hz, err := l.node.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/healthz")
	if err != nil || strings.TrimSpace(string(hz)) != "ok" {
		t.Fatalf("/healthz: %q %v", hz, err)
	}
}

func TestConflictGuard(t *testing.T) {
	l := newLoneLab(t)
	v4, v6 := l.VIP4(11), l.VIP6(11)
	ctx := ctxT(t, 40*time.Second)
	// The client already answers for both VIPs: a mistyped VIP, or a host
	// that kept it.
	for _, a := range []string{v4.String() + "/32", v6.String() + "/128"} {
		if _, err := l.Client.Output(ctx, "ip", "addr", "add", a, "dev", "eth0", "nodad"); err != nil {
			t.Fatal(err)
		}
	}
	p := l.start(t, "VIPD_ADDRESS="+v4.String()+"/32,"+v6.String()+"/128")
	clientMAC := l.Client.MAC.String()
	for _, v := range []netip.Addr{v4, v6} {
		if err := p.WaitOutput(ctx, "VIP conflict: another host answered the probe; not binding\" node=n1 vip="+v.String()+" mac="+clientMAC); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // several retries
	if addrs, _ := l.node.Addrs(ctx); len(addrs) != 0 {
		t.Fatalf("bound despite the conflict: %v", addrs)
	}
	metrics, err := l.node.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{v4.String() + "/32", v6.String() + "/128"} {
		if !strings.Contains(string(metrics), `vipd_conflicts_total{vip="`+v+`"}`) || strings.Contains(string(metrics), `vipd_conflicts_total{vip="`+v+`"} 1`+"\n") {
			t.Errorf("vipd_conflicts_total for %s should count several retries:\n%s", v, grepLines(string(metrics), "vipd_conflicts_total"))
		}
	}
	// The other host lets go: vipd binds within a retry period.
	for _, a := range []string{v4.String() + "/32", v6.String() + "/128"} {
		if _, err := l.Client.Output(ctx, "ip", "addr", "del", a, "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []netip.Addr{v4, v6} {
		if err := l.node.WaitAddr(ctx, v, true); err != nil {
			t.Fatal(err)
		}
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
