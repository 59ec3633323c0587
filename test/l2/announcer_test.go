package l2

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
	"github.com/vipd/vipd/vip"
)

// entries lists every address entry equal to a on the host's eth0 as
// "/len label", whatever its prefix length or label (Host.Addrs keeps one
// per address).
func entries(ctx context.Context, t *testing.T, h *lab.Host, a netip.Addr) []string {
	t.Helper()
	out, err := h.Output(ctx, "ip", "-j", "addr", "show", "dev", h.Link)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			Label     string `json:"label"`
			Prefixlen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatal(err)
	}
	var res []string
	for _, l := range links {
		for _, e := range l.AddrInfo {
			if ip, err := netip.ParseAddr(e.Local); err == nil && ip == a {
				res = append(res, strings.TrimSpace(fmt.Sprintf("/%d %s", e.Prefixlen, e.Label)))
			}
		}
	}
	sort.Strings(res)
	return res
}

// leftover is a VIP somebody else bound: an operator, kube-vip, a crashed
// vipd of an older version.
type leftover struct {
	name string
	args []string // after "ip addr add VIP"
}

func leftovers() []leftover {
	return []leftover{
		{"/32 without label", []string{"/32"}},
		{"/24 without label", []string{"/24"}},
		{"/32 with another label", []string{"/32", "label", "eth0:kv"}},
	}
}

func addLeftover(ctx context.Context, t *testing.T, h *lab.Host, v netip.Addr, lo leftover) {
	t.Helper()
	args := append([]string{"addr", "add", v.String() + lo.args[0], "dev", "eth0"}, lo.args[1:]...)
	if _, err := h.Output(ctx, "ip", args...); err != nil {
		t.Fatal(err)
	}
}

// startOwned starts vipd and kills it when the (sub)test ends, so a failed
// subtest does not leave it holding the metrics port for the next one.
func (l *loneLab) startOwned(t *testing.T, env ...string) *lab.Proc {
	t.Helper()
	p := l.start(t, env...)
	t.Cleanup(p.Kill)
	return p
}

// waitGone waits up to d for every entry of v to go, failing with what is
// left.
func waitGone(t *testing.T, h *lab.Host, v netip.Addr, d time.Duration, what string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := h.WaitAddr(wctx, v, false); err != nil {
		t.Fatalf("%s: %s still bound as %v after %v", what, v, entries(context.Background(), t, h, v), d)
	}
}

func stop(t *testing.T, p *lab.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(3 * time.Second); err != nil || code != 0 {
		t.Fatalf("vipd exit %d, %v:\n%s", code, err, p.Output())
	}
}

// TestLeftoverVIPInAnyFormIsRemoved: a VIP bound by hand, without vipd's
// label or with another prefix length, is removed while the apiserver is
// unhealthy, is adopted and then removed when the apiserver fails after vipd
// held it, and is gone after SIGTERM. Before, release deleted only vipd's own
// labelled /32 and took "no such address" as success: a second holder.
func TestLeftoverVIPInAnyFormIsRemoved(t *testing.T) {
	l := newLoneLab(t)
	for i, lo := range leftovers() {
		t.Run(lo.name, func(t *testing.T) {
			v := l.VIP4(20 + i)
			ctx := ctxT(t, 60*time.Second)
			env := []string{"VIPD_ADDRESS=" + v.String() + "/32", "VIPD_HEALTH_INTERVAL=200ms", "VIPD_FAIL_THRESHOLD=2"}

			// 1. Bound before vipd starts, apiserver unhealthy: removed.
			if err := l.api.SetMode(lab.Failing); err != nil {
				t.Fatal(err)
			}
			addLeftover(ctx, t, l.node, v, lo)
			start := time.Now()
			p := l.startOwned(t, env...)
			waitGone(t, l.node, v, 5*time.Second, "leftover while the apiserver is unhealthy")
			t.Logf("removed %v after start", time.Since(start).Round(time.Millisecond))
			if e := entries(ctx, t, l.node, l.node.IPv4); len(e) == 0 {
				t.Fatalf("the node's own address %s went with the VIP", l.node.IPv4)
			}
			stop(t, p)

			// 2. Bound before vipd starts, apiserver healthy: adopted in
			// vipd's own form, then removed when the apiserver fails.
			addLeftover(ctx, t, l.node, v, lo)
			if err := l.api.SetMode(lab.OK); err != nil {
				t.Fatal(err)
			}
			p = l.startOwned(t, env...)
			if err := p.WaitOutput(ctx, "VIP held"); err != nil {
				t.Fatal(err)
			}
			waitEntries(ctx, t, l.node, v, []string{"/32 eth0:vipd"})
			failAt := time.Now()
			if err := l.api.SetMode(lab.Failing); err != nil {
				t.Fatal(err)
			}
			waitGone(t, l.node, v, 5*time.Second, "adopted VIP after the apiserver failed")
			t.Logf("released %v after the apiserver failed", time.Since(failAt).Round(time.Millisecond))

			// 3. Held again, and a leftover appears next to vipd's entry
			// while it holds: SIGTERM removes both.
			if err := l.api.SetMode(lab.OK); err != nil {
				t.Fatal(err)
			}
			if err := l.node.WaitAddr(ctx, v, true); err != nil {
				t.Fatal(err)
			}
			addLeftover(ctx, t, l.node, v, leftover{args: []string{"/24"}})
			if n := len(entries(ctx, t, l.node, v)); n != 2 {
				t.Fatalf("want vipd's entry and a leftover, got %v", entries(ctx, t, l.node, v))
			}
			stop(t, p)
			if e := entries(ctx, t, l.node, v); len(e) != 0 {
				t.Fatalf("left behind after SIGTERM: %v", e)
			}
		})
	}
}

func waitEntries(ctx context.Context, t *testing.T, h *lab.Host, v netip.Addr, want []string) {
	t.Helper()
	for {
		got := entries(ctx, t, h, v)
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("entries of %s are %v, want %v", v, got, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestLeftoverPrimaryVIPKeepsNodeAddress: a leftover VIP/24 that the kernel
// holds as the primary address of the node's own subnet (it was bound
// before the node's address) takes the node's address with it when deleted
// and promote_secondaries is off. vipd must put it back.
func TestLeftoverPrimaryVIPKeepsNodeAddress(t *testing.T) {
	testenv.RequireCommands(t, "ping")
	l := newLoneLab(t)
	v := l.VIP4(30)
	ctx := ctxT(t, 30*time.Second)
	for _, k := range []string{"net.ipv4.conf.all.promote_secondaries", "net.ipv4.conf.eth0.promote_secondaries"} {
		if err := l.node.Sysctl(ctx, k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	own := netip.PrefixFrom(l.node.IPv4, 24).String()
	for _, args := range [][]string{
		{"addr", "del", own, "dev", "eth0"},
		{"addr", "add", v.String() + "/24", "dev", "eth0"},
		{"addr", "add", own, "dev", "eth0"},
	} {
		if _, err := l.node.Output(ctx, "ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.api.SetMode(lab.Failing); err != nil {
		t.Fatal(err)
	}
	p := l.start(t, "VIPD_ADDRESS="+v.String()+"/32")
	waitGone(t, l.node, v, 5*time.Second, "leftover primary VIP")
	if err := p.WaitOutput(ctx, "re-added it"); err != nil {
		t.Fatal(err)
	}
	if e := entries(ctx, t, l.node, l.node.IPv4); len(e) != 1 || e[0] != "/24 eth0" {
		t.Fatalf("node address %s after the VIP was removed: %v", l.node.IPv4, e)
	}
	if _, err := l.Client.Output(ctx, "ping", "-c", "1", "-W", "2", l.node.IPv4.String()); err != nil {
		t.Fatalf("node unreachable at its own address after the VIP was removed: %v", err)
	}
}

func heldMetric(ctx context.Context, t *testing.T, h *lab.Host, v netip.Prefix) string {
	t.Helper()
	out, err := h.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf(`vipd_vip_held{mode="l2",vip="%s"} `, v)
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimPrefix(line, prefix)
		}
	}
	t.Fatalf("/metrics lacks %s", prefix)
	return ""
}

// TestVIPInterfaceDownNeverHeld: with the VIP interface down (administratively
// inside the node, or without carrier because the switch port is down) a
// lone vipd with a healthy apiserver does not hold the VIP: nothing bound,
// vipd_vip_held 0. Once the link is up it holds within a retry period.
func TestVIPInterfaceDownNeverHeld(t *testing.T) {
	l := newLoneLab(t)
	for i, inside := range []bool{true, false} {
		name := "no carrier"
		if inside {
			name = "admin down"
		}
		t.Run(name, func(t *testing.T) {
			v := netip.PrefixFrom(l.VIP4(40+i), 32)
			ctx := ctxT(t, 40*time.Second)
			if err := l.node.SetLink(ctx, false, inside); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.node.SetLink(context.Background(), true, inside) })
			p := l.startOwned(t, "VIPD_ADDRESS="+v.String())
			if err := p.WaitOutput(ctx, "vipd started"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2500 * time.Millisecond) // several acquire retries
			if e := entries(ctx, t, l.node, v.Addr()); len(e) != 0 {
				t.Fatalf("bound on a down interface: %v", e)
			}
			if got := heldMetric(ctx, t, l.node, v); got != "0" {
				t.Fatalf("vipd_vip_held = %s on a down interface, want 0", got)
			}
			if strings.Contains(p.Output(), "VIP held") {
				t.Fatalf("vipd reported holding on a down interface:\n%s", p.Output())
			}
			if !strings.Contains(p.Output(), "VIP interface is down or missing") {
				t.Fatalf("vipd does not say why it cannot hold:\n%s", p.Output())
			}
			up := time.Now()
			if err := l.node.SetLink(ctx, true, inside); err != nil {
				t.Fatal(err)
			}
			if err := l.node.WaitAddr(ctx, v.Addr(), true); err != nil {
				t.Fatal(err)
			}
			t.Logf("held %v after the link came up", time.Since(up).Round(time.Millisecond))
			for heldMetric(ctx, t, l.node, v) != "1" {
				if ctx.Err() != nil {
					t.Fatal("vipd_vip_held never became 1")
				}
				time.Sleep(50 * time.Millisecond)
			}
			stop(t, p)
		})
	}
}

// TestVIPInterfaceMissing: VIPD_INTERFACE renamed away after start: acquire
// fails clearly and binds nothing; a VIP left on the renamed interface is
// still seen and released.
func TestVIPInterfaceMissing(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	l := lab.New(t, lab.Options{Nodes: 1})
	n := l.Nodes[0]
	v := netip.PrefixFrom(l.VIP4(50), 32)
	ctx := ctxT(t, 20*time.Second)
	err := n.Run(func() error {
		a, err := newL2(t, "eth0", nil)
		if err != nil {
			return err
		}
		if err := a.Acquire(ctx, v); err != nil {
			return err
		}
		for _, args := range [][]string{{"link", "set", "eth0", "down"}, {"link", "set", "eth0", "name", "eth9"}, {"link", "set", "eth9", "up"}} {
			if _, err := n.Output(ctx, "ip", args...); err != nil {
				return err
			}
		}
		if err := a.Check(ctx, v, false); !errors.Is(err, vip.ErrLinkDown) {
			return fmt.Errorf("check on a renamed interface: %v, want ErrLinkDown", err)
		}
		if ok, err := a.Present(ctx, v); err != nil || !ok {
			return fmt.Errorf("present on the renamed interface: %v %v, want true", ok, err)
		}
		// Acquire refuses, naming the new name, and unbinds what it finds.
		if err := a.Acquire(ctx, v); !errors.Is(err, vip.ErrLinkDown) || !strings.Contains(err.Error(), "eth0 does not exist any more (renamed to eth9?)") {
			return fmt.Errorf("acquire on a renamed interface: %v, want ErrLinkDown naming eth9", err)
		}
		if ok, err := a.Present(ctx, v); err != nil || ok {
			return fmt.Errorf("present after a refused acquire: %v %v, want false", ok, err)
		}
		// A VIP bound there by anyone is still released.
		if _, err := n.Output(ctx, "ip", "addr", "add", l.VIP4(51).String()+"/24", "dev", "eth9"); err != nil {
			return err
		}
		if err := a.Release(ctx, netip.PrefixFrom(l.VIP4(51), 32)); err != nil {
			return fmt.Errorf("release from the renamed interface: %v", err)
		}
		out, err := n.Output(ctx, "ip", "-4", "addr", "show", "dev", "eth9")
		if err != nil {
			return err
		}
		if strings.Contains(string(out), l.VIP4(50).String()+"/") || strings.Contains(string(out), l.VIP4(51).String()+"/") {
			return fmt.Errorf("VIP left on the renamed interface:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// newL2 builds an announcer in the calling thread's namespace.
func newL2(t *testing.T, ifname string, reg prometheus.Registerer) (*vip.L2, error) {
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return vip.NewL2(vip.L2Options{Interface: ifname, ProbeTimeout: 200 * time.Millisecond}, log, reg)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestCheck drives L2.Check on a holder in the lab: our own kernel's
// answers are never a conflict, a second host binding the VIP is (with its
// MAC, IPv4 and IPv6), and a down link is ErrLinkDown.
func TestCheck(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "tcpdump")
	l := lab.New(t, lab.Options{Nodes: 2})
	a, b := l.Nodes[0], l.Nodes[1]
	v4, v6 := netip.PrefixFrom(l.VIP4(60), 32), netip.PrefixFrom(l.VIP6(60), 128)
	ctx := ctxT(t, 60*time.Second)
	// What B sees of A's probes, and what it answers.
	capB, err := b.StartCapture(ctx, "arp or icmp6")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var ann *vip.L2
	inA := func(fn func() error) {
		t.Helper()
		if err := a.Run(fn); err != nil {
			t.Fatal(err)
		}
	}
	inA(func() error {
		var err error
		ann, err = newL2(t, "eth0", reg)
		if err != nil {
			return err
		}
		for _, v := range []netip.Prefix{v4, v6} {
			if err := ann.Acquire(ctx, v); err != nil {
				return fmt.Errorf("acquire %s: %w", v, err)
			}
		}
		return nil
	})
	check := func(v netip.Prefix) (err error) {
		t.Helper()
		inA(func() error {
			err = ann.Check(ctx, v, true)
			return nil
		})
		return err
	}

	// Alone: several probes, none a conflict, although our own kernel
	// answers for the VIP.
	for i := 0; i < 5; i++ {
		for _, v := range []netip.Prefix{v4, v6} {
			if err := check(v); err != nil {
				t.Fatalf("check %s alone (round %d): %v", v, i, err)
			}
		}
	}

	// B binds the VIPs by hand: a second holder.
	for _, v := range []netip.Prefix{v4, v6} {
		if _, err := b.Output(ctx, "ip", "addr", "add", v.String(), "dev", "eth0", "nodad"); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel joins the VIP's solicited-node group from a work queue
	// after the address is added: wait for it, or B cannot hear the probe.
	waitSolicitedNode(ctx, t, b, v6.Addr())
	for _, v := range []netip.Prefix{v4, v6} {
		err := check(v)
		var ce *vip.ConflictError
		if !errors.As(err, &ce) || !errors.Is(err, vip.ErrConflict) {
			t.Fatalf("check %s with a second holder: %v, want a *ConflictError", v, err)
		}
		if ce.MAC.String() != b.MAC.String() || ce.VIP != v.Addr() {
			t.Fatalf("conflict names %s at %s, want %s at %s", ce.VIP, ce.MAC, v.Addr(), b.MAC)
		}
		if got := conflicts(t, reg, v); got < 1 {
			t.Fatalf("vipd_conflicts_total{vip=%q} = %v after a conflict", v, got)
		}
	}
	// On the wire: an RFC 5227 probe (sender 0.0.0.0) from A's MAC and B's
	// reply; a solicitation for the IPv6 VIP and B's advertisement.
	for _, want := range [][]string{
		{"Request who-has " + v4.Addr().String() + " tell 0.0.0.0"},
		{"Reply " + v4.Addr().String() + " is-at " + b.MAC.String()},
		{"neighbor solicitation", "who has " + v6.Addr().String()},
		{"neighbor advertisement", "tgt is " + v6.Addr().String(), b.MAC.String()},
	} {
		if _, err := capB.WaitFrames(ctx, 1, want...); err != nil {
			t.Fatalf("no frame matching %q at B: %v\n%s", want, err, capB.All())
		}
	}
	for _, f := range capB.Frames("Request who-has "+v4.Addr().String(), "tell 0.0.0.0") {
		if f.Src != a.MAC.String() {
			t.Fatalf("ARP probe from %s, want A's %s: %s", f.Src, a.MAC, f.Line)
		}
	}
	// Without probe a conflict is not looked for.
	inA(func() error {
		if err := ann.Check(ctx, v4, false); err != nil {
			return fmt.Errorf("check without probe: %w", err)
		}
		return nil
	})
	for _, v := range []netip.Prefix{v4, v6} {
		if _, err := b.Output(ctx, "ip", "addr", "del", v.String(), "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []netip.Prefix{v4, v6} {
		if err := check(v); err != nil {
			t.Fatalf("check %s after B let go: %v", v, err)
		}
	}

	// Link down, inside (admin) and at the switch (carrier): ErrLinkDown.
	for _, inside := range []bool{true, false} {
		if err := a.SetLink(ctx, false, inside); err != nil {
			t.Fatal(err)
		}
		if err := check(v4); !errors.Is(err, vip.ErrLinkDown) {
			t.Fatalf("check with the link down (inside=%v): %v, want ErrLinkDown", inside, err)
		}
		// Acquire refuses too, and leaves nothing bound.
		v := netip.PrefixFrom(l.VIP4(61), 32)
		inA(func() error {
			err := ann.Acquire(ctx, v)
			if !errors.Is(err, vip.ErrLinkDown) {
				return fmt.Errorf("acquire with the link down (inside=%v): %v, want ErrLinkDown", inside, err)
			}
			return nil
		})
		if e := entries(ctx, t, a, v.Addr()); len(e) != 0 {
			t.Fatalf("acquire on a down link left %v", e)
		}
		if err := a.SetLink(ctx, true, inside); err != nil {
			t.Fatal(err)
		}
	}
	waitUp := time.Now()
	for check(v4) != nil {
		if time.Since(waitUp) > 10*time.Second {
			t.Fatalf("check still fails after the link came up: %v", check(v4))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// conflicts reads vipd_conflicts_total for v from reg.
func conflicts(t *testing.T, reg *prometheus.Registry, v netip.Prefix) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vipd_conflicts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "vip" && lp.GetValue() == v.String() {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestL2ReleaseAndAdoptAnyForm drives the announcer directly: Present sees
// a VIP in any form, Release removes every entry, Acquire replaces foreign
// entries by vipd's own.
func TestL2ReleaseAndAdoptAnyForm(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	l := lab.New(t, lab.Options{Nodes: 1})
	n := l.Nodes[0]
	ctx := ctxT(t, 30*time.Second)
	var ann *vip.L2
	if err := n.Run(func() error {
		var err error
		ann, err = newL2(t, "eth0", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	in := func(fn func() error) {
		t.Helper()
		if err := n.Run(fn); err != nil {
			t.Fatal(err)
		}
	}
	cases := append(leftovers(), leftover{"/24 and /32 together", []string{"/24"}})
	for i, lo := range cases {
		v := netip.PrefixFrom(l.VIP4(70+i), 32)
		addLeftover(ctx, t, n, v.Addr(), lo)
		if lo.name == "/24 and /32 together" {
			addLeftover(ctx, t, n, v.Addr(), leftover{args: []string{"/32"}})
		}
		in(func() error {
			if ok, err := ann.Present(ctx, v); err != nil || !ok {
				return fmt.Errorf("%s: present = %v %v, want true", lo.name, ok, err)
			}
			return ann.Release(ctx, v)
		})
		if e := entries(ctx, t, n, v.Addr()); len(e) != 0 {
			t.Fatalf("%s: release left %v", lo.name, e)
		}
		in(func() error {
			if ok, err := ann.Present(ctx, v); err != nil || ok {
				return fmt.Errorf("%s: present after release = %v %v", lo.name, ok, err)
			}
			return ann.Release(ctx, v) // idempotent
		})
		addLeftover(ctx, t, n, v.Addr(), lo)
		in(func() error { return ann.Acquire(ctx, v) })
		if e := entries(ctx, t, n, v.Addr()); strings.Join(e, ",") != "/32 eth0:vipd" {
			t.Fatalf("%s: after acquire the VIP is bound as %v, want only vipd's /32", lo.name, e)
		}
	}
	// IPv6: a leftover /64 is seen, adopted as a /128, and released.
	v6 := netip.PrefixFrom(l.VIP6(70), 128)
	if _, err := n.Output(ctx, "ip", "addr", "add", l.VIP6(70).String()+"/64", "dev", "eth0", "nodad"); err != nil {
		t.Fatal(err)
	}
	in(func() error {
		if ok, err := ann.Present(ctx, v6); err != nil || !ok {
			return fmt.Errorf("present v6 leftover = %v %v", ok, err)
		}
		return ann.Acquire(ctx, v6)
	})
	if e := entries(ctx, t, n, v6.Addr()); strings.Join(e, ",") != "/128" {
		t.Fatalf("IPv6 VIP after acquire: %v, want /128", e)
	}
	in(func() error { return ann.Release(ctx, v6) })
	if e := entries(ctx, t, n, v6.Addr()); len(e) != 0 {
		t.Fatalf("IPv6 release left %v", e)
	}
}

func waitSolicitedNode(ctx context.Context, t *testing.T, h *lab.Host, v netip.Addr) {
	t.Helper()
	snm, err := ndp.SolicitedNodeMulticast(v)
	if err != nil {
		t.Fatal(err)
	}
	for {
		out, err := h.Output(ctx, "ip", "-6", "maddr", "show", "dev", h.Link)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), " "+snm.String()+"\n") || strings.HasSuffix(strings.TrimSpace(string(out)), " "+snm.String()) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never joined %s:\n%s", h.Name, snm, out)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// answerNS answers, from h, every neighbour solicitation for v with a
// neighbour advertisement to all nodes naming tlla (no target link-layer
// option when tlla is nil), like a switch doing ND suppression or a proxy.
// It stops when the test ends.
func answerNS(t *testing.T, h *lab.Host, v netip.Addr, tlla net.HardwareAddr) {
	t.Helper()
	var c *ndp.Conn
	err := h.Run(func() error {
		ifi, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		snm, err := ndp.SolicitedNodeMulticast(v)
		if err != nil {
			return err
		}
		c, _, err = ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			return err
		}
		return c.JoinGroup(snm)
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, _, _, err := c.ReadFrom()
			if err != nil {
				return // closed
			}
			if ns, ok := m.(*ndp.NeighborSolicitation); !ok || ns.TargetAddress != v {
				continue
			}
			na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: v}
			if tlla != nil {
				na.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: tlla}}
			}
			_ = c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
		}
	}()
	t.Cleanup(func() {
		_ = c.Close()
		<-done
	})
}

// TestNDPProbeAnswers: an advertisement for the VIP naming our own MAC (ND
// suppression or a proxy answering with the MAC it learned from us) is no
// conflict; one without a target link-layer option is a conflict naming the
// sender's MAC, never an empty one. Before, both were conflicts with an
// empty MAC and the VIP was never bound.
func TestNDPProbeAnswers(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	l := lab.New(t, lab.Options{Nodes: 1, Client: true})
	n, c := l.Nodes[0], l.Client
	ctx := ctxT(t, 30*time.Second)
	var ann *vip.L2
	if err := n.Run(func() error {
		var err error
		ann, err = newL2(t, "eth0", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	acquire := func(v netip.Prefix) (err error) {
		t.Helper()
		if rerr := n.Run(func() error { err = ann.Acquire(ctx, v); return nil }); rerr != nil {
			t.Fatal(rerr)
		}
		return err
	}
	tests := []struct {
		name     string
		tlla     net.HardwareAddr
		conflict net.HardwareAddr // nil: acquire must succeed
	}{
		{"advertises our own MAC", n.MAC, nil},
		{"no target link-layer option", nil, c.MAC},
		{"advertises its own MAC", c.MAC, c.MAC},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := netip.PrefixFrom(l.VIP6(90+i), 128)
			answerNS(t, c, v.Addr(), tt.tlla)
			err := acquire(v)
			if tt.conflict == nil {
				if err != nil {
					t.Fatalf("acquire: %v, want success", err)
				}
				if e := entries(ctx, t, n, v.Addr()); len(e) != 1 {
					t.Fatalf("VIP not bound: %v", e)
				}
				return
			}
			var ce *vip.ConflictError
			if !errors.As(err, &ce) {
				t.Fatalf("acquire: %v, want a *ConflictError", err)
			}
			if ce.MAC.String() != tt.conflict.String() {
				t.Fatalf("conflict names %q, want %s", ce.MAC, tt.conflict)
			}
			if e := entries(ctx, t, n, v.Addr()); len(e) != 0 {
				t.Fatalf("bound despite the conflict: %v", e)
			}
		})
	}
}
