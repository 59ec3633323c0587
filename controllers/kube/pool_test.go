package kube

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func nodesOf(names ...string) []poolNode {
	var out []poolNode
	for _, n := range names {
		out = append(out, poolNode{Name: n, ProviderID: "do://" + n})
	}
	return out
}

// drive runs what the controller does in one pass, with a scripted
// provider: owners are read from holders, assigns go to assignFn.
type fakeIPs struct {
	holders map[string]string // ip -> provider ID
	assign  func(ip, pid string) error
	reads   int
	assigns []string
}

func (f *fakeIPs) pass(c *poolCore, nodes []poolNode, now time.Time) {
	for _, ip := range c.dueChecks(now) {
		f.reads++
		owner, ok := f.holders[ip]
		var err error
		if !ok && owner == "" {
			if _, exists := f.holders[ip]; !exists {
				err = fmt.Errorf("get %s: %w", ip, ErrNotFound)
			}
		}
		c.observe(ip, owner, err, now)
	}
	c.setEnabled(nodes, now)
	for {
		a, _, ok := c.nextAssignment(nodes, now)
		if !ok {
			return
		}
		var err error
		if f.assign != nil {
			err = f.assign(a.IP, a.Node.ProviderID)
		}
		if err == nil {
			f.holders[a.IP] = a.Node.ProviderID
			f.assigns = append(f.assigns, a.IP+"->"+a.Node.Name)
		}
		c.assigned(a, err, now)
	}
}

// FLIPOP's order: nodes by name, IPs read as unassigned pushed to the
// front of the free queue one by one in spec order, so the last one listed
// goes to the first node (FLIPOP's "happy path" and "no node selector").
func TestPoolInitialAssignmentFLIPOPOrder(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "", "2.2.2.2": ""}}
	nodes := nodesOf("c", "a", "b")
	slices.SortFunc(nodes, func(x, y poolNode) int { return compareStr(x.Name, y.Name) })
	f.pass(c, nodes, t0)
	if want := []string{"2.2.2.2->a", "1.1.1.1->b"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
	st := c.status(nodes)
	if st.IPs["2.2.2.2"].State != IPStateInProgress || !slices.Equal(st.AssignableNodes, []string{"c"}) {
		t.Fatalf("status %+v", st)
	}
	if got := c.activeIPs(nodes); len(got) != 0 {
		t.Fatalf("active before verification: %v", got)
	}
	// Verified a second later.
	f.pass(c, nodes, t0.Add(time.Second))
	if got := c.activeIPs(nodes); !slices.Equal(got, []string{"1.1.1.1", "2.2.2.2"}) {
		t.Fatalf("active %v", got)
	}
	if st := c.status(nodes); st.IPs["1.1.1.1"] != (IPStatus{State: IPStateActive, NodeName: "b", ProviderID: "do://b"}) {
		t.Fatalf("status %+v", st.IPs["1.1.1.1"])
	}
	if ann := c.annotations(nodes); ann["a"] != "2.2.2.2" || ann["b"] != "1.1.1.1" || len(ann) != 2 {
		t.Fatalf("annotations %v", ann)
	}
}

// Created IPs join spec.ips and are read in spec order: the newest one is
// handed out first (FLIPOP's "create new ips": 10.0.2.2 goes active).
func TestPoolCreatedIPsFLIPOPOrder(t *testing.T) {
	c := newPoolCore()
	c.setSpec(nil, 2, 0, nil, t0)
	c.created("10.0.1.1", nil, t0)
	c.created("10.0.2.2", nil, t0)
	c.setSpec([]string{"10.0.1.1", "10.0.2.2"}, 2, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"10.0.1.1": "", "10.0.2.2": ""}}
	f.pass(c, nodesOf("rio-grande"), t0)
	if want := []string{"10.0.2.2->rio-grande"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
}

// A node that stops matching puts its IP at the back of the queue: an IP
// read as unassigned later still goes out first.
func TestPoolReleasedIPGoesToTheBack(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "do://a", "2.2.2.2": "do://x"}}
	f.pass(c, nodesOf("a"), t0)
	if len(f.assigns) != 0 {
		t.Fatalf("assigns %v", f.assigns)
	}
	f.pass(c, nil, t0.Add(time.Second)) // a stops matching
	f.holders["2.2.2.2"] = ""           // x let its IP go; read at the next check
	f.pass(c, nodesOf("b"), t0.Add(healthyRecheck+time.Second))
	if want := []string{"2.2.2.2->b"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v (a keeps its IP while another is free)", f.assigns, want)
	}
}

// Two pools listing the same IP: neither acts on it, both report it, and
// neither removes an annotation naming it.
func TestPoolSharedAndInvalidIPs(t *testing.T) {
	c := newPoolCore()
	others := map[string]string{"2.2.2.2": "ns/other", "7.7.7.7": "ns/third"}
	c.setSpec([]string{"1.1.1.1", "2.2.2.2", "010.0.0.1"}, 0, 0, others, t0)
	if due := c.dueChecks(t0); !slices.Equal(due, []string{"1.1.1.1", "2.2.2.2"}) {
		t.Fatalf("read %v, want the IPv4 ones (reading changes nothing)", due)
	}
	// c holds the shared IP: it gets no second one; a does.
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "", "2.2.2.2": "do://c"}}
	f.pass(c, nodesOf("a", "b", "c"), t0)
	if want := []string{"1.1.1.1->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
	if ann := c.annotations(nodesOf("a", "b", "c")); len(ann) != 1 || ann["a"] != "1.1.1.1" {
		t.Fatalf("annotations %v: the shared IP's holder is left alone", ann)
	}
	if st := c.status(nodesOf("a", "b", "c")); !slices.Equal(st.AssignableNodes, []string{"b"}) {
		t.Fatalf("assignable %v", st.AssignableNodes)
	}
	st := c.status(nodesOf("a", "b", "c"))
	if !strings.Contains(st.Error, "ip 2.2.2.2 is also listed by FloatingIPPool ns/other") {
		t.Fatalf("status.error %q", st.Error)
	}
	if s := st.IPs["2.2.2.2"]; s.State != IPStateError || s.Error != "also listed by FloatingIPPool ns/other" {
		t.Fatalf("shared IP status %+v", s)
	}
	if s := st.IPs["010.0.0.1"]; s.State != IPStateError || !strings.Contains(s.Error, "not an IPv4 address") {
		t.Fatalf("invalid IP status %+v", s)
	}
	if c.ownsAnnotation("2.2.2.2") || c.ownsAnnotation("7.7.7.7") || !c.ownsAnnotation("1.1.1.1") {
		t.Fatal("annotation ownership wrong")
	}
	// The other pool drops it: this pool takes it up, on c where it is.
	c.setSpec([]string{"1.1.1.1", "2.2.2.2", "010.0.0.1"}, 0, 0, nil, t0.Add(time.Second))
	f.pass(c, nodesOf("a", "b", "c"), t0.Add(time.Second))
	if want := []string{"1.1.1.1->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
	if ann := c.annotations(nodesOf("a", "b", "c")); ann["c"] != "2.2.2.2" {
		t.Fatalf("annotations %v", ann)
	}
	if st := c.status(nil); st.Error != "" {
		t.Fatalf("status.error %q after the fix", st.Error)
	}
}

func compareStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestPoolKeepsExistingAssignmentsWithoutCalls(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 0, nil, t0)
	// b holds 1.1.1.1 already; a holds nothing.
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "do://b", "2.2.2.2": ""}}
	nodes := nodesOf("a", "b")
	f.pass(c, nodes, t0)
	if want := []string{"2.2.2.2->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v (b keeps its IP)", f.assigns, want)
	}
}

func TestPoolStealsFromNonMatchingDropletLast(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2", "3.3.3.3"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "do://other", "2.2.2.2": "", "3.3.3.3": "do://x"}}
	f.pass(c, nodesOf("a"), t0)
	if want := []string{"2.2.2.2->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want the unassigned IP first", f.assigns)
	}
	if st := c.status(nodesOf("a")); st.IPs["1.1.1.1"].State != IPStateNoMatch || st.IPs["1.1.1.1"].ProviderID != "do://other" {
		t.Fatalf("status %+v", st.IPs["1.1.1.1"])
	}
}

func TestPoolDisabledNodeKeepsIPUntilNeeded(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": ""}}
	f.pass(c, nodesOf("a"), t0)
	f.pass(c, nodesOf("a"), t0.Add(time.Second))
	// a drops out; nobody else needs the IP: no call, state no-match.
	f.pass(c, nil, t0.Add(2*time.Second))
	if len(f.assigns) != 1 {
		t.Fatalf("assigns %v", f.assigns)
	}
	if st := c.status(nil); st.IPs["1.1.1.1"].State != IPStateNoMatch {
		t.Fatalf("state %+v", st.IPs["1.1.1.1"])
	}
	if ann := c.annotations(nil); len(ann) != 0 {
		t.Fatalf("annotations %v", ann)
	}
	if !c.ownsAnnotation("1.1.1.1") {
		t.Fatal("pool must own its IP's annotation to remove it")
	}
	// a comes back: it still holds the IP, active again without a call.
	f.pass(c, nodesOf("a"), t0.Add(3*time.Second))
	if len(f.assigns) != 1 || !slices.Equal(c.activeIPs(nodesOf("a")), []string{"1.1.1.1"}) {
		t.Fatalf("assigns %v active %v", f.assigns, c.activeIPs(nodesOf("a")))
	}
	// a leaves, b arrives: the IP moves (one assign, no unassign).
	f.pass(c, nodesOf("b"), t0.Add(4*time.Second))
	if want := []string{"1.1.1.1->a", "1.1.1.1->b"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
}

func TestPoolCoolOff(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 20*time.Second, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "", "2.2.2.2": ""}}
	nodes := nodesOf("a", "b")
	f.pass(c, nodes, t0)
	if len(f.assigns) != 1 {
		t.Fatalf("assigns %v, want 1 within the cool-off", f.assigns)
	}
	if _, wake, ok := c.nextAssignment(nodes, t0.Add(time.Second)); ok || !wake.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("wake %v ok %v, want cool-off end", wake, ok)
	}
	if w := c.nextWake(nodes, t0.Add(2*time.Second)); w.After(t0.Add(20 * time.Second)) {
		t.Fatalf("nextWake %v is after the cool-off end", w)
	}
	f.pass(c, nodes, t0.Add(19*time.Second))
	if len(f.assigns) != 1 {
		t.Fatalf("assigns %v before the cool-off ended", f.assigns)
	}
	f.pass(c, nodes, t0.Add(20*time.Second))
	if len(f.assigns) != 2 {
		t.Fatalf("assigns %v after the cool-off", f.assigns)
	}
}

func TestPoolAssignErrorBackoffAndNoNodeLeftBehind(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 0, nil, t0)
	fail := 2
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "", "2.2.2.2": ""}}
	f.assign = func(ip, pid string) error {
		if pid == "do://a" && fail > 0 {
			fail--
			return &apiError{Provider: "digitalocean", Status: 500, Message: "boom"}
		}
		return nil
	}
	nodes := nodesOf("a", "b")
	f.pass(c, nodes, t0)
	// a failed with 2.2.2.2 (first in FLIPOP's order); b still got
	// 1.1.1.1 in the same pass.
	if want := []string{"1.1.1.1->b"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
	st := c.status(nodes)
	if !slices.Equal(st.NodeErrors, []string{"a"}) || st.IPs["2.2.2.2"].State != IPStateError {
		t.Fatalf("status %+v", st)
	}
	// FLIPOP names the node the failed assignment was for.
	if s := st.IPs["2.2.2.2"]; s.ProviderID != "do://a" || s.NodeName != "a" || !strings.HasPrefix(s.Error, "assigning IP to node: ") {
		t.Fatalf("failed IP status %+v", s)
	}
	if c.assignErrors["2.2.2.2"] != 1 {
		t.Fatalf("assign errors %v", c.assignErrors)
	}
	// Inside the node's backoff (1s): no retry.
	f.pass(c, nodes, t0.Add(500*time.Millisecond))
	if len(f.assigns) != 1 || fail != 1 {
		t.Fatalf("retried inside backoff: assigns %v fail %d", f.assigns, fail)
	}
	// After it: second failure, backoff grows (1s then 1s then 5s).
	f.pass(c, nodes, t0.Add(1100*time.Millisecond))
	if fail != 0 {
		t.Fatalf("no retry after the backoff")
	}
	f.pass(c, nodes, t0.Add(2200*time.Millisecond))
	if want := []string{"1.1.1.1->b", "2.2.2.2->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v", f.assigns, want)
	}
	f.pass(c, nodes, t0.Add(4*time.Second))
	st = c.status(nodes)
	if len(st.NodeErrors) != 0 || st.IPs["2.2.2.2"].State != IPStateActive {
		t.Fatalf("status after recovery %+v", st)
	}
}

func TestPoolReadErrors(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "9.9.9.9"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": ""}} // 9.9.9.9 does not exist
	f.pass(c, nodesOf("a", "b"), t0)
	st := c.status(nodesOf("a", "b"))
	if st.IPs["9.9.9.9"].State != IPStateError {
		t.Fatalf("missing IP state %+v", st.IPs["9.9.9.9"])
	}
	if want := []string{"1.1.1.1->a"}; !slices.Equal(f.assigns, want) {
		t.Fatalf("assigns %v, want %v (never the missing IP)", f.assigns, want)
	}
	// Not found retries slowly (1 minute).
	if due := c.dueChecks(t0.Add(30 * time.Second)); slices.Contains(due, "9.9.9.9") {
		t.Fatalf("missing IP re-read after 30s: %v", due)
	}
	if due := c.dueChecks(t0.Add(61 * time.Second)); !slices.Contains(due, "9.9.9.9") {
		t.Fatalf("missing IP not re-read after a minute: %v", due)
	}
}

func TestPoolDesiredIPsAndDisabled(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2", "3.3.3.3"}, 2, 0, nil, t0)
	if n := c.toCreate(3, 2, t0); n != 0 {
		t.Fatalf("toCreate %d", n)
	}
	st := c.status(nil)
	if st.IPs["3.3.3.3"].State != IPStateDisabled {
		t.Fatalf("status %+v", st)
	}
	if due := c.dueChecks(t0); !slices.Equal(due, []string{"1.1.1.1", "2.2.2.2"}) {
		t.Fatalf("disabled IP is read: %v", due)
	}

	c = newPoolCore()
	c.setSpec(nil, 3, 0, nil, t0)
	if n := c.toCreate(0, 3, t0); n != 3 {
		t.Fatalf("toCreate %d, want 3", n)
	}
	c.created("4.4.4.4", nil, t0)
	c.created("", &apiError{Provider: "digitalocean", Status: 429, Message: "slow down"}, t0)
	if c.createErr == "" || c.toCreate(0, 3, t0.Add(500*time.Millisecond)) != 0 {
		t.Fatalf("create error not backed off: %q", c.createErr)
	}
	// Pending IPs count toward desiredIPs (no runaway creation).
	if n := c.toCreate(0, 3, t0.Add(2*time.Second)); n != 2 {
		t.Fatalf("toCreate %d, want 2 with one pending", n)
	}
	c.setSpec([]string{"4.4.4.4"}, 3, 0, nil, t0)
	if len(c.pending) != 0 {
		t.Fatalf("pending %v after it reached spec.ips", c.pending)
	}
}

func TestRetrySchedule(t *testing.T) {
	tests := []struct {
		err  error
		want schedule
	}{
		{ErrInProgress, retryFast},
		{fmt.Errorf("x: %w", ErrNotFound), retrySlow},
		{&apiError{Status: 429}, retryFast},
		{&apiError{Status: 503}, retryFast},
		{&apiError{Status: 0}, retryFast},
		{&apiError{Status: 403}, retrySlow},
		{errors.New("other"), retrySlow},
	}
	for _, tt := range tests {
		if got := retrySchedule(tt.err); got != tt.want {
			t.Errorf("retrySchedule(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	var b backoff
	var waits []time.Duration
	for range 14 {
		waits = append(waits, b.fail(retryFast, t0).Sub(t0))
	}
	want := []time.Duration{time.Second, time.Second, 5 * time.Second, 5 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second,
		time.Minute, time.Minute, time.Minute, time.Minute, time.Minute, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(waits, want) {
		t.Fatalf("fast ladder %v", waits)
	}
}

func TestPoolReadErrorKeepsHolder(t *testing.T) {
	c := newPoolCore()
	c.setSpec([]string{"1.1.1.1", "2.2.2.2"}, 0, 0, nil, t0)
	f := &fakeIPs{holders: map[string]string{"1.1.1.1": "", "2.2.2.2": ""}}
	nodes := nodesOf("a")
	f.pass(c, nodes, t0)
	f.pass(c, nodes, t0.Add(time.Second))
	if !slices.Equal(c.activeIPs(nodes), []string{"2.2.2.2"}) {
		t.Fatalf("active %v", c.activeIPs(nodes))
	}
	// The periodic re-read of a's IP fails with a 500.
	c.observe("2.2.2.2", "", &apiError{Provider: "digitalocean", Status: 500, Message: "boom"}, t0.Add(healthyRecheck))
	if a, _, ok := c.nextAssignment(nodes, t0.Add(healthyRecheck)); ok {
		t.Fatalf("a read error made a look empty-handed: would assign %+v", a)
	}
	st := c.status(nodes)
	if st.IPs["2.2.2.2"].State != IPStateError || len(st.AssignableNodes) != 0 {
		t.Fatalf("status %+v", st)
	}
	if ann := c.annotations(nodes); ann["a"] != "2.2.2.2" {
		t.Fatalf("annotation dropped on a read error: %v", ann)
	}
	// The read recovers (fast retry).
	if due := c.dueChecks(t0.Add(healthyRecheck + time.Second)); !slices.Contains(due, "2.2.2.2") {
		t.Fatalf("not re-read after 1s: %v", due)
	}
	c.observe("2.2.2.2", "do://a", nil, t0.Add(healthyRecheck+time.Second))
	if st := c.status(nodes); st.IPs["2.2.2.2"].State != IPStateActive {
		t.Fatalf("status after recovery %+v", st.IPs["2.2.2.2"])
	}
}
