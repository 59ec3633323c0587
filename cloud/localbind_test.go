package cloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/internal/testenv"
)

func TestLinkBinder(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "vipdcloud-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	binder, err := NewLinkBinderAt("lo", ns)
	if err != nil {
		t.Fatal(err)
	}

	p := &memProvider{holder: "me", local: boolp(true)}
	a := NewAnnouncer(p, AnnouncerOptions{Binder: binder})
	defer a.Close()
	ctx := context.Background()
	vip := netip.MustParsePrefix("192.0.2.10/32")

	if err := a.Acquire(ctx, vip); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "-n", name, "-4", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	// preferred_lft 0 shows as "deprecated": never chosen as a source.
	if !strings.Contains(string(out), "inet 192.0.2.10/32") || !strings.Contains(string(out), "deprecated") {
		t.Fatalf("lo after Acquire:\n%s", out)
	}
	if ok, err := a.Present(ctx, vip); err != nil || !ok {
		t.Fatalf("Present = %v, %v", ok, err)
	}
	// Someone deletes the address: Present says so, and Acquire restores it.
	if out, err := exec.Command("ip", "-n", name, "addr", "del", "192.0.2.10/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if ok, _ := a.Present(ctx, vip); ok {
		t.Fatal("Present true without the local address")
	}
	if err := a.Acquire(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if ok, _ := binder.Bound(vip); !ok {
		t.Fatal("Acquire did not restore the address")
	}
	if err := a.Release(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if ok, _ := binder.Bound(vip); ok {
		t.Fatal("address still bound after Release")
	}
	if err := a.Release(ctx, vip); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if _, as, _ := p.counts(); as != 0 {
		t.Fatalf("%d assigns for an IP the metadata says is held", as)
	}
}
