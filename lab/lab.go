// Package lab builds throwaway network-namespace topologies for vipd's
// integration tests, `make demo` and `make bench`.
//
// A lab is a bridge living in its own namespace, N node namespaces and an
// optional client namespace, each joined to the bridge by a veth pair whose
// inside end is called eth0. Nothing is connected to the host's interfaces:
// every frame a lab sees was sent by a process the lab started. Addresses
// come from 10.x.y.0/24 and fd00:x:y::/64, chosen per lab so that labs in
// parallel test packages do not collide.
//
// Everything the lab creates (namespaces, processes) is removed by Close,
// which New registers with the test's Cleanup.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// Options shape a lab.
type Options struct {
	Nodes  int  // node namespaces n1..nN
	Client bool // a client namespace "c"
	// Extra adds more named hosts on the bridge (e.g. "r" for a router).
	Extra []string
}

// Host is one namespace attached to the lab bridge through eth0.
type Host struct {
	Name  string // short name in the lab: n1, n2, c, r
	NS    string // network namespace name (ip netns)
	Link  string // interface inside the namespace: eth0
	Peer  string // the veth end in the bridge namespace
	IPv4  netip.Addr
	IPv6  netip.Addr
	MAC   net.HardwareAddr
	Index int // position on the bridge, 1-based; node hosts use 1..N
	lab   *Lab
}

// Lab is a running topology.
type Lab struct {
	ID       string // random hex, part of every namespace name
	BridgeNS string
	Nodes    []*Host
	Client   *Host
	Extra    map[string]*Host
	Prefix4  netip.Prefix
	Prefix6  netip.Prefix
	procsMu  sync.Mutex
	closers  []func()
	hosts    []*Host
	closed   bool
	closeErr error
	spawn    chan func()
}

// TB is the part of testing.TB the lab uses; demo and bench pass their own.
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// New creates a lab and registers its teardown with tb.Cleanup.
func New(tb TB, opts Options) *Lab {
	tb.Helper()
	l, err := Create(opts)
	if err != nil {
		tb.Fatalf("lab: %v", err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Logf("lab close: %v", err)
		}
	})
	return l
}

// Create builds a lab without a test; the caller must Close it.
func Create(opts Options) (*Lab, error) {
	if opts.Nodes < 0 || opts.Nodes > 60 {
		return nil, fmt.Errorf("lab: nodes must be 0..60, got %d", opts.Nodes)
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(b[:])
	// 10.<200+b0%50>.<b1>.0/24 and fd00:<b0b1>:<b2>::/64 keep parallel labs apart.
	p4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200 + b[0]%50, b[1], 0}), 24)
	p6 := netip.MustParsePrefix(fmt.Sprintf("fd00:%02x%02x:%02x::/64", b[0], b[1], b[2]))
	l := &Lab{ID: id, BridgeNS: "vl" + id + "br", Prefix4: p4, Prefix6: p6, Extra: map[string]*Host{}, spawn: make(chan func())}
	go l.spawner()
	if err := l.build(opts); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(opts Options) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ip(ctx, "netns", "add", l.BridgeNS); err != nil {
		return err
	}
	cmds := [][]string{
		{"-n", l.BridgeNS, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", l.BridgeNS, "link", "set", "br0", "up"},
		{"-n", l.BridgeNS, "link", "set", "lo", "up"},
	}
	for _, c := range cmds {
		if err := ip(ctx, c...); err != nil {
			return err
		}
	}
	idx := 0
	add := func(name string) (*Host, error) {
		idx++
		return l.addHost(ctx, name, idx)
	}
	for i := 1; i <= opts.Nodes; i++ {
		h, err := add(fmt.Sprintf("n%d", i))
		if err != nil {
			return err
		}
		l.Nodes = append(l.Nodes, h)
	}
	if opts.Client {
		// The client sits at .200 so node numbering stays 1..N.
		idx = 199
		h, err := add("c")
		if err != nil {
			return err
		}
		l.Client = h
	}
	for i, name := range opts.Extra {
		idx = 219 + i
		h, err := add(name)
		if err != nil {
			return err
		}
		l.Extra[name] = h
	}
	return l.waitIPv6Ready(ctx)
}

func (l *Lab) addHost(ctx context.Context, name string, idx int) (*Host, error) {
	h := &Host{
		Name:  name,
		NS:    "vl" + l.ID + name,
		Link:  "eth0",
		Peer:  "v" + name,
		Index: idx,
		lab:   l,
	}
	a4 := l.Prefix4.Addr().As4()
	a4[3] = byte(idx)
	h.IPv4 = netip.AddrFrom4(a4)
	a6 := l.Prefix6.Addr().As16()
	a6[15] = byte(idx)
	h.IPv6 = netip.AddrFrom16(a6)
	// Locally administered, unicast, lab- and host-specific MAC.
	h.MAC = net.HardwareAddr{0x02, 0x76, l.Prefix6.Addr().As16()[2], l.Prefix6.Addr().As16()[3], l.Prefix6.Addr().As16()[5], byte(idx)}
	l.hosts = append(l.hosts, h)
	if err := ip(ctx, "netns", "add", h.NS); err != nil {
		return nil, err
	}
	cmds := [][]string{
		{"-n", l.BridgeNS, "link", "add", h.Peer, "type", "veth", "peer", "name", h.Link, "netns", h.NS},
		{"-n", l.BridgeNS, "link", "set", h.Peer, "master", "br0"},
		{"-n", l.BridgeNS, "link", "set", h.Peer, "up"},
		{"-n", h.NS, "link", "set", h.Link, "address", h.MAC.String()},
		{"-n", h.NS, "link", "set", "lo", "up"},
		{"-n", h.NS, "addr", "add", netip.PrefixFrom(h.IPv4, 24).String(), "dev", h.Link},
		{"-n", h.NS, "-6", "addr", "add", netip.PrefixFrom(h.IPv6, 64).String(), "dev", h.Link, "nodad"},
		{"-n", h.NS, "link", "set", h.Link, "up"},
	}
	for _, c := range cmds {
		if err := ip(ctx, c...); err != nil {
			return nil, err
		}
	}
	// Short DAD and neighbour timers keep IPv6 link-local set-up fast; the
	// VIP's own duplicate detection is done by vipd's probe, not the kernel's.
	if err := sysctl(ctx, h.NS, "net.ipv6.neigh."+h.Link+".retrans_time_ms", "100"); err != nil {
		return nil, err
	}
	return h, nil
}

// waitIPv6Ready waits until no host has a tentative link-local address.
func (l *Lab) waitIPv6Ready(ctx context.Context) error {
	for _, h := range l.hosts {
		for {
			out, err := h.Output(ctx, "ip", "-6", "addr", "show", "dev", h.Link, "tentative")
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(out)) == "" {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("lab: %s: IPv6 addresses still tentative: %w", h.Name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Close stops every process the lab started and deletes its namespaces.
func (l *Lab) Close() error {
	l.procsMu.Lock()
	if l.closed {
		l.procsMu.Unlock()
		return l.closeErr
	}
	l.closed = true
	closers := l.closers
	l.procsMu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, h := range l.hosts {
		// Kill stragglers started in the namespace by anyone (ip netns pids).
		if out, err := exec.CommandContext(ctx, "ip", "netns", "pids", h.NS).Output(); err == nil {
			for _, pid := range strings.Fields(string(out)) {
				// Our own process shows up when a thread that entered the
				// namespace was the main thread (Go wedges it, never reuses it).
				if pid == strconv.Itoa(os.Getpid()) {
					continue
				}
				_ = exec.CommandContext(ctx, "kill", "-9", pid).Run()
			}
		}
		if err := ip(ctx, "netns", "del", h.NS); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if err := ip(ctx, "netns", "del", l.BridgeNS); err != nil && !strings.Contains(err.Error(), "No such file") {
		errs = append(errs, err)
	}
	close(l.spawn)
	l.closeErr = errors.Join(errs...)
	return l.closeErr
}

// Hosts returns every host in the lab.
func (l *Lab) Hosts() []*Host { return l.hosts }

// VIP4 returns an unused IPv4 address in the lab subnet (.100 + n).
func (l *Lab) VIP4(n int) netip.Addr {
	a := l.Prefix4.Addr().As4()
	a[3] = byte(100 + n)
	return netip.AddrFrom4(a)
}

// VIP6 returns an unused IPv6 address in the lab subnet (::100 + n).
func (l *Lab) VIP6(n int) netip.Addr {
	a := l.Prefix6.Addr().As16()
	a[14] = 0x01
	a[15] = byte(n)
	return netip.AddrFrom16(a)
}

// Command returns a command that runs inside the host's namespace.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Output runs a command in the namespace and returns its standard output.
func (h *Host) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := h.Command(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), h.NS, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// SetLink brings the host's eth0 (as seen from the bridge) up or down. The
// bridge side is used so the node's own view of its interface stays up, like
// a cable pulled at the switch; pass inside=true to down the node's eth0.
func (h *Host) SetLink(ctx context.Context, up, inside bool) error {
	state := "down"
	if up {
		state = "up"
	}
	if inside {
		return ip(ctx, "-n", h.NS, "link", "set", h.Link, state)
	}
	return ip(ctx, "-n", h.lab.BridgeNS, "link", "set", h.Peer, state)
}

// Run calls fn on an OS thread that is switched into the host's namespace.
// Sockets created by fn live in that namespace for their whole life, so a
// listener or dialer made here can be used from any goroutine afterwards.
func (h *Host) Run(fn func() error) error {
	return RunInNS(h.NS, fn)
}

// RunInNS runs fn with the calling goroutine's thread in the named namespace.
func RunInNS(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is never unlocked: it dies with the goroutine, so a
		// thread left in a foreign namespace is never reused.
		target, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen opens a listener inside the host's namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Run(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// spawner starts child processes from one OS thread that lives as long as
// the lab. Children get SIGKILL when the thread that forked them exits
// (Pdeathsig); Go ends threads whose goroutine exits while locked (as
// RunInNS does), so forking from an arbitrary thread would kill children
// at random. This thread ends only when the lab closes.
func (l *Lab) spawner() {
	runtime.LockOSThread()
	for f := range l.spawn {
		f()
	}
}

// StartCommand starts cmd from the lab's spawner thread: use it for any
// child that sets Pdeathsig (see spawner).
func (l *Lab) StartCommand(cmd *exec.Cmd) error { return l.startProcess(cmd) }

// startProcess starts cmd from the spawner thread.
func (l *Lab) startProcess(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	l.spawn <- func() { errc <- cmd.Start() }
	return <-errc
}

// OnClose registers fn to run when the lab closes, before its namespaces
// are deleted (last registered, first run).
func (l *Lab) OnClose(fn func()) {
	l.procsMu.Lock()
	defer l.procsMu.Unlock()
	l.closers = append(l.closers, fn)
}

func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func sysctl(ctx context.Context, ns, key, value string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw", key+"="+value).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s=%s in %s: %w: %s", key, value, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Sysctl sets a sysctl inside the host's namespace.
func (h *Host) Sysctl(ctx context.Context, key, value string) error {
	return sysctl(ctx, h.NS, key, value)
}

// Node returns the node host with the given short name (n1, n2...), or nil.
func (l *Lab) Node(name string) *Host {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Peers returns the IPv4 addresses of every node but self, as a
// VIPD_PEERS value.
func (l *Lab) Peers(self *Host) string {
	var p []string
	for _, n := range l.Nodes {
		if n != self {
			p = append(p, n.IPv4.String())
		}
	}
	return strings.Join(p, ",")
}
