package packaging

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
	c := boot(ctx, t, root, n1.NS)
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

	prober := l.Client.StartProber(vip.String()+":6443", 10*time.Millisecond, time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for !answered(prober.Answers(), "n1") {
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
	c = boot(ctx, t, root, n1.NS)
	if st := c.show(ctx, t, "vipd", "ActiveState"); st != "active" {
		t.Errorf("vipd %s after the reboot:\n%s", st, c.journal(ctx, "vipd"))
	}
	upAt := time.Now()
	// The rebooted node joins without taking the VIP back (no preemption):
	// give it a few health intervals and gossip rounds.
	time.Sleep(2 * time.Second)
	prober.Stop()
	end := time.Now()
	t.Logf("systemctl reboot: container down after %v, booted again (systemd running) after %v",
		downAt.Sub(offAt).Round(time.Millisecond), upAt.Sub(offAt).Round(time.Millisecond))

	ans := prober.Answers()
	var failed, total int
	var lastN1, firstOther time.Time
	for _, a := range ans {
		total++
		switch {
		case a.Node == "":
			failed++
			if failed <= 5 {
				t.Logf("failed attempt sent %s, failed after %v", a.Sent.Format("15:04:05.000"), a.RTT.Round(time.Millisecond))
			}
		case a.Node == "n1":
			lastN1 = a.Sent
		case firstOther.IsZero():
			firstOther = a.Sent
		}
	}
	gap, before, after := lab.Outage(ans, offAt.Add(-time.Second), end)
	holders := mon.Samples()
	newHolder := ""
	if len(holders) > 0 {
		newHolder = strings.Join(holders[len(holders)-1].Holders, ",")
	}
	none := mon.Longest(offAt, end, func(n int) bool { return n == 0 })
	overlap := mon.Longest(offAt, end, func(n int) bool { return n == 2 })
	t.Logf("reboot of the holder n1: %d attempts, %d failed; longest gap between answered attempts %v (%s -> %s); "+
		"last answer by n1 %v after systemctl reboot, first by the successor %v after; holders: none for %v, two (make-before-break) for %v; holder after the reboot %s",
		total, failed, gap.Round(time.Millisecond), before, after,
		lastN1.Sub(offAt).Round(time.Millisecond), firstOther.Sub(offAt).Round(time.Millisecond),
		none.Round(time.Millisecond), overlap.Round(time.Millisecond), newHolder)
	if failed > 0 {
		t.Errorf("%d of %d connection attempts failed across the reboot of the holder", failed, total)
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

func answersFrom(ans []lab.Answer, from time.Time) []lab.Answer {
	var r []lab.Answer
	for _, a := range ans {
		if !a.Sent.Before(from) {
			r = append(r, a)
		}
	}
	return r
}

func answered(ans []lab.Answer, node string) bool {
	for _, a := range ans {
		if a.Node == node {
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
