package sim

import (
	"flag"

	"github.com/vipd/vipd/cluster"
	"strings"
	"testing"
	"time"
)

var (
	seeds = flag.Int("sim.seeds", 12, "number of seeds to run")
	first = flag.Int64("sim.seed", 1, "first seed")
	trace = flag.Bool("sim.trace", false, "print the whole trace of each seed")
)

// TestSimulate runs a fixed set of seeds (make test). A failure prints the
// seed, the violations and the end of the trace; replay one seed with
//
//	go test ./cluster/sim -run TestSimulate -sim.seed=N -sim.seeds=1 -sim.trace -v
func TestSimulate(t *testing.T) {
	var simulated time.Duration
	start := time.Now()
	for seed := *first; seed < *first+int64(*seeds); seed++ {
		opt := seedOptions(seed)
		r := Run(opt)
		simulated += r.Simulated
		report(t, "TestSimulate", opt, r)
	}
	wall := time.Since(start)
	t.Logf("%d schedules, %.1f simulated hours in %v: %.0f simulated hours per minute", *seeds, simulated.Hours(), wall.Round(time.Millisecond), simulated.Hours()/wall.Minutes())
}

// TestSimulatorCatchesSplitBrain makes sure the invariants can fail: with
// quorum off, each side of a partition elects its own holder.
func TestSimulatorCatchesSplitBrain(t *testing.T) {
	found := 0
	for seed := int64(1); seed <= 6; seed++ {
		r := Run(Options{Seed: seed, Duration: 3 * time.Minute, QuorumOff: true, NoProbe: true})
		for _, v := range r.Violations {
			if strings.Contains(v, "holders") {
				found++
			}
		}
	}
	if found == 0 {
		t.Fatal("no split brain found with quorum off: the invariants do not check anything")
	}
}

// TestSimulatorDeterministic replays a seed.
func TestSimulatorDeterministic(t *testing.T) {
	a := Run(Options{Seed: 7, Duration: time.Minute, Trace: true})
	b := Run(Options{Seed: 7, Duration: time.Minute, Trace: true})
	if strings.Join(a.Trace, "\n") != strings.Join(b.Trace, "\n") {
		t.Fatal("the same seed gave two different traces")
	}
}

// TestSimulateFast runs seeds with VIPD_PROFILE=fast (the holder
// heartbeat): the same invariants.
func TestSimulateFast(t *testing.T) {
	n := max(*seeds/2, 1)
	for seed := *first; seed < *first+int64(n); seed++ {
		opt := seedOptions(seed)
		opt.Fast = true
		report(t, "TestSimulateFast", opt, Run(opt))
	}
}

// seedOptions is a random schedule's run: 3, 4 or 5 nodes by seed; odd
// seeds without the data-plane probe (cloud mode), where safety must rest
// on the election alone.
func seedOptions(seed int64) Options {
	return Options{Seed: seed, Nodes: 3 + int(seed%3), Duration: 5 * time.Minute, Trace: *trace, NoProbe: seed%2 == 1}
}

// report logs a run's trace when asked (-sim.trace) and fails the test
// with the violations, the end of the trace and how to replay the seed.
func report(t *testing.T, test string, opt Options, r Result) {
	t.Helper()
	if *trace {
		t.Logf("seed %d trace:\n%s", opt.Seed, strings.Join(r.Trace, "\n"))
	}
	if len(r.Violations) == 0 {
		return
	}
	tail := r.Trace
	if len(tail) > 80 {
		tail = tail[len(tail)-80:]
	}
	t.Errorf("%s, seed %d (%d nodes, probe %v): %d violation(s):\n  %s\nend of trace:\n%s\nreplay: go test ./cluster/sim -run '%s$' -sim.seed=%d -sim.seeds=1 -sim.trace -v",
		test, opt.Seed, opt.Nodes, !opt.NoProbe, len(r.Violations), strings.Join(r.Violations, "\n  "), strings.Join(tail, "\n"), test, opt.Seed)
}

// TestScenarioFastHolderLinkDown: with the fast profile the holder whose
// link goes down is replaced once its heartbeats stop, before the failure
// detector would declare it dead; with the default profile, only after.
func TestScenarioFastHolderLinkDown(t *testing.T) {
	for _, fast := range []bool{true, false} {
		var down, moved time.Duration = -1, -1
		var old string
		r := scenario(t, Options{Seed: 1, Nodes: 3, Duration: 20 * time.Second, Fast: fast, Script: []Step{
			{At: 10 * time.Second, Do: func(s *Sim) {
				for _, n := range s.nodes {
					if answering(n) {
						old, down = n.name, s.Now()
						n.linkUp = false
					}
				}
			}},
		}, Observe: func(s *Sim) {
			if down < 0 || moved >= 0 {
				return
			}
			for _, n := range s.nodes {
				if n.name != old && answering(n) {
					moved = s.Now() - down
				}
			}
		}})
		if old == "" || moved < 0 {
			t.Fatalf("fast=%v: the VIP did not move (old holder %q)\n%s", fast, old, strings.Join(r.Trace, "\n"))
		}
		deadline := cluster.FastHeartbeat().Deadline()
		if fast && (moved > deadline+100*time.Millisecond || moved >= DeadAfter) {
			t.Errorf("fast: moved %v after the link went down, want within the heartbeat deadline %v (+ one tick and the probe)", moved, deadline)
		}
		if !fast && moved < DeadAfter {
			t.Errorf("default: moved %v after the link went down: before the failure detector could declare the holder dead", moved)
		}
		if fast != strings.Contains(strings.Join(r.Trace, "\n"), "holder heartbeats stopped") {
			t.Errorf("fast=%v: heartbeat verdict in the trace: %v", fast, !fast)
		}
		t.Logf("fast=%v: VIP moved %v after the holder's link went down", fast, moved)
	}
}
