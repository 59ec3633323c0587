package main

import (
	"errors"
	"log/slog"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// raisePriority sets the nice value of every thread of this process to
// nice (VIPD_NICE; 0: leave it). Linux keeps a nice value per thread and a
// new thread inherits its creator's, so the threads the Go runtime starts
// later run at nice too. The lease must be renewed by a majority within a
// few ticks: a node whose vipd waits behind CPU-bound processes loses it
// (test/fast's two-core stress). It returns the threads it could not set.
func raisePriority(nice int, log *slog.Logger) int {
	if nice == 0 {
		return 0
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		log.Warn("VIPD_NICE: cannot list this process's threads: running at the priority it was started with", "err", err)
		return 1
	}
	failed := 0
	var first error
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		log.Warn("VIPD_NICE: cannot set the scheduling priority (raising it needs CAP_SYS_NICE, or start vipd at that nice value, as vipd.service does with Nice=-10; VIPD_NICE=0 keeps the priority it was started with)", "nice", nice, "err", first)
		return failed
	}
	log.Debug("scheduling priority set", "nice", nice, "threads", len(ents))
	return 0
}
