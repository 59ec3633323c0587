// Command vipd-sim runs the deterministic cluster simulator over many seeds
// (make simulate) and reports violations, schedules and simulated hours
// explored per minute.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vipd/vipd/cluster/sim"
)

func main() {
	seeds := flag.Int("seeds", 200, "number of seeds")
	first := flag.Int64("seed", 1, "first seed")
	dur := flag.Duration("duration", 5*time.Minute, "simulated fault time per seed")
	beats := flag.Bool("beats", false, "run with member beats (sim.Options.Beats)")
	flag.Parse()
	start := time.Now()
	var simulated time.Duration
	failed := 0
	test := "'TestSimulate$'"
	if *beats {
		test = "'TestSimulateBeats$'"
	}
	for seed := *first; seed < *first+int64(*seeds); seed++ {
		nodes := 3 + int(seed%3)
		r := sim.Run(sim.Options{Seed: seed, Nodes: nodes, Duration: *dur, Beats: *beats})
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
