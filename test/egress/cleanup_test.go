package egress

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// TestCleanupAfterKill: a vipd killed while it holds its VIPs and is the
// egress gateway leaves them in the kernel (SIGKILL runs no stop path);
// `vipd cleanup`, which vipd.service runs through vipd-cleanup.service
// when the unit fails for good, removes every part of it: both VIPs (IPv4
// with vipd's label, IPv6), the egress IP, the nftables table, the ip
// rules and the routes. It refuses while vipd runs and removes nothing
// then, and a second run finds nothing.
func TestCleanupAfterKill(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 1})
	n := l.Nodes[0]
	v4, v6, e4 := l.VIP4(60), l.VIP6(60), l.VIP4(61)
	sh(t, n.NS, "sysctl -qw net.ipv4.ip_forward=1")
	if _, err := n.StartAPIServer("[::]:6443", lab.OK); err != nil {
		t.Fatal(err)
	}
	env := append([]string{"VIPD_ADDRESS=" + v4.String() + "/32," + v6.String() + "/128",
		"VIPD_EGRESS=" + e4.String() + " from 100.64.0.0/16 to 203.0.113.0/24",
		"VIPD_EGRESS_CLUSTER_CIDRS=100.64.0.0/16"}, fastHealth...)
	p, err := n.StartVipd(bin, env...)
	if err != nil {
		t.Fatal(err)
	}
	bound := func() []string {
		var on []string
		addrs := out(t, n.NS, "ip addr show dev eth0")
		for _, a := range []string{v4.String() + "/32", v6.String() + "/128", e4.String() + "/32"} {
			if strings.Contains(addrs, " "+a+" ") {
				on = append(on, a)
			}
		}
		return on
	}
	waitFor(t, 20*time.Second, "both VIPs and the egress IP bound, the gateway programmed", func() error {
		if on := bound(); len(on) != 3 {
			return fmt.Errorf("bound: %v", on)
		}
		if o := out(t, n.NS, "nft list tables"); !strings.Contains(o, "vipd-egress") {
			return fmt.Errorf("no egress table yet")
		}
		return nil
	})
	if !strings.Contains(out(t, n.NS, "ip -4 addr show dev eth0"), "eth0:vipd") {
		t.Fatalf("the IPv4 VIP is not bound with vipd's label:\n%s", out(t, n.NS, "ip -4 addr show dev eth0"))
	}

	// While vipd runs: refused, nothing removed.
	o, code, err := n.RunVipd(ctx, bin, env, "cleanup")
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 || !strings.Contains(o, "vipd is running on this node") {
		t.Errorf("vipd cleanup beside a running vipd: exit %d, want 1 and \"vipd is running on this node\":\n%s", code, o)
	}
	if on := bound(); len(on) != 3 {
		t.Fatalf("vipd cleanup beside a running vipd removed addresses: still bound %v\n%s", on, o)
	}

	// Killed: everything stays.
	p.Kill()
	if err := kernelLeftovers(t, n, e4); err == nil {
		t.Fatal("a killed vipd left nothing: the test cannot tell cleanup's work")
	}
	if on := bound(); len(on) != 3 {
		t.Fatalf("after SIGKILL bound: %v, want all three", on)
	}

	// A pool address a killed vipd left (bound with vipd's label, not in
	// the configuration), and an operator's address beside it.
	pool, own := l.VIP4(62), l.VIP4(63)
	sh(t, n.NS, "ip addr add "+pool.String()+"/32 dev eth0 label eth0:vipd", "ip addr add "+own.String()+"/32 dev eth0")

	o, code, err = n.RunVipd(ctx, bin, env, "cleanup")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vipd cleanup:\n%s", o)
	if code != 0 {
		t.Fatalf("vipd cleanup: exit %d\n%s", code, o)
	}
	for _, want := range []string{"removed VIP " + v4.String() + "/32 from eth0", "removed VIP " + v6.String() + "/128 from eth0",
		"removed VIP " + e4.String() + "/32 from eth0", "removed " + pool.String() + " (vipd's label) from eth0", "removed egress rules"} {
		if !strings.Contains(o, want) {
			t.Errorf("vipd cleanup did not say %q", want)
		}
	}
	if on := bound(); len(on) != 0 {
		t.Errorf("after vipd cleanup still bound: %v", on)
	}
	if err := kernelLeftovers(t, n, e4); err != nil {
		t.Errorf("after vipd cleanup: %v", err)
	}
	addrs := out(t, n.NS, "ip -4 addr show dev eth0")
	if strings.Contains(addrs, " "+pool.String()+"/32 ") {
		t.Errorf("the pool address with vipd's label is still bound:\n%s", addrs)
	}
	if !strings.Contains(addrs, " "+own.String()+"/32 ") || !strings.Contains(addrs, " "+n.IPv4.String()+"/") {
		t.Errorf("vipd cleanup removed an address that is not vipd's:\n%s", addrs)
	}
	o, code, err = n.RunVipd(ctx, bin, env, "cleanup")
	if err != nil || code != 0 || strings.TrimSpace(o) != "nothing to clean up" {
		t.Errorf("a second vipd cleanup: exit %d %v, want 0 and \"nothing to clean up\":\n%s", code, err, o)
	}
	// A gossip key file that cannot be read (cleanup never joins the
	// cluster) does not keep it from working.
	o, code, err = n.RunVipd(ctx, bin, append(env, "VIPD_PEERS=10.0.0.9", "VIPD_GOSSIP_KEY_FILE=/nonexistent/gossip.key"), "cleanup")
	if err != nil || code != 0 || strings.TrimSpace(o) != "nothing to clean up" {
		t.Errorf("vipd cleanup with an unreadable gossip key file: exit %d %v, want 0:\n%s", code, err, o)
	}
	// The interface is gone (a NIC renamed or removed): its addresses went
	// with it, which is no failure; the egress rules are still looked at.
	sh(t, n.NS, "nft add table inet vipd-egress")
	o, code, err = n.RunVipd(ctx, bin, append(env, "VIPD_INTERFACE=gone0"), "cleanup")
	if err != nil || code != 0 || !strings.Contains(o, "interface gone0 is gone") || !strings.Contains(o, "removed egress rules") {
		t.Errorf("vipd cleanup without its interface: exit %d %v, want 0, the interface named and the egress table removed:\n%s", code, err, o)
	}
	// An invalid setting: one line naming it, exit 2, nothing touched.
	o, code, err = n.RunVipd(ctx, bin, append(env, "VIPD_ADDRESS=not-an-ip"), "cleanup")
	if err != nil || code != 2 || !strings.Contains(o, "VIPD_ADDRESS") || strings.Count(strings.TrimSpace(o), "\n") != 0 {
		t.Errorf("vipd cleanup with an invalid VIPD_ADDRESS: exit %d %v, want 2 and one line naming it:\n%s", code, err, o)
	}
}
