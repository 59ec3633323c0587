package sim

import (
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

func TestOverlapBound(t *testing.T) {
	for _, c := range []struct {
		profile string
		want    time.Duration
	}{
		// 300 ms on a clock 1 % slow is 303.03 ms of true time: the
		// 302.7 ms seen in a 2,500-schedule run is inside it.
		{"default", 303030303 * time.Nanosecond},
		{"fast", 151515151 * time.Nanosecond},
	} {
		if got := OverlapBound(lease.ProfileConfig(c.profile)); got != c.want {
			t.Errorf("%s: OverlapBound = %v, want %v", c.profile, got, c.want)
		}
	}
}

// The strict checker accepts a declared overlap up to the bound in true
// time and nothing longer, nothing undeclared or one-sided.
func TestOverlapOK(t *testing.T) {
	s := New(lease.ProfileConfig("default"), 1)
	start := s.now
	bound := OverlapBound(s.Cfg)
	decl := func(until time.Time) (*Node, *Node) {
		n := &Node{Name: "a", ovs: map[string]lease.Overlap{"vip": {With: "b", Old: true, Until: until}}}
		o := &Node{Name: "b", ovs: map[string]lease.Overlap{"vip": {With: "a", Until: until}}}
		return n, o
	}
	for _, c := range []struct {
		name string
		long time.Duration
		edit func(n, o *Node)
		want bool
	}{
		{"nominal overlap", 300 * time.Millisecond, nil, true},
		{"a slow clock's full overlap", 302700 * time.Microsecond, nil, true},
		{"at the bound", bound, nil, true},
		{"past the bound", bound + 10*time.Microsecond, nil, false},
		{"the successor did not declare it", 10 * time.Millisecond, func(n, o *Node) { delete(o.ovs, "vip") }, false},
		{"both say they are the old holder", 10 * time.Millisecond, func(n, o *Node) { o.ovs["vip"] = lease.Overlap{With: "a", Old: true, Until: start.Add(time.Second)} }, false},
		{"declared with a third node", 10 * time.Millisecond, func(n, o *Node) { o.ovs["vip"] = lease.Overlap{With: "c", Until: start.Add(time.Second)} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			end := start.Add(c.long)
			n, o := decl(start.Add(time.Second))
			if c.edit != nil {
				c.edit(n, o)
			}
			if got := s.overlapOK(n, o, "vip", start, end); got != c.want {
				t.Errorf("overlapOK over %v = %v, want %v", c.long, got, c.want)
			}
		})
	}
	// An overlap that outlasts what either side declared is refused.
	n, o := decl(start.Add(100 * time.Millisecond))
	if s.overlapOK(n, o, "vip", start, start.Add(200*time.Millisecond)) {
		t.Error("an overlap past the declared Until was accepted")
	}
}
