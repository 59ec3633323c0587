package cluster

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestPeerKnownOverMemberlist: over real memberlists on loopback, a node
// started without a member list (a rebuilt machine) that joins a peer
// counting five members counts them too, and with two of five alive has
// no quorum and holds nothing; the peer, which has its own list, adopts
// nothing back.
func TestPeerKnownOverMemberlist(t *testing.T) {
	key := bytes.Repeat([]byte{5}, 32)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(&tlog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	mk := func(name, dir string, peers ...string) *Node {
		n, err := New(Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), Keys: [][]byte{key}, StateDir: dir, Peers: peers,
			VIPs: []string{vip1}, Timings: DefaultTimings(), LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// b knows five members (three of them are gone), as on the minority
	// side of a partition.
	bdir := t.TempDir()
	five := Known{Members: map[string]KnownMember{}}
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		five.Members[n] = KnownMember{FirstSeen: time.Now().UTC()}
	}
	if _, err := SaveKnown(bdir, five); err != nil {
		t.Fatal(err)
	}
	b := mk("b", bdir)
	a := mk("a", t.TempDir(), b.localAddr) // rebuilt: no list; VIPD_PEERS names b
	b.peers = []string{a.localAddr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	held := map[string]bool{}
	var mu sync.Mutex
	for _, n := range []*Node{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.Run(ctx, func(_ string, d Decision) {
				mu.Lock()
				held[n.cfg.Name] = held[n.cfg.Name] || d.Holder
				mu.Unlock()
			})
		}()
		n.SetHealthy(true)
	}
	defer func() {
		cancel()
		wg.Wait()
		_ = a.ml.Shutdown()
		_ = b.ml.Shutdown()
	}()
	known := func(n *Node) []string {
		n.mu.Lock()
		defer n.mu.Unlock()
		return slices.Sorted(slices.Values(n.status.Election.Known))
	}
	waitFor(t, 10*time.Second, "the rebuilt node counts the peer's five members", func() bool {
		return slices.Equal(known(a), []string{"a", "b", "c", "d", "e"})
	})
	time.Sleep(QuorumSettle + 500*time.Millisecond) // what it would wait before claiming
	mu.Lock()
	defer mu.Unlock()
	if held["a"] || held["b"] {
		t.Errorf("a node holds the VIP with 2 of 5 members alive: %v", held)
	}
	if got := known(b); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Errorf("b's list %v, want its own five", got)
	}
}

type tlog struct{ t *testing.T }

func (l *tlog) Write(p []byte) (int, error) { l.t.Log(string(bytes.TrimSpace(p))); return len(p), nil }

// TestMergeRemoteState: a peer's member list reaches the election as one
// PeerKnown event; an empty, unreadable or memberless list (an older
// version, or a corrupted push/pull) is dropped without an event.
func TestMergeRemoteState(t *testing.T) {
	list := encodeKnown(Known{Members: map[string]KnownMember{
		"a": {FirstSeen: time.Unix(100, 0).UTC()},
		"b": {Addr: "10.0.0.2:7946", FirstSeen: time.Unix(200, 0).UTC()},
	}})
	for _, tc := range []struct {
		name string
		buf  []byte
		want []string // the members of the PeerKnown event; nil: no event
	}{
		{"older version sends nothing", nil, nil},
		{"not JSON", []byte("\x00\xffgarbage"), nil},
		{"truncated", list[:len(list)/2], nil},
		{"no members", []byte(`{"members":{}}`), nil},
		{"wrong shape", []byte(`{"members":["a","b"]}`), nil},
		{"a list", list, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{inbox: make(chan Event, 4), wake: make(chan struct{}, 1),
				log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			(*delegate)(n).MergeRemoteState(tc.buf, false)
			var got []Event
			for len(n.inbox) > 0 {
				got = append(got, <-n.inbox)
			}
			if tc.want == nil {
				if len(got) != 0 {
					t.Fatalf("events %#v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("events %#v, want one PeerKnown", got)
			}
			pk, ok := got[0].(PeerKnown)
			if !ok {
				t.Fatalf("event %T, want PeerKnown", got[0])
			}
			if names := pk.Known.Names(); !slices.Equal(names, tc.want) {
				t.Fatalf("members %v, want %v", names, tc.want)
			}
			if !pk.Known.Members["b"].FirstSeen.Equal(time.Unix(200, 0)) {
				t.Fatalf("first seen of b %v, want it carried over", pk.Known.Members["b"].FirstSeen)
			}
		})
	}
}

// TestStepDoesNotWaitForBroadcast: the election loop never blocks on
// memberlist's metadata broadcast. With slow gossip (here 10 s rounds) a
// broadcast is not done for seconds; a loop that waited for it (up to 1 s
// per metadata change) saw members join late, and a node that had just
// joined could claim before it saw a higher-priority peer become eligible
// (test/l2 TestHandover, CI 2026-11-23).
func TestStepDoesNotWaitForBroadcast(t *testing.T) {
	key := bytes.Repeat([]byte{6}, 32)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tm := DefaultTimings()
	tm.ProbeInterval, tm.ProbeTimeout, tm.GossipInterval = 10*time.Second, 5*time.Second, 10*time.Second
	mk := func(name string, peers ...string) *Node {
		n, err := New(Config{Name: name, Bind: netip.MustParseAddrPort("127.0.0.1:0"), Keys: [][]byte{key}, StateDir: t.TempDir(), Peers: peers,
			VIPs: []string{vip1}, Timings: tm, LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	x := mk("x")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var nodes []*Node
	run := func(n *Node) {
		nodes = append(nodes, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.Run(ctx, func(string, Decision) {})
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
		for _, n := range nodes {
			_ = n.ml.Shutdown()
		}
	}()
	known := func(n *Node) []string {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.status.Election.Known
	}
	run(x)
	run(mk("y", x.localAddr))
	// x remembers y: its metadata (the members it counts) changes, and
	// the broadcast of that change will not be done for seconds.
	waitFor(t, 5*time.Second, "x sees y join", func() bool { return x.ml.NumMembers() == 2 })
	time.Sleep(50 * time.Millisecond)
	run(mk("z", x.localAddr))
	waitFor(t, 5*time.Second, "x sees z join", func() bool { return x.ml.NumMembers() == 3 })
	joined := time.Now()
	waitFor(t, 5*time.Second, "x's election counts z", func() bool { return slices.Contains(known(x), "z") })
	if el := time.Since(joined); el > 500*time.Millisecond {
		t.Fatalf("x's election counted z %v after memberlist saw it join, want at once (under 500 ms)", el)
	}
}
