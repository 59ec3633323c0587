package l2

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lab"
)

// allPeers is VIPD_PEERS naming every node, this one included: the same
// env file on every node, as docs/kubeadm.md recommends.
func allPeers(l *lab.Lab) string {
	var p []string
	for _, n := range l.Nodes {
		p = append(p, n.IPv4.String())
	}
	return strings.Join(p, ",")
}

func metric(ctx context.Context, t *testing.T, h *lab.Host, line string) bool {
	t.Helper()
	out, err := h.Output(ctx, "curl", "-sf", "http://127.0.0.1:9469/metrics")
	if err != nil {
		t.Logf("%s /metrics: %v", h.Name, err) // not up yet
		return false
	}
	return strings.Contains(string(out), line)
}

// Found 3: with its own address in VIPD_PEERS (the documented config) and
// the wrong key, a node used to "join" itself, count as connected and
// bootstrap alone. Its own address is ignored now, and a node that the
// real cluster rejects never holds alone, even when that cluster has no
// holder.
func TestClusterWrongKeyWithOwnAddressInPeers(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	_ = os.WriteFile(good, []byte("0123456789abcdef0123456789abcdef"), 0o600)
	_ = os.WriteFile(bad, []byte("fedcba9876543210fedcba9876543210"), 0o600)
	c := newClusterLab(t, 3)
	ctx := ctxT(t, 60*time.Second)
	for _, n := range c.Nodes {
		key := good
		if n.Name == "n3" {
			key = bad
		}
		p, err := n.StartVipd(c.bin, append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + allPeers(c.Lab), "VIPD_GOSSIP_KEY_FILE=" + key}, fastHealth...)...)
		if err != nil {
			t.Fatal(err)
		}
		c.vipd[n.Name] = p
	}
	h := c.holder(ctx)
	if h == "n3" {
		t.Fatalf("the node with the wrong key holds the VIP")
	}
	if err := c.vipd["n3"].WaitOutput(ctx, "VIPD_GOSSIP_KEY_FILE"); err != nil {
		t.Fatal(err)
	}
	// Nobody else may hold: n3 still must not take it alone.
	for _, n := range []string{"n1", "n2"} {
		_ = c.apis[n].SetMode(lab.Failing)
	}
	time.Sleep(4 * time.Second)
	if hs, _ := c.Holders(ctx, c.vip); len(hs) != 0 {
		t.Fatalf("holders %v with both keyed nodes unhealthy: the node with the wrong key took the VIP alone", hs)
	}
}

// Found 4 / Build 5: the first-ranked node (highest priority) cannot bind
// (its VIP interface is down while gossip runs on another NIC): it steps
// aside, another node holds within detection time + 1 s, and the broken
// node shows it in its metrics.
func TestClusterFirstRankedNodeThatCannotBind(t *testing.T) {
	c := newClusterLab(t, 3)
	ctx := ctxT(t, 60*time.Second)
	n1 := c.node("n1")
	// A second interface in n1, down, for the VIP.
	for _, args := range [][]string{
		{"ip", "link", "add", "vipif", "type", "veth", "peer", "name", "vipif-peer"},
		{"ip", "link", "set", "vipif", "down"},
	} {
		if out, err := n1.Output(ctx, args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	// n2 and n3 start unhealthy: n1 is the only eligible node and ranks
	// first (priority 100) when they become healthy.
	_ = c.apis["n2"].SetMode(lab.Failing)
	_ = c.apis["n3"].SetMode(lab.Failing)
	for _, n := range c.Nodes {
		env := append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + c.Peers(n)}, fastHealth...)
		if n.Name == "n1" {
			env = append(env, "VIPD_PRIORITY=100", "VIPD_INTERFACE=vipif")
		}
		p, err := n.StartVipd(c.bin, env...)
		if err != nil {
			t.Fatal(err)
		}
		c.vipd[n.Name] = p
	}
	broken := `vipd_vip_broken{vip="` + c.vip.String() + `/32"} 1`
	for !metric(ctx, t, n1, broken) {
		if ctx.Err() != nil {
			t.Fatal("n1 never reported the VIP as broken")
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := n1.Output(ctx, c.bin, "status")
	if !strings.Contains(string(out), "CANNOT HOLD") {
		t.Errorf("vipd status on n1 does not show that it cannot hold the VIP:\n%s", out)
	}
	start := time.Now()
	_ = c.apis["n2"].SetMode(lab.OK)
	_ = c.apis["n3"].SetMode(lab.OK)
	h := c.holder(ctx)
	took := time.Since(start) - 500*time.Millisecond // holder() waits 500 ms of stability
	if h == "n1" {
		t.Fatal("n1 holds the VIP on a down interface")
	}
	t.Logf("holder %s %v after the others became healthy (n1 ranks first but cannot bind)", h, took)
	if took > maxCrashGap {
		t.Errorf("holder after %v", took)
	}
	if !metric(ctx, t, n1, broken) {
		t.Error("n1 no longer reports the VIP as broken although its interface is still down")
	}
	// The VIP stays where it is; n1 keeps trying and failing without
	// disturbing it.
	time.Sleep(3 * time.Second)
	if cur := c.mon.Now(); len(cur) != 1 || cur[0] != h {
		t.Fatalf("holders %v, want [%s]", cur, h)
	}
}

// Found 4: "a holder whose VIP interface goes down keeps the VIP". Now it
// releases it (nothing left on the interface to answer when the link comes
// back) and the others take over; back up, there is one holder.
func TestClusterHolderLinkDownReleases(t *testing.T) {
	c := newClusterLab(t, 3)
	ctx := ctxT(t, 60*time.Second)
	c.start()
	h := c.holder(ctx)
	hn := c.node(h)
	down := time.Now()
	if out, err := hn.Output(ctx, "ip", "link", "set", hn.Link, "down"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := hn.WaitAddr(ctx, c.vip, false); err != nil {
		t.Fatalf("the old holder kept the VIP on its down interface: %v", err)
	}
	t.Logf("old holder released the VIP from its down interface %v after link down", time.Since(down))
	nh, d := c.newHolder(ctx, h, down, true)
	t.Logf("new holder %s after %v", nh, d)
	if out, err := hn.Output(ctx, "ip", "link", "set", hn.Link, "up"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	time.Sleep(4 * time.Second)
	c.noStale(ctx)
	c.checkInvariants(down.Add(2*time.Second), 0)
}

// Found 6: two nodes with one name (a cloned VM): both refuse loudly.
// With the lease election the configuration already has a member of that
// name: the clone is refused at join and never holds, the member keeps its
// place (and the VIP if it held it), and the configuration stays the three
// original voters.
func TestClusterDuplicateNodeName(t *testing.T) {
	c := newClusterLab(t, 4)
	ctx := ctxT(t, 60*time.Second)
	c.start("n1", "n2", "n3")
	before := c.holder(ctx)
	n4 := c.node("n4")
	peers := c.node("n1").IPv4.String() + ":7950," + c.node("n2").IPv4.String() + ":7950"
	p, err := n4.StartVipd(c.bin, append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + peers, "VIPD_NODE_NAME=n1"}, fastHealth...)...)
	if err != nil {
		t.Fatal(err)
	}
	c.vipd["n4"] = p
	if err := p.WaitOutput(ctx, "uses this node's name"); err != nil {
		t.Fatalf("the clone did not notice: %v", err)
	}
	if err := c.vipd["n1"].WaitOutput(ctx, "uses this node's name"); err != nil {
		t.Fatalf("n1 did not notice its clone: %v", err)
	}
	// The alert VIPDDuplicateNodeName reads this on both.
	for _, h := range []string{"n1", "n4"} {
		if !metric(ctx, t, c.node(h), "vipd_cluster_name_conflict 1") {
			t.Errorf("host %s: vipd_cluster_name_conflict is not 1", h)
		}
	}
	time.Sleep(3 * time.Second)
	for _, s := range c.mon.Samples() {
		if slices.Contains(s.Holders, "n4") {
			t.Fatalf("the clone (host n4, named n1) held the VIP at %s: %v", s.At.Format("15:04:05.000"), s.Holders)
		}
	}
	if cur := c.mon.Now(); len(cur) != 1 || cur[0] != before {
		t.Fatalf("holders %v, want %s still: a clone must not move the VIP", cur, before)
	}
	out, err := c.node("n2").Output(ctx, c.bin, "status", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Components struct {
			Cluster struct {
				Voters   []string `json:"voters"`
				Learners []string `json:"learners"`
			} `json:"cluster"`
		} `json:"components"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status: %v: %s", err, out)
	}
	if cl := st.Components.Cluster; !slices.Equal(cl.Voters, []string{"n1", "n2", "n3"}) || len(cl.Learners) != 0 {
		t.Fatalf("n2's configuration: voters %v learners %v, want n1 n2 n3 and no learner: %s", cl.Voters, cl.Learners, out)
	}
}

// Found 1: blue/green replacement of a 3-node control plane: three new
// nodes join, then the old ones are stopped one by one. The VIP never goes
// away for longer than a handover, and the new nodes end up counting only
// themselves.
func TestClusterBlueGreenReplacement(t *testing.T) {
	c := newClusterLab(t, 6)
	ctx := ctxT(t, 120*time.Second)
	old, green := []string{"n1", "n2", "n3"}, []string{"n4", "n5", "n6"}
	for _, name := range old {
		n := c.node(name)
		p, err := n.StartVipd(c.bin, append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + peersOf(c, old, n)}, fastHealth...)...)
		if err != nil {
			t.Fatal(err)
		}
		c.vipd[name] = p
	}
	c.holder(ctx)
	start := time.Now()
	for _, name := range green {
		n := c.node(name)
		p, err := n.StartVipd(c.bin, append([]string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + peersOf(c, append(old, green...), n)}, fastHealth...)...)
		if err != nil {
			t.Fatal(err)
		}
		c.vipd[name] = p
	}
	time.Sleep(3 * time.Second)
	for _, name := range old {
		if err := c.vipd[name].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if _, err := c.vipd[name].Wait(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
	}
	h := c.holder(ctx)
	if !strings.Contains(strings.Join(green, ","), h) {
		t.Fatalf("holder %s is not a new node", h)
	}
	c.checkInvariants(start, maxCrashGap)
	// The old nodes left the configuration: the voters are the new ones.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := c.node("n4").Output(ctx, c.bin, "status", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Components struct {
				Cluster struct {
					Voters []string `json:"voters"`
				} `json:"cluster"`
			} `json:"components"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status: %v: %s", err, out)
		}
		v := st.Components.Cluster.Voters
		if slices.Equal(v, green) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n4's voters 5 s after the old nodes left: %v, want %v", v, green)
		}
	}
}

func peersOf(c *clusterLab, names []string, self *lab.Host) string {
	var p []string
	for _, name := range names {
		if n := c.node(name); n != self {
			p = append(p, n.IPv4.String())
		}
	}
	return strings.Join(p, ",")
}

// Found 2: peers without a key refuse to start, naming the setting and
// `vipd keygen`; VIPD_GOSSIP_INSECURE=true opts out. Nothing is bound.
func TestGossipKeyRequiredWithPeers(t *testing.T) {
	c := newClusterLab(t, 2)
	ctx := ctxT(t, 30*time.Second)
	n1 := c.node("n1")
	p, err := n1.Start("vipd n1", []string{"VIPD_ADDRESS=" + c.vip.String() + "/32", "VIPD_PEERS=" + c.Peers(n1),
		"VIPD_INTERFACE=" + n1.Link, "VIPD_STATE_DIR=" + t.TempDir(), "VIPD_METRICS_ADDRESS=127.0.0.1:9469"}, c.bin, "run")
	if err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out := p.Output()
	if code == 0 || !strings.Contains(out, "VIPD_GOSSIP_KEY_FILE") || !strings.Contains(out, "vipd keygen") || !strings.Contains(out, "VIPD_GOSSIP_INSECURE") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	if ok, _ := n1.HasAddr(ctx, c.vip); ok {
		t.Fatal("VIP bound although start-up failed")
	}
	p2, err := n1.StartVipd(c.bin, "VIPD_ADDRESS="+c.vip.String()+"/32", "VIPD_PEERS="+c.Peers(n1), "VIPD_GOSSIP_INSECURE=true")
	if err != nil {
		t.Fatal(err)
	}
	c.vipd["n1"] = p2
	if err := p2.WaitOutput(ctx, "gossip is not authenticated"); err != nil {
		t.Fatal(err)
	}
}
