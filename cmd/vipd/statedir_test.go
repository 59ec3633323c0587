package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/internal/testenv"
)

func TestCheckStateDir(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(base, "lease-state-is-a-dir")
	if err := os.MkdirAll(filepath.Join(stateDir, cluster.LeaseStateFile), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		ok        bool
	}{
		{"existing empty dir", t.TempDir(), true},
		{"created", filepath.Join(base, "new", "state"), true},
		{"a regular file", file, false},
		{"below a regular file", filepath.Join(file, "state"), false},
		{"lease.state cannot be written", stateDir, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStateDir(tc.dir)
			if tc.ok != (err == nil) {
				t.Fatalf("checkStateDir(%s) = %v, want ok=%v", tc.dir, err, tc.ok)
			}
			if err != nil {
				msg := err.Error()
				if !strings.HasPrefix(msg, "VIPD_STATE_DIR "+tc.dir+" is not writable") || strings.Contains(msg, "\n") {
					t.Fatalf("error %q: want one line starting with the setting and the directory", msg)
				}
				return
			}
			left, _ := os.ReadDir(tc.dir)
			if len(left) != 0 {
				t.Fatalf("probe left files behind: %v", left)
			}
		})
	}
}

// TestCheckStateDirReadOnlyMount: the case an operator meets (a read-only
// file system, e.g. ProtectSystem=strict without StateDirectory=), which
// root's permissions do not bypass.
func TestCheckStateDirReadOnlyMount(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "mount", "umount")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, cluster.LeaseStateFile), []byte("{}\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	if out, err := exec.Command("mount", "-o", "remount,ro,bind", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	err := checkStateDir(dir)
	if err == nil || !strings.Contains(err.Error(), "read-only file system") || !strings.HasPrefix(err.Error(), "VIPD_STATE_DIR "+dir) {
		t.Fatalf("checkStateDir on a read-only mount = %v", err)
	}
}
