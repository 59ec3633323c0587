package sim

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// TestSchedules runs a fixed set of random schedules per profile (make
// simulate and vipd-sim run thousands).
func TestSchedules(t *testing.T) {
	n := 20
	if v := os.Getenv("LEASE_SIM_SEEDS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	for _, profile := range []string{"default", "fast"} {
		var fo, ov []time.Duration
		planned, fallbacks := 0, 0
		for seed := int64(1); seed <= int64(n); seed++ {
			r := RunSchedule(profile, seed, ScheduleOptions{})
			fo = append(fo, r.Failovers...)
			ov = append(ov, r.Overlaps...)
			planned += r.Planned
			fallbacks += r.Fallbacks
			if r.Failed() {
				t.Fatalf("profile %s seed %d: violations %v liveness %v\nreplay: go run ./cluster/lease/sim/cmd/vipd-sim -profile %s -replay %d\ntrace:\n%s",
					profile, seed, r.Violations, r.Liveness, profile, seed, r.Trace)
			}
		}
		t.Logf("%s: %d failovers, p50 %v, p99 %v, max %v; %d planned transfers of the holder, %d make-before-break overlaps (p50 %v, max %v, bound %v in true time), %d ended at the bound",
			profile, len(fo), Percentile(fo, 0.5), Percentile(fo, 0.99), Percentile(fo, 1), planned, len(ov), Percentile(ov, 0.5), Percentile(ov, 1), OverlapBound(lease.ProfileConfig(profile)), fallbacks)
	}
}

// TestStormStopsTheRun: events that breed faster than time passes (nodes
// answering each other without end) fail the schedule with a violation
// instead of filling memory; vipd-sim -rollback -replay 671 did.
func TestStormStopsTheRun(t *testing.T) {
	s := New(lease.ProfileConfig("default"), 1)
	var breed func()
	breed = func() {
		s.After(time.Millisecond, breed)
		s.After(time.Millisecond, breed)
	}
	s.After(0, breed)
	s.Run(time.Second) // without the bound: 2^1000 events
	if len(s.Violations) != 1 || !strings.Contains(s.Violations[0], "message storm") {
		t.Fatalf("violations %v, want one message storm", s.Violations)
	}
}
