package cluster

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStateFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := newStateFile(dir)
	if b, err := s.Load(); err != nil || b != nil {
		t.Fatalf("missing file: %q, %v; want nil, nil (a node that never ran)", b, err)
	}
	for _, want := range [][]byte{[]byte("first"), {}, bytes.Repeat([]byte{0, 1, 2}, 4000)} {
		if err := s.Save(want); err != nil {
			t.Fatal(err)
		}
		got, err := s.Load()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("got %d bytes, %v; want %d bytes", len(got), err, len(want))
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
	if st, _ := os.Stat(s.path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
}

// A damaged file is an error that names the file and what to do; it is
// never taken for an empty state (that would bootstrap a second cluster or
// forget votes).
func TestStateFileDamaged(t *testing.T) {
	good := wrapState([]byte("raft hard state and log"))
	tests := map[string][]byte{
		"empty":          {},
		"foreign":        []byte(`{"members":{}}`),
		"truncated":      good[:len(good)-3],
		"flipped bit":    append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^0x10),
		"header only":    good[:len(leaseStateMagic)+8],
		"trailing bytes": append(append([]byte(nil), good...), 'x'),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, LeaseStateFile)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := newStateFile(dir).Load()
			if err == nil {
				t.Fatalf("loaded %q from a damaged file", got)
			}
			msg := err.Error()
			if !strings.Contains(msg, p) || !strings.Contains(msg, "vipd forget") || strings.Contains(msg, "\n") {
				t.Fatalf("error %q: want one line naming %s and `vipd forget`", msg, p)
			}
		})
	}
}

func TestStateFileUnreadable(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, LeaseStateFile)
	if err := os.Mkdir(p, 0o700); err != nil { // a directory where the file should be
		t.Fatal(err)
	}
	if _, err := newStateFile(dir).Load(); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("got %v", err)
	}
	if err := newStateFile(dir).Save([]byte("x")); err == nil {
		t.Fatal("saved over a directory")
	}
}

// A failed write leaves the previous state whole.
func TestStateFileSaveFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	s := newStateFile(dir)
	if err := s.Save([]byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() == 0 {
		// root writes anyway; use a state that is too large instead.
		if err := s.Save(make([]byte, leaseStateMax+1)); err == nil {
			t.Fatal("saved an oversized state")
		}
	} else if err := s.Save([]byte("new")); err == nil {
		t.Fatal("saved into a read-only directory")
	}
	if got, err := s.Load(); err != nil || string(got) != "old" {
		t.Fatalf("got %q, %v", got, err)
	}
}
