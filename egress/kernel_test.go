package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testNS makes a network namespace with one veth pair (eth0 up, with
// addresses) and returns its name, a Kernel in it and eth0's index.
func testNS(t *testing.T) (string, *Kernel, int) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "vle" + hex.EncodeToString(b)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run("ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	run("ip", "-n", name, "link", "set", "eth0", "up")
	run("ip", "-n", name, "link", "set", "peer0", "up")
	run("ip", "-n", name, "addr", "add", "10.0.0.11/24", "dev", "eth0")
	run("ip", "-n", name, "addr", "add", "fd00::11/64", "dev", "eth0", "nodad")
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	k, err := NewKernelAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	l, err := nl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	return name, k, l.Attrs().Index
}

func inNS(t *testing.T, ns string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	return string(out)
}

// syncKernel applies the plan and checks the kernel then matches it.
func syncKernel(t *testing.T, k *Kernel, want State, s Settings) Changes {
	t.Helper()
	obs, err := k.Observe(s)
	if err != nil {
		t.Fatal(err)
	}
	c := Diff(want, obs)
	if err := k.Apply(want, c); err != nil {
		t.Fatalf("apply %s: %v", c.Summary(), err)
	}
	obs, err = k.Observe(s)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(want, obs); !d.Empty() {
		t.Fatalf("after apply the kernel still differs: %s", d.Summary())
	}
	return c
}

func TestKernelProgramsRepairsAndRemoves(t *testing.T) {
	ns, k, link := testNS(t)
	s := settings()
	s.Link = link
	gw2 := netip.MustParseAddr("10.0.0.12")
	in := Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Node: "n2", Addr: gw2}, eip6: {Node: "n2", Addr: gw2}}, Settings: s}

	// Director of both (the IPv6 gateway known by its IPv4 address: routed
	// via the egress IP on link).
	dir := Plan(in)
	syncKernel(t, k, dir, s)
	table := inNS(t, ns, "nft", "list", "table", "inet", TableName)
	for _, want := range []string{
		"type filter hook prerouting priority dstnat + 10",
		"type nat hook postrouting priority srcnat - 10",
		"ip saddr 10.244.0.0/16 counter packets 0 bytes 0 meta mark set meta mark & 0xff1fffff | 0x00100000",
		"ip6 saddr fd00:10:244::/56 ip6 daddr 2001:db8::/32",
		"ct status dnat",
		"fib daddr type local",
		"ip daddr 10.96.0.0/12",
		"meta mark & 0x00f00000 == 0x00100000 counter packets 0 bytes 0 snat ip to ip saddr",
		`comment "vipd director 10.0.0.200 mark #`,
	} {
		if !strings.Contains(table, want) {
			t.Errorf("nft table lacks %q:\n%s", want, table)
		}
	}
	rules4 := inNS(t, ns, "ip", "rule")
	rules6 := inNS(t, ns, "ip", "-6", "rule")
	if !strings.Contains(rules4, "7950:\tfrom all fwmark 0x100000/0xf00000 lookup 7950") || !strings.Contains(rules6, "7950:\tfrom all fwmark 0x200000/0xf00000 lookup 7951") {
		t.Errorf("ip rules:\n%s\n%s", rules4, rules6)
	}
	if r := inNS(t, ns, "ip", "route", "show", "table", "7950"); !strings.Contains(r, "default via 10.0.0.12 dev eth0 onlink") {
		t.Errorf("table 7950: %s", r)
	}
	if r := inNS(t, ns, "ip", "-6", "route", "show", "table", "7951"); !strings.Contains(r, "default via fd00::200 dev eth0 metric 1024 onlink") {
		t.Errorf("table 7951: %s", r)
	}

	// Gateway of the IPv4 egress IP: SNAT and forward, the route goes.
	in.Gateways[eip4] = Gateway{Self: true, Node: "n1"}
	gw := Plan(in)
	c := syncKernel(t, k, gw, s)
	if !c.ReplaceTable || len(c.DelRoutes) != 1 {
		t.Fatalf("role change: %s", c.Summary())
	}
	table = inNS(t, ns, "nft", "list", "table", "inet", TableName)
	for _, want := range []string{"snat ip to 10.0.0.200", "type filter hook forward priority filter - 10", "ct state established,related"} {
		if !strings.Contains(table, want) {
			t.Errorf("gateway table lacks %q:\n%s", want, table)
		}
	}
	if r := inNS(t, ns, "ip", "route", "show", "table", "7950"); strings.TrimSpace(r) != "" {
		t.Errorf("gateway keeps a route: %s", r)
	}

	// Drift: every kind of hand edit is found and repaired.
	for _, edit := range [][]string{
		{"ip", "rule", "del", "priority", "7950", "fwmark", "0x100000/0xf00000", "lookup", "7950"},
		{"ip", "-6", "route", "replace", "default", "via", "fd00::99", "dev", "eth0", "table", "7951"},
		{"ip", "route", "add", "192.0.2.0/24", "dev", "eth0", "table", "7952"},
		{"nft", "insert", "rule", "inet", TableName, "forward", "counter", "drop"},
		{"nft", "delete", "table", "inet", TableName},
		{"nft", "flush", "chain", "inet", TableName, "forward"},
	} {
		inNS(t, ns, edit...)
		obs, err := k.Observe(s)
		if err != nil {
			t.Fatal(err)
		}
		if Diff(gw, obs).Empty() {
			t.Fatalf("after %v the diff is empty", edit)
		}
		syncKernel(t, k, gw, s)
	}

	// Remove leaves nothing: no table, rule or route.
	if _, err := k.Remove(s); err != nil {
		t.Fatal(err)
	}
	if out := inNS(t, ns, "nft", "list", "tables"); strings.Contains(out, TableName) {
		t.Fatalf("table left: %s", out)
	}
	for _, cmd := range [][]string{{"ip", "rule"}, {"ip", "-6", "rule"}} {
		if out := inNS(t, ns, cmd...); strings.Contains(out, "7950") || strings.Contains(out, "fwmark") {
			t.Fatalf("rule left: %s", out)
		}
	}
	for _, cmd := range [][]string{{"ip", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"}} {
		if out := inNS(t, ns, cmd...); strings.Contains(out, "table 795") {
			t.Fatalf("route left: %s", out)
		}
	}
	// Removing twice is fine.
	if c, err := k.Remove(s); err != nil || !c.Empty() {
		t.Fatalf("second remove: %v %s", err, c.Summary())
	}
}

// TestKernelStoppingDropsBeforeMasquerade sends real packets through a
// node namespace that has a CNI-like masquerade (its own nftables table,
// priority srcnat): a selected pod's packet coming from another node is
// dropped by the stopping state's guard before the masquerade, and
// counted as an arrival; without vipd's table the masquerade takes it
// (the leak the guard prevents).
func TestKernelStoppingDropsBeforeMasquerade(t *testing.T) {
	ns, k, link := testNS(t)
	testenv.RequireCommands(t, "ping", "sysctl")
	peer := ns + "p"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", peer)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", peer).Run() })
	// The other node (a director routing its pod's traffic here): peer0
	// moves to its own namespace, with a pod address as source.
	run("ip", "-n", ns, "link", "set", "peer0", "netns", peer)
	run("ip", "-n", peer, "link", "set", "peer0", "up")
	run("ip", "-n", peer, "addr", "add", "10.0.0.12/24", "dev", "peer0")
	run("ip", "-n", peer, "addr", "add", "10.244.1.5/32", "dev", "peer0")
	run("ip", "-n", peer, "route", "add", "198.51.100.0/24", "via", "10.0.0.11")
	// This node forwards to the outside and masquerades the pod CIDR.
	inNS(t, ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run("ip", "-n", ns, "route", "add", "198.51.100.0/24", "via", "10.0.0.99", "dev", "eth0", "onlink")
	inNS(t, ns, "nft", "add table ip cni; add chain ip cni post { type nat hook postrouting priority srcnat; }; "+
		"add rule ip cni post ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 counter masquerade")
	send := func() {
		t.Helper()
		// No answer comes (the next hop does not exist): only the
		// counters tell what happened.
		_ = exec.Command("ip", "netns", "exec", peer, "ping", "-c", "2", "-i", "0.2", "-W", "0.3", "-I", "10.244.1.5", "198.51.100.9").Run()
	}
	masqueraded := func() string {
		out := inNS(t, ns, "nft", "list", "chain", "ip", "cni", "post")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "masquerade") {
				return strings.TrimSpace(l)
			}
		}
		t.Fatalf("no masquerade rule:\n%s", out)
		return ""
	}

	s := settings()
	s.Link = link
	in := Input{Rules: rules(), Gateways: map[netip.Addr]Gateway{eip4: {Node: "n2", Addr: netip.MustParseAddr("10.0.0.12")}}, Settings: s}
	syncKernel(t, k, PlanStopping(in), s)
	if n, err := k.Arrivals(); err != nil || n != 0 {
		t.Fatalf("arrivals before any packet: %d, %v", n, err)
	}
	send()
	if m := masqueraded(); !strings.Contains(m, "packets 0 ") {
		t.Fatalf("stopping state: the masquerade took the pod's packets: %s\n%s", m, inNS(t, ns, "nft", "list", "table", "inet", TableName))
	}
	if n, err := k.Arrivals(); err != nil || n < 2 {
		t.Fatalf("arrivals after two packets: %d, %v", n, err)
	}
	table := inNS(t, ns, "nft", "list", "table", "inet", TableName)
	if !strings.Contains(table, `ip saddr 10.244.0.0/16 counter packets 2 bytes 168 drop comment "vipd guard 10.0.0.200 drop unless snat`) {
		t.Fatalf("the guard did not drop both packets:\n%s", table)
	}

	// The same packets without vipd's table: masqueraded with this node's
	// address.
	if _, err := k.Remove(s); err != nil {
		t.Fatal(err)
	}
	send()
	if m := masqueraded(); strings.Contains(m, "packets 0 ") {
		t.Fatalf("without the guard the masquerade should have taken the packets (test setup): %s", m)
	}
}
