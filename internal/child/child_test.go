package child

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
)

// TestMain makes the test binary the child (CHILD_SCRIPT set) or the fake
// vipd (CHILD_FAKE_VIPD set) when re-executed.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("CHILD_SCRIPT") != "":
		helperChild(os.Getenv("CHILD_SCRIPT"))
	case os.Getenv("CHILD_FAKE_VIPD") != "":
		fakeVipd()
	}
	os.Exit(m.Run())
}

// helperChild plays one script.
func helperChild(script string) {
	dir := os.Getenv("CHILD_DIR")
	switch script {
	case "lines":
		fmt.Println(`{"n":1}`)
		fmt.Println(`not json`)
		fmt.Println(`{"n":` + strings.Repeat("9", 300) + `}`) // too long
		fmt.Println()                                         // empty: ignored
		fmt.Println(`{"n":2}`)
		fmt.Fprintln(os.Stderr, "a log line of the child")
		time.Sleep(time.Hour)
	case "crash":
		os.Exit(3)
	case "flood": // a hostile child: a thousand bad lines, then one good one
		w := bufio.NewWriter(os.Stdout)
		for range 1000 {
			fmt.Fprintln(w, "garbage")
		}
		fmt.Fprintln(w, `{"n":3}`)
		_ = w.Flush()
		time.Sleep(time.Hour)
	case "config":
		os.Exit(2)
	case "stubborn": // ignores SIGTERM, and has a child of its own
		signal.Ignore(syscall.SIGTERM)
		gc := exec.Command("sleep", "3600")
		if err := gc.Start(); err != nil {
			os.Exit(5)
		}
		writePids(dir, os.Getpid(), gc.Process.Pid)
		time.Sleep(time.Hour)
	}
	os.Exit(0)
}

func writePids(dir string, pids ...int) {
	b, _ := json.Marshal(pids)
	_ = os.WriteFile(filepath.Join(dir, "pids.tmp"), b, 0o600)
	_ = os.Rename(filepath.Join(dir, "pids.tmp"), filepath.Join(dir, "pids"))
}

// fakeVipd supervises a "polite" child until it is killed.
func fakeVipd() {
	s := New(Config{Name: "test child", Path: os.Args[0],
		Env: append(os.Environ(), "CHILD_FAKE_VIPD=", "CHILD_SCRIPT=stubborn")}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	_ = s.Run(context.Background())
	os.Exit(0)
}

func helper(t *testing.T, script string) (Config, string) {
	dir := t.TempDir()
	return Config{Name: "test child", Path: os.Args[0],
		Env: append(os.Environ(), "CHILD_SCRIPT="+script, "CHILD_DIR="+dir)}, dir
}

func readPids(t *testing.T, dir string) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(dir, "pids")); err == nil {
			var p []int
			if json.Unmarshal(b, &p) == nil && len(p) > 0 {
				return p
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the child did not write its pids")
	return nil
}

// gone reports whether pid no longer runs (absent or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

func waitGone(t *testing.T, within time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, p := range pids {
		for !gone(p) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs after %v", p, within)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// noLeak checks that the goroutines of the test are back to before.
func noLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Fatalf("%d goroutines left, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestLines: good lines reach the callback and the snapshot file, bad and
// too long ones are counted, logged and skipped, the child keeps running,
// stderr reaches the log.
func TestLines(t *testing.T) {
	noLeak(t)
	cfg, dir := helper(t, "lines")
	cfg.MaxLine = 100
	cfg.SnapshotFile = filepath.Join(dir, "last.json")
	var mu sync.Mutex
	var got []string
	cfg.Line = func(l []byte) error {
		var v struct{ N int }
		if err := json.Unmarshal(l, &v); err != nil {
			return err
		}
		mu.Lock()
		got = append(got, string(l))
		mu.Unlock()
		return nil
	}
	var logs testenv.Buffer
	s := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Status().Lines < 2 || !strings.Contains(logs.String(), "a log line of the child") {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, log:\n%s", s.Status(), logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := s.Status()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != `{"n":1},{"n":2}` {
		t.Fatalf("lines %q", got)
	}
	if !st.Running || st.Restarts != 0 || st.BadLines != 2 || st.Lines != 2 {
		t.Fatalf("status %+v: want running, no restart, 2 good and 2 bad lines", st)
	}
	if s.Status().Running {
		t.Fatal("running after Run returned")
	}
	if b, _ := os.ReadFile(cfg.SnapshotFile); string(b) != "{\"n\":2}\n" {
		t.Fatalf("snapshot file %q", b)
	}
	if n := strings.Count(logs.String(), "unreadable line from the test child"); n != 2 || !strings.Contains(logs.String(), "longer than 100 bytes") {
		t.Fatalf("%d bad-line log lines:\n%s", n, logs.String())
	}
}

// TestCrashLoopBacksOff: a child that exits at once is restarted after
// pauses that double up to the cap.
func TestCrashLoopBacksOff(t *testing.T) {
	noLeak(t)
	cfg, _ := helper(t, "crash")
	cfg.Backoff = Backoff{First: 20 * time.Millisecond, Max: 80 * time.Millisecond}
	var mu sync.Mutex
	var pauses []time.Duration
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Exited = func(err error, in time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		pauses, errs = append(pauses, in), append(errs, err)
		if len(pauses) == 5 {
			cancel()
		}
	}
	if err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{20, 40, 80, 80, 80}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if fmt.Sprint(pauses) != fmt.Sprint(want) {
		t.Fatalf("pauses %v, want %v", pauses, want)
	}
	var ee *exec.ExitError
	if !errors.As(errs[0], &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit error %v", errs[0])
	}
}

// TestFinalExit: an exit Final refuses ends Run with its error, no restart.
func TestFinalExit(t *testing.T) {
	noLeak(t)
	cfg, _ := helper(t, "config")
	starts := 0
	cfg.Started = func() { starts++ }
	cfg.Final = func(err error) error {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 2 {
			return errors.New("rejected")
		}
		return nil
	}
	err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(context.Background())
	if err == nil || err.Error() != "rejected" || starts != 1 {
		t.Fatalf("Run = %v after %d starts", err, starts)
	}
}

// TestStop: a child that exits on SIGTERM is gone at once; one that
// ignores it is killed with its process group after StopTimeout.
func TestStop(t *testing.T) {
	for _, tc := range []struct {
		script   string
		stop     time.Duration // StopTimeout
		min, max time.Duration
	}{
		// Well before the deadline: SIGTERM did it.
		{"polite", 5 * time.Second, 0, 4 * time.Second},
		// Not before the deadline: SIGKILL did it.
		{"stubborn", 300 * time.Millisecond, 300 * time.Millisecond, 4 * time.Second},
	} {
		t.Run(tc.script, func(t *testing.T) {
			noLeak(t)
			cfg, dir := helper(t, tc.script)
			if tc.script == "polite" {
				// A plain process that dies on SIGTERM (a Go child built
				// with -race takes long to exit).
				cfg.Path, cfg.Args = "/bin/sh", []string{"-c", `echo "[$$]" > "$CHILD_DIR/pids"; exec sleep 3600`}
			}
			cfg.StopTimeout = tc.stop
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			s := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			go func() { done <- s.Run(ctx) }()
			pids := readPids(t, dir)
			start := time.Now()
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if took < tc.min || took > tc.max {
				t.Fatalf("stop took %v, want %v..%v", took, tc.min, tc.max)
			}
			waitGone(t, time.Second, pids...)
			if s.Status().Restarts != 0 {
				t.Fatalf("restarted on stop: %+v", s.Status())
			}
		})
	}
}

// TestVipdKilled: when the supervising process dies (SIGKILL, no clean
// stop), its child is killed too.
func TestVipdKilled(t *testing.T) {
	dir := t.TempDir()
	vipd := exec.Command(os.Args[0])
	vipd.Env = append(os.Environ(), "CHILD_FAKE_VIPD=1", "CHILD_DIR="+dir)
	if err := vipd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vipd.Process.Kill(); _ = vipd.Wait() })
	pids := readPids(t, dir)
	if gone(pids[0]) {
		t.Fatal("the child is not running")
	}
	if err := vipd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = vipd.Wait()
	waitGone(t, 2*time.Second, pids[0])
	// The grandchild is not killed by the kernel (Pdeathsig reaches the
	// child only): say so instead of leaving it.
	_ = syscall.Kill(pids[1], syscall.SIGKILL)
}

// TestStartFails: a missing binary is an error that names it, retried.
func TestStartFails(t *testing.T) {
	noLeak(t)
	var got error
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{Name: "test child", Path: filepath.Join(t.TempDir(), "missing"), Backoff: Backoff{First: time.Millisecond},
		Exited: func(err error, _ time.Duration) { got = err; cancel() }}
	if err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got == nil || !strings.Contains(got.Error(), "start test child") || !errors.Is(got, os.ErrNotExist) {
		t.Fatalf("error %v", got)
	}
}

// TestSnapshotFileUnwritable: a snapshot that cannot be saved is logged;
// the lines still reach the callback.
func TestSnapshotFileUnwritable(t *testing.T) {
	noLeak(t)
	cfg, dir := helper(t, "lines")
	cfg.MaxLine = 100
	cfg.SnapshotFile = filepath.Join(dir, "missing", "last.json")
	var mu sync.Mutex
	n := 0
	cfg.Line = func(l []byte) error {
		if !json.Valid(l) {
			return errors.New("not json")
		}
		mu.Lock()
		n++
		mu.Unlock()
		return nil
	}
	var logs testenv.Buffer
	s := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Status().Lines < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v", s.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 2 || strings.Count(logs.String(), "cannot save the last line of the test child") != 2 {
		t.Fatalf("%d lines; log:\n%s", n, logs.String())
	}
}

// TestStderrWriter: a child that writes vipd's own log records has its
// lines passed on whole, not wrapped in another record.
func TestStderrWriter(t *testing.T) {
	noLeak(t)
	cfg, _ := helper(t, "lines")
	cfg.MaxLine = 100
	var out testenv.Buffer
	cfg.Stderr = &out
	s := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	// No Line callback: stdout is passed on like stderr.
	for !strings.Contains(out.String(), "a log line of the child\n") || !strings.Contains(out.String(), "{\"n\":2}\n") {
		if time.Now().After(deadline) {
			t.Fatalf("stderr writer got %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "level=") || strings.Contains(out.String(), "\n\n") {
		t.Fatalf("lines were wrapped or empty lines passed: %q", out.String())
	}
}

// TestRunCancelled: a supervisor whose context is already done starts
// nothing.
func TestRunCancelled(t *testing.T) {
	noLeak(t)
	cfg, _ := helper(t, "crash")
	started := false
	cfg.Started = func() { started = true }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))).Run(ctx); err != nil || started {
		t.Fatalf("Run = %v, started %v", err, started)
	}
}

// TestBadLineFlood: a child that floods bad lines has them all counted and
// skipped, a handful logged, and its next good line still applied.
func TestBadLineFlood(t *testing.T) {
	noLeak(t)
	cfg, _ := helper(t, "flood")
	good := make(chan string, 1)
	cfg.Line = func(l []byte) error {
		if !json.Valid(l) {
			return errors.New("not json")
		}
		good <- string(l)
		return nil
	}
	var logs testenv.Buffer
	s := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	select {
	case l := <-good:
		if l != `{"n":3}` {
			t.Fatalf("good line %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no good line; status %+v", s.Status())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.BadLines != 1000 || st.Lines != 1 {
		t.Fatalf("status %+v, want 1000 bad lines and 1 good", s.Status())
	}
	if n := strings.Count(logs.String(), "unreadable line from the test child"); n != 5 {
		t.Fatalf("%d bad lines logged, want 5 (the default burst)", n)
	}
}
