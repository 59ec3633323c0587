package vip

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/internal/testenv"
)

// nsEnv names the network namespace a re-executed test runs in.
const nsEnv = "VIPD_VIP_TEST_NETNS"

// inNetns runs the calling test again in a new network namespace, as a
// child process (L2 works in its process's namespace, and every thread of
// the child is in the new one), and returns false: the caller returns. In
// the child it returns true: the caller runs the test.
func inNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(nsEnv) != "" {
		return true
	}
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	ns := "vipw-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var run []string
	for _, part := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run", strings.Join(run, "/"), "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), nsEnv+"="+ns)
	out, err := cmd.CombinedOutput()
	t.Logf("in netns %s:\n%s", ns, out)
	if err != nil {
		t.Fatalf("test in netns %s: %v", ns, err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("test in netns %s did not pass", ns)
	}
	return false
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// bound reports whether addr is on the interface named ifname.
func bound(t *testing.T, ifname string, addr netip.Addr) bool {
	t.Helper()
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return false
	}
	as, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			return true
		}
	}
	return false
}

// watchLab is an L2 on veth vw0 (peer vw1) with another veth, other0,
// driven by a Driver that holds vip (elected: no lone-holder probes).
type watchLab struct {
	l2     *L2
	d      *Driver
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	trans []Transition
}

func (w *watchLab) transitions() []Transition {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Transition(nil), w.trans...)
}

func (w *watchLab) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("driver did not stop")
	}
}

func setupLinks(t *testing.T) {
	t.Helper()
	// No duplicate address detection on new interfaces: its end (the
	// link-local address no longer tentative) is a change of the VIP
	// interface's addresses a second after it comes up, and would wake the
	// driver in the middle of a test that asserts it stays asleep.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = exec.Command("ip", "link", "del", "vw0").Run()
	_ = exec.Command("ip", "link", "del", "vw9").Run()
	_ = exec.Command("ip", "link", "del", "other0").Run()
	ipCmd(t, "link", "add", "vw0", "type", "veth", "peer", "name", "vw1")
	ipCmd(t, "link", "add", "other0", "type", "veth", "peer", "name", "other1")
	for _, l := range []string{"lo", "vw0", "vw1", "other0", "other1"} {
		ipCmd(t, "link", "set", l, "up")
	}
	ipCmd(t, "addr", "add", "10.0.0.1/24", "dev", "vw0")
	waitLinkLocal(t, "vw0")
}

// waitLinkLocal waits for the interface's IPv6 link-local address (added
// once its carrier is up): the neighbour probe is sent from it.
func waitLinkLocal(t *testing.T, ifname string) {
	t.Helper()
	waitFor(t, ifname+" link-local address", 5*time.Second, func() bool {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return false
		}
		as, _ := netlink.AddrList(link, netlink.FAMILY_V6)
		for _, a := range as {
			if a.IP.IsLinkLocalUnicast() {
				return true
			}
		}
		return false
	})
}

func startWatchLab(t *testing.T, log *slog.Logger) *watchLab {
	t.Helper()
	setupLinks(t)
	l2, err := NewL2(L2Options{Interface: "vw0", ProbeTimeout: 50 * time.Millisecond}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &watchLab{l2: l2, done: make(chan struct{})}
	w.d, err = NewDriver(New([]netip.Prefix{v4, v6}, Options{Elect: true, Announce: true, Check: true}), l2, log, nil, DriverOptions{
		Mode: "l2", OnTransition: func(tr Transition) { w.mu.Lock(); w.trans = append(w.trans, tr); w.mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() { w.d.Run(ctx, 5*time.Second); close(w.done) }()
	t.Cleanup(func() { cancel(); <-w.done })
	w.d.Send(HealthChanged{Healthy: true, Reason: "test"})
	w.d.Send(Elected{VIP: v4, Holder: true, Reason: "test"})
	w.d.Send(Elected{VIP: v6, Holder: true, Reason: "test"})
	waitFor(t, "VIPs bound", 5*time.Second, func() bool { return bound(t, "vw0", v4.Addr()) && bound(t, "vw0", v6.Addr()) })
	// The watch is live once it asked for its first reconcile; give it
	// the time to settle.
	waitFor(t, "a reconcile from the watch", 5*time.Second, func() bool { return w.d.reconciles.Load() >= 2 })
	time.Sleep(300 * time.Millisecond)
	// The watch is live: no polling (every second without it), so what
	// happens within a second or two below is the watch's doing.
	w.quietFor(t, 1200*time.Millisecond, "idle holder with a live watch")
	return w
}

// settle waits until the driver has not reconciled for twice watchGap
// plus a margin (the echo of its own kernel change has been handled).
func (w *watchLab) settle(t *testing.T) {
	t.Helper()
	const still = 2*watchGap + 200*time.Millisecond
	deadline := time.Now().Add(5 * time.Second)
	for last, since := w.d.reconciles.Load(), time.Now(); time.Since(since) < still; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the driver kept reconciling for 5 s (%d reconciles)", w.d.reconciles.Load())
		}
		if r := w.d.reconciles.Load(); r != last {
			last, since = r, time.Now()
		}
	}
}

// quiet asserts that nothing makes the driver reconcile for a while (the
// watch is live: the backstop is WatchedReconcileEvery away).
func (w *watchLab) quietFor(t *testing.T, d time.Duration, what string) {
	t.Helper()
	r0 := w.d.reconciles.Load()
	time.Sleep(d)
	if r := w.d.reconciles.Load() - r0; r != 0 {
		t.Fatalf("%s: %d reconciles in %v, want none", what, r, d)
	}
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestL2Watch: the l2 driver sees changes of its interface and addresses
// in the kernel as they happen, and nothing else wakes it.
//
// Each subtest runs in a network namespace of its own, in a process of its
// own (separate namespaces, caches and goroutines). "interface deleted and
// created again" also binds the IPv6 VIP on the new interface: Go caches
// interface names (IPv6 zones) for up to a minute, and NDP addressed by
// name sent to the old index (ndpInterface).
func TestL2Watch(t *testing.T) {
	// The interval a change must beat by far: without the watch it would
	// wait for the 10 s backstop. Generous for a loaded machine.
	const soon = 2 * time.Second
	nsRun := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			if inNetns(t) {
				f(t)
			}
		})
	}

	nsRun("addresses on another interface do not wake the driver", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		ipCmd(t, "addr", "add", "192.0.2.1/24", "dev", "other0")
		ipCmd(t, "addr", "add", "fd00:2::1/64", "dev", "other0", "nodad")
		ipCmd(t, "link", "set", "other0", "down")
		ipCmd(t, "link", "set", "other0", "up")
		ipCmd(t, "addr", "del", "192.0.2.1/24", "dev", "other0")
		w.quietFor(t, time.Second, "changes on other0")
		// The same on the VIP interface does wake it.
		r0 := w.d.reconciles.Load()
		ipCmd(t, "addr", "add", "192.0.2.9/32", "dev", "vw0")
		waitFor(t, "reconcile after an address added on vw0", soon, func() bool { return w.d.reconciles.Load() > r0 })
		w.stop(t)
	})

	nsRun("a VIP deleted by another program comes back at once", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		for i, v := range []netip.Prefix{v4, v4, v4, v6, v6} {
			start := time.Now()
			ipCmd(t, "addr", "del", v.String(), "dev", "vw0")
			took := waitFor(t, v.String()+" re-added", soon, func() bool { return bound(t, "vw0", v.Addr()) })
			t.Logf("deletion %d (%s): re-added after %v (from before the ip command: %v)", i+1, v, took, time.Since(start))
		}
		w.stop(t)
		if bound(t, "vw0", v4.Addr()) || bound(t, "vw0", v6.Addr()) {
			t.Fatal("VIP left bound after stop")
		}
	})

	nsRun("a VIP added by hand on a node that does not hold it goes at once", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		w.d.Send(Elected{VIP: v4, Holder: false, Reason: "test: another node"})
		waitFor(t, "VIP released", soon, func() bool { return !bound(t, "vw0", v4.Addr()) })
		// The watch reports the driver's own unbind too: one reconcile
		// follows it, later than the address is gone when the machine
		// is loaded. Let it pass before asserting quiet.
		w.settle(t)
		w.quietFor(t, 1200*time.Millisecond, "released, watch live")
		ipCmd(t, "addr", "add", "10.0.0.100/24", "dev", "vw0", "label", "vw0:kv")
		took := waitFor(t, "stray VIP removed", soon, func() bool { return !bound(t, "vw0", v4.Addr()) })
		t.Logf("stray VIP removed after %v", took)
		// The node's own address in that subnet is still there.
		if !bound(t, "vw0", netip.MustParseAddr("10.0.0.1")) {
			t.Fatal("the node's own address went with the stray VIP")
		}
		w.stop(t)
	})

	nsRun("interface down: the check fails at once", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		n := len(w.transitions())
		ipCmd(t, "link", "set", "vw0", "down")
		took := waitFor(t, "failed transition after the interface went down", soon, func() bool {
			for _, tr := range w.transitions()[n:] {
				if tr.Failed && strings.Contains(tr.Cause, "interface down") {
					return true
				}
			}
			return false
		})
		t.Logf("link down seen after %v", took)
		if bound(t, "vw0", v4.Addr()) {
			t.Fatal("VIP still bound on a down interface")
		}
		ipCmd(t, "link", "set", "vw0", "up")
		waitFor(t, "VIP bound again after the interface came up", 10*time.Second, func() bool { return bound(t, "vw0", v4.Addr()) })
		w.stop(t)
	})

	nsRun("carrier lost: the check fails at once", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		n := len(w.transitions())
		ipCmd(t, "link", "set", "vw1", "down") // the peer: vw0 loses its carrier
		waitFor(t, "failed transition after the carrier was lost", soon, func() bool {
			for _, tr := range w.transitions()[n:] {
				if tr.Failed {
					return true
				}
			}
			return false
		})
		ipCmd(t, "link", "set", "vw1", "up")
		waitFor(t, "VIP bound again with the carrier back", 10*time.Second, func() bool { return bound(t, "vw0", v4.Addr()) })
		w.stop(t)
	})

	nsRun("interface renamed: the VIP leaves it", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		n := len(w.transitions())
		// Linux renames only a down interface: down, rename, up at once.
		cmd := exec.Command("ip", "-batch", "-")
		cmd.Stdin = strings.NewReader("link set vw0 down\nlink set vw0 name vw9\nlink set vw9 up\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rename: %v: %s", err, out)
		}
		waitFor(t, "failed transition after the rename", soon, func() bool {
			for _, tr := range w.transitions()[n:] {
				if tr.Failed {
					return true
				}
			}
			return false
		})
		waitFor(t, "VIP gone from the renamed interface", soon, func() bool { return !bound(t, "vw9", v4.Addr()) })
		// It stays gone while the configured name does not exist.
		time.Sleep(3 * time.Second)
		if bound(t, "vw9", v4.Addr()) {
			t.Fatal("VIP bound again on the renamed interface")
		}
		// Renamed back: held again, and its addresses watched.
		cmd = exec.Command("ip", "-batch", "-")
		cmd.Stdin = strings.NewReader("link set vw9 down\nlink set vw9 name vw0\nlink set vw0 up\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rename back: %v: %s", err, out)
		}
		waitFor(t, "VIP bound after the name came back", 10*time.Second, func() bool { return bound(t, "vw0", v4.Addr()) })
		time.Sleep(200 * time.Millisecond)
		ipCmd(t, "addr", "del", v4.String(), "dev", "vw0")
		waitFor(t, "VIP re-added on the renamed-back interface", soon, func() bool { return bound(t, "vw0", v4.Addr()) })
		w.stop(t)
	})

	nsRun("interface deleted and created again", func(t *testing.T) {
		w := startWatchLab(t, testLog(t))
		n := len(w.transitions())
		ipCmd(t, "link", "del", "vw0")
		waitFor(t, "failed transition after the interface was deleted", soon, func() bool {
			for _, tr := range w.transitions()[n:] {
				if tr.Failed {
					return true
				}
			}
			return false
		})
		ipCmd(t, "link", "add", "vw0", "type", "veth", "peer", "name", "vw1")
		ipCmd(t, "link", "set", "vw0", "up")
		ipCmd(t, "link", "set", "vw1", "up")
		ipCmd(t, "addr", "add", "10.0.0.1/24", "dev", "vw0") // the ARP probe's sender
		waitLinkLocal(t, "vw0")
		waitFor(t, "VIPs bound on the new interface", 10*time.Second, func() bool { return bound(t, "vw0", v4.Addr()) && bound(t, "vw0", v6.Addr()) })
		// The new interface (another index) is the one watched now.
		time.Sleep(200 * time.Millisecond)
		ipCmd(t, "addr", "del", v4.String(), "dev", "vw0")
		waitFor(t, "VIP re-added on the new interface", soon, func() bool { return bound(t, "vw0", v4.Addr()) })
		w.stop(t)
	})

	nsRun("subscription lost: polling, then subscribed again", func(t *testing.T) {
		setupLinks(t)
		l2, err := NewL2(L2Options{Interface: "vw0"}, testLog(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		l2.watchRcvBuf = 1 // the kernel's minimum: a burst of notifications overflows it
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch := l2.Watch(ctx)
		next := func(what string) WatchEvent {
			t.Helper()
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatalf("%s: watch closed", what)
				}
				return ev
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no event", what)
			}
			return WatchEvent{}
		}
		if ev := next("subscribed"); !ev.Live {
			t.Fatal("first event not live")
		}
		var batch strings.Builder
		for i := range 250 {
			batch.WriteString("addr add 198.18." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + "/32 dev other0\n")
		}
		for i := range 250 {
			batch.WriteString("addr del 198.18." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + "/32 dev other0\n")
		}
		sawLost := false
		for try := 0; try < 10 && !sawLost; try++ {
			cmd := exec.Command("ip", "-batch", "-")
			cmd.Stdin = strings.NewReader(batch.String())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("flood: %v: %s", err, out)
			}
			deadline := time.After(2 * time.Second)
		drain:
			for {
				select {
				case ev, ok := <-ch:
					if !ok {
						t.Fatal("watch closed")
					}
					if !ev.Live {
						sawLost = true
						break drain
					}
				case <-deadline:
					break drain
				}
			}
		}
		if !sawLost {
			t.Fatal("ten floods of 500 address notifications never overflowed a minimal socket buffer")
		}
		// Back within the back-off, and reporting changes again.
		for ev := next("subscribed again"); !ev.Live; ev = next("subscribed again") {
		}
		time.Sleep(300 * time.Millisecond)
		for len(ch) > 0 {
			<-ch
		}
		ipCmd(t, "addr", "add", "192.0.2.9/32", "dev", "vw0")
		if ev := next("address added after re-subscribing"); !ev.Live {
			t.Fatal("not live after re-subscribing")
		}
	})

	nsRun("cancel stops every goroutine", func(t *testing.T) {
		setupLinks(t)
		before := runtime.NumGoroutine()
		l2, err := NewL2(L2Options{Interface: "vw0"}, testLog(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ch := l2.Watch(ctx)
		if ev := <-ch; !ev.Live {
			t.Fatal("first event not live")
		}
		// A notification in flight while stopping.
		ipCmd(t, "addr", "add", "192.0.2.9/32", "dev", "vw0")
		if during := runtime.NumGoroutine(); during <= before {
			t.Fatalf("%d goroutines while watching, %d before: the test cannot see them", during, before)
		}
		cancel()
		waitFor(t, "watch channel closed", 5*time.Second, func() bool {
			select {
			case _, ok := <-ch:
				return !ok
			default:
				return false
			}
		})
		waitFor(t, "goroutines back to "+strconv.Itoa(before), 5*time.Second, func() bool { return runtime.NumGoroutine() <= before })
	})
}

// TestNetInterface: the net.Interface built from netlink's description of
// a link (upLink) is what net.InterfaceByName reads from the kernel, for a
// link up and down, with its MAC and MTU changed.
func TestNetInterface(t *testing.T) {
	if !inNetns(t) {
		return
	}
	setupLinks(t)
	check := func(what string) {
		t.Helper()
		link, err := netlink.LinkByName("vw0")
		if err != nil {
			t.Fatal(err)
		}
		want, err := net.InterfaceByName("vw0")
		if err != nil {
			t.Fatal(err)
		}
		if got := netInterface(link.Attrs()); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: netInterface = %+v, net.InterfaceByName = %+v", what, got, want)
		}
	}
	check("up")
	ipCmd(t, "link", "set", "vw0", "mtu", "1400", "address", "02:00:00:00:0a:01")
	check("new MTU and MAC")
	ipCmd(t, "link", "set", "vw0", "down")
	check("down")
}
