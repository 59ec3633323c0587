package packaging

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// standInKubelet is a unit named like the kubelet that serves the health
// URL (/livez) and the port behind the VIP, so the packaged vipd.service's
// own ordering (After=kubelet.service) decides the stop order, as on a
// kubeadm node where the kubelet runs the apiserver.
const standInKubelet = `[Unit]
Description=stand-in kubelet serving the apiserver for the vipd reboot test

[Service]
ExecStart=/usr/local/bin/fake-apiserver -listen 0.0.0.0:6443 -name n1

[Install]
WantedBy=multi-user.target
`

// rebootHandsOver is issue 28's "a reboot of the holder node under
// systemd without one (failed connection attempt)": the holder n1 is the
// deb's vipd.service in a container booted with systemd, on a lab bridge
// with two more vipd nodes (the same binary, plain lab namespaces) and a
// client that opens a TCP+TLS connection to VIP:6443 every 10 ms. The
// container is rebooted with `systemctl reboot` (systemd-nspawn boots it
// again): vipd must hand the VIP over make-before-break before the
// stand-in kubelet (and with it the port) stops, with no failed attempt,
// leave nothing in the container's network namespace, and, booted again,
// join without taking the VIP back.
func rebootHandsOver(ctx context.Context, t *testing.T, repo, deb string) {
	start := time.Now()
	root := rootfs(ctx, t, repo)
	l := lab.New(t, lab.Options{Nodes: 3, Client: true})
	n1, vip := l.Nodes[0], l.VIP4(60)

	// The root: the stand-in kubelet, a persistent journal (both boots,
	// read from the host), the lab's gossip key, the configuration.
	bin := filepath.Join(root, "usr", "local", "bin", "fake-apiserver")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./test/packaging/fakeapiserver")
	cmd.Dir, cmd.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build fake apiserver: %v\n%s", err, out)
	}
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	must(t, os.WriteFile(filepath.Join(unitDir, "kubelet.service"), []byte(standInKubelet), 0o644))
	must(t, os.MkdirAll(filepath.Join(unitDir, "multi-user.target.wants"), 0o755))
	must(t, os.Symlink("/etc/systemd/system/kubelet.service", filepath.Join(unitDir, "multi-user.target.wants", "kubelet.service")))
	journalDir := filepath.Join(root, "var", "log", "journal")
	must(t, os.MkdirAll(journalDir, 0o755))
	keyFile, err := l.GossipKey()
	must(t, err)
	key, err := os.ReadFile(keyFile)
	must(t, err)
	must(t, os.MkdirAll(filepath.Join(root, "etc", "vipd"), 0o750))
	must(t, os.WriteFile(filepath.Join(root, "etc", "vipd", "gossip.key"), key, 0o600))
	common := []string{"VIPD_ADDRESS=" + vip.String() + "/32", "VIPD_HEALTH_INTERVAL=200ms", "VIPD_FAIL_THRESHOLD=3"}
	env := strings.Join(append(common, "VIPD_NODE_NAME=n1", "VIPD_INTERFACE=eth0", "VIPD_PEERS="+l.Peers(n1),
		"VIPD_GOSSIP_KEY_FILE=/etc/vipd/gossip.key", "VIPD_LOG_LEVEL=debug"), "\n") + "\n"
	must(t, os.WriteFile(filepath.Join(root, "etc", "vipd", "vipd.env"), []byte(env), 0o640))
	run(ctx, t, "cp", deb, filepath.Join(root, "root", "vipd.deb"))

	// n1's namespace is the container's: the monitor and the kernel checks
	// see what vipd.service does.
	c := bootWith(ctx, t, root, n1.NS, l.StartCommand)
	if st := c.show(ctx, t, "kubelet.service", "ActiveState"); st != "active" {
		t.Fatalf("stand-in kubelet %s:\n%s", st, c.journal(ctx, "kubelet.service"))
	}
	// A configuration in place before the install: vipd starts at install.
	c.must(ctx, t, "dpkg", "-i", "--force-confold", "/root/vipd.deb")
	if st := c.show(ctx, t, "vipd", "ActiveState"); st != "active" {
		t.Fatalf("vipd %s after install:\n%s", st, c.journal(ctx, "vipd"))
	}
	t.Logf("root ready, booted and vipd installed in %v", time.Since(start).Round(time.Millisecond))

	// n2 and n3: the packaged binary in plain lab namespaces.
	vipdBin := filepath.Join(root, "usr", "bin", "vipd")
	procs := map[string]*lab.Proc{}
	for _, n := range l.Nodes[1:] {
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
		p, err := n.StartVipd(vipdBin, append(common, "VIPD_PEERS="+l.Peers(n))...)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	mon, err := l.Monitor(vip)
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("holders:\n%s", mon)
			for name, p := range procs {
				t.Logf("--- vipd %s:\n%s", name, lastLines(p.Output(), 60))
			}
			out, _ := exec.Command("journalctl", "-D", journalDir, "--no-pager", "-o", "short-precise", "-u", "vipd.service", "-u", "kubelet.service").CombinedOutput()
			t.Logf("--- container journal (vipd, kubelet):\n%s", lastLines(string(out), 200))
		}
	})
	holder, err := mon.WaitStable(ctx, time.Second)
	if err != nil {
		t.Fatalf("no stable holder: %v", err)
	}
	if holder != "n1" {
		// Make the container the holder (a planned handover).
		out, err := exec.CommandContext(ctx, vipdBin, "handover", "--state-dir", l.Node(holder).StateDir(), "--to", "n1").CombinedOutput()
		if err != nil {
			t.Fatalf("vipd handover --to n1 on %s: %v\n%s", holder, err, out)
		}
		if holder, err = mon.WaitStable(ctx, time.Second); err != nil || holder != "n1" {
			t.Fatalf("holder %q (%v) after a handover to n1", holder, err)
		}
	}

	prober := startConnProber(l.Client, vip.String()+":6443", 10*time.Millisecond)
	t.Cleanup(prober.stop)
	deadline := time.Now().Add(10 * time.Second)
	for !answered(prober.attempts(), "n1") {
		if time.Now().After(deadline) {
			t.Fatalf("the client never reached n1 through the VIP")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The reboot. systemctl returns once the job is queued. The container's
	// systemd stops every unit and exits with status 133, "reboot";
	// systemd-nspawn passes that on, and systemd-nspawn@.service on a host
	// (RestartForceExitStatus=133) boots the same root again: so does the
	// test.
	offAt := time.Now()
	if out, err := c.exec(ctx, "systemctl", "reboot"); err != nil {
		t.Fatalf("systemctl reboot: %v\n%s", err, out)
	}
	select {
	case err := <-c.done:
		c.done <- err // the container's cleanup waits for it too
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 133 {
			t.Fatalf("systemd-nspawn exited with %v at the reboot, want exit status 133 (reboot)", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the container did not shut down within 60 s of systemctl reboot")
	}
	downAt := time.Now()
	c = bootWith(ctx, t, root, n1.NS, l.StartCommand)
	if st := c.show(ctx, t, "vipd", "ActiveState"); st != "active" {
		t.Errorf("vipd %s after the reboot:\n%s", st, c.journal(ctx, "vipd"))
	}
	upAt := time.Now()
	// The rebooted node joins without taking the VIP back (no preemption):
	// give it a few health intervals and gossip rounds.
	time.Sleep(2 * time.Second)
	if out, _ := c.exec(ctx, "journalctl", "-b", "--no-pager", "-o", "cat", "-u", "vipd"); !regexp.MustCompile(`msg="member joined".* member=n[23] `).MatchString(out) {
		t.Errorf("the rebooted vipd did not rejoin n2 or n3:\n%s", lastLines(out, 40))
	}
	prober.stop()
	end := time.Now()
	t.Logf("systemctl reboot: container down after %v, booted again (systemd running) after %v",
		downAt.Sub(offAt).Round(time.Millisecond), upAt.Sub(offAt).Round(time.Millisecond))

	ans := prober.attempts()
	var failed, cut int
	var lastN1, firstOther, lastOK time.Time
	var gap time.Duration
	for _, a := range ans {
		switch {
		case a.node == "" && a.cut:
			cut++
			t.Logf("attempt sent %s cut in flight after %v: %s", a.sent.Format("15:04:05.000"), a.rtt.Round(time.Millisecond), a.err)
		case a.node == "":
			failed++
			if failed <= 5 {
				t.Logf("attempt sent %s unanswered after %v: %s", a.sent.Format("15:04:05.000"), a.rtt.Round(time.Millisecond), a.err)
			}
		case a.node == "n1":
			lastN1 = a.sent
		case firstOther.IsZero():
			firstOther = a.sent
		}
		if a.node != "" {
			if !lastOK.IsZero() && a.sent.After(offAt) && a.sent.Sub(lastOK) > gap {
				gap = a.sent.Sub(lastOK)
			}
			lastOK = a.sent
		}
	}
	holders := mon.Samples()
	newHolder := ""
	if len(holders) > 0 {
		newHolder = strings.Join(holders[len(holders)-1].Holders, ",")
	}
	none := mon.Longest(offAt, end, func(n int) bool { return n == 0 })
	overlap := mon.Longest(offAt, end, func(n int) bool { return n == 2 })
	t.Logf("reboot of the holder n1: %d attempts, %d unanswered, %d cut in flight; longest gap between answered attempts %v; "+
		"last answer by n1 %v after systemctl reboot, first by the successor %v after; holders: none for %v, two (make-before-break) for %v; holder after the reboot %s",
		len(ans), failed, cut, gap.Round(time.Millisecond),
		lastN1.Sub(offAt).Round(time.Millisecond), firstOther.Sub(offAt).Round(time.Millisecond),
		none.Round(time.Millisecond), overlap.Round(time.Millisecond), newHolder)
	// A failed attempt is one nobody answered (refused, or timed out before
	// a connection was established), as in test/maintenance. A connection
	// in flight at the move (opened to n1, rerouted to the successor by its
	// gratuitous ARP, which resets it) is cut: counted and printed, not
	// asserted, as there.
	if failed > 0 {
		t.Errorf("%d of %d connection attempts were not answered across the reboot of the holder", failed, len(ans))
	}
	if gap > time.Second {
		t.Errorf("the client went %v without an answer across the reboot (a planned handover: at most 1 s, as in test/maintenance)", gap)
	}
	if newHolder != "n2" && newHolder != "n3" {
		t.Errorf("holder %q after n1 rebooted, want n2 or n3 (the rebooted node must not take the VIP back)", newHolder)
	}
	if none > 0 {
		t.Errorf("no node held the VIP for %v across the reboot (want a make-before-break handover)", none)
	}
	if answered(answersFrom(ans, downAt), "n1") {
		t.Errorf("n1 answered the client after its reboot began (it took the VIP back?)")
	}

	// The journal (kept on the root's disk, both boots): vipd handed over at stop, and
	// before the stand-in kubelet was stopped.
	out, err := exec.CommandContext(ctx, "journalctl", "-D", journalDir, "--no-pager", "-o", "cat").CombinedOutput()
	if err != nil {
		t.Fatalf("journalctl -D: %v\n%s", err, out)
	}
	journal := string(out)
	handed := regexp.MustCompile(`handed over at stop.*vip=` + regexp.QuoteMeta(vip.String()) + `/32 to=(n2|n3)`).FindStringIndex(journal)
	kubeletStop := strings.Index(journal, "Stopping kubelet.service")
	if kubeletStop < 0 {
		kubeletStop = strings.Index(journal, "Stopping stand-in kubelet")
	}
	switch {
	case handed == nil:
		t.Errorf("the container's vipd did not log `handed over at stop ... to=n2|n3`")
	case kubeletStop < 0:
		t.Errorf("the container's journal has no stop of the stand-in kubelet")
	case kubeletStop < handed[0]:
		t.Errorf("the stand-in kubelet was stopped before vipd handed the VIP over")
	}
	for _, bad := range []string{"no handover at stop", "handover at stop did not finish", "State 'stop-sigterm' timed out"} {
		if strings.Contains(journal, bad) {
			t.Errorf("the container's journal says %q", bad)
		}
	}

	// Nothing left in the container's network namespace: the rebooted
	// vipd, a follower, binds nothing, so whatever is there was left by
	// the one that stopped. (l2 mode installs no nftables and no routes
	// of its own; the VIP's local route goes with the address.)
	if addrs, err := n1.Output(ctx, "ip", "-o", "addr", "show"); err != nil || strings.Contains(string(addrs), " "+vip.String()+"/") {
		t.Errorf("the VIP is still in the container's namespace (%v):\n%s", err, addrs)
	}
	if rules, err := n1.Output(ctx, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(string(rules)) != "" {
		t.Errorf("nftables left in the container's namespace (%v):\n%s", err, rules)
	}
	if routes, err := n1.Output(ctx, "ip", "route", "show", "table", "all", "match", vip.String()+"/32"); err != nil || strings.Contains(string(routes), vip.String()+" ") {
		t.Errorf("routes for the VIP left in the container's namespace (%v):\n%s", err, routes)
	}
	t.Logf("reboot test total %v", time.Since(start).Round(time.Millisecond))
}

// connProber opens a fresh TCP connection to an address every period from
// a host, then TLS and GET /probe, and records who answered (the lab's
// fake apiservers answer their node name), as test/maintenance's prober
// does: cut tells a failure after the connection was established.
type connProber struct {
	mu     sync.Mutex
	tries  []attempt
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type attempt struct {
	sent time.Time
	node string // "" when it failed
	cut  bool
	err  string
	rtt  time.Duration
}

func startConnProber(h *lab.Host, addr string, period time.Duration) *connProber {
	ctx, cancel := context.WithCancel(context.Background())
	p := &connProber{cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			p.wg.Add(1)
			go func(sent time.Time) {
				defer p.wg.Done()
				a := attempt{sent: sent}
				var err error
				// Not ctx: stop lets the attempts in flight finish.
				a.node, a.cut, err = probeOnce(context.Background(), h, addr)
				if err != nil {
					a.node, a.err = "", err.Error()
				}
				a.rtt = time.Since(sent)
				p.mu.Lock()
				p.tries = append(p.tries, a)
				p.mu.Unlock()
			}(time.Now())
		}
	}()
	return p
}

func probeOnce(ctx context.Context, h *lab.Host, addr string) (node string, cut bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn net.Conn
	if err := h.Run(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	}); err != nil {
		return "", false, err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the lab's self-signed stand-ins
	if _, err := fmt.Fprintf(tc, "GET /probe HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n"); err != nil {
		return "", true, err
	}
	b, _ := io.ReadAll(io.LimitReader(tc, 4<<10))
	head, body, _ := strings.Cut(string(b), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200") {
		return "", true, fmt.Errorf("answer %q", strings.SplitN(head, "\r\n", 2)[0])
	}
	return strings.TrimSpace(body), true, nil
}

// stop ends the attempts and waits for those in flight (at most 2 s).
func (p *connProber) stop() {
	p.cancel()
	p.wg.Wait()
}

// attempts returns the attempts so far, ordered by send time.
func (p *connProber) attempts() []attempt {
	p.mu.Lock()
	a := append([]attempt(nil), p.tries...)
	p.mu.Unlock()
	sort.Slice(a, func(i, j int) bool { return a[i].sent.Before(a[j].sent) })
	return a
}

func answersFrom(ans []attempt, from time.Time) []attempt {
	var r []attempt
	for _, a := range ans {
		if !a.sent.Before(from) {
			r = append(r, a)
		}
	}
	return r
}

func answered(ans []attempt, node string) bool {
	for _, a := range ans {
		if a.node == node {
			return true
		}
	}
	return false
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
