// Package testenv decides whether a test's prerequisites are present, and
// holds the small helpers integration tests share (a free loopback address,
// polling until a condition holds, a TCP relay).
//
// Outside CI a missing prerequisite skips the test with a reason. With
// CI=true it fails the test instead: CI must never pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the CI environment variable asks for strict mode.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Missing skips (locally) or fails (in CI) the test, naming what is missing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("prerequisite missing (CI=true makes this fatal): "+format, args...)
	}
	t.Skipf("prerequisite missing: "+format, args...)
}

// RequireRoot needs uid 0 (network namespaces, raw sockets).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (uid 0) for network namespaces and raw sockets")
	}
}

// RequireCommands needs each named program on PATH and returns nothing;
// use exec.LookPath afterwards if the full path is wanted.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Missing(t, "command %q not on PATH (make test installs it)", n)
		}
	}
}

// Short reports whether long integration tests should be skipped because
// -short was given. It never applies in CI.
func Short(t testing.TB) {
	t.Helper()
	if testing.Short() && !InCI() {
		t.Skip("skipped with -short")
	}
}
