package lease

import (
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// heartbeatsTo is 1 when p goes from -> to and carries a renewal round's
// heartbeat (raft's own, every HeartbeatTick, carry no context).
func heartbeatsTo(t *testing.T, p pkt, from, to string) int {
	t.Helper()
	if p.from != from || p.to != to {
		return 0
	}
	e, err := decode(p.data)
	if err != nil {
		t.Fatalf("decode %s -> %s: %v", p.from, p.to, err)
	}
	for _, m := range e.msgs {
		if m.GetType() == pb.MsgHeartbeat && len(m.GetContext()) > 0 {
			return 1
		}
	}
	return 0
}

// TestRenewalRetry: a renewal round no majority answered within a tick is
// sent again at the next tick instead of at the next renewal, so the
// lease outlives lost rounds; an answered round is never repeated.
func TestRenewalRetry(t *testing.T) {
	cfg := ProfileConfig("default")
	renewal := time.Duration(cfg.HeartbeatTicks) * cfg.Tick
	for _, tc := range []struct {
		name string
		// lost: how long every packet from the leader is dropped, from
		// just after a renewal round a majority answered
		lost    time.Duration
		retries int // a retry at every tick from the first lost renewal that is not a renewal, until one gets through
	}{
		{"nothing lost", 0, 0},
		{"one round lost", renewal + cfg.Tick, 2},
		// the lease (685 ms) ends before the renewal after the third lost
		// one: only the retries keep it
		{"three rounds lost", 3*renewal + cfg.Tick/5, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := three(t)
			n.run(time.Second)
			a := n.nodes["a"].m
			// to just after a renewal a majority answered
			for n.now.Sub(n.now.Truncate(renewal)) != 2*time.Millisecond {
				n.run(time.Millisecond)
			}
			if len(a.reads) != 0 {
				t.Fatalf("setup: the round at %v is not answered: %v", n.now, a.reads)
			}
			start := n.now
			beats := 0
			n.drop = func(p pkt) bool {
				beats += heartbeatsTo(t, p, "a", "b")
				return p.from == "a" && n.now.Sub(start) < tc.lost
			}
			var lapsed []time.Duration
			late := false
			n.after = func() {
				if !a.leaseValid() {
					lapsed = append(lapsed, n.now.Sub(start))
				}
				// vipd's loop sleeps until Output.Next: an unanswered
				// round must wake the leader at the next tick
				if nx := a.next(); len(a.reads) > 0 && nx.Sub(n.now) > cfg.Tick && !late {
					late = true
					t.Errorf("%v after the loss began a round is unanswered and the next step is %v away", n.now.Sub(start), nx.Sub(n.now))
				}
			}
			n.run(2 * time.Second)
			if len(lapsed) > 0 {
				t.Errorf("the leader's lease lapsed %d times, first %v after the loss began", len(lapsed), lapsed[0])
			}
			if h := n.holders("vip"); len(h) != 1 || h[0] != "a" {
				t.Errorf("vip held by %v, want a", h)
			}
			if want := int(2*time.Second/renewal) + tc.retries; beats != want {
				t.Errorf("%d packets with heartbeats to b in 2 s, want %d", beats, want)
			}
		})
	}
}
