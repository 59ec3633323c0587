package packaging

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
	"github.com/vipd/vipd/lab"
)

// TestKubeVIPSwitchOverL2 rehearses the l2 switch-over of docs/migration.md
// in the lab: n1 holds the VIP the way kube-vip does (an address added by
// another program, answered by the kernel); vipd starts on n2 and n3 and must
// not take the VIP while n1 answers for it; then "kube-vip" on n1 stops (the
// address is removed) and vipd must bind the VIP elsewhere; finally vipd on
// n1 joins without moving it. A client measures the outage.
func TestKubeVIPSwitchOverL2(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Short(t)
	testenv.RequireCommands(t, "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := lab.VipdBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := lab.New(t, lab.Options{Nodes: 3, Client: true})
	vip := l.VIP4(60)
	for _, n := range l.Nodes {
		if _, err := n.StartAPIServer("0.0.0.0:6443", lab.OK); err != nil {
			t.Fatal(err)
		}
	}
	mon, err := l.Monitor(vip)
	if err != nil {
		t.Fatal(err)
	}
	n1 := l.Nodes[0]
	// "kube-vip" on n1.
	if out, err := n1.Output(ctx, "ip", "addr", "add", vip.String()+"/32", "dev", n1.Link); err != nil {
		t.Fatalf("bind the VIP on n1: %v\n%s", err, out)
	}
	prober := l.Client.StartProber(vip.String()+":6443", 10*time.Millisecond, 300*time.Millisecond)
	capt, err := l.Client.StartCapture(ctx, "arp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("client ARP capture:\n%s", capt.All())
			var b strings.Builder
			last := "?"
			for _, a := range prober.Answers() {
				if a.Node != last {
					fmt.Fprintf(&b, "%s %q\n", a.Sent.Format("15:04:05.000"), a.Node)
					last = a.Node
				}
			}
			t.Logf("client answers (changes):\n%s", b.String())
		}
	})

	peers := func(self *lab.Host) string {
		var p []string
		for _, n := range l.Nodes {
			if n != self {
				p = append(p, n.IPv4.String())
			}
		}
		return strings.Join(p, ",")
	}
	procs := map[string]*lab.Proc{}
	start := func(n *lab.Host) {
		p, err := n.StartVipd(bin, "VIPD_ADDRESS="+vip.String()+"/32", "VIPD_PEERS="+peers(n),
			"VIPD_HEALTH_INTERVAL=200ms", "VIPD_FAIL_THRESHOLD=3")
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("holders:\n%s", mon)
			for name, p := range procs {
				t.Logf("--- vipd %s:\n%s", name, p.Output())
			}
		}
	})

	// vipd on the nodes without "kube-vip": they elect a holder, whose
	// probe is answered by n1, so nobody binds.
	startAll := time.Now()
	start(l.Nodes[1])
	start(l.Nodes[2])
	time.Sleep(4 * time.Second)
	if h := mon.Now(); strings.Join(h, ",") != "n1" {
		t.Fatalf("holders %v while kube-vip holds the VIP on n1, want only n1", h)
	}
	// Nothing may disturb the clients while kube-vip still holds the VIP:
	// a vipd that announced the VIP without binding it would steal the
	// clients' ARP entries.
	if gap, since := longestFailure(prober.Answers(), startAll, time.Now()); gap > 200*time.Millisecond {
		t.Errorf("starting vipd next to kube-vip cut the clients off for %v from %s (a vipd announced the VIP it did not bind?)",
			gap.Round(time.Millisecond), since.Format("15:04:05.000"))
	}
	conflicts := procs["n2"].Output() + procs["n3"].Output()
	if !strings.Contains(strings.ToLower(conflicts), "conflict") {
		t.Errorf("no vipd logged a conflict with the address kube-vip holds")
	}

	// kube-vip stops on n1: it removes the VIP.
	stopAt := time.Now()
	if out, err := n1.Output(ctx, "ip", "addr", "del", vip.String()+"/32", "dev", n1.Link); err != nil {
		t.Fatalf("unbind the VIP on n1: %v\n%s", err, out)
	}
	var holder string
	for holder == "" {
		if time.Since(stopAt) > 10*time.Second {
			t.Fatalf("no vipd took the VIP within 10 s after kube-vip released it")
		}
		if h := mon.Now(); len(h) == 1 && h[0] != "n1" {
			holder = h[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	bound := time.Since(stopAt)
	time.Sleep(time.Second)
	gap, before, after := lab.Outage(prober.Answers(), stopAt.Add(-time.Second), time.Now())
	t.Logf("kube-vip released the VIP; vipd on %s bound it after %v; client-visible gap %v (%s -> %s)",
		holder, bound.Round(time.Millisecond), gap.Round(time.Millisecond), before, after)
	// vipd retries a conflicted acquire after at most 2 s (vip.RetryMax).
	if gap > 3*time.Second {
		t.Errorf("switch-over gap %v, want at most 3 s", gap)
	}

	// vipd on n1 joins; the VIP stays.
	joinAt := time.Now()
	start(n1)
	time.Sleep(3 * time.Second)
	if h := mon.Now(); len(h) != 1 || h[0] != holder {
		t.Errorf("holders %v after vipd joined on n1, want %s (no preemption)", h, holder)
	}
	if gap, _ := longestFailure(prober.Answers(), joinAt, time.Now()); gap > 200*time.Millisecond {
		t.Errorf("vipd joining on n1 caused a %v gap", gap)
	}
}

// longestFailure returns the longest run of failed probes sent in
// [from, to], a run still open at to counting up to to, and its start.
func longestFailure(ans []lab.Answer, from, to time.Time) (time.Duration, time.Time) {
	var longest time.Duration
	var longestAt, runStart time.Time
	for _, a := range ans {
		if a.Sent.Before(from) || a.Sent.After(to) {
			continue
		}
		switch {
		case a.Node == "" && runStart.IsZero():
			runStart = a.Sent
		case a.Node != "" && !runStart.IsZero():
			if d := a.Sent.Sub(runStart); d > longest {
				longest, longestAt = d, runStart
			}
			runStart = time.Time{}
		}
	}
	if !runStart.IsZero() {
		if d := to.Sub(runStart); d > longest {
			longest, longestAt = d, runStart
		}
	}
	return longest, longestAt
}
