package sim

import (
	"fmt"
	"time"
)

// fault injects one random fault. The schedule respects the one rule the
// documentation asks of operators: a node is deleted for good (without a
// graceful stop) only while every earlier such deletion has been forgotten
// (VIPD_MEMBER_EXPIRY) and the rest are a majority.
func (s *Sim) fault() {
	s.lastTopo = s.now
	live := s.members()
	pick := func(ns []*node) *node {
		if len(ns) == 0 {
			return nil
		}
		return ns[s.rnd.Intn(len(ns))]
	}
	up := func() []*node {
		var out []*node
		for _, n := range live {
			if n.up {
				out = append(out, n)
			}
		}
		return out
	}
	switch k := s.rnd.Intn(20); {
	case k < 2: // partition: a random split into two sides
		ns := up()
		if len(ns) < 2 {
			return
		}
		side := map[int]bool{}
		for _, n := range ns {
			side[n.id] = s.rnd.Intn(2) == 0
		}
		for _, a := range s.nodes {
			for _, b := range s.nodes {
				if a != b && side[a.id] != side[b.id] {
					s.block[[2]int{a.id, b.id}] = true
				}
			}
		}
		s.logf("FAULT partition %v", sides(s, side))
	case k < 3: // every node alone (1+1+1)
		for _, a := range s.nodes {
			for _, b := range s.nodes {
				if a != b {
					s.block[[2]int{a.id, b.id}] = true
				}
			}
		}
		s.logf("FAULT full partition")
	case k < 4: // one-way link loss
		a, b := pick(live), pick(live)
		if a == nil || a == b {
			return
		}
		s.block[[2]int{a.id, b.id}] = true
		s.logf("FAULT one-way: %s -> %s dropped", a.name, b.name)
	case k < 6: // heal the network
		s.block = map[[2]int]bool{}
		s.drop = 0
		s.logf("FAULT network healed")
	case k < 7: // lossy network
		s.drop = []float64{0.05, 0.2, 0.5}[s.rnd.Intn(3)]
		s.logf("FAULT gossip loss %.0f%%", s.drop*100)
	case k < 8: // vipd crashes, systemd restarts it
		if n := pick(up()); n != nil && n.running {
			s.stopVipd(n, false)
			n.restartAt = s.now.Add(RestartDelay)
			s.logf("FAULT %s: vipd crashed", n.name)
		}
	case k < 9: // machine off, or back on
		n := pick(live)
		if n == nil {
			return
		}
		if n.up {
			n.up, n.bound = false, false
			s.logf("FAULT %s: machine off", n.name)
		} else {
			n.up = true
			n.restartAt = s.now.Add(RestartDelay)
			s.logf("FAULT %s: machine on", n.name)
		}
	case k < 10: // planned restart, with or without the state directory
		if n := pick(up()); n != nil && n.running {
			wipe := s.rnd.Intn(2) == 0
			s.stopVipd(n, true)
			s.startVipd(n, !wipe)
			s.logf("FAULT %s: restarted (state wiped: %v)", n.name, wipe)
		}
	case k < 12: // apiserver health flaps
		if n := pick(up()); n != nil {
			n.healthy = !n.healthy
			s.logf("FAULT %s: apiserver healthy=%v", n.name, n.healthy)
			if n.running {
				s.coreStep(n, vipHealth(n.healthy))
				s.elStep(n, elHealth(n.healthy))
			}
		}
	case k < 13: // acquires fail (netlink refuses), or work again
		if n := pick(live); n != nil {
			n.brokenAcq = !n.brokenAcq
			s.logf("FAULT %s: acquire broken=%v", n.name, n.brokenAcq)
		}
	case k < 14: // VIP interface down while gossip runs on another NIC, or up
		if n := pick(live); n != nil {
			n.vipIf = !n.vipIf
			s.logf("FAULT %s: VIP interface up=%v", n.name, n.vipIf)
		}
	case k < 15: // the node's only link down, or up
		if n := pick(live); n != nil {
			n.linkUp = !n.linkUp
			s.logf("FAULT %s: link up=%v", n.name, n.linkUp)
		}
	case k < 17: // membership: join, graceful leave, replacement, deletion
		s.membership(live)
	case k < 18: // a clone with the same name
		if len(s.nodes) < 12 {
			if o := pick(live); o != nil {
				n := s.addNode(o.name, "k")
				n.healthy = true
				s.startVipd(n, false)
				s.logf("FAULT duplicate name %s started", n.name)
			}
		}
	case k < 19: // a stranger with another key
		if len(s.nodes) < 12 {
			// Each stranger has a key of its own: two strangers sharing a
			// key would be a second cluster configured with our VIP, which
			// no election can see (out of scope; l2's probe still catches it).
			n := s.addNode(fmt.Sprintf("rogue%d", len(s.nodes)), fmt.Sprintf("other%d", len(s.nodes)))
			n.healthy = true
			s.startVipd(n, false)
			s.logf("FAULT %s with another gossip key started", n.name)
		}
	default: // the operator removes duplicates and strangers
		for _, n := range s.nodes {
			if n.deleted {
				continue
			}
			if n.key != "k" || s.dupOlder(n) {
				s.stopVipd(n, true)
				s.remove(n)
				s.logf("FAULT %s (node%d) removed by the operator", n.name, n.id)
			}
		}
	}
}

// dupOlder reports whether another node with n's name was added before n.
func (s *Sim) dupOlder(n *node) bool {
	for _, o := range s.nodes {
		if o.id < n.id && !o.deleted && o.name == n.name && o.key == n.key {
			return true
		}
	}
	return false
}

func (s *Sim) membership(live []*node) {
	s.seq++
	recent := false
	for _, t := range s.deletedAt {
		if s.now.Sub(t) < s.opt.Expiry+s.forget+10*time.Second {
			recent = true
		}
		_ = t
	}
	switch k := s.rnd.Intn(4); {
	case k == 0 && len(live) < 7: // a new node joins
		n := s.addNode(fmt.Sprintf("new%d", len(s.nodes)), "k")
		n.healthy = true
		s.startVipd(n, false)
		s.logf("FAULT %s joins", n.name)
	case k == 1 && len(live) > 2: // graceful stop, machine removed
		n := live[s.rnd.Intn(len(live))]
		s.stopVipd(n, true)
		s.remove(n)
		s.logf("FAULT %s stopped gracefully and removed", n.name)
	case k == 2 && len(live) > 2 && !recent: // ungraceful deletion
		n := live[s.rnd.Intn(len(live))]
		s.remove(n)
		if n.running {
			s.stopVipd(n, false)
		}
		s.logf("FAULT %s deleted without a stop", n.name)
	case k == 3 && len(live) > 1: // replacement: a new node, then an old one stops
		n := s.addNode(fmt.Sprintf("new%d", len(s.nodes)), "k")
		n.healthy = true
		s.startVipd(n, false)
		old := live[s.rnd.Intn(len(live))]
		// The new node first, the old one after the new one is counted.
		s.pendingStop = append(s.pendingStop, stopAt{n: old, at: s.now.Add(5 * time.Second)})
		s.logf("FAULT replacement: %s joins, %s stops in 5 s", n.name, old.name)
	}
}

type stopAt struct {
	n  *node
	at time.Time
}

func sides(s *Sim, side map[int]bool) string {
	var a, b []string
	for _, n := range s.nodes {
		if _, ok := side[n.id]; !ok {
			continue
		}
		if side[n.id] {
			a = append(a, n.name)
		} else {
			b = append(b, n.name)
		}
	}
	return fmt.Sprintf("%v | %v", a, b)
}
