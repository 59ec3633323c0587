package egress

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// TestStopPathsLeaveNothing (issue 28, Found 4 and Build 5): every way a
// vipd with egress rules stops removes everything it added to the kernel
// (the nftables table inet vipd-egress, the ip rules at priority 7950,
// the routes of tables 7950-7969, the egress IP on eth0): the gateway
// handing over to a live successor, the gateway whose handover fails
// (its successor froze: its heartbeats stop, it is still listed alive,
// the offer is never acknowledged), a node that hits a fatal error, and
// the last node, with nobody to hand over to. The kernel is read with
// nft and ip in each stopped node's namespace after the process exited.
// One lab of three nodes with fake apiservers serves every path.
func TestStopPathsLeaveNothing(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 3})
	e4 := l.VIP4(55)
	prio := map[string]string{"n1": "10", "n2": "5", "n3": "0"}
	for _, n := range l.Nodes {
		sh(t, n.NS, "sysctl -qw net.ipv4.ip_forward=1")
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	// cur is the test the helpers below fail: the running subtest.
	cur, parent := t, t
	dir := t.TempDir()
	vipds := map[string]*lab.Proc{}
	start := func(name string, extra ...string) {
		t := cur
		t.Helper()
		n := l.Node(name)
		env := append([]string{"VIPD_PEERS=" + l.Peers(n), "VIPD_PRIORITY=" + prio[name],
			"VIPD_EGRESS=" + e4.String() + " from 100.64.0.0/16 to 203.0.113.0/24",
			"VIPD_EGRESS_CLUSTER_CIDRS=100.64.0.0/16"}, fastHealth...)
		p, err := n.StartVipd(bin, append(env, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		vipds[name] = p
	}
	holder := func(except ...string) string {
		t := cur
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			hs, err := l.Holders(ctx, e4)
			hs = slices.DeleteFunc(hs, func(h string) bool { return slices.Contains(except, h) })
			if err == nil && len(hs) == 1 {
				return hs[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("holders of %s: %v %v (not %v)", e4, hs, err, except)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// programmed waits until the node's egress table shows its role.
	programmed := func(name, role string) {
		t := cur
		t.Helper()
		n := l.Node(name)
		waitFor(t, 15*time.Second, name+" programmed as "+role, func() error {
			o, err := n.Output(ctx, "nft", "list", "table", "inet", "vipd-egress")
			if err != nil {
				return err
			}
			if !strings.Contains(string(o), "vipd "+role+" "+e4.String()) {
				return fmt.Errorf("no %s rule yet", role)
			}
			return nil
		})
	}
	// stopped waits for the exit and checks the node's kernel. The stop
	// must end within the unit's TimeoutStopSec (5 s), counted from
	// since: systemd kills a vipd still stopping then, with its state in
	// the kernel. "vipd stopped" must be its last word: logged once
	// everything was removed.
	stopped := func(name string, wantCode int, since time.Time) {
		t := cur
		t.Helper()
		code, err := vipds[name].Wait(8 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, tail(vipds[name].Output(), 40))
		}
		took := time.Since(since)
		t.Logf("%s exited %d after %v", name, code, took.Round(time.Millisecond))
		if took > stopBound {
			t.Errorf("%s: stopped %v after the signal, want within %v (the unit's TimeoutStopSec)", name, took.Round(time.Millisecond), stopBound)
		}
		if after, ok := logAfterStopped(vipds[name].Output()); !ok {
			t.Errorf("%s: logged after \"vipd stopped\" (or never logged it): %q", name, after)
		}
		if (wantCode == 0) != (code == 0) {
			t.Errorf("%s: exit code %d, want %d", name, code, wantCode)
		}
		if err := kernelLeftovers(t, l.Node(name), e4); err != nil {
			t.Errorf("%s after its stop: %v\n%s", name, err, tail(vipds[name].Output(), 40))
		}
	}
	// formed waits until every node counts three voters and no learner:
	// a stop while a peer is still a learner hands over to whichever
	// voter there is, not to the best by priority.
	formed := func() {
		t := cur
		t.Helper()
		waitFor(t, 30*time.Second, "three voters, no learner", func() error {
			for _, n := range l.Nodes {
				o, _ := n.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
				if m := string(o); !strings.Contains(m, `vipd_cluster_members{state="voters"} 3`) || !strings.Contains(m, `vipd_cluster_members{state="learners"} 0`) {
					return fmt.Errorf("%s: not three voters yet", n.Name)
				}
			}
			return nil
		})
	}
	for _, n := range l.Nodes {
		start(n.Name)
	}
	formed()
	if gw := holder(); gw != "n1" {
		t.Fatalf("gateway %s, want n1 (highest priority)", gw)
	}
	programmed("n1", "gateway")
	programmed("n2", "director")
	programmed("n3", "director")

	t.Run("handover ok", func(t *testing.T) {
		cur = t
		defer func() { cur = parent }()
		at := time.Now()
		if err := vipds["n1"].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped("n1", 0, at)
		if !strings.Contains(vipds["n1"].Output(), "handed over at stop") {
			t.Errorf("n1 did not hand over at stop:\n%s", tail(vipds["n1"].Output(), 40))
		}
		if gw := holder("n1"); gw != "n2" {
			t.Fatalf("gateway %s after n1 stopped, want n2\nn1:\n%s\nn2:\n%s", gw, tail(vipds["n1"].Output(), 40), tail(vipds["n2"].Output(), 20))
		}
		start("n1")
		programmed("n1", "director")
		programmed("n2", "gateway")
		formed()
	})

	t.Run("handover failed", func(t *testing.T) {
		cur = t
		defer func() { cur = parent }()
		// n1 is n2's best successor (priority 10). Frozen, it is still
		// listed alive for about three heartbeats, so the offer goes to
		// it and is never acknowledged.
		if err := vipds["n1"].Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = vipds["n1"].Signal(syscall.SIGCONT) }()
		at := time.Now()
		if err := vipds["n2"].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped("n2", 0, at)
		out := vipds["n2"].Output()
		switch {
		case strings.Contains(out, "handover at stop did not finish"), strings.Contains(out, "no handover at stop"):
			t.Logf("n2's handover at stop failed, as wanted")
		default:
			t.Logf("n2's handover at stop did not fail (the successor was seen dead in time):\n%s", tail(out, 30))
		}
		_ = vipds["n1"].Signal(syscall.SIGCONT)
		holder("n2")
		start("n2")
		programmed("n2", "director")
	})

	t.Run("stop right after taking over from a dead gateway", func(t *testing.T) {
		cur = t
		defer func() { cur = parent }()
		// Found 4: the gateway dies (SIGKILL: its heartbeats stop), a
		// node takes the egress IP over and is stopped 0.5 s later,
		// while the dead node may still be listed.
		// The machine is gone: its vipd killed, its link cut at the
		// switch (its kernel would still answer ARP for the egress IP).
		gw := holder()
		if err := vipds[gw].Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, _ = vipds[gw].Wait(5 * time.Second)
		if err := l.Node(gw).SetLink(ctx, false, false); err != nil {
			t.Fatal(err)
		}
		next := holder(gw)
		programmed(next, "gateway")
		time.Sleep(500 * time.Millisecond)
		at := time.Now()
		if err := vipds[next].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped(next, 0, at)
		t.Logf("%s died, %s took over and stopped 0.5 s later: %s", gw, next,
			grepLine(vipds[next].Output(), "handover at stop", "handed over at stop"))
		// The node killed without a clean stop left its state; its next
		// start removes it (TestEgress/stale-state-at-start).
		if err := l.Node(gw).SetLink(ctx, true, false); err != nil {
			t.Fatal(err)
		}
		start(gw)
		start(next)
		programmed(gw, "director")
		programmed(next, "director")
	})

	t.Run("fatal error", func(t *testing.T) {
		cur = t
		defer func() { cur = parent }()
		// A vipd-controllers child that rejects the configuration (exit
		// 2) is a fatal error: vipd releases, leaves and exits non-zero.
		victim := "n3"
		if gw := holder(); gw == victim {
			victim = "n2"
		}
		trigger := filepath.Join(dir, "fail-now")
		fake := filepath.Join(dir, "vipd-controllers")
		script := "#!/bin/sh\necho fake vipd-controllers running\n" +
			"while [ ! -e " + trigger + " ]; do sleep 0.02; done\n" +
			"echo fake vipd-controllers: configuration rejected >&2\nexit 2\n"
		if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := vipds[victim].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped(victim, 0, time.Now())
		start(victim, "VIPD_CONTROLLERS=services", "VIPD_CONTROLLERS_BINARY="+fake)
		programmed(victim, "director")
		if err := vipds[victim].WaitOutput(ctx, "fake vipd-controllers running"); err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if err := os.WriteFile(trigger, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		stopped(victim, 2, at)
		if !strings.Contains(vipds[victim].Output(), "stopping after a fatal error") {
			t.Errorf("%s did not stop on the fatal error:\n%s", victim, tail(vipds[victim].Output(), 40))
		}
	})

	t.Run("no successor", func(t *testing.T) {
		cur = t
		defer func() { cur = parent }()
		gw := holder()
		for _, n := range l.Nodes {
			if n.Name == gw || vipds[n.Name].Exited() {
				continue
			}
			at := time.Now()
			if err := vipds[n.Name].Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			stopped(n.Name, 0, at)
		}
		at := time.Now()
		if err := vipds[gw].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped(gw, 0, at)
		for _, n := range l.Nodes {
			if err := kernelLeftovers(t, n, e4); err != nil {
				t.Error(err)
			}
		}
	})
}

// stopBound is the packaged unit's TimeoutStopSec.
const stopBound = 5 * time.Second

// logAfterStopped returns the log lines after the last "vipd stopped";
// ok when there is such a line and none after it (the exit message of a
// fatal error, not a log line, may follow).
func logAfterStopped(out string) (string, bool) {
	lines := strings.Split(out, "\n")
	at := -1
	for i, l := range lines {
		if strings.Contains(l, "msg=\"vipd stopped\"") {
			at = i
		}
	}
	if at < 0 {
		return "", false
	}
	var after []string
	for _, l := range lines[at+1:] {
		if strings.Contains(l, "level=") {
			after = append(after, l)
		}
	}
	return strings.Join(after, "\n"), len(after) == 0
}

// kernelLeftovers lists what of vipd's egress is still in n's kernel.
func kernelLeftovers(t *testing.T, n *lab.Host, egressIP netip.Addr) error {
	t.Helper()
	var left []string
	if o := out(t, n.NS, "nft list tables"); strings.Contains(o, "vipd-egress") {
		left = append(left, "nftables: "+strings.TrimSpace(o))
	}
	if o := out(t, n.NS, "ip -4 rule"); strings.Contains(o, "fwmark") || strings.Contains(o, "7950") {
		left = append(left, "ip rules: "+strings.TrimSpace(o))
	}
	if o := out(t, n.NS, "ip -4 route show table all"); strings.Contains(o, "table 795") || strings.Contains(o, "table 796") {
		left = append(left, "routes: "+strings.TrimSpace(o))
	}
	if o := out(t, n.NS, "ip -4 addr show dev eth0"); strings.Contains(o, " "+egressIP.String()+"/") {
		left = append(left, "egress IP "+egressIP.String()+" bound")
	}
	if len(left) > 0 {
		return fmt.Errorf("left in the kernel: %s", strings.Join(left, "; "))
	}
	return nil
}

// grepLine returns the first line of out that contains one of subs.
func grepLine(out string, subs ...string) string {
	for _, line := range strings.Split(out, "\n") {
		for _, s := range subs {
			if strings.Contains(line, s) {
				return line
			}
		}
	}
	return "(no handover line)"
}
