//go:build linux

package bfd

// Integration tests against FRR's bfdd, as root, in network namespaces:
//
//	router namespace (FRR zebra + bfdd)  veth0 <-> veth1  node namespace (bfd.Server)
//	192.0.2.1/24, 2001:db8::1/64                          192.0.2.2/24, 2001:db8::2/64
//
// The Server runs in the test process: NewServer and Add open every socket
// synchronously on the calling goroutine's OS thread, so inNetns runs them
// on a thread locked into the node namespace (netns.Set) and returns the
// thread to the host namespace afterwards. Sockets stay in the namespace
// they were created in, whichever thread later reads or writes them.
//
// Run: go test -run FRR -v ./bfd/   (as root; skipped otherwise, fatal with CI=true)

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/internal/testenv"
)

var (
	rtrV4  = netip.MustParseAddr("192.0.2.1")
	nodeV4 = netip.MustParseAddr("192.0.2.2")
	rtrV6  = netip.MustParseAddr("2001:db8::1")
	nodeV6 = netip.MustParseAddr("2001:db8::2")
)

type frrLab struct {
	t         *testing.T
	rtr, node string // namespace names; rtr is also FRR's pathspace (-N)
	logFile   string
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newFRRLab(t *testing.T) *frrLab {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "vtysh")
	for _, d := range []string{"/usr/lib/frr/zebra", "/usr/lib/frr/bfdd"} {
		if _, err := os.Stat(d); err != nil {
			testenv.Missing(t, "FRR daemon %s (Debian package frr)", d)
		}
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	sfx := hex.EncodeToString(rnd[:])
	l := &frrLab{t: t, rtr: "bfdr-" + sfx, node: "bfdn-" + sfx}

	for _, ns := range []string{l.rtr, l.node} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", l.rtr, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", l.node)
	for _, c := range [][]string{
		{"-n", l.rtr, "addr", "add", "192.0.2.1/24", "dev", "veth0"},
		{"-n", l.rtr, "addr", "add", "2001:db8::1/64", "dev", "veth0", "nodad"},
		{"-n", l.node, "addr", "add", "192.0.2.2/24", "dev", "veth1"},
		{"-n", l.node, "addr", "add", "2001:db8::2/64", "dev", "veth1", "nodad"},
		{"-n", l.rtr, "link", "set", "veth0", "up"},
		{"-n", l.node, "link", "set", "veth1", "up"},
	} {
		run(t, "ip", c...)
	}

	// FRR pathspace: sockets and pid files in /var/run/frr/<rtr>, vtysh.conf
	// in /etc/frr/<rtr>; no config file, everything is configured by vtysh.
	runDir, etcDir := "/var/run/frr/"+l.rtr, "/etc/frr/"+l.rtr
	logDir, err := os.MkdirTemp("", "vipd-bfd-frr-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(logDir, 0o777); err != nil { // the daemons run as user frr
		t.Fatal(err)
	}
	l.logFile = filepath.Join(logDir, "frr.log")
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("VIPD_TEST_FRR_LOG") != "" {
			l.dumpLog()
		}
		os.RemoveAll(logDir)
	})
	for _, d := range []string{runDir, etcDir} {
		run(t, "install", "-d", "-o", "frr", "-g", "frr", "-m", "755", d)
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	if err := os.WriteFile(etcDir+"/vtysh.conf", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.stopFRR(runDir) }) // runs before the namespaces are deleted
	for _, d := range []string{"zebra", "bfdd"} {
		args := []string{"netns", "exec", l.rtr, "/usr/lib/frr/" + d, "-d", "-N", l.rtr, "-F", "traditional",
			"-A", "127.0.0.1"}
		if d == "zebra" {
			args = append(args, "-s", "90000000")
		}
		run(t, "ip", args...)
	}
	waitUntil(t, 10*time.Second, "bfdd to answer vtysh", func() bool {
		out, err := exec.Command("vtysh", "-N", l.rtr, "-c", "show bfd peers json").CombinedOutput()
		return err == nil && strings.HasPrefix(strings.TrimSpace(string(out)), "[")
	})
	l.vtysh("configure terminal", "log timestamp precision 6", "log file "+l.logFile+" debugging")
	l.vtysh("debug bfd peer")
	return l
}

// stopFRR ends the daemons this lab started, by the pids in their pid files.
func (l *frrLab) stopFRR(runDir string) {
	pids, _ := filepath.Glob(runDir + "/*.pid")
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(3 * time.Second)
		for processAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if processAlive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// processAlive is false for a gone or zombie process.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func (l *frrLab) dumpLog() {
	b, err := os.ReadFile(l.logFile)
	if err != nil {
		l.t.Logf("FRR log: %v", err)
		return
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	l.t.Logf("FRR log (tail):\n%s", strings.Join(lines, "\n"))
}

// vtysh runs one vtysh session with the commands in order.
func (l *frrLab) vtysh(cmds ...string) string {
	l.t.Helper()
	args := []string{"-N", l.rtr}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out := run(l.t, "vtysh", args...)
	if strings.Contains(out, "% ") { // vtysh reports command errors with "% "
		l.t.Fatalf("vtysh %q: %s", cmds, out)
	}
	return out
}

// peerCmd is the FRR bfd peer line for a node address.
func peerCmd(node netip.Addr) string {
	local := rtrV4
	if node.Is6() {
		local = rtrV6
	}
	return fmt.Sprintf("peer %s local-address %s interface veth0", node, local)
}

func (l *frrLab) addPeer(node netip.Addr, rxMS, txMS, mult int) {
	l.vtysh("configure terminal", "bfd", peerCmd(node),
		fmt.Sprintf("receive-interval %d", rxMS), fmt.Sprintf("transmit-interval %d", txMS),
		fmt.Sprintf("detect-multiplier %d", mult))
}

func (l *frrLab) peerConfig(node netip.Addr, lines ...string) {
	l.vtysh(append([]string{"configure terminal", "bfd", peerCmd(node)}, lines...)...)
}

func (l *frrLab) deletePeer(node netip.Addr) {
	l.vtysh("configure terminal", "bfd", "no "+peerCmd(node))
}

// frrPeer is the subset of FRR 8.4 `show bfd peers json` we check.
type frrPeer struct {
	Peer                   string `json:"peer"`
	ID                     uint32 `json:"id"`
	RemoteID               uint32 `json:"remote-id"`
	Status                 string `json:"status"`
	Diagnostic             string `json:"diagnostic"`
	RemoteDiagnostic       string `json:"remote-diagnostic"`
	ReceiveInterval        int    `json:"receive-interval"`
	TransmitInterval       int    `json:"transmit-interval"`
	DetectMultiplier       int    `json:"detect-multiplier"`
	RemoteReceiveInterval  int    `json:"remote-receive-interval"`
	RemoteTransmitInterval int    `json:"remote-transmit-interval"`
	RemoteDetectMultiplier int    `json:"remote-detect-multiplier"`
}

func (l *frrLab) peer(node netip.Addr) (frrPeer, bool) {
	l.t.Helper()
	out, err := exec.Command("vtysh", "-N", l.rtr, "-c", "show bfd peers json").Output()
	if err != nil {
		l.t.Fatalf("show bfd peers json: %v", err)
	}
	var peers []frrPeer
	if err := json.Unmarshal(out, &peers); err != nil {
		l.t.Fatalf("parse show bfd peers json: %v\n%s", err, out)
	}
	for _, p := range peers {
		if p.Peer == node.String() {
			return p, true
		}
	}
	return frrPeer{}, false
}

func (l *frrLab) waitPeer(node netip.Addr, timeout time.Duration, what string, ok func(frrPeer) bool) frrPeer {
	l.t.Helper()
	var last frrPeer
	deadline := time.Now().Add(timeout)
	for {
		p, found := l.peer(node)
		last = p
		if found && ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("FRR peer %s: timed out after %v waiting for %s; last %+v", node, timeout, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// silence drops all traffic in and out of the node namespace (the link
// stays up, so only BFD can notice).
func (l *frrLab) silence(on bool) {
	l.t.Helper()
	if on {
		cmd := exec.Command("ip", "netns", "exec", l.node, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(`table inet vipdbfdtest {
  chain in  { type filter hook input  priority 0; policy drop; }
  chain out { type filter hook output priority 0; policy drop; }
}
`)
		if out, err := cmd.CombinedOutput(); err != nil {
			l.t.Fatalf("nft: %v\n%s", err, out)
		}
		return
	}
	run(l.t, "ip", "netns", "exec", l.node, "nft", "delete", "table", "inet", "vipdbfdtest")
}

// frrLogTime returns the time of the first FRR log line after since that
// contains all of subs (FRR logs local time with microseconds).
func (l *frrLab) frrLogTime(since time.Time, subs ...string) (time.Time, bool) {
	f, err := os.Open(l.logFile)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 26 {
			continue
		}
		ts, err := time.ParseInLocation("2006/01/02 15:04:05.000000", line[:26], time.Local)
		if err != nil || ts.Before(since) {
			continue
		}
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			return ts, true
		}
	}
	return time.Time{}, false
}

// inNetns runs fn on an OS thread switched into namespace ns.
func inNetns(t testing.TB, ns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(ns)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and dies with this goroutine
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("in netns %s: %v", ns, err)
	}
}

// startNode runs a Server in the node namespace with sessions to the
// router's addresses.
func (l *frrLab) startNode(cfg SessionConfig, reg prometheus.Registerer, rec *recorder, peers ...netip.Addr) *Server {
	l.t.Helper()
	var srv *Server
	inNetns(l.t, l.node, func() error {
		var err error
		srv, err = NewServer(ServerConfig{OnStateChange: rec.fn, Registerer: reg})
		if err != nil {
			return err
		}
		for _, p := range peers {
			local := nodeV4
			if p.Is6() {
				local = nodeV6
			}
			if err := srv.Add(p, local, cfg); err != nil {
				return err
			}
		}
		return nil
	})
	l.t.Cleanup(func() { srv.Close() })
	return srv
}

func waitStatus(t *testing.T, srv *Server, peer netip.Addr, timeout time.Duration, what string, ok func(PeerStatus) bool) PeerStatus {
	t.Helper()
	var st PeerStatus
	waitUntil(t, timeout, fmt.Sprintf("%s for %s", what, peer), func() bool {
		st, _ = srv.Status(peer)
		return ok(st)
	})
	return st
}

func TestFRRInterop(t *testing.T) {
	testenv.Short(t)
	l := newFRRLab(t)
	// FRR wants 100 ms x 3; we want 300 ms x 3.
	l.addPeer(nodeV4, 100, 100, 3)
	l.addPeer(nodeV6, 100, 100, 3)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	ours := DefaultSessionConfig()
	srv := l.startNode(ours, reg, rec, rtrV4, rtrV6)

	for _, pair := range [][2]netip.Addr{{nodeV4, rtrV4}, {nodeV6, rtrV6}} {
		node, rtr := pair[0], pair[1]
		t.Run("up-negotiated-"+map[bool]string{false: "ipv4", true: "ipv6"}[node.Is6()], func(t *testing.T) {
			p := l.waitPeer(node, 15*time.Second, "up with our 300ms x 3", func(p frrPeer) bool {
				return p.Status == "up" && p.RemoteTransmitInterval == 300 && p.RemoteReceiveInterval == 300
			})
			if p.RemoteDetectMultiplier != 3 || p.ReceiveInterval != 100 || p.TransmitInterval != 100 {
				t.Fatalf("FRR peer %+v", p)
			}
			st := waitStatus(t, srv, rtr, 5*time.Second, "up, poll done", func(s PeerStatus) bool {
				return s.Session.State == StateUp && !s.Session.PollInProgress
			})
			s := st.Session
			// TX max(300, 100) = 300; we wait 3 x max(300, 100); FRR waits 3 x max(100, 300).
			if s.TxInterval != 300*ms || s.DetectionTime != 900*ms || s.RemoteDetectionTime != 900*ms ||
				s.RemoteDesiredMinTx != 100*ms || s.RemoteRequiredMinRx != 100*ms || s.RemoteDetectMult != 3 {
				t.Fatalf("our status %+v", s)
			}
			if s.RemoteDiscriminator != p.ID || s.LocalDiscriminator != p.RemoteID {
				t.Fatalf("discriminators: ours %d/%d, FRR %d/%d", s.LocalDiscriminator, s.RemoteDiscriminator, p.ID, p.RemoteID)
			}
			if v, ok := gaugeValue(t, reg, "vipd_bfd_session_up", rtr.String()); !ok || v != 1 {
				t.Fatalf("vipd_bfd_session_up{peer=%s} = %v", rtr, v)
			}
		})
	}
	if t.Failed() {
		return
	}

	t.Run("poll-final-interval-change", func(t *testing.T) {
		cfg := SessionConfig{DetectMult: 3, DesiredMinTx: 200 * ms, RequiredMinRx: 250 * ms}
		if err := srv.Update(rtrV4, cfg); err != nil {
			t.Fatal(err)
		}
		l.waitPeer(nodeV4, 5*time.Second, "our new intervals", func(p frrPeer) bool {
			return p.Status == "up" && p.RemoteTransmitInterval == 200 && p.RemoteReceiveInterval == 250
		})
		st := waitStatus(t, srv, rtrV4, 5*time.Second, "poll to finish", func(s PeerStatus) bool {
			return !s.Session.PollInProgress && s.Session.TxInterval == 200*ms
		})
		if st.Session.DetectionTime != 750*ms || st.Session.State != StateUp || st.Flaps != 0 {
			t.Fatalf("status after poll %+v", st)
		}
	})

	t.Run("frr-shutdown-and-back", func(t *testing.T) {
		rec.drain()
		l.peerConfig(nodeV4, "shutdown")
		c := rec.waitForPeer(t, rtrV4, StateDown, 3*time.Second)
		if c.peer != rtrV4 || c.old != StateUp || c.diag != DiagNeighborDown {
			t.Fatalf("change %+v, want %s up -> down diag neighbor-signaled-down", c, rtrV4)
		}
		if v, _ := gaugeValue(t, reg, "vipd_bfd_session_up", rtrV4.String()); v != 0 {
			t.Fatalf("vipd_bfd_session_up = %v after down", v)
		}
		l.peerConfig(nodeV4, "no shutdown")
		rec.waitForPeer(t, rtrV4, StateUp, 10*time.Second)
		l.waitPeer(nodeV4, 5*time.Second, "up again", func(p frrPeer) bool { return p.Status == "up" })
		if v, _ := gaugeValue(t, reg, "vipd_bfd_session_flaps_total", rtrV4.String()); v != 1 {
			t.Fatalf("flaps = %v, want 1", v)
		}
	})

	t.Run("frr-recreates-peer", func(t *testing.T) {
		old, _ := l.peer(nodeV4)
		l.deletePeer(nodeV4)
		l.addPeer(nodeV4, 100, 100, 3)
		p := l.waitPeer(nodeV4, 15*time.Second, "re-created peer up", func(p frrPeer) bool { return p.Status == "up" })
		if p.ID == old.ID {
			t.Fatalf("FRR kept discriminator %d; the test needs a new one", p.ID)
		}
		st := waitStatus(t, srv, rtrV4, 5*time.Second, "re-learned discriminator", func(s PeerStatus) bool {
			return s.Session.State == StateUp && s.Session.RemoteDiscriminator == p.ID
		})
		if p.RemoteID != st.Session.LocalDiscriminator {
			t.Fatalf("FRR remote-id %d, our discriminator %d", p.RemoteID, st.Session.LocalDiscriminator)
		}
	})

	t.Run("our-admin-down-and-up", func(t *testing.T) {
		rec.drain()
		if err := srv.SetAdminDown(rtrV6, true); err != nil {
			t.Fatal(err)
		}
		c := rec.waitForPeer(t, rtrV6, StateAdminDown, 2*time.Second)
		if c.diag != DiagAdminDown {
			t.Fatalf("change %+v", c)
		}
		p := l.waitPeer(nodeV6, 2*time.Second, "down after our AdminDown", func(p frrPeer) bool { return p.Status == "down" })
		if p.RemoteDiagnostic != "administratively down" || p.Diagnostic != "neighbor signaled session down" {
			t.Fatalf("FRR peer %+v", p)
		}
		if err := srv.SetAdminDown(rtrV6, false); err != nil {
			t.Fatal(err)
		}
		rec.waitForPeer(t, rtrV6, StateUp, 10*time.Second)
		l.waitPeer(nodeV6, 5*time.Second, "up again", func(p frrPeer) bool { return p.Status == "up" })
	})

	t.Run("close-sends-admin-down", func(t *testing.T) {
		// Both FRR sessions must go down much faster than FRR's detection time.
		start := time.Now()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		for _, node := range []netip.Addr{nodeV4, nodeV6} {
			p := l.waitPeer(node, 5*time.Second, "down after our AdminDown", func(p frrPeer) bool { return p.Status != "up" })
			if p.Diagnostic != "neighbor signaled session down" {
				t.Errorf("FRR peer %s diagnostic %q, want neighbor signaled session down", node, p.Diagnostic)
			}
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("FRR took %v to see the AdminDown", el)
		}
		for _, node := range []netip.Addr{nodeV4, nodeV6} {
			if ts, ok := l.frrLogTime(start, "state-change", "peer:"+node.String(), "up -> down"); ok {
				t.Logf("FRR saw %s go down %v after Close", node, ts.Sub(start).Round(time.Microsecond))
			}
		}
	})

	t.Run("restart-with-new-discriminators", func(t *testing.T) {
		// A restarted vipd has new discriminators while FRR still remembers
		// the old ones: both sides must meet again without waiting for FRR
		// to forget.
		start := time.Now()
		rec2 := newRecorder()
		srv2 := l.startNode(ours, nil, rec2, rtrV4, rtrV6)
		for _, pair := range [][2]netip.Addr{{nodeV4, rtrV4}, {nodeV6, rtrV6}} {
			p := l.waitPeer(pair[0], 10*time.Second, "up with the restarted node", func(p frrPeer) bool { return p.Status == "up" })
			st := waitStatus(t, srv2, pair[1], 5*time.Second, "up", func(s PeerStatus) bool { return s.Session.State == StateUp })
			if p.RemoteID != st.Session.LocalDiscriminator {
				t.Fatalf("FRR remote-id %d, our new discriminator %d", p.RemoteID, st.Session.LocalDiscriminator)
			}
		}
		t.Logf("restarted node Up at FRR after %v", time.Since(start).Round(time.Millisecond))
	})
}

// TestFRRSilentNode drops all of the node's traffic and measures how long
// FRR takes to declare the session down (from its log), at 300 ms x 3 and
// 100 ms x 3. FRR's detection time is 3 x max(its RX 100 ms, our TX).
func TestFRRSilentNode(t *testing.T) {
	testenv.Short(t)
	l := newFRRLab(t)
	l.addPeer(nodeV4, 100, 100, 3)
	rec := newRecorder()
	srv := l.startNode(DefaultSessionConfig(), nil, rec, rtrV4)

	for _, tc := range []struct {
		name string
		cfg  SessionConfig
		det  time.Duration // FRR's detection time
	}{
		{"300ms-x3", DefaultSessionConfig(), 900 * ms},
		{"100ms-x3", SessionConfig{DetectMult: 3, DesiredMinTx: 100 * ms, RequiredMinRx: 100 * ms}, 300 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := srv.Update(rtrV4, tc.cfg); err != nil {
				t.Fatal(err)
			}
			txMS := int(tc.cfg.DesiredMinTx / ms)
			var measured []time.Duration
			for i := range 3 {
				l.waitPeer(nodeV4, 15*time.Second, "up at our interval", func(p frrPeer) bool {
					return p.Status == "up" && p.RemoteTransmitInterval == txMS
				})
				waitStatus(t, srv, rtrV4, 5*time.Second, "up", func(s PeerStatus) bool {
					return s.Session.State == StateUp && !s.Session.PollInProgress
				})
				time.Sleep(300 * ms) // steady state
				rec.drain()
				start := time.Now()
				l.silence(true)
				applied := time.Now() // the drop took effect between start and applied
				l.waitPeer(nodeV4, tc.det+3*time.Second, "down after silence", func(p frrPeer) bool { return p.Status == "down" })
				pollEl := time.Since(start)
				p, _ := l.peer(nodeV4)
				if p.Diagnostic != "control detection time expired" {
					t.Errorf("FRR diagnostic %q, want control detection time expired", p.Diagnostic)
				}
				// Our side times out as well (our detection: 3 x max(our RX, FRR TX 100 ms)).
				// FRR's packets cannot reach us, so no other reason is possible.
				c := rec.waitFor(t, StateDown, 3*time.Second)
				if c.diag != DiagControlDetectExpired {
					t.Errorf("our diag %v, want control-detection-time-expired", c.diag)
				}
				el := pollEl
				if ts, ok := l.frrLogTime(start, "state-change", "peer:"+nodeV4.String(), "up -> down"); ok {
					el = ts.Sub(start)
				} else {
					t.Logf("no FRR log line; using the vtysh polling time")
				}
				measured = append(measured, el)
				t.Logf("run %d: FRR down %v after nft started, %v after it returned", i,
					el.Round(time.Millisecond), (el - applied.Sub(start)).Round(time.Millisecond))
				// FRR counts from the last packet it got, up to one TX interval
				// before the drop; allow a second of scheduling slack (loaded box).
				if afterApplied := el - applied.Sub(start); afterApplied > tc.det+time.Second {
					t.Errorf("run %d: FRR declared down %v after the drop, want about %v", i, afterApplied, tc.det)
				}
				l.silence(false)
				rec.waitFor(t, StateUp, 15*time.Second)
			}
			t.Logf("FRR detection at %s (FRR rx 100ms, ours tx %v, mult 3; theory <= %v): %v", tc.name, tc.cfg.DesiredMinTx, tc.det, measured)
		})
	}
}
