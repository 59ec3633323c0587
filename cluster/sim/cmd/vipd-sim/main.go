// Command vipd-sim runs the deterministic cluster simulator over many seeds
// (make simulate) and reports violations, schedules and simulated hours
// explored per minute. With -lease it runs the strict simulator of the
// consensus lease machine (cluster/lease/sim) instead: N schedules per
// profile, never two holders of an address in one cluster.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/cluster/lease/sim"
	oldsim "github.com/vipd/vipd/cluster/sim"
)

func main() {
	seeds := flag.Int("seeds", 200, "number of seeds")
	first := flag.Int64("seed", 1, "first seed")
	dur := flag.Duration("duration", 5*time.Minute, "simulated fault time per seed")
	beats := flag.Bool("beats", false, "run with member beats (sim.Options.Beats)")
	leaseMode := flag.Bool("lease", false, "run the strict simulator of the consensus lease machine (cluster/lease/sim)")
	profiles := flag.String("profile", "default,fast", "with -lease: comma-separated profiles")
	replay := flag.Int64("replay", 0, "with -lease: run this one seed of -profile and print its whole trace")
	faults := flag.Duration("faults", 30*time.Second, "with -lease: simulated fault time per schedule")
	jobs := flag.Int("j", runtime.GOMAXPROCS(0), "with -lease: schedules run in parallel")
	flag.Parse()
	if *leaseMode {
		os.Exit(runLease(strings.Split(*profiles, ","), *first, *seeds, *replay, *faults, *jobs))
	}
	start := time.Now()
	var simulated time.Duration
	failed := 0
	test := "'TestSimulate$'"
	if *beats {
		test = "'TestSimulateBeats$'"
	}
	for seed := *first; seed < *first+int64(*seeds); seed++ {
		nodes := 3 + int(seed%3)
		r := oldsim.Run(oldsim.Options{Seed: seed, Nodes: nodes, Duration: *dur, Beats: *beats})
		simulated += r.Simulated
		if len(r.Violations) > 0 {
			failed++
			fmt.Printf("seed %d (%d nodes): %s\n  replay: go test ./cluster/sim -run %s -sim.seed=%d -sim.seeds=1 -sim.trace -v\n",
				seed, nodes, strings.Join(r.Violations, "\n  "), test, seed)
		}
	}
	wall := time.Since(start)
	fmt.Printf("%d schedules, %d failed, %.1f simulated hours in %v: %.1f schedules and %.1f simulated hours per minute\n",
		*seeds, failed, simulated.Hours(), wall.Round(time.Second), float64(*seeds)/wall.Minutes(), simulated.Hours()/wall.Minutes())
	if failed > 0 {
		os.Exit(1)
	}
}

func runLease(profiles []string, first int64, seeds int, replay int64, faults time.Duration, jobs int) int {
	if replay != 0 {
		r := sim.RunSchedule(profiles[0], replay, sim.ScheduleOptions{Faults: faults, TraceAll: true})
		fmt.Println(r.Trace)
		fmt.Printf("profile %s seed %d: violations %v liveness %v failovers %v\n", r.Profile, r.Seed, r.Violations, r.Liveness, r.Failovers)
		if r.Failed() {
			return 1
		}
		return 0
	}
	code := 0
	for _, p := range profiles {
		start := time.Now()
		failed, steps := 0, 0
		var fo, ov []time.Duration
		var slow []int64
		planned, fallbacks := 0, 0
		budget := time.Second
		if p == "fast" {
			budget = 250 * time.Millisecond
		}
		results := make([]sim.Result, seeds)
		var wg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < max(1, jobs); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					results[i] = sim.RunSchedule(p, first+int64(i), sim.ScheduleOptions{Faults: faults})
				}
			}()
		}
		for i := 0; i < seeds; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
		for i, r := range results {
			seed := first + int64(i)
			steps += r.Steps
			fo = append(fo, r.Failovers...)
			ov = append(ov, r.Overlaps...)
			planned += r.Planned
			fallbacks += r.Fallbacks
			if sim.Percentile(r.Failovers, 1) > budget {
				slow = append(slow, seed)
			}
			if r.Failed() {
				failed++
				code = 1
				fmt.Printf("profile %s seed %d: violations %v liveness %v\n  replay: go run ./cluster/sim/cmd/vipd-sim -lease -profile %s -replay %d\n",
					p, seed, r.Violations, r.Liveness, p, seed)
			}
		}
		wall := time.Since(start)
		fmt.Printf("lease %s: %d schedules, %d failed, %d machine steps in %v: %.0f schedules per minute; holder-death failover over %d measurements: p50 %v, p99 %v, max %v\n",
			p, seeds, failed, steps, wall.Round(time.Second), float64(seeds)/wall.Minutes(), len(fo),
			sim.Percentile(fo, 0.5).Round(time.Millisecond), sim.Percentile(fo, 0.99).Round(time.Millisecond), sim.Percentile(fo, 1).Round(time.Millisecond))
		fmt.Printf("  planned transfers of the holder: %d; make-before-break overlaps: %d (p50 %v, max %v, bound %v), %d ended at the bound (no confirmation)\n",
			planned, len(ov), sim.Percentile(ov, 0.5).Round(10*time.Microsecond), sim.Percentile(ov, 1).Round(10*time.Microsecond), lease.ProfileConfig(p).Overlap, fallbacks)
		if len(slow) > 0 {
			shown := slow[:min(len(slow), 10)]
			fmt.Printf("  %d schedules had a failover over %v (in a cluster already degraded by earlier faults or slow links), e.g. seeds %v\n", len(slow), budget, shown)
		}
	}
	return code
}
