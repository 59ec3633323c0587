package cluster

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/vipd/vipd/cluster/lease"
)

// lateness watches the lease loop for what makes a lease run out on a
// node that is up: its timer firing well after the deadline (the process
// got no CPU) and a step that took long (it waited inside: a send, a
// lock, a decision's consumer). Either past limit is logged as a warning
// naming how late and how much silence the lease outlives, at most once
// per lateLogEvery with a count of the ones in between: an operator whose
// VIP moved under load can tell a starved node from a lost network.
type lateness struct {
	limit     time.Duration // 0: not watched
	tolerance time.Duration // the silence the lease outlives (L - R - T), for the log
	due       time.Time     // the deadline the loop's timer is armed for
	lim       logLimit      // one warning per lateLogEvery
}

// lateLogEvery is the shortest time between two lateness warnings.
const lateLogEvery = 10 * time.Second

// The lateness warnings (the lab's stress bench counts them).
const (
	LateWakeWarning = "lease election: this node woke late for its deadline (starved of CPU?)"
	LongStepWarning = "lease election: one step took long"
)

// newLateness watches for half the silence a lease of cfg outlives: a
// node that loses that much to one wake-up or step keeps its lease only
// while nothing else is lost.
func newLateness(cfg lease.Config) lateness {
	tol := cfg.LeaseLength() - time.Duration(cfg.HeartbeatTicks)*cfg.Tick - cfg.Tick
	if tol <= 0 {
		return lateness{}
	}
	return lateness{limit: tol / 2, tolerance: tol, lim: logLimit{every: lateLogEvery}}
}

// woke is called when the loop's timer fired, at now.
func (w *lateness) woke(now time.Time, log *slog.Logger) {
	if w.limit <= 0 || w.due.IsZero() {
		return
	}
	if late := now.Sub(w.due); late > w.limit {
		w.warn(now, log, LateWakeWarning, "late", late.Round(time.Millisecond))
	}
}

// stepped is called after each step that started at start and ended at end.
func (w *lateness) stepped(start, end time.Time, ev lease.Event, log *slog.Logger) {
	if w.limit <= 0 {
		return
	}
	if d := end.Sub(start); d > w.limit {
		w.warn(end, log, LongStepWarning, "took", d.Round(time.Millisecond), "event", fmt.Sprintf("%T", ev))
	}
}

func (w *lateness) warn(now time.Time, log *slog.Logger, msg string, attrs ...any) {
	ok, missed := w.lim.allow(now)
	if !ok {
		return
	}
	attrs = append(attrs, "limit", w.limit, "lease_outlives", w.tolerance.Round(time.Millisecond))
	if missed > 0 {
		attrs = append(attrs, "more_since_last_warning", missed)
	}
	log.Warn(msg, attrs...)
}
