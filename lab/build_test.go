package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fatalTB records the first Fatal and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Fatal(args ...any) { f.msg = fmt.Sprint(args...); runtime.Goexit() }

func pathOf(b *Build) (string, string) {
	tb := &fatalTB{}
	var p string
	done := make(chan struct{})
	go func() { defer close(done); p = b.Path(tb) }()
	<-done
	return p, tb.msg
}

// $VIPD_TEST_BINARY is used as it is; Controllers wants vipd-controllers
// next to it and fails the test, naming it, when it is not.
func TestBuildUsesTheTestBinary(t *testing.T) {
	dir := t.TempDir()
	vipd := filepath.Join(dir, "vipd")
	if err := os.WriteFile(vipd, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIPD_TEST_BINARY", vipd)

	plain := &Build{}
	if p, msg := pathOf(plain); p != vipd || msg != "" {
		t.Fatalf("Path = %q (fatal %q), want %s", p, msg, vipd)
	}
	withCtrl := &Build{Controllers: true}
	if _, msg := pathOf(withCtrl); !strings.Contains(msg, "vipd-controllers is not next to "+vipd) {
		t.Fatalf("without vipd-controllers: fatal %q", msg)
	}
	if err := os.WriteFile(filepath.Join(dir, "vipd-controllers"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, msg := pathOf(withCtrl); p != vipd || msg != "" {
		t.Fatalf("with vipd-controllers: Path = %q (fatal %q)", p, msg)
	}
	withCtrl.Remove() // built nothing: removes nothing
	if _, err := os.Stat(vipd); err != nil {
		t.Fatal(err)
	}
}
