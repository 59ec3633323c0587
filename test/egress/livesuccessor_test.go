package egress

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// TestLeaseStopGoesToLiveSuccessor (issue 28, Found 3 and Build 5, with
// VIPD_ELECTION=lease): the egress gateway stops (SIGTERM) while another
// node is frozen (SIGSTOP: no answers for 0.5 s, still counted alive for
// the election timeout). The address must go, make-before-break, to the
// node that answers now, never to the frozen one: the stopping gateway
// logs its overlap with the live node, hands over at stop, and leaves
// nothing of its egress in the kernel. Every non-leader other node is
// frozen in turn (the leader must stay up to place the address).
func TestLeaseStopGoesToLiveSuccessor(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "curl")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Four nodes: with one frozen and one stopping, the other two are
	// still a majority of the three voters left.
	l := lab.New(t, lab.Options{Nodes: 4})
	e4 := l.VIP4(57)
	for _, n := range l.Nodes {
		sh(t, n.NS, "sysctl -qw net.ipv4.ip_forward=1")
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	vipds := map[string]*lab.Proc{}
	start := func(name string) {
		n := l.Node(name)
		env := append([]string{"VIPD_ELECTION=lease", "VIPD_PEERS=" + l.Peers(n),
			"VIPD_EGRESS=" + e4.String() + " from 100.64.0.0/16 to 203.0.113.0/24",
			"VIPD_EGRESS_CLUSTER_CIDRS=100.64.0.0/16"}, fastHealth...)
		p, err := n.StartVipd(bin, env...)
		if err != nil {
			t.Fatal(err)
		}
		vipds[name] = p
	}
	metrics := func(name string) string {
		o, _ := l.Node(name).Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
		return string(o)
	}
	// settled: one holder of the egress IP, four voters and one leader.
	settled := func() (holder, leader string) {
		t.Helper()
		waitFor(t, 30*time.Second, "one holder, four voters, one leader", func() error {
			hs, err := l.Holders(ctx, e4)
			if err != nil || len(hs) != 1 {
				return fmt.Errorf("holders %v %v", hs, err)
			}
			holder, leader = hs[0], ""
			for _, n := range l.Nodes {
				m := metrics(n.Name)
				if !strings.Contains(m, `vipd_cluster_members{state="voters"} 4`) || !strings.Contains(m, `vipd_cluster_members{state="learners"} 0`) {
					return fmt.Errorf("%s: not four voters yet", n.Name)
				}
			}
			// the leader: the node that last logged "became leader" with
			// the highest term
			best := -1
			for _, n := range l.Nodes {
				for _, line := range strings.Split(vipds[n.Name].Output(), "\n") {
					if i := strings.Index(line, `msg="became leader"`); i >= 0 {
						var term int
						if j := strings.Index(line, " term="); j >= 0 {
							_, _ = fmt.Sscanf(line[j+6:], "%d", &term)
						}
						if term > best {
							best, leader = term, n.Name
						}
					}
				}
			}
			if leader == "" {
				return fmt.Errorf("no leader")
			}
			return nil
		})
		return holder, leader
	}
	for _, n := range l.Nodes {
		start(n.Name)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range l.Nodes {
			var lines []string
			for _, line := range strings.Split(vipds[n.Name].Output(), "\n") {
				if strings.Contains(line, "component=cluster") && !strings.Contains(line, "level=DEBUG") {
					lines = append(lines, line)
				}
			}
			t.Logf("%s (election):\n%s", n.Name, tail(strings.Join(lines, "\n"), 40))
		}
	})
	rounds := 0
	wasFrozen := map[string]bool{}
	for round := 0; round < 2; round++ {
		gw, leader := settled()
		var cands []string
		for _, n := range l.Nodes {
			if n.Name != gw && n.Name != leader {
				cands = append(cands, n.Name)
			}
		}
		frozen := ""
		for _, c := range cands { // a node not frozen before, if any
			if frozen == "" || wasFrozen[frozen] && !wasFrozen[c] {
				frozen = c
			}
		}
		wasFrozen[frozen] = true
		if frozen == "" {
			t.Logf("round %d: gateway %s, leader %s: no other node to freeze", round, gw, leader)
			continue
		}
		rounds++
		t.Logf("round %d: gateway %s, leader %s, frozen %s", round, gw, leader, frozen)
		if err := vipds[frozen].Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // more than 1.5 heartbeats, less than the election timeout
		if err := vipds[gw].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, err := vipds[gw].Wait(8 * time.Second)
		if err != nil || code != 0 {
			_ = vipds[frozen].Signal(syscall.SIGCONT)
			t.Fatalf("%s after SIGTERM: exit %d %v\n%s", gw, code, err, tail(vipds[gw].Output(), 40))
		}
		// Still frozen: the address is on a live node (once the frozen one
		// is back, a rebalance may move it there, make-before-break).
		hs, err := l.Holders(ctx, e4)
		_ = vipds[frozen].Signal(syscall.SIGCONT)
		live := ""
		if err == nil && len(hs) == 1 && hs[0] != frozen && hs[0] != gw {
			live = hs[0]
		} else {
			t.Errorf("holders %v (%v) when %s had stopped, want one live node (not the frozen %s)", hs, err, gw, frozen)
		}
		out := vipds[gw].Output()
		if !strings.Contains(out, "handed over at stop") {
			t.Errorf("%s did not hand over at stop:\n%s", gw, tail(out, 40))
		}
		// the successor gw handed over to, make-before-break (a rebalance
		// may have moved the address on while gw drained its egress)
		succ := ""
		prefix := "address=" + e4.String() + "/32 from=" + gw + " to="
		for _, line := range strings.Split(out, "\n") {
			if i := strings.Index(line, prefix); i >= 0 && strings.Contains(line, `planned transfer: make-before-break overlap"`) {
				succ = strings.Fields(line[i+len(prefix):])[0]
			}
		}
		if succ == "" || succ == frozen {
			var lines []string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "component=cluster") && !strings.Contains(line, "level=DEBUG") || strings.Contains(line, "at stop") {
					lines = append(lines, line)
				}
			}
			t.Errorf("%s handed over make-before-break to %q, want a live node (not the frozen %s):\n%s", gw, succ, frozen, tail(strings.Join(lines, "\n"), 30))
		}
		t.Logf("round %d: %s handed over to %s; %s holds after the stop", round, gw, succ, live)
		if err := kernelLeftovers(t, l.Node(gw), e4); err != nil {
			t.Errorf("%s after its stop: %v", gw, err)
		}
		start(gw)
	}
	if rounds == 0 {
		t.Fatal("no round froze a successor")
	}
}
