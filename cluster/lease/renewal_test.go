package lease

import (
	"fmt"
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
	// the longest silence a retry at the next tick still covers: the
	// lease from the last answered round lasts LeaseLength
	longest := cfg.LeaseLength().Truncate(cfg.Tick) - cfg.Tick
	for _, tc := range []struct {
		name string
		// lost: how long every packet from the leader is dropped, from
		// just after a renewal round a majority answered
		lost time.Duration
	}{
		{"nothing lost", 0},
		{"one round lost", renewal + cfg.Tick},
		// the next renewal after it comes after the lease's end: only the
		// retries keep the lease
		{"rounds lost for most of a lease", longest},
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
			// a retry at every tick from the first lost renewal that is
			// not a renewal, until one gets through
			retries := 0
			if tc.lost >= renewal {
				for at := renewal + cfg.Tick; ; at += cfg.Tick {
					if at%renewal != 0 {
						retries++
					}
					if at > tc.lost { // the loss began 2 ms after the round
						break
					}
				}
			}
			if want := int(2*time.Second/renewal) + retries; beats != want {
				t.Errorf("%d packets with heartbeats to b in 2 s, want %d", beats, want)
			}
		})
	}
}

// TestGrantsOutliveTheNextHeartbeat: a grant rides on the next heartbeat
// only when what the follower holds already lasts past it. The answers
// that come before a round completes are granted against the lease as it
// was (a renewal interval shorter); a follower that answered first in one
// round and late in the next was granted short, then told to wait for the
// next heartbeat, and its hold ran out before it (renewals every 250 ms
// with a lease of 685 ms: the simulator saw pool addresses held by nobody).
func TestGrantsOutliveTheNextHeartbeat(t *testing.T) {
	for _, hb := range []int{4, 5, 6, 7} {
		t.Run(fmt.Sprintf("renewal every %d ticks", hb), func(t *testing.T) {
			n := clusterWith(t, 5, manyAddresses(12, 2), func(c *Config) { c.HeartbeatTicks = hb })
			leader := leaderOf(t, n)
			renewal := time.Duration(hb) * n.nodes[leader].cfg.Tick
			w := track(n)
			// every other round, one follower's answers come a
			// millisecond late: it answers first, then after the majority
			slow := ""
			for _, name := range n.order {
				if name != leader {
					slow = name
					break
				}
			}
			n.delayOnce(func(p pkt) bool {
				return p.from == slow && p.to == leader && n.now.Sub(n.now.Truncate(2*renewal)) >= renewal
			})
			n.run(5 * time.Second)
			held := 0
			for _, k := range w.keys {
				f := w.first[k]
				if f == "" || f == leader {
					continue
				}
				held++
				if w.gap[k] > 0 || w.moved[k] != "" {
					t.Errorf("%s held by %s: gap %v, moved to %q", k, f, w.gap[k], w.moved[k])
				}
			}
			if held == 0 {
				t.Fatal("setup: the followers hold nothing")
			}
		})
	}
}

// TestTransferVoteBeforeAnnouncement: the transferee's vote requests
// overtake the leader's announcement of the transfer (sent at the same
// moment); a voter holds such a request until the announcement comes and
// answers it then, so the transfer completes at once instead of failing
// and leaving the cluster to an election after the leader's lease. (With
// 3 nodes the old leader's own vote makes the majority: it knows.)
func TestTransferVoteBeforeAnnouncement(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d nodes", size), func(t *testing.T) {
			n := cluster(t, size, manyAddresses(6, 1))
			leader := leaderOf(t, n)
			w := track(n)
			// the announcement to every voter but the transferee comes a
			// millisecond late, after the transferee's vote request
			var announced time.Time
			delayed := n.delayOnce(func(p pkt) bool {
				if p.from != leader {
					return false
				}
				e, err := decode(p.data)
				if err != nil || e.h.Transfer == "" || e.h.Transfer == p.to {
					return false
				}
				if announced.IsZero() {
					announced = n.now // the transfer itself begins (after the VIP's make-before-break)
				}
				return true
			})
			start := n.now
			n.step(leader, Transfer{})
			var took time.Duration
			for took == 0 && n.now.Sub(start) < 3*time.Second {
				n.run(time.Millisecond)
				for _, name := range n.order {
					if name != leader && n.nodes[name].m.lead != nil && n.nodes[name].m.leaseValid() {
						took = n.now.Sub(announced)
					}
				}
			}
			if *delayed == 0 {
				t.Fatal("setup: no announcement was delayed")
			}
			if took == 0 || took > 50*time.Millisecond {
				t.Fatalf("the transferee held a lease %v after the leader announced the transfer, want within 50 ms", took)
			}
			n.run(2 * time.Second)
			for _, k := range w.keys {
				if f := w.first[k]; f != leader && (w.gap[k] > 0 || w.moved[k] != "") {
					t.Errorf("%s held by %s: gap %v, moved to %q in a handover", k, f, w.gap[k], w.moved[k])
				}
			}
		})
	}
}

// delayOnce holds every packet that match selects for a millisecond (it is
// delivered after the packets queued behind it), once. It replaces n.drop
// and chains n.after; the count is how many packets it delayed.
func (n *tnet) delayOnce(match func(p pkt) bool) *int {
	var late []pkt
	delayed := map[*byte]bool{}
	count := new(int)
	n.drop = func(p pkt) bool {
		if len(p.data) == 0 || delayed[&p.data[0]] || !match(p) {
			return false
		}
		delayed[&p.data[0]] = true
		*count++
		late = append(late, p)
		return true
	}
	prev := n.after
	n.after = func() {
		n.q, late = append(n.q, late...), nil
		if prev != nil {
			prev()
		}
	}
	return count
}
