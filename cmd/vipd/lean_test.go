package main

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/testenv"
)

// exeResidentKB sums the resident kilobytes of this test binary's
// read-only mappings.
func exeResidentKB(t *testing.T) int {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 6 && strings.Contains(fs[0], "-"):
			in = fs[5] == exe && !strings.Contains(fs[1], "w")
		case in && len(fs) >= 2 && fs[0] == "Rss:":
			n, _ := strconv.Atoi(fs[1])
			total += n
		}
	}
	return total
}

// TestTrimResident: the binary's read-only pages leave the resident set,
// and the program keeps running (they are faulted back when used).
func TestTrimResident(t *testing.T) {
	before := exeResidentKB(t)
	n, err := trimResident()
	if err != nil {
		t.Fatal(err)
	}
	after := exeResidentKB(t)
	if n == 0 || after >= before {
		t.Fatalf("trimResident covered %d bytes; resident binary pages %d kB before, %d kB after", n, before, after)
	}
	t.Logf("binary resident: %d kB -> %d kB (%d bytes of mappings)", before, after, n)
	if s := strconv.Itoa(42); s != "42" { // code runs after the trim
		t.Fatal(s)
	}
}

// TestTrimAfterStops: the trimming goroutine returns when its context
// ends, also while it waits between retrims.
func TestTrimAfterStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		trimAfter(ctx, time.Millisecond, false, slog.New(slog.DiscardHandler))
	}()
	time.Sleep(50 * time.Millisecond) // past the first trim, waiting for the next
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("trimAfter did not return after its context ended")
	}
}

// TestLockMemory: with VIPD_MEMORY_LOCK=on the first trim locks what vipd
// touches (VmLck > 0) and is the last (trimAfter returns); where the lock
// is refused (no CAP_IPC_LOCK and a finite memlock limit, under which the
// runtime's next heap growth would fail) vipd warns once and keeps
// trimming. (vipd.service's way, no CAP_IPC_LOCK and LimitMEMLOCK=infinity,
// needs CAP_SYS_RESOURCE to set up here: TestLockRefused covers its rule.)
// Each case runs in a child process: a lock would outlive its test.
func TestLockMemory(t *testing.T) {
	if mode := os.Getenv("VIPD_TEST_LOCK_CHILD"); mode != "" {
		lockChild(t, mode)
		return
	}
	testenv.RequireRoot(t)
	for _, mode := range []string{"allowed", "refused"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockMemory$", "-test.v")
		cmd.Env = append(os.Environ(), "VIPD_TEST_LOCK_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestLockMemory") {
			t.Fatalf("%s: %v\n%s", mode, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "lock_test:") {
				t.Logf("%s: %s", mode, strings.TrimSpace(l))
			}
		}
	}
}

func lockChild(t *testing.T, mode string) {
	var buf testenv.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if mode == "refused" {
		// This thread runs trimAfter below: without CAP_IPC_LOCK in its
		// effective set and under a 64 KB memlock limit.
		runtime.LockOSThread() // never unlocked: the thread dies with the child
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: 64 << 10}); err != nil {
			t.Fatal(err)
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			t.Fatal(err)
		}
		data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	trimAfter(ctx, time.Millisecond, true, log)
	took := time.Since(start)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var locked string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmLck:") {
			locked = strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	t.Logf("lock_test: VmLck %s, trimAfter returned after %v; log: %s", locked, took.Round(time.Millisecond), strings.TrimSpace(buf.String()))
	switch mode {
	case "allowed":
		if locked == "0 kB" || locked == "" || took >= 400*time.Millisecond || !strings.Contains(buf.String(), "memory locked") {
			t.Fatalf("locking allowed: VmLck %q, trimAfter returned after %v (want at once: no trims after the lock)", locked, took)
		}
	case "refused":
		if locked != "0 kB" || took < 400*time.Millisecond || !strings.Contains(buf.String(), "cannot lock vipd's memory") {
			t.Fatalf("locking refused: VmLck %q, trimAfter returned after %v (want it trimming until its context ended), no warning", locked, took)
		}
	}
}

// The lock is taken only where every later mapping may be locked too.
func TestLockRefused(t *testing.T) {
	for _, tc := range []struct {
		limit  uint64
		cap    bool
		refuse bool
	}{
		{unix.RLIM_INFINITY, false, false}, // vipd.service: LimitMEMLOCK=infinity
		{8 << 20, true, false},             // root, or CAP_IPC_LOCK granted
		{unix.RLIM_INFINITY, true, false},
		{8 << 20, false, true}, // systemd's default limit, no capability
		{0, false, true},
	} {
		if err := lockRefused(tc.limit, tc.cap); (err != nil) != tc.refuse {
			t.Errorf("lockRefused(%d, %v) = %v, want refused %v", tc.limit, tc.cap, err, tc.refuse)
		}
	}
}

// residentPages counts the pages of r present in this process's page
// tables (/proc/self/pagemap, bit 63). No testing.T: its Helper reads the
// tables being counted.
func residentPages(pagemap *os.File, r pageRange, buf []byte) (int, error) {
	page := uintptr(os.Getpagesize())
	buf = buf[:(r.end-r.start)/page*8]
	if _, err := pagemap.ReadAt(buf, int64(r.start/page*8)); err != nil {
		return 0, err
	}
	n := 0
	for i := 0; i < len(buf); i += 8 {
		if binary.LittleEndian.Uint64(buf[i:])&(1<<63) != 0 {
			n++
		}
	}
	return n, nil
}

// TestElfSection: the section headers read by hand agree with debug/elf
// for every section of this test binary.
func TestElfSection(t *testing.T) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range ef.Sections {
		if s.Name == "" {
			continue
		}
		off, size, err := elfSection(f, s.Name)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if s.Type != elf.SHT_NOBITS && (off != s.Offset || size != s.Size) {
			t.Errorf("%s: offset %#x size %#x, debug/elf says %#x %#x", s.Name, off, size, s.Offset, s.Size)
		}
		found = found || s.Name == ".gopclntab"
	}
	if !found {
		t.Fatal("no .gopclntab in this test binary")
	}
	if _, _, err := elfSection(f, ".no-such-section"); err == nil {
		t.Error("a missing section was found")
	}
	if _, _, err := elfSection(strings.NewReader("#!/bin/sh\n"+strings.Repeat(" ", 64)), ".text"); err == nil {
		t.Error("a shell script read as ELF")
	}
}

// TestSectionPages: the section's whole pages within the mapping that
// holds it, partial pages at either end left out.
func TestSectionPages(t *testing.T) {
	const page = 0x1000
	maps := `00400000-010e6000 r-xp 00000000 fe:00 9977954    /usr/bin/vipd
010e6000-02081000 r--p 00ce6000 fe:00 9977954    /usr/bin/vipd
02081000-0210b000 rw-p 01c81000 fe:00 9977954    /usr/bin/vipd
0210b000-04153000 rw-p 00000000 00:00 0
7f4546f58000-7f4546f5a000 r-xp 00000000 00:00 0                          [vdso]
`
	ms, err := parseExeMappings(strings.NewReader(maps), "/usr/bin/vipd")
	if err != nil {
		t.Fatal(err)
	}
	want := []exeMapping{{0x400000, 0x10e6000, 0}, {0x10e6000, 0x2081000, 0xce6000}}
	if !slices.Equal(ms, want) {
		t.Fatalf("mappings %x, want %x", ms, want)
	}
	// .gopclntab of that binary: file offset 0x121cb80, 0xa51194 bytes.
	r, err := sectionPages(ms, 0x121cb80, 0xa51194, page)
	if err != nil {
		t.Fatal(err)
	}
	if want := (pageRange{0x161d000, 0x206d000}); r != want {
		t.Errorf("pages %x, want %x", r, want)
	}
	if _, err := sectionPages(ms, 0x1c81000, 0x1000, page); err == nil {
		t.Error("a section in a writable mapping was found")
	}
	if _, err := sectionPages(ms, 0x121cb80, 0x100, page); err == nil {
		t.Error("a section within one page gave pages")
	}
}

// TestGCTablesTrimmedAfterGC: a collection brings the GC tables into the
// resident set, the trim after it takes them out again.
func TestGCTablesTrimmedAfterGC(t *testing.T) {
	r, err := gcTables()
	if err != nil {
		t.Fatal(err)
	}
	if r.end-r.start < 1<<20 {
		t.Fatalf("GC tables %x: under 1 MB", r)
	}
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Fatal(err)
	}
	defer pagemap.Close()
	buf := make([]byte, (r.end-r.start)/uintptr(os.Getpagesize())*8)
	runtime.GC()
	before, err := residentPages(pagemap, r, buf)
	if err != nil {
		t.Fatal(err)
	}
	if before == 0 {
		t.Fatal("no page of the GC tables resident after a collection")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		n   int
		err error
	}
	trimmed := make(chan result, 10)
	afterGC(ctx, func() {
		_ = r.trim()
		n, err := residentPages(pagemap, r, buf)
		trimmed <- result{n, err}
	})
	for i := range 3 {
		runtime.GC()
		select {
		case res := <-trimmed:
			if res.err != nil {
				t.Fatal(res.err)
			}
			t.Logf("collection %d: %d of %d pages resident before, %d after the trim", i, before, len(buf)/8, res.n)
			if res.n > before/4 {
				t.Fatalf("%d pages of the GC tables resident after the trim, %d before", res.n, before)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no trim after collection %d", i)
		}
	}
	cancel()
	runtime.GC()
	select {
	case <-trimmed:
		t.Fatal("trimmed after the context ended")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestBuildsKeepStacks: every build of vipd links in its runtime defaults
// (gcshrinkstackoff=1: see gcTables), packaging/build.sh --print-godebug.
func TestBuildsKeepStacks(t *testing.T) {
	for file, want := range map[string]string{
		"../../packaging/build.sh": `-X runtime.godebugDefault=$(godebug_of_vipd)" -o "$BUILD/vipd" ./cmd/vipd`,
		"../../packaging/image.sh": `-X runtime.godebugDefault=$godebug`,
		"../../Makefile":           `-X runtime.godebugDefault=$(VIPD_GODEBUG)' -o $(BIN) ./cmd/vipd`,
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not build vipd with %s", file, want)
		}
	}
	b, err := os.ReadFile("../../packaging/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `echo "${d:+$d,}gcshrinkstackoff=1"`) {
		t.Error("packaging/build.sh --print-godebug does not print gcshrinkstackoff=1")
	}
}

// TestGCTrimEvery: after collections less than gcTrimEvery apart, the
// GC tables are trimmed once.
func TestGCTrimEvery(t *testing.T) {
	r, err := gcTables()
	if err != nil {
		t.Fatal(err)
	}
	tr := &gcTrim{tables: r, every: time.Second}
	t0, trims := time.Now(), 0
	for i, c := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {100 * time.Millisecond, false}, {999 * time.Millisecond, false}, {time.Second, true}, {1500 * time.Millisecond, false}, {5 * time.Second, true}} {
		got := tr.after(t0.Add(c.after))
		if got != c.want {
			t.Errorf("collection %d, %v after the first: trimmed %v, want %v", i, c.after, got, c.want)
		}
		if got {
			trims++
		}
	}
	if trims != 3 {
		t.Errorf("%d trims, want 3", trims)
	}
}
