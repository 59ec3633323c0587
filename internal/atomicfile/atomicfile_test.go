package atomicfile

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, tc := range []struct {
		data string
		mode os.FileMode
	}{{"first\n", 0o600}, {"second, longer\n", 0o640}, {"", 0o600}} {
		if err := Write(p, []byte(tc.data), tc.mode); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != tc.data {
			t.Fatalf("read %q %v, want %q", b, err, tc.data)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != tc.mode {
			t.Fatalf("mode %v, want %v", fi.Mode().Perm(), tc.mode)
		}
	}
	if left := temps(t, dir); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// TestWriteFailsCleanly: a directory that cannot be written, or a target
// that is a directory, leaves the old state and no temporary file.
func TestWriteFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Renaming a file over a non-empty directory fails.
	err := Write(sub, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), sub) {
		t.Fatalf("want an error naming %s, got %v", sub, err)
	}
	if left := temps(t, dir); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	err = Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want ErrNotExist, got %v", err)
	}
}

// TestCrashBeforeRename: a process killed between writing the new content
// and the rename leaves the old file intact; the next Write succeeds.
func TestCrashBeforeRename(t *testing.T) {
	if p := os.Getenv("ATOMICFILE_CRASH"); p != "" {
		_ = write(p, []byte("new content\n"), 0o600, func(string) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		})
		os.Exit(0) // not reached
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := Write(p, []byte("old content\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashBeforeRename$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_CRASH="+p)
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the writer was not killed before the rename: %v", err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "old content\n" {
		t.Fatalf("after the crash: %q %v, want the old content", b, err)
	}
	left := temps(t, dir)
	if len(left) != 1 {
		t.Fatalf("want the crashed write's temporary file, got %v", left)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, left[0])); string(b) != "new content\n" {
		t.Fatalf("the temporary file holds %q: the crash was not after the write", b)
	}
	if err := Write(p, []byte("next\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "next\n" {
		t.Fatalf("after the next write: %q", b)
	}
}

func temps(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if strings.Contains(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}
