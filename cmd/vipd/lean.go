package main

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// vipd idles most of its life: a few timers a second, a few MB of heap.
// leanRuntime and trimResident keep what that costs small (docs/l2.md has
// the numbers, `make bench` measures them).

// trimDelay is how long after start the resident set is trimmed first;
// retrims are the later trims: once past the announcement burst, then
// every retrimEvery.
const (
	trimDelay   = 5 * time.Second
	retrimAfter = 15 * time.Second
	retrimEvery = time.Minute
)

// leanRuntime runs the Go scheduler on one processor and collects garbage
// at 50 % growth, unless GOMAXPROCS or GOGC say otherwise. vipd's work is
// sequential (one election, one driver, one probe at a time); with more
// processors every timer that fires wakes idle threads that spin looking
// for work, which costs more CPU than the work itself. An idle vipd's heap
// is about 3 MB, so a tighter GC target costs little CPU and keeps the
// resident heap near the live one.
func leanRuntime() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
}

// trimAfter waits d (past start-up: package initialisation, the first
// decisions and announcements), then returns the memory start-up needed
// and vipd does not: garbage to the OS, and the pages of the vipd binary
// touched only then (the code and tables of every package's init, flag
// parsing, the modes not running) from its resident set. Those pages are
// clean file pages: if a code path needs one again it is mapped back from
// the page cache at the cost of a minor fault.
//
// Later, at retrimAfter (past the announcement burst and the first
// elections) and then every retrimEvery, the binary's pages are dropped
// again (without a forced garbage collection): what vipd touched once,
// such as a failover's code paths, leaves the resident set, and what it
// keeps running is faulted back from the page cache at once (a few
// hundred minor faults, well under a millisecond of CPU a minute).
//
// Not after each garbage collection: a collection reads the runtime's
// tables for every goroutine frame (about 4 MB of the binary's read-only
// data), and dropping them after each one kept the resident set about
// 1.5 MB lower, but on a paravirtualised VM each unmap and fault back is
// costly: 0.39 against 0.28 % of a core per idle node, measured side by
// side (docs/l2.md).
func trimAfter(ctx context.Context, d time.Duration, log *slog.Logger) {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	if !wait(d) {
		return
	}
	debug.FreeOSMemory()
	n, err := trimResident()
	if err != nil {
		log.Debug("trimming the resident set", "err", err)
		return
	}
	log.Debug("resident set trimmed", "binary_bytes", n)
	next := retrimAfter - d
	for wait(max(next, time.Second)) {
		if _, err := trimResident(); err != nil {
			log.Debug("trimming the resident set", "err", err)
			return
		}
		next = retrimEvery
	}
}

// trimResident drops the resident pages of the read-only mappings of the
// running executable (code and read-only data) and returns how many bytes
// of mappings it covered.
func trimResident() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	total := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 00400000-00f98000 r-xp 00000000 fe:00 9993556   /usr/bin/vipd
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[5] != exe || strings.Contains(fs[1], "w") || !strings.HasSuffix(fs[1], "p") {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); e != 0 {
			return total, e
		}
		total += int(end - start)
	}
	return total, sc.Err()
}
