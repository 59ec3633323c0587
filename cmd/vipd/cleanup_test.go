package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/testenv"
)

// TestRunLock: the run lock is held while its release has not run, by
// whichever process; a state directory without the file, or one that does
// not exist, holds nothing.
func TestRunLock(t *testing.T) {
	dir := t.TempDir()
	if runLockHeld(dir) {
		t.Fatal("held before anybody took it")
	}
	release, err := holdRunLock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !runLockHeld(dir) {
		t.Fatal("not held while taken")
	}
	if _, err := holdRunLock(dir); err == nil {
		t.Fatal("taken twice: a second vipd would not be told from the first")
	}
	release()
	if runLockHeld(dir) {
		t.Fatal("still held after its release")
	}
	if _, err := holdRunLock(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("took a lock in a directory that does not exist")
	}
	if runLockHeld(filepath.Join(dir, "missing")) {
		t.Fatal("a missing directory holds a lock")
	}
}

// TestCleanupRefusesWhileRunning: with the run lock held, cleanup stops
// before it looks at the kernel, with one line naming the lock file.
func TestCleanupRefusesWhileRunning(t *testing.T) {
	dir := t.TempDir()
	release, err := holdRunLock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var out strings.Builder
	c := &config.Config{StateDir: dir, Mode: config.ModeL2, Interface: "does-not-exist0"}
	err = cleanup(t.Context(), c, &out)
	if !errors.Is(err, errRunning) || !strings.Contains(err.Error(), filepath.Join(dir, RunLock)) {
		t.Fatalf("cleanup with the run lock held: %v, want errRunning naming %s", err, filepath.Join(dir, RunLock))
	}
	if out.Len() > 0 {
		t.Fatalf("cleanup printed %q while refusing", out.String())
	}
}

// TestManPageListsEveryCommand: vipd(8)'s COMMANDS section
// (packaging/genman, written by hand) has an entry for every command of
// vipd, so that a new command is documented where operators look.
func TestManPageListsEveryCommand(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "packaging", "genman", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range newRootCmd().Commands() {
		switch c.Name() {
		case "help", "completion":
			continue
		}
		if !strings.Contains(string(src), `{"`+c.Name()) {
			t.Errorf("vipd(8) has no COMMANDS entry for %q (packaging/genman/main.go)", c.Name())
		}
	}
}

// TestCleanupEnvFile: cleanup reads --env-file as check-config does, and
// warns of the lines systemd would ignore there too (one helper for both).
func TestCleanupEnvFile(t *testing.T) {
	dir := t.TempDir()
	release, err := holdRunLock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	f := filepath.Join(t.TempDir(), "vipd.env")
	body := "VIPD_ADDRESS=10.0.0.9/32\nVIPD_INTERFACE=does-not-exist0\nVIPD_STATE_DIR=" + dir + "\nexport VIPD_PRIORITY=5\n"
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIPD_ADDRESS", "")
	t.Setenv("VIPD_INTERFACE", "")
	t.Setenv("VIPD_STATE_DIR", "")
	t.Setenv("VIPD_NODE_NAME", "n")
	code, out, errs := run(t, nil, "cleanup", "--env-file", f)
	// The settings came from the file: the lock in its VIPD_STATE_DIR is
	// found and cleanup refuses.
	if code != exitFailure || !strings.Contains(errs, filepath.Join(dir, RunLock)) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d naming %s", code, out, errs, exitFailure, filepath.Join(dir, RunLock))
	}
	if !strings.Contains(errs, `warning: --env-file `+f+`: line 4: "export VIPD_PRIORITY" is not a valid variable name`) {
		t.Fatalf("no warning of the ignored export line:\n%s", errs)
	}
	code, _, errs = run(t, nil, "cleanup", "--env-file", filepath.Join(dir, "missing.env"))
	if code != exitConfig || !strings.Contains(errs, "--env-file") {
		t.Fatalf("missing env file: exit %d, stderr %q; want exit %d naming --env-file", code, errs, exitConfig)
	}
}

func TestIsVipdRun(t *testing.T) {
	for _, c := range []struct {
		cmdline string
		want    bool
	}{
		{"/usr/bin/vipd\x00run\x00", true},
		{"vipd\x00--log-level\x00debug\x00run\x00", true},
		{"/usr/bin/vipd\x00cleanup\x00", false},
		{"/usr/bin/vipd\x00", false},
		{"/usr/bin/vipd-controllers\x00run\x00", false},
		{"/bin/sh\x00/usr/bin/vipd\x00run\x00", false},
		{"", false},
	} {
		if got := isVipdRun([]byte(c.cmdline)); got != c.want {
			t.Errorf("isVipdRun(%q) = %v, want %v", c.cmdline, got, c.want)
		}
	}
}

// TestCleanupSeesAVipdWithoutTheLock: a `vipd run` without the run lock
// (a release from before it, another VIPD_STATE_DIR) in this network
// namespace makes cleanup refuse; one in another network namespace does
// not.
func TestCleanupSeesAVipdWithoutTheLock(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	// A process whose command line is "vipd run": sh started as "vipd"
	// reads the script "run" from its working directory.
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte("sleep 60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, flags uintptr) int {
		t.Helper()
		cmd := exec.Command(sh, "run")
		cmd.Args[0] = "vipd"
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: flags}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
		// until its command line is visible
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)); isVipdRun(b) {
				return cmd.Process.Pid
			}
			if time.Now().After(deadline) {
				t.Fatal("the stand-in vipd did not start")
			}
		}
	}
	c := &config.Config{StateDir: t.TempDir(), Mode: config.ModeL2, Interface: "does-not-exist0"}

	// In another network namespace: not counted.
	other := start(t, syscall.CLONE_NEWNET)
	if pids, err := runningVipd(); err != nil || slices.Contains(pids, other) {
		t.Fatalf("runningVipd with a vipd (pid %d) in another network namespace: %v, %v", other, pids, err)
	}

	// In this one: counted, and cleanup refuses naming it.
	pid := start(t, 0)
	if pids, err := runningVipd(); err != nil || !slices.Contains(pids, pid) || slices.Contains(pids, other) {
		t.Fatalf("runningVipd: %v, %v; want %d and not %d", pids, err, pid, other)
	}
	var out strings.Builder
	err = cleanup(t.Context(), c, &out)
	if !errors.Is(err, errRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("cleanup with a vipd running: %v, want errRunning naming pid %d", err, pid)
	}
	if out.Len() > 0 {
		t.Fatalf("cleanup printed %q while refusing", out.String())
	}
}
