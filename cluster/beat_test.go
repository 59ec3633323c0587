package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestMemberBeats runs three nodes on loopback with member heartbeats
// (fast intervals, slow memberlist probes) and checks with real packets
// that each hears the others, that a node whose beats stop is found silent
// by the others within its deadline although memberlist still sees it
// alive, and that beats signed with another key are never heard.
func TestMemberBeats(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	hb := HeartbeatConfig{Interval: 50 * time.Millisecond, Misses: 3, Members: true}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var nodes []*Node
	for i := range 3 {
		n, err := New(Config{Name: fmt.Sprintf("n%d", i), Bind: netip.MustParseAddrPort("127.0.0.1:0"), Keys: [][]byte{key},
			StateDir: t.TempDir(), VIPs: []string{vip1}, Timings: BeatTimings(), Heartbeat: hb,
			LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		n.peers = nil
		for _, o := range nodes {
			if o != n {
				n.peers = append(n.peers, o.localAddr)
			}
		}
	}
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, len(nodes))
	for i, n := range nodes {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.Run(ctx, func(string, Decision) {})
		}()
		n.SetHealthy(true)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
		for _, n := range nodes {
			_ = n.ml.Shutdown()
		}
	}()

	heard := func(n *Node, from string) time.Time {
		n.hb.mu.Lock()
		defer n.hb.mu.Unlock()
		return n.hb.mb.last[from]
	}
	silent := func(n *Node, who string) bool {
		n.hb.mu.Lock()
		defer n.hb.mu.Unlock()
		return n.hb.mb.silent[who]
	}
	// Everyone hears everyone (the time heard keeps moving on).
	waitFor(t, 10*time.Second, "all members hear each other", func() bool {
		for _, n := range nodes {
			for _, o := range nodes {
				if o != n && (heard(n, o.cfg.Name).IsZero() || time.Since(heard(n, o.cfg.Name)) > 2*hb.Interval || silent(n, o.cfg.Name)) {
					return false
				}
			}
		}
		return true
	})

	// The holder's beats will stop: find it, as everyone sees it.
	var hold string
	waitFor(t, 10*time.Second, "every node sees one holder", func() bool {
		h0, _ := nodes[0].Holder(vip1)
		h1, _ := nodes[1].Holder(vip1)
		h2, _ := nodes[2].Holder(vip1)
		hold = h0
		return h0 != "" && h0 == h1 && h1 == h2
	})
	victim := slices.IndexFunc(nodes, func(n *Node) bool { return n.cfg.Name == hold })
	others := slices.Delete(slices.Clone(nodes), victim, victim+1)
	var otherNames []string
	for _, n := range others {
		otherNames = append(otherNames, n.cfg.Name)
	}

	// A forger with another key sending the holder's name to another
	// node: never heard.
	fpc, err := (&net.ListenConfig{Control: reusePort}).ListenPacket(context.Background(), "udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fpc.Close()
	forger, err := openBeatSocket(fpc.(*net.UDPConn))
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	to := netip.MustParseAddrPort(others[0].localAddr)

	// The holder's beats stop (its Run ends; memberlist keeps answering
	// probes).
	cancels[victim]()
	stopped := time.Now()
	stopForging := make(chan struct{})
	forged := make(chan struct{})
	go func() {
		defer close(forged)
		seq := uint64(time.Now().UnixNano())
		for {
			select {
			case <-stopForging:
				return
			case <-time.After(10 * time.Millisecond):
			}
			seq++
			pkt, _ := encodeBeat(beatMsg{Name: hold, Term: 1, Seq: seq}, beatKeys([][]byte{bytes.Repeat([]byte{8}, 32)}))
			_ = forger.send(pkt, to)
		}
	}()
	waitFor(t, 5*time.Second, "the others find the holder silent", func() bool {
		return silent(others[0], hold) && silent(others[1], hold)
	})
	took := time.Since(stopped)
	close(stopForging)
	<-forged
	if max := 4*hb.Deadline() + time.Second; took > max {
		t.Errorf("the holder found silent after %s, want within %s", took, max)
	}
	for _, n := range others {
		for _, m := range n.members() {
			if m.Name == hold && m.State != Alive {
				t.Errorf("%s: memberlist already sees the holder %v: the test did not check the beats", n.cfg.Name, m.State)
			}
		}
		if silent(n, otherNames[0]) || silent(n, otherNames[1]) {
			t.Errorf("%s: a live member found silent", n.cfg.Name)
		}
		// The pool announcers' view leaves the silent member out as the
		// election does (memberlist still has it alive).
		var names []string
		for _, m := range n.PoolMembers() {
			names = append(names, m.Name)
		}
		if !slices.Equal(names, otherNames) {
			t.Errorf("%s: pool members %v, want %v (%s's beats stopped)", n.cfg.Name, names, otherNames, hold)
		}
		if h, _ := n.Holder(vip1); h == hold {
			t.Errorf("%s: Holder(%s) is still %s, whose beats stopped", n.cfg.Name, vip1, hold)
		}
	}
	t.Logf("the holder found silent %s after its beats stopped (deadline %s)", took.Round(time.Millisecond), hb.Deadline())

	// A member that stops is seen leaving at once, not at the next 5 s
	// gossip round: Close pushes the leave with a ping to every member.
	leaver, stayer := others[0], others[1]
	cancels[slices.Index(nodes, leaver)]()
	closed := time.Now()
	if err := leaver.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	// (memberlist's Members leaves out members that left; its detector
	// would take 15 s and more, its gossip up to 5 s.)
	waitFor(t, 2*time.Second, "the leave seen at once", func() bool {
		for _, m := range stayer.ml.Members() {
			if m.Name == leaver.cfg.Name {
				return false
			}
		}
		return true
	})
	t.Logf("%s saw %s leave %s after its Close", stayer.cfg.Name, leaver.cfg.Name, time.Since(closed).Round(time.Millisecond))
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
