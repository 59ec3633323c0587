package vip

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// A held VIP whose announcements the other nodes cannot receive
// (ErrUnverified from Check) is given up as this node's fault: a Failed
// transition, which the daemon reports to the election (SetFailed) so
// that another node takes the VIP; even a vouched-for holder steps aside.
func TestCoreUnverifiedStepsAside(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	stepDone(c, Elected{VIP: v4, Holder: true}, t0)
	o := c.Step(Failed{Action: Action{Kind: Check, VIP: v4}, Err: fmt.Errorf("n2, n3 cannot reach it: %w", ErrUnverified)}, t0.Add(time.Second))
	if fmt.Sprint(acts(o)) != "[release 10.0.0.100/32]" || len(o.Transitions) != 1 || !o.Transitions[0].Failed || o.Transitions[0].Held {
		t.Fatalf("got %v %+v", acts(o), o.Transitions)
	}
}
