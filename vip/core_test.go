package vip

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var (
	v4 = netip.MustParsePrefix("10.0.0.100/32")
	v6 = netip.MustParsePrefix("fd00::100/128")
	t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// step is one event at an offset from t0 and the actions it must produce,
// written as "acquire 10.0.0.100/32" etc., in order.
type step struct {
	at   time.Duration
	ev   Event
	want []string
}

func acts(out Output) []string {
	var s []string
	for _, a := range out.Actions {
		s = append(s, a.Kind.String()+" "+a.VIP.String())
	}
	return s
}

// stepDone is Step followed by what a driver whose actions all succeed
// does: every Acquire completes (Done) at once, and its output is merged.
func stepDone(c *Core, ev Event, now time.Time) Output {
	out := c.Step(ev, now)
	for i := 0; i < len(out.Actions); i++ {
		if a := out.Actions[i]; a.Kind == Acquire {
			o := c.Step(Done{Action: a}, now)
			out.Actions = append(out.Actions, o.Actions...)
			out.Transitions = append(out.Transitions, o.Transitions...)
			out.Next = o.Next
		}
	}
	return out
}

func run(t *testing.T, c *Core, steps []step) {
	t.Helper()
	for i, st := range steps {
		var out Output
		// The action fails when the next step says so; it succeeds at once otherwise.
		if i+1 < len(steps) {
			if f, ok := steps[i+1].ev.(Failed); ok && f.Action.Kind == Acquire {
				out = c.Step(st.ev, t0.Add(st.at))
				goto check
			}
		}
		out = stepDone(c, st.ev, t0.Add(st.at))
	check:
		got := strings.Join(acts(out), "; ")
		want := strings.Join(st.want, "; ")
		if got != want {
			t.Fatalf("step %d (%T %+v at %v): got [%s], want [%s]", i, st.ev, st.ev, st.at, got, want)
		}
	}
}

func TestCoreTransitions(t *testing.T) {
	up := HealthChanged{Healthy: true, Reason: "ok"}
	down := HealthChanged{Healthy: false, Reason: "http_5xx"}
	tests := []struct {
		name  string
		vips  []netip.Prefix
		opts  Options
		steps []step
	}{
		{"lone node binds on health and releases on failure", []netip.Prefix{v4}, Options{Announce: true}, []step{
			{0, Tick{}, nil},
			{0, up, []string{"acquire 10.0.0.100/32", "announce 10.0.0.100/32"}},
			{time.Second, up, nil}, // no change, nothing to do
			{2 * time.Second, down, []string{"release 10.0.0.100/32"}},
			{3 * time.Second, down, nil},
			{4 * time.Second, up, []string{"acquire 10.0.0.100/32", "announce 10.0.0.100/32"}},
		}},
		{"dual stack acts on both", []netip.Prefix{v4, v6}, Options{Announce: true}, []step{
			{0, up, []string{"acquire 10.0.0.100/32", "acquire fd00::100/128", "announce 10.0.0.100/32", "announce fd00::100/128"}},
			{time.Second, Shutdown{Reason: "SIGTERM"}, []string{"release 10.0.0.100/32", "release fd00::100/128"}},
			{2 * time.Second, up, nil}, // stopping: never acquire again
		}},
		{"bgp mode does not announce", []netip.Prefix{v4}, Options{}, []step{
			{0, up, []string{"acquire 10.0.0.100/32"}},
			{5 * time.Second, Tick{}, nil},
		}},
		{"election gates holding", []netip.Prefix{v4, v6}, Options{Elect: true}, []step{
			{0, up, nil},
			{time.Second, Elected{VIP: v6, Holder: true, Reason: "highest priority"}, []string{"acquire fd00::100/128"}},
			{2 * time.Second, Elected{VIP: v4, Holder: false, Reason: "n2 holds it"}, nil},
			{3 * time.Second, down, []string{"release fd00::100/128"}},
			{4 * time.Second, up, []string{"acquire fd00::100/128"}},
			{5 * time.Second, Elected{VIP: v6, Holder: false, Reason: "lost quorum"}, []string{"release fd00::100/128"}},
		}},
		{"elected but unhealthy holds nothing", []netip.Prefix{v4}, Options{Elect: true}, []step{
			{0, Elected{VIP: v4, Holder: true}, nil},
			{time.Second, up, []string{"acquire 10.0.0.100/32"}},
		}},
		{"unknown VIP events are ignored", []netip.Prefix{v4}, Options{Elect: true}, []step{
			{0, Elected{VIP: v6, Holder: true}, nil},
			{0, Observed{VIP: v6, Present: true}, nil},
		}},
		{"reconcile re-adds a removed VIP and re-announces", []netip.Prefix{v4}, Options{Announce: true}, []step{
			{0, up, []string{"acquire 10.0.0.100/32", "announce 10.0.0.100/32"}},
			{time.Second, Observed{VIP: v4, Present: true}, nil},
			{2 * time.Second, Observed{VIP: v4, Present: false}, []string{"acquire 10.0.0.100/32", "announce 10.0.0.100/32"}},
		}},
		{"reconcile removes a stale VIP at start-up", []netip.Prefix{v4}, Options{Announce: true}, []step{
			{0, Observed{VIP: v4, Present: true}, []string{"release 10.0.0.100/32"}},
			{time.Second, Observed{VIP: v4, Present: false}, nil},
		}},
		{"reconcile removes a VIP of a non-elected node", []netip.Prefix{v4}, Options{Elect: true}, []step{
			{0, up, nil},
			{0, Observed{VIP: v4, Present: true}, []string{"release 10.0.0.100/32"}},
		}},
		{"failed acquire backs off and retries", []netip.Prefix{v4}, Options{}, []step{
			{0, up, []string{"acquire 10.0.0.100/32"}},
			{10 * time.Millisecond, Failed{Action: Action{Kind: Acquire, VIP: v4}, Err: errors.New("conflict")}, []string{"release 10.0.0.100/32"}},
			{100 * time.Millisecond, Tick{}, nil},
			{100 * time.Millisecond, up, nil}, // health news does not bypass the backoff
			{510 * time.Millisecond, Tick{}, []string{"acquire 10.0.0.100/32"}},
			{520 * time.Millisecond, Failed{Action: Action{Kind: Acquire, VIP: v4}, Err: errors.New("conflict")}, []string{"release 10.0.0.100/32"}},
			{1300 * time.Millisecond, Tick{}, nil}, // second backoff is 1 s
			{1520 * time.Millisecond, Tick{}, []string{"acquire 10.0.0.100/32"}},
		}},
		{"a failed acquire left bound is removed by reconcile", []netip.Prefix{v4}, Options{}, []step{
			{0, up, []string{"acquire 10.0.0.100/32"}},
			{10 * time.Millisecond, Failed{Action: Action{Kind: Acquire, VIP: v4}, Err: errors.New("x")}, []string{"release 10.0.0.100/32"}},
			{20 * time.Millisecond, Observed{VIP: v4, Present: true}, []string{"release 10.0.0.100/32"}},
		}},
		{"retry abandoned when no longer wanted", []netip.Prefix{v4}, Options{}, []step{
			{0, up, []string{"acquire 10.0.0.100/32"}},
			{10 * time.Millisecond, Failed{Action: Action{Kind: Acquire, VIP: v4}, Err: errors.New("x")}, []string{"release 10.0.0.100/32"}},
			{20 * time.Millisecond, down, nil},
			{time.Second, Tick{}, nil},
		}},
		{"failed release is left to reconcile", []netip.Prefix{v4}, Options{}, []step{
			{0, up, []string{"acquire 10.0.0.100/32"}},
			{time.Second, down, []string{"release 10.0.0.100/32"}},
			{time.Second, Failed{Action: Action{Kind: Release, VIP: v4}, Err: errors.New("busy")}, nil},
			{2 * time.Second, Observed{VIP: v4, Present: true}, []string{"release 10.0.0.100/32"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, New(tt.vips, tt.opts), tt.steps)
		})
	}
}

func TestCoreAnnounceSchedule(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Announce: true})
	out := stepDone(c, HealthChanged{Healthy: true}, t0)
	var sent []time.Duration
	sent = append(sent, 0) // with the acquire
	for out.Next.Sub(t0) < 2*time.Minute {
		now := out.Next
		out = c.Step(Tick{}, now)
		if n := len(out.Actions); n != 1 || out.Actions[0].Kind != Announce {
			t.Fatalf("tick at %v: %v", now.Sub(t0), acts(out))
		}
		sent = append(sent, now.Sub(t0))
	}
	want := []time.Duration{0, 1100 * time.Millisecond, 2200 * time.Millisecond, 3300 * time.Millisecond, 4400 * time.Millisecond,
		34400 * time.Millisecond, 64400 * time.Millisecond, 94400 * time.Millisecond}
	if fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Fatalf("announcements at %v, want %v", sent, want)
	}
	// Ticks between deadlines do nothing.
	if out := c.Step(Tick{}, t0.Add(95*time.Second)); len(out.Actions) != 0 {
		t.Fatalf("early tick announced: %v", acts(out))
	}
	// Release stops the schedule.
	out = c.Step(HealthChanged{Healthy: false}, t0.Add(96*time.Second))
	if !out.Next.IsZero() {
		t.Fatalf("timer still armed after release: %v", out.Next)
	}
}

func TestCoreTransitionsCarryCause(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true})
	c.Step(HealthChanged{Healthy: true, Reason: "ok"}, t0)
	out := c.Step(Elected{VIP: v4, Holder: true, Reason: "incumbent"}, t0.Add(time.Second))
	if len(out.Transitions) != 0 {
		t.Fatalf("held before the acquire was done: %+v", out.Transitions)
	}
	out = c.Step(Done{Action: out.Actions[0]}, t0.Add(time.Second))
	if len(out.Transitions) != 1 || !out.Transitions[0].Held || !strings.Contains(out.Transitions[0].Cause, "incumbent") {
		t.Fatalf("transitions: %+v", out.Transitions)
	}
	out = c.Step(HealthChanged{Healthy: false, Reason: "timeout"}, t0.Add(2*time.Second))
	if len(out.Transitions) != 1 || out.Transitions[0].Held || !strings.Contains(out.Transitions[0].Cause, "timeout") {
		t.Fatalf("transitions: %+v", out.Transitions)
	}
	st := c.State()
	if len(st) != 1 || st[0].Held || st[0].Last.At != t0.Add(2*time.Second) {
		t.Fatalf("state: %+v", st)
	}
}

func TestCoreBurstStartsWhenBound(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Announce: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	// The bind (with its conflict probe) took 120 ms.
	out := c.Step(Done{Action: Action{Kind: Acquire, VIP: v4}}, t0.Add(120*time.Millisecond))
	if want := t0.Add(120*time.Millisecond + BurstSpacing); !out.Next.Equal(want) {
		t.Fatalf("next announcement at %v, want %v", out.Next.Sub(t0), want.Sub(t0))
	}
	// A later Done (e.g. a reconcile re-add mid-burst) does not stretch the burst.
	c.Step(Tick{}, t0.Add(120*time.Millisecond+BurstSpacing))
	out = c.Step(Done{Action: Action{Kind: Acquire, VIP: v4}}, t0.Add(2*time.Second))
	if want := t0.Add(120*time.Millisecond + 2*BurstSpacing); !out.Next.Equal(want) {
		t.Fatalf("next announcement at %v, want %v", out.Next.Sub(t0), want.Sub(t0))
	}
}

func TestCoalesce(t *testing.T) {
	q := make(chan Event, 10)
	q <- Elected{VIP: v4, Holder: false}
	q <- HealthChanged{Healthy: false}
	q <- Elected{VIP: v6, Holder: true}
	q <- Elected{VIP: v4, Holder: true}
	q <- Shutdown{}
	q <- HealthChanged{Healthy: true}
	got := coalesce(Elected{VIP: v4, Holder: true}, q)
	want := []Event{Elected{VIP: v6, Holder: true}, Elected{VIP: v4, Holder: true}, Shutdown{}, HealthChanged{Healthy: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if len(q) != 0 {
		t.Fatal("queue not drained")
	}
}

func TestCoreAcquiringAndChecks(t *testing.T) {
	up := HealthChanged{Healthy: true, Reason: "ok"}
	linkDown := fmt.Errorf("eth0: %w", ErrLinkDown)
	conflict := &ConflictError{VIP: v4.Addr(), MAC: []byte{2, 0, 0, 0, 0, 9}}
	acquire := Action{Kind: Acquire, VIP: v4}
	tests := []struct {
		name string
		opts Options
		do   func(c *Core) []Output
		want func(t *testing.T, outs []Output, c *Core)
	}{
		{"nothing is announced or held before the acquire is done", Options{Announce: true, Check: true}, func(c *Core) []Output {
			return []Output{c.Step(up, t0)}
		}, func(t *testing.T, outs []Output, c *Core) {
			if got := acts(outs[0]); fmt.Sprint(got) != "[acquire 10.0.0.100/32]" || len(outs[0].Transitions) != 0 || c.State()[0].Held {
				t.Fatalf("before Done: %v %+v", got, outs[0].Transitions)
			}
		}},
		{"an acquire that fails for this node's fault is a failed transition and cleans up", Options{Announce: true, Check: true}, func(c *Core) []Output {
			c.Step(up, t0)
			return []Output{c.Step(Failed{Action: acquire, Err: linkDown}, t0.Add(time.Millisecond))}
		}, func(t *testing.T, outs []Output, c *Core) {
			o := outs[0]
			if fmt.Sprint(acts(o)) != "[release 10.0.0.100/32]" || len(o.Transitions) != 1 || !o.Transitions[0].Failed || o.Transitions[0].Held {
				t.Fatalf("got %v %+v", acts(o), o.Transitions)
			}
		}},
		{"a held VIP is checked every second, a lone one probed soon after binding, then every two", Options{Announce: true, Check: true}, func(c *Core) []Output {
			stepDone(c, up, t0)
			var outs []Output
			for i := 1; i <= 4; i++ {
				outs = append(outs, c.Step(Tick{}, t0.Add(time.Duration(i)*time.Second)))
			}
			return outs
		}, func(t *testing.T, outs []Output, c *Core) {
			var probes []bool
			for _, o := range outs {
				for _, a := range o.Actions {
					if a.Kind == Check {
						probes = append(probes, a.Probe)
					}
				}
			}
			if fmt.Sprint(probes) != "[true false true false]" {
				t.Fatalf("checks (probe flags) %v", probes)
			}
		}},
		{"an elected, vouched-for holder never probes", Options{Elect: true, Check: true}, func(c *Core) []Output {
			c.Step(up, t0)
			stepDone(c, Elected{VIP: v4, Holder: true}, t0)
			var outs []Output
			for i := 1; i <= 4; i++ {
				outs = append(outs, c.Step(Tick{}, t0.Add(time.Duration(i)*time.Second)))
			}
			return outs
		}, func(t *testing.T, outs []Output, c *Core) {
			for _, o := range outs {
				for _, a := range o.Actions {
					if a.Kind == Check && a.Probe {
						t.Fatalf("probe by a vouched-for holder: %+v", a)
					}
				}
			}
		}},
		{"interface down: give up, back off, tell the election", Options{Elect: true, Check: true, Jitter: 100 * time.Millisecond}, func(c *Core) []Output {
			c.Step(up, t0)
			stepDone(c, Elected{VIP: v4, Holder: true}, t0)
			o := c.Step(Failed{Action: Action{Kind: Check, VIP: v4}, Err: linkDown}, t0.Add(time.Second))
			early := c.Step(Tick{}, t0.Add(time.Second+550*time.Millisecond))
			late := c.Step(Tick{}, t0.Add(time.Second+600*time.Millisecond))
			return []Output{o, early, late}
		}, func(t *testing.T, outs []Output, c *Core) {
			o := outs[0]
			if fmt.Sprint(acts(o)) != "[release 10.0.0.100/32]" || len(o.Transitions) != 1 || !o.Transitions[0].Failed {
				t.Fatalf("got %v %+v", acts(o), o.Transitions)
			}
			if len(outs[1].Actions) != 0 || fmt.Sprint(acts(outs[2])) != "[acquire 10.0.0.100/32]" {
				t.Fatalf("retry: before jittered back-off %v, after %v", acts(outs[1]), acts(outs[2]))
			}
		}},
		{"conflict seen by a lone holder: give up", Options{Announce: true, Check: true}, func(c *Core) []Output {
			stepDone(c, up, t0)
			return []Output{c.Step(Failed{Action: Action{Kind: Check, VIP: v4, Probe: true}, Err: conflict}, t0.Add(2*time.Second))}
		}, func(t *testing.T, outs []Output, c *Core) {
			// A plain release: another host holds it, no fault of this node.
			if fmt.Sprint(acts(outs[0])) != "[release 10.0.0.100/32]" || outs[0].Transitions[0].Failed || outs[0].Transitions[0].Held {
				t.Fatalf("got %v %+v", acts(outs[0]), outs[0].Transitions)
			}
		}},
		{"conflict seen by an elected holder: keep it and re-announce", Options{Elect: true, Announce: true, Check: true}, func(c *Core) []Output {
			c.Step(up, t0)
			stepDone(c, Elected{VIP: v4, Holder: true}, t0)
			return []Output{c.Step(Failed{Action: Action{Kind: Check, VIP: v4, Probe: true}, Err: conflict}, t0.Add(2*time.Second))}
		}, func(t *testing.T, outs []Output, c *Core) {
			if fmt.Sprint(acts(outs[0])) != "[announce 10.0.0.100/32]" || len(outs[0].Transitions) != 0 || !c.State()[0].Held {
				t.Fatalf("got %v %+v", acts(outs[0]), outs[0].Transitions)
			}
		}},
		{"elected lone holder gives up on conflict", Options{Elect: true, Announce: true, Check: true}, func(c *Core) []Output {
			c.Step(up, t0)
			stepDone(c, Elected{VIP: v4, Holder: true, Lone: true}, t0)
			return []Output{c.Step(Failed{Action: Action{Kind: Check, VIP: v4, Probe: true}, Err: conflict}, t0.Add(2*time.Second))}
		}, func(t *testing.T, outs []Output, c *Core) {
			if fmt.Sprint(acts(outs[0])) != "[release 10.0.0.100/32]" {
				t.Fatalf("got %v", acts(outs[0]))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New([]netip.Prefix{v4}, tt.opts)
			tt.want(t, tt.do(c), c)
		})
	}
}

// Another host answering the acquire probe (kube-vip still holding the VIP
// during a migration) is no fault of this node: it retries after the
// back-off and does not step aside (every other node would find the same).
func TestCoreAcquireConflictIsNoStepAside(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	out := c.Step(Elected{VIP: v4, Holder: true}, t0)
	out = c.Step(Failed{Action: out.Actions[0], Err: &ConflictError{VIP: v4.Addr(), MAC: []byte{2, 0, 0, 0, 0, 9}}}, t0.Add(50*time.Millisecond))
	if len(out.Transitions) != 1 || out.Transitions[0].Failed || fmt.Sprint(acts(out)) != "[release 10.0.0.100/32]" {
		t.Fatalf("got %v %+v", acts(out), out.Transitions)
	}
	if out := c.Step(Tick{}, t0.Add(50*time.Millisecond+RetryMin)); fmt.Sprint(acts(out)) != "[acquire 10.0.0.100/32]" {
		t.Fatalf("no retry after the back-off: %v", acts(out))
	}
}

// TestCoreCheckInterval: when held VIPs are checked, with ticks every
// 500 ms and the given events in between.
func TestCoreCheckInterval(t *testing.T) {
	up := HealthChanged{Healthy: true, Reason: "ok"}
	type ev struct {
		at time.Duration
		ev Event
	}
	tests := []struct {
		name   string
		opts   Options
		events []ev // besides a Tick every 500 ms
		until  time.Duration
		want   string // offsets of the Check actions
	}{
		{"default: every second", Options{Elect: true, Check: true}, nil, 4 * time.Second,
			"[1s 2s 3s 4s]"},
		{"a watched interval of 10 s", Options{Elect: true, Check: true}, []ev{{100 * time.Millisecond, CheckInterval{Every: 10 * time.Second}}}, 25 * time.Second,
			"[1s 11s 21s]"},
		{"CheckNow checks at once and restarts the interval", Options{Elect: true, Check: true},
			[]ev{{0, CheckInterval{Every: 10 * time.Second}}, {3200 * time.Millisecond, CheckNow{}}, {4 * time.Second, CheckNow{}}}, 15 * time.Second,
			"[1s 3.2s 4s 14s]"},
		{"back to the default interval: the next check comes forward", Options{Elect: true, Check: true},
			[]ev{{0, CheckInterval{Every: 10 * time.Second}}, {5200 * time.Millisecond, CheckInterval{}}}, 8 * time.Second,
			"[1s 6.5s 7.5s]"},
		{"without Check (bgp, cloud) nothing is ever checked", Options{Elect: true},
			[]ev{{time.Second, CheckNow{}}, {2 * time.Second, CheckInterval{Every: time.Second}}}, 5 * time.Second,
			"[]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New([]netip.Prefix{v4}, tt.opts)
			c.Step(up, t0)
			stepDone(c, Elected{VIP: v4, Holder: true}, t0)
			var got []time.Duration
			evs := tt.events
			for at := time.Duration(0); at <= tt.until; at += 100 * time.Millisecond {
				for len(evs) > 0 && evs[0].at <= at {
					for _, a := range c.Step(evs[0].ev, t0.Add(evs[0].at)).Actions {
						if a.Kind == Check {
							got = append(got, evs[0].at)
						}
					}
					evs = evs[1:]
				}
				if at%(500*time.Millisecond) != 0 {
					continue
				}
				for _, a := range c.Step(Tick{}, t0.Add(at)).Actions {
					if a.Kind == Check {
						got = append(got, at)
					}
				}
			}
			if fmt.Sprint(got) != tt.want {
				t.Fatalf("checks at %v, want %s", got, tt.want)
			}
		})
	}
}

func TestCoreCheckNow(t *testing.T) {
	c := New([]netip.Prefix{v4, v6}, Options{Elect: true, Announce: true, Check: true})
	c.Step(HealthChanged{Healthy: true}, t0)
	// Nothing held: nothing to check.
	if out := c.Step(CheckNow{}, t0); len(out.Actions) != 0 {
		t.Fatalf("CheckNow with nothing held: %v", acts(out))
	}
	stepDone(c, Elected{VIP: v4, Holder: true}, t0)
	// v6 is being acquired: its Done or Failed settles it, no check.
	if out := c.Step(Elected{VIP: v6, Holder: true}, t0); len(out.Actions) != 1 || out.Actions[0].Kind != Acquire {
		t.Fatalf("acquire v6: %v", acts(out))
	}
	out := c.Step(CheckNow{}, t0.Add(100*time.Millisecond))
	if fmt.Sprint(acts(out)) != "[check 10.0.0.100/32]" || out.Actions[0].Probe || len(out.Transitions) != 0 {
		t.Fatalf("CheckNow: %v %+v", acts(out), out.Actions)
	}
	// The check fails with the link down: give up at once, as a periodic check would.
	o := c.Step(Failed{Action: out.Actions[0], Err: fmt.Errorf("eth0 is administratively down: %w", ErrLinkDown)}, t0.Add(110*time.Millisecond))
	if fmt.Sprint(acts(o)) != "[release 10.0.0.100/32]" || len(o.Transitions) != 1 || !o.Transitions[0].Failed {
		t.Fatalf("after the failed check: %v %+v", acts(o), o.Transitions)
	}
}

// TestCoreElectedConflictRetry: a holder the election vouches for probes
// again ElectedConflictRetry after its pre-bind probe was answered (a
// killed vipd's stale binding, dropped when systemd restarts it), for
// ElectedConflictTries tries, then backs off as before; a lone holder
// (nobody vouches for it) backs off from the start.
func TestCoreElectedConflictRetry(t *testing.T) {
	conflict := &ConflictError{VIP: v4.Addr(), MAC: []byte{2, 0, 0, 0, 0, 9}}
	tests := []struct {
		name  string
		lone  bool
		tries int           // conflicted acquires before the one measured
		want  time.Duration // from the failure to the next acquire
	}{
		{"elected: the first retry is quick", false, 0, ElectedConflictRetry},
		{"elected: the last quick retry", false, ElectedConflictTries - 1, ElectedConflictRetry},
		{"elected: then the normal back-off", false, ElectedConflictTries, RetryMax},
		{"lone: the normal back-off at once", true, 0, RetryMin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
			now := t0
			c.Step(HealthChanged{Healthy: true}, now)
			out := c.Step(Elected{VIP: v4, Holder: true, Lone: tt.lone}, now)
			for i := 0; ; i++ {
				if len(out.Actions) != 1 || out.Actions[0].Kind != Acquire {
					t.Fatalf("try %d: %v, want one acquire", i, acts(out))
				}
				failedAt := now.Add(50 * time.Millisecond)
				out = c.Step(Failed{Action: out.Actions[0], Err: conflict}, failedAt)
				if len(out.Transitions) != 1 || out.Transitions[0].Failed {
					t.Fatalf("try %d: transitions %+v, want one, not failed (no step-aside)", i, out.Transitions)
				}
				if i < tt.tries {
					now = out.Next
					out = c.Step(Tick{}, now)
					continue
				}
				if got := out.Next.Sub(failedAt); got != tt.want {
					t.Fatalf("next try %v after the conflict, want %v", got, tt.want)
				}
				if out := c.Step(Tick{}, out.Next); fmt.Sprint(acts(out)) != "[acquire 10.0.0.100/32]" {
					t.Fatalf("no acquire at the retry: %v", acts(out))
				}
				return
			}
		})
	}
}

// TestCoreLoneThenVouchedNoBusyLoop: the first node bootstraps alone and
// holds lone (it probes for another holder), then its peers join and the
// lease vouches for it. Its probe deadline must go with its loneness: a
// deadline left in the past is returned as Next after every Tick, and the
// driver ticked the core without pause (one core at 100 % on the first
// node of every cluster, idle, found by make bench).
func TestCoreLoneThenVouchedNoBusyLoop(t *testing.T) {
	c := New([]netip.Prefix{v4}, Options{Elect: true, Announce: true, Check: true})
	now := t0
	c.Step(HealthChanged{Healthy: true}, now)
	out := c.Step(Elected{VIP: v4, Holder: true, Lone: true, Until: now.Add(time.Hour)}, now)
	out = c.Step(Done{Action: out.Actions[0]}, now)
	if out.Next.IsZero() || out.Next.After(now.Add(FirstProbe)) {
		t.Fatalf("lone holder: next %v, want its first probe within %v", out.Next.Sub(now), FirstProbe)
	}
	now = now.Add(100 * time.Millisecond) // before the first probe is due
	c.Step(Elected{VIP: v4, Holder: true, Until: now.Add(time.Hour)}, now)
	now = now.Add(time.Second)
	for i := 0; i < 100; i++ {
		out = c.Step(Tick{}, now)
		if !out.Next.After(now) {
			t.Fatalf("tick %d at %v: next %v is not after now", i, now.Sub(t0), out.Next.Sub(t0))
		}
		for _, a := range out.Actions {
			if a.Probe {
				t.Fatalf("tick %d: %v probes although the lease vouches for this node", i, a)
			}
		}
		now = out.Next
	}
}
