package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
)

// standInControllers makes a shell script with body the controllers child
// (VIPD_CONTROLLERS_BINARY) and returns the supervisor vipd would run it
// with, for the settings env.
func standInControllers(t *testing.T, body string, env map[string]string) *controllers {
	t.Helper()
	script := filepath.Join(t.TempDir(), "vipd-controllers")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIPD_CONTROLLERS_BINARY", script)
	c, err := config.Load(func(s *config.Setting) (string, bool) {
		v, ok := env[s.Env]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	k, err := newControllers(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestControllersChildGetsConfigAndStopsOnConfigError(t *testing.T) {
	out := filepath.Join(t.TempDir(), "env")
	// A stand-in child: records what it was given, then rejects it (exit 2).
	k := standInControllers(t, "echo \"$VIPD_CONTROLLERS|$VIPD_PRIORITY|$DIGITALOCEAN_ACCESS_TOKEN|$VIPD_CONTROLLERS_METRICS_SOCKET\" >> "+out+"\nexit 2\n",
		map[string]string{"VIPD_CONTROLLERS": "floatingippool", "VIPD_PRIORITY": "9", "DIGITALOCEAN_ACCESS_TOKEN": "tok", "VIPD_NODE_NAME": "n"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := k.Run(ctx)
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("want a configuration error, got %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(string(b))
	if strings.Count(got, "\n") != 0 || !strings.HasPrefix(got, "floatingippool|9|tok|@vipd-controllers-") {
		t.Fatalf("child ran with %q (want once, with the effective settings)", got)
	}
	// Nothing to gather from a child that is not running.
	if fams, err := k.Gather(); err != nil || len(fams) != 0 {
		t.Fatalf("gather: %v %v", fams, err)
	}
}

func TestControllersBinaryMissing(t *testing.T) {
	t.Setenv("VIPD_CONTROLLERS_BINARY", "")
	if _, err := os.Stat("/usr/lib/vipd/vipd-controllers"); err == nil {
		t.Skip("installed system-wide")
	}
	c := &config.Config{Controllers: "floatingippool"}
	_, err := newControllers(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "vipd-controllers was not found") {
		t.Fatalf("got %v", err)
	}
}

// TestControllersChildThatHangsOnStop: a child that ignores SIGTERM (its
// leader stuck releasing the lease on an API that does not answer) is
// killed after controllersStopTimeout, so that vipd's stop stays inside the
// unit's TimeoutStopSec (TestStopBudgetFitsEveryPackaging).
func TestControllersChildThatHangsOnStop(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	k := standInControllers(t, "trap '' TERM\necho $$ > "+pidFile+"\nwhile :; do sleep 0.1; done\n",
		map[string]string{"VIPD_CONTROLLERS": "floatingippool", "DIGITALOCEAN_ACCESS_TOKEN": "tok", "VIPD_NODE_NAME": "n"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	var pid int
	for end := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(end) {
			cancel()
			t.Fatal("the child never started")
		}
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		took := time.Since(start)
		if err != nil {
			t.Errorf("Run after a stop: %v", err)
		}
		if took < controllersStopTimeout || took > controllersStopTimeout+time.Second {
			t.Errorf("the stop took %v; want the kill after %v", took.Round(time.Millisecond), controllersStopTimeout)
		}
	case <-time.After(controllersStopTimeout + 5*time.Second):
		t.Fatal("Run did not return after the stop")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child (pid %d) is still there after the stop: %v", pid, err)
	}
}
