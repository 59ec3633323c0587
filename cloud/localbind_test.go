package cloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/internal/testenv"
)

func TestLinkBinder(t *testing.T) {
	name, ns := newNS(t)
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

// deliveringProvider is a memProvider whose network delivers the IP to the
// address itself, as Hetzner's does.
type deliveringProvider struct {
	*memProvider
	onAssign func() // called before each assign
}

func (deliveringProvider) DeliversToAddress() bool { return true }

func (d deliveringProvider) Assign(ctx context.Context, ip netip.Addr) error {
	if d.onAssign != nil {
		d.onAssign()
	}
	return d.memProvider.Assign(ctx, ip)
}

// With a provider that delivers to the address, a released IP keeps its
// local address until the provider says another instance holds it (the
// IP still routes here until then), and no longer: a re-acquire meanwhile
// keeps it, MovedWait and Close bound the wait. Checked in the kernel.
func TestReleasedAddressStaysUntilTheIPMoved(t *testing.T) {
	_, ns := newNS(t)
	binder, err := NewLinkBinderAt("lo", ns)
	if err != nil {
		t.Fatal(err)
	}
	boundAtAssign := 0
	p := deliveringProvider{memProvider: &memProvider{holder: "other"}}
	p.onAssign = func() {
		if ok, _ := binder.Bound(netip.MustParsePrefix("192.0.2.10/32")); ok {
			boundAtAssign++
		}
	}
	a := NewAnnouncer(p, AnnouncerOptions{Binder: binder, CoolOff: -1, MovedCheck: 20 * time.Millisecond, MovedWait: 400 * time.Millisecond})
	closed := false
	defer func() {
		if !closed {
			_ = a.Close()
		}
	}()
	ctx := context.Background()
	vip := netip.MustParsePrefix("192.0.2.10/32")
	bound := func() bool {
		ok, err := binder.Bound(vip)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	waitUnbound := func(what string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for bound() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the address is still bound after %v", what, within)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// A failed assign leaves no address behind.
	p.set(func(m *memProvider) { m.assignErr = ErrUnavailable })
	if err := a.Acquire(ctx, vip); err == nil || bound() {
		t.Fatalf("failed acquire: %v, bound %v", err, bound())
	}
	p.set(func(m *memProvider) { m.assignErr = nil })
	if err := a.Acquire(ctx, vip); err != nil || !bound() {
		t.Fatalf("acquire: %v, bound %v", err, bound())
	}
	// The address was there before the assign went out: the IP routes
	// here the moment the action completes.
	if boundAtAssign != 2 {
		t.Fatalf("the address was bound at %d of 2 assigns, want both", boundAtAssign)
	}
	// Released, the IP still routes here: the address stays.
	if err := a.Release(ctx, vip); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if !bound() {
		t.Fatal("the address went at release, while the IP still routes here")
	}
	// The successor's assign completes: the address goes.
	p.set(func(m *memProvider) { m.holder = "other" })
	waitUnbound("after the IP moved", 200*time.Millisecond)

	// Released, then acquired again before the IP moved: the late check
	// must not remove the new holder's address.
	if err := a.Acquire(ctx, vip); err != nil || !bound() {
		t.Fatalf("re-acquire: %v", err)
	}
	if err := a.Release(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(ctx, vip); err != nil {
		t.Fatal(err)
	}
	p.set(func(m *memProvider) { m.holder = "other" })
	time.Sleep(150 * time.Millisecond)
	if !bound() {
		t.Fatal("a stale deferred unbind removed the address of a new acquire")
	}

	// The IP never moves: MovedWait bounds the wait.
	p.set(func(m *memProvider) { m.holder = "me" })
	if err := a.Release(ctx, vip); err != nil {
		t.Fatal(err)
	}
	waitUnbound("after MovedWait", time.Second)

	// Close removes a lingering address at once.
	if err := a.Acquire(ctx, vip); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, vip); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	closed = true
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Fatalf("Close took %v", took)
	}
	b2, err := NewLinkBinderAt("lo", ns)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if ok, _ := b2.Bound(vip); ok {
		t.Fatal("the address outlived Close")
	}
}

// A local address left by a run that did not stop cleanly is found at
// start-up: removed at once when the IP is elsewhere (or the provider does
// not deliver to the address), kept until the IP moves when it may still
// route here. Checked in the kernel.
func TestLeftoverAddressAtStartUp(t *testing.T) {
	_, ns := newNS(t)
	vip := netip.MustParsePrefix("192.0.2.10/32")
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		holder    string
		deliverer bool
		kept      bool
	}{
		{"IP elsewhere: removed", "other", true, false},
		{"IP unassigned: removed", "", true, false},
		{"IP still here, provider delivers to the address: kept until it moves", "me", true, true},
		{"IP still here, anchor-style provider: removed (re-added if elected)", "me", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binder, err := NewLinkBinderAt("lo", ns)
			if err != nil {
				t.Fatal(err)
			}
			if err := binder.Bind(ctx, vip); err != nil {
				t.Fatal(err)
			}
			mp := &memProvider{holder: tc.holder}
			var p Provider = mp
			if tc.deliverer {
				p = deliveringProvider{memProvider: mp}
			}
			a := NewAnnouncer(p, AnnouncerOptions{Binder: binder, MovedCheck: 20 * time.Millisecond})
			defer a.Close()
			if err := a.Prime(ctx, []netip.Prefix{vip}); err != nil {
				t.Fatal(err)
			}
			if ok, _ := binder.Bound(vip); ok != tc.kept {
				t.Fatalf("bound after start-up = %v, want %v", ok, tc.kept)
			}
			if !tc.kept {
				return
			}
			mp.set(func(m *memProvider) { m.holder = "other" })
			deadline := time.Now().Add(time.Second)
			for {
				ok, _ := binder.Bound(vip)
				if !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the leftover address outlived the move")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// newNS is a new network namespace for a test (deleted at cleanup): its
// name for `ip -n` and its handle.
func newNS(t *testing.T) (string, netns.NsHandle) {
	t.Helper()
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
	t.Cleanup(func() { _ = ns.Close() })
	return name, ns
}
