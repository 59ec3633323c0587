package bgp

import (
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestNetlinkBinder binds, checks and unbinds VIPs on lo of a throwaway
// network namespace, and notices a VIP someone else removed within the
// snapshot lifetime.
func TestNetlinkBinder(t *testing.T) {
	testenv.RequireRoot(t)
	runtime.LockOSThread() // the thread never returns to the host namespace: Go drops it at exit
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
	}()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	b := newNetlinkBinder("lo")
	v4, v6 := netip.MustParsePrefix("198.51.100.10/32"), netip.MustParsePrefix("2001:db8:ffff::10/128")
	for _, v := range []netip.Prefix{v4, v6} {
		if ok, err := b.Bound(v); err != nil || ok {
			t.Fatalf("Bound(%s) before Bind = %v, %v", v, ok, err)
		}
		for range 2 { // idempotent
			if err := b.Bind(v); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := b.Bound(v); err != nil || !ok {
			t.Fatalf("Bound(%s) after Bind = %v, %v", v, ok, err)
		}
	}
	// Someone else removes the IPv4 VIP: seen within the snapshot lifetime.
	if err := netlink.AddrDel(lo, b.addr(v4)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(snapshotTTL + 50*time.Millisecond)
	if ok, err := b.Bound(v4); err != nil || ok {
		t.Fatalf("Bound(%s) after an outside removal = %v, %v", v4, ok, err)
	}
	if ok, _ := b.Bound(v6); !ok {
		t.Fatalf("%s lost", v6)
	}
	for range 2 {
		if err := b.Unbind(v6); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _ := b.Bound(v6); ok {
		t.Fatalf("%s still bound after Unbind", v6)
	}
	// The kernel agrees.
	addrs, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.IP.Equal(v4.Addr().AsSlice()) || a.IP.Equal(v6.Addr().AsSlice()) {
			t.Errorf("kernel still has %s on lo", a.IP)
		}
	}
	if err := newNetlinkBinder("nope0").Bind(v4); err == nil {
		t.Error("Bind on a missing interface succeeded")
	}

	// UnbindLocal (vipd cleanup): what a dead vipd's speaker bound goes,
	// once; a VIP that is not there and an operator's other address on
	// lo stay as they are.
	if err := newNetlinkBinder("lo").Bind(v4); err != nil {
		t.Fatal(err)
	}
	other := &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP("198.51.100.99"))}
	if err := netlink.AddrAdd(lo, other); err != nil {
		t.Fatal(err)
	}
	if ok, err := UnbindLocal("lo", v4); err != nil || !ok {
		t.Fatalf("UnbindLocal(%s) = %v, %v, want true", v4, ok, err)
	}
	if ok, err := UnbindLocal("lo", v4); err != nil || ok {
		t.Fatalf("UnbindLocal(%s) again = %v, %v, want false", v4, ok, err)
	}
	if ok, err := UnbindLocal("lo", v6); err != nil || ok {
		t.Fatalf("UnbindLocal(%s), never bound = %v, %v, want false", v6, ok, err)
	}
	if _, err := UnbindLocal("nope0", v4); err == nil {
		t.Error("UnbindLocal on a missing interface succeeded")
	}
	addrs, err = netlink.AddrList(lo, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	kept := false
	for _, a := range addrs {
		if a.IP.Equal(v4.Addr().AsSlice()) {
			t.Errorf("kernel still has %s on lo after UnbindLocal", a.IP)
		}
		kept = kept || a.IP.Equal(other.IP)
	}
	if !kept {
		t.Error("UnbindLocal removed another address from lo")
	}
}
