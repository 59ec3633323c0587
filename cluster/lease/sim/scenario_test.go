package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

var cpKey = "10.0.0.100/32"

func addrs(pool int) []lease.Address {
	a := []lease.Address{{Key: cpKey, Kind: lease.ControlPlane}}
	for i := 0; i < pool; i++ {
		a = append(a, lease.Address{Key: fmt.Sprintf("10.0.1.%d/32", i), Kind: lease.Pool})
	}
	return a
}

func fail(t *testing.T, s *Sim, format string, a ...any) {
	t.Helper()
	t.Fatalf(format+"\ntrace:\n%s", append(a, s.Trace())...)
}

func noViolations(t *testing.T, s *Sim) {
	t.Helper()
	if len(s.Violations) > 0 {
		fail(t, s, "violations: %v", s.Violations)
	}
}

// threeNodes: the kubeadm flow, node 1 alone first, then two joiners.
func threeNodes(t *testing.T, profile string, seed int64) *Sim {
	s := New(lease.ProfileConfig(profile), seed)
	s.Want(addrs(3))
	s.AddNode("n1", NodeOpts{})
	s.Run(100 * time.Millisecond)
	s.AddNode("n2", NodeOpts{ExpectPeers: true})
	s.AddNode("n3", NodeOpts{ExpectPeers: true})
	s.Run(5 * time.Second)
	noViolations(t, s)
	st := s.Status("n1")
	if len(st.Voters) != 3 {
		fail(t, s, "voters = %v, want 3", st.Voters)
	}
	return s
}

func TestThreeNodesHoldAndFailover(t *testing.T) {
	s := threeNodes(t, "default", 1)
	h := s.Holders(cpKey)
	if len(h) != 1 {
		fail(t, s, "holders of %s = %v", cpKey, h)
	}
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("10.0.1.%d/32", i)
		if len(s.Holders(k)) != 1 {
			fail(t, s, "holders of %s = %v", k, s.Holders(k))
		}
	}
	old := h[0]
	start := s.Now()
	var took time.Duration
	s.OnHold = func(key, node string, at time.Time) {
		if key == cpKey && node != old && took == 0 {
			took = s.Now() - start
		}
	}
	s.Crash(old, true, -1)
	s.Run(3 * time.Second)
	noViolations(t, s)
	if took == 0 || took > time.Second {
		fail(t, s, "failover took %v, want <= 1s", took)
	}
	t.Logf("failover %v", took)
}
