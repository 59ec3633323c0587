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

type tlog struct{ t *testing.T }

func (l *tlog) Write(p []byte) (int, error) { l.t.Log(string(bytes.TrimSpace(p))); return len(p), nil }
