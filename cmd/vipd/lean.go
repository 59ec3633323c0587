package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

// gcTrimEvery is the shortest time between two trims of the GC tables
// after collections (gcTables): an idle node collects every 4 to 12 s,
// a busy one (a failover, 1,000 pool addresses) may collect several times
// a second, and each trim costs its faults back at the next collection.
const gcTrimEvery = time.Second

// leanRuntime runs the Go scheduler on one processor and collects garbage
// at 50 % growth, unless GOMAXPROCS or GOGC say otherwise. vipd's work is
// sequential (one election, one driver, one probe at a time); with more
// processors every timer that fires wakes idle threads that spin looking
// for work, which costs more CPU than the work itself. An idle vipd's heap
// is about 3 MB, so a tighter GC target costs little CPU and keeps the
// resident heap near the live one. One more runtime setting cannot be made
// here, it is read at start only: the builds link in gcshrinkstackoff=1
// (see gcTables).
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
// From the first trim on, the runtime's tables for walking stacks are also
// dropped after each garbage collection: see gcTables.
//
// With lock (VIPD_MEMORY_LOCK=on), the first trim is the last: what vipd
// touches from then on stays in RAM (lockMemory), and nothing is dropped
// again. Where the lock is refused, it trims as without.
func trimAfter(ctx context.Context, d time.Duration, lock bool, log *slog.Logger) {
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
	if lock {
		if err := lockMemory(); err != nil {
			log.Warn("VIPD_MEMORY_LOCK=on: cannot lock vipd's memory, running unlocked (vipd.service sets LimitMEMLOCK=infinity; elsewhere raise the memlock limit or grant CAP_IPC_LOCK)", "err", err)
		} else {
			log.Info("memory locked: what vipd touches stays in RAM (VIPD_MEMORY_LOCK=on)")
			return
		}
	}
	if tables, err := gcTables(); err != nil {
		log.Debug("no trim of the GC tables", "err", err)
	} else {
		log.Debug("trimming the GC tables after each collection", "bytes", tables.end-tables.start)
		t := &gcTrim{tables: tables, every: gcTrimEvery}
		afterGC(ctx, func() { t.after(time.Now()) })
	}
	next := retrimAfter - d
	for wait(max(next, time.Second)) {
		if _, err := trimResident(); err != nil {
			log.Debug("trimming the resident set", "err", err)
			return
		}
		next = retrimEvery
	}
}

// lockMemory locks vipd's pages in RAM as they are touched: those resident
// now and every one faulted in later (MCL_ONFAULT: nothing is read in to
// lock it, so the resident set stays what vipd uses). A host that reclaims
// idle memory ahead of need (DAMON's pageout, memory.reclaim) evicts the
// binary's pages a renewal or a collection reads only every few seconds;
// read back from disk on a loaded machine they stalled five vipd
// processes for up to 1.3 s at once (docs/l2.md), longer than the fast
// profile's lease outlives. Locked pages cannot be dropped, so the trims
// end here.
//
// It locks only where every later mapping may be locked too: a memlock
// limit that is not unlimited, without CAP_IPC_LOCK, would let the lock
// succeed now and make the runtime's next heap growth fail (a fatal out of
// memory), so it is refused up front.
func lockMemory() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return fmt.Errorf("memlock limit: %w", err)
	}
	if err := lockRefused(lim.Cur, capIPCLock()); err != nil {
		return err
	}
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE | unix.MCL_ONFAULT); err != nil {
		return fmt.Errorf("mlockall: %w", err)
	}
	return nil
}

// lockRefused explains why memory must not be locked under a memlock
// limit of limit bytes, with or without CAP_IPC_LOCK; nil when it may.
func lockRefused(limit uint64, capLock bool) error {
	if limit == unix.RLIM_INFINITY || capLock {
		return nil
	}
	return fmt.Errorf("the memlock limit is %d bytes and vipd lacks CAP_IPC_LOCK: heap growth after the lock would fail", limit)
}

// capIPCLock reports whether the calling thread has CAP_IPC_LOCK in its
// effective set.
func capIPCLock() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_IPC_LOCK/32].Effective&(1<<(unix.CAP_IPC_LOCK%32)) != 0
}

// trimResident drops the resident pages of the read-only mappings of the
// running executable (code and read-only data) and returns how many bytes
// of mappings it covered.
func trimResident() (int, error) {
	ms, err := exeMappings()
	if err != nil {
		return 0, err
	}
	total := 0
	for _, m := range ms {
		if err := dropPages(m.start, m.end); err != nil {
			return total, err
		}
		total += int(m.end - m.start)
	}
	return total, nil
}

// exeMapping is a private read-only mapping of the running executable:
// addresses [start, end) map the file from offset off.
type exeMapping struct {
	start, end uintptr
	off        uint64
}

// exeMappings returns the private read-only mappings of the running
// executable, from /proc/self/maps.
func exeMappings() ([]exeMapping, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseExeMappings(f, exe)
}

// parseExeMappings reads a maps file (proc(5)) and returns the private
// read-only mappings of the file exe.
func parseExeMappings(r io.Reader, exe string) ([]exeMapping, error) {
	var ms []exeMapping
	sc := bufio.NewScanner(r)
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
		off, err3 := strconv.ParseUint(fs[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || end <= start {
			continue
		}
		ms = append(ms, exeMapping{start: uintptr(start), end: uintptr(end), off: off})
	}
	return ms, sc.Err()
}

// dropPages drops the resident pages of [start, end) (MADV_DONTNEED): for
// a read-only file mapping the page is mapped back from the page cache
// when next read.
func dropPages(start, end uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_DONTNEED); e != 0 {
		return e
	}
	return nil
}

// pageRange is a range of whole pages [start, end) of the address space.
type pageRange struct{ start, end uintptr }

// trim drops the resident pages of r.
func (r pageRange) trim() error { return dropPages(r.start, r.end) }

// gcTables returns the pages at which the running executable's
// .gopclntab section is mapped: the runtime's tables for each function
// (frame sizes, where its pointers are: the stack maps) and the function
// table that finds them, 10 MB of vipd's 30 MB binary.
//
// The runtime reads them to walk a goroutine's stack: when a collection
// scans the stacks (an idle node has about 40 goroutines), and when it
// copies a stack that has to grow. Each read maps the 64 KB around it
// (the kernel's fault-around, which MADV_RANDOM, MADV_SEQUENTIAL or
// MADV_NORMAL on the mapping do not change: checked on 6.18, one read per
// MB of a file mapping left 64 KB resident each time), and the pages stay
// until the next trim: 3.5 to 4.5 MB of a 20.6 MB idle node. Faults sampled with perf on an
// idle follower over 40 s (with these tables trimmed after each
// collection, stacks shrunk as by default): 228 faults in the tables, 165
// of them a stack growing back right after a collection had shrunk it,
// 42 the collections' stack scans, the rest preemption signals and new
// goroutines. So vipd is built with its stacks never shrunk
// (gcshrinkstackoff=1 in runtime.godebugDefault, by `make build` and
// packaging/build.sh: a GODEBUG in the environment overrides it), and
// after each collection (afterGC; at most every gcTrimEvery) these pages
// are dropped: they stay out of the resident set until the next one, 4 to
// 12 s later on an idle node. Measured with `vipd-lab bench -scenarios idle` (3 nodes, 60 s,
// mean per node): 20.6 and 20.7 MB before; 20.6 MB with stacks never
// shrunk alone (the collections still bring the tables back); 19.3 MB
// with the trim after collections alone (the stacks growing back bring
// them back); 17.5, 17.6, 17.6 and 17.8 MB with both. CPU per node in the
// same runs, noisy on this shared VM: 0.54, 0.51 % before; 0.46, 0.48,
// 0.47, 0.53 % with both.
//
// The cost: one madvise after each collection and that collection's
// faults back, at most about 65 faults of 3.5 us and 125 us to unmap them
// on this VM (a loop over the binary's pages), 0.35 ms a collection
// against the collection's own 2.6 ms of CPU; and no stack is copied any
// more to grow back after a collection. perf stat on the nodes of two
// idle clusters side by side, 60 s: page faults 269, 217, 255 before and
// 1214, 534, 507 after (the leader collects most often), CPU 442, 216,
// 204 ms before and 441, 213, 204 ms after. A goroutine keeps the largest stack it needed:
// about 0.3 MB more anonymous memory on an idle node (7.3 against 7.0 MB
// in one run). Only these tables are trimmed after a
// collection: code and read-only data vipd keeps running would be
// faulted back at once (the trim of all of them after each collection
// cost about 0.1 % of a core).
func gcTables() (pageRange, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return pageRange{}, err
	}
	defer f.Close()
	off, size, err := elfSection(f, ".gopclntab")
	if err != nil {
		return pageRange{}, err
	}
	ms, err := exeMappings()
	if err != nil {
		return pageRange{}, err
	}
	return sectionPages(ms, off, size, uintptr(os.Getpagesize()))
}

// sectionPages returns the whole pages of ms at which the file bytes
// [off, off+size) are mapped (partial pages at either end left out: they
// hold the neighbouring sections too).
func sectionPages(ms []exeMapping, off, size uint64, page uintptr) (pageRange, error) {
	for _, m := range ms {
		lo := max(off, m.off)
		hi := min(off+size, m.off+uint64(m.end-m.start))
		if lo >= hi {
			continue
		}
		r := pageRange{start: m.start + uintptr(lo-m.off), end: m.start + uintptr(hi-m.off)}
		r.start = (r.start + page - 1) &^ (page - 1)
		r.end &^= page - 1
		if r.start >= r.end {
			break
		}
		return r, nil
	}
	return pageRange{}, errors.New("section not mapped read-only")
}

// elfSection returns the file offset and size of the section called name
// in the 64-bit ELF file r (the section headers only: no debug/elf).
func elfSection(r io.ReaderAt, name string) (off, size uint64, err error) {
	var h [64]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return 0, 0, err
	}
	if string(h[:4]) != "\x7fELF" || h[4] != 2 { // ELFCLASS64
		return 0, 0, errors.New("not a 64-bit ELF file")
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if h[5] == 2 { // ELFDATA2MSB
		bo = binary.BigEndian
	}
	shoff := bo.Uint64(h[0x28:])
	shentsize := uint64(bo.Uint16(h[0x3a:]))
	shnum := uint64(bo.Uint16(h[0x3c:]))
	shstrndx := uint64(bo.Uint16(h[0x3e:]))
	if shentsize < 64 || shnum == 0 || shstrndx >= shnum {
		return 0, 0, errors.New("no ELF section headers")
	}
	shs := make([]byte, shentsize*shnum)
	if _, err := r.ReadAt(shs, int64(shoff)); err != nil {
		return 0, 0, err
	}
	sh := func(i uint64) []byte { return shs[i*shentsize : (i+1)*shentsize] }
	strs := sh(shstrndx)
	strsSize := bo.Uint64(strs[32:])
	if strsSize > 1<<20 {
		return 0, 0, errors.New("ELF section names too large")
	}
	names := make([]byte, strsSize)
	if _, err := r.ReadAt(names, int64(bo.Uint64(strs[24:]))); err != nil {
		return 0, 0, err
	}
	for i := range shnum {
		s := sh(i)
		n := uint64(bo.Uint32(s[0:]))
		if n >= uint64(len(names)) {
			continue
		}
		if end := bytes.IndexByte(names[n:], 0); end >= 0 && string(names[n:n+uint64(end)]) == name {
			return bo.Uint64(s[24:]), bo.Uint64(s[32:]), nil
		}
	}
	return 0, 0, fmt.Errorf("no ELF section %s", name)
}

// gcTrim trims the GC tables after a collection, unless it did less than
// every ago.
type gcTrim struct {
	tables pageRange
	every  time.Duration
	last   time.Time
}

// after is called after each collection; it reports whether it trimmed.
func (t *gcTrim) after(now time.Time) bool {
	if !t.last.IsZero() && now.Sub(t.last) < t.every {
		return false
	}
	t.last = now
	_ = t.tables.trim()
	return true
}

// afterGC calls f after each garbage collection until ctx is done: a
// cleanup on an object nothing references runs once a collection found it
// unreachable (in the runtime's cleanup goroutine, so f must be short),
// and sets up the next one.
func afterGC(ctx context.Context, f func()) {
	var arm func()
	arm = func() {
		// Holds a pointer: not batched by the tiny allocator, whose
		// objects are freed (and cleaned up) only with their whole block.
		runtime.AddCleanup(new(struct{ _ *byte }), func(struct{}) {
			if ctx.Err() != nil {
				return
			}
			f()
			arm()
		}, struct{}{})
	}
	arm()
}
