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

// trimDelay is how long after start the resident set is trimmed.
const trimDelay = 5 * time.Second

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
func trimAfter(ctx context.Context, d time.Duration, log *slog.Logger) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(d):
	}
	debug.FreeOSMemory()
	n, err := trimResident()
	if err != nil {
		log.Debug("trimming the resident set", "err", err)
		return
	}
	log.Debug("resident set trimmed", "binary_bytes", n)
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
