// Command vipd-sim runs the strict simulator of the consensus lease machine
// (cluster/lease/sim) over many schedules (make simulate): N schedules per
// profile, never two holders of an address in one cluster; it reports
// violations, failover times and schedules per minute.
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
)

func main() {
	seeds := flag.Int("seeds", 200, "schedules per profile")
	first := flag.Int64("seed", 1, "first seed")
	// -lease was needed while the old election's simulator was the default:
	// accepted so that scripts that pass it keep working.
	_ = flag.Bool("lease", true, "ignored: the lease simulator is the only one")
	profiles := flag.String("profile", "default,fast", "comma-separated profiles")
	replay := flag.Int64("replay", 0, "run this one seed of -profile and print its whole trace")
	faults := flag.Duration("faults", 30*time.Second, "simulated fault time per schedule")
	jobs := flag.Int("j", runtime.GOMAXPROCS(0), "schedules run in parallel")
	rollback := flag.Bool("rollback", false, "restart some crashed nodes from older state (a reverted VM): finds forks the lease does not detect yet (docs/lease.md)")
	flag.Parse()
	os.Exit(runLease(strings.Split(*profiles, ","), *first, *seeds, *replay, sim.ScheduleOptions{Faults: *faults, Rollback: *rollback}, *jobs))
}

func runLease(profiles []string, first int64, seeds int, replay int64, o sim.ScheduleOptions, jobs int) int {
	if replay != 0 {
		r := sim.RunSchedule(profiles[0], replay, sim.ScheduleOptions{Faults: o.Faults, TraceAll: true, Rollback: o.Rollback})
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
					results[i] = sim.RunSchedule(p, first+int64(i), o)
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
				flags := ""
				if o.Rollback {
					flags = " -rollback"
				}
				fmt.Printf("profile %s seed %d: violations %v liveness %v\n  replay: go run ./cluster/lease/sim/cmd/vipd-sim -profile %s%s -replay %d\n",
					p, seed, r.Violations, r.Liveness, p, flags, seed)
			}
		}
		wall := time.Since(start)
		fmt.Printf("lease %s: %d schedules, %d failed, %d machine steps in %v: %.0f schedules per minute; holder-death failover over %d measurements: p50 %v, p99 %v, max %v\n",
			p, seeds, failed, steps, wall.Round(time.Second), float64(seeds)/wall.Minutes(), len(fo),
			sim.Percentile(fo, 0.5).Round(time.Millisecond), sim.Percentile(fo, 0.99).Round(time.Millisecond), sim.Percentile(fo, 1).Round(time.Millisecond))
		cfg := lease.ProfileConfig(p)
		fmt.Printf("  planned transfers of the holder: %d; make-before-break overlaps: %d (p50 %v, max %v, bound %v: %v on the old holder's clock at the %g drift bound), %d ended at the bound (no confirmation)\n",
			planned, len(ov), sim.Percentile(ov, 0.5).Round(10*time.Microsecond), sim.Percentile(ov, 1).Round(10*time.Microsecond),
			sim.OverlapBound(cfg).Round(10*time.Microsecond), cfg.Overlap, cfg.Drift, fallbacks)
		if len(slow) > 0 {
			shown := slow[:min(len(slow), 10)]
			fmt.Printf("  %d schedules had a failover over %v (in a cluster already degraded by earlier faults or slow links), e.g. seeds %v\n", len(slow), budget, shown)
		}
	}
	return code
}
