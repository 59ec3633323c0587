package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// usesGossip reports whether this configuration joins a cluster over
// gossip (memberlist, the lease election): l2 or cloud mode with VIPs and
// peers.
func usesGossip(c *config.Config) bool {
	return (len(c.Addresses) > 0 || c.Pools) && len(c.Peers) > 0 && (c.Mode == config.ModeL2 || c.Mode == config.ModeCloud)
}

// usesStateDir reports whether this configuration keeps state in
// VIPD_STATE_DIR: the lease election persists its state there
// (cluster.LeaseStateFile).
func usesStateDir(c *config.Config) bool { return usesGossip(c) || c.Pools || c.Witness() }

// checkStateDir makes sure the state directory can be written the way
// vipd writes it (internal/atomicfile: a temporary file renamed over the
// old one), before anything is bound: a node that cannot persist its
// lease state would lose its votes at the next restart. It creates the
// directory if needed, writes and renames a probe file and removes it, and
// checks that an existing lease state file can be opened for writing (a
// read-only mount, an immutable file). The error is one line naming VIPD_STATE_DIR.
func checkStateDir(dir string) error {
	fail := func(err error) error {
		var pe *os.PathError
		var le *os.LinkError
		switch {
		case errors.As(err, &pe):
			err = fmt.Errorf("%s %s: %w", pe.Op, pe.Path, pe.Err)
		case errors.As(err, &le):
			err = fmt.Errorf("%s %s: %w", le.Op, le.New, le.Err)
		}
		return fmt.Errorf("VIPD_STATE_DIR %s is not writable (%v): vipd keeps the lease election's state there; make it a writable directory (vipd.service has StateDirectory=vipd) or set VIPD_STATE_DIR", dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fail(err)
	}
	final := filepath.Join(dir, fmt.Sprintf(".write-probe-%d", os.Getpid()))
	if err := atomicfile.Write(final, []byte("vipd\n"), 0o600); err != nil {
		return fail(err)
	}
	if err := os.Remove(final); err != nil {
		return fail(err)
	}
	state := filepath.Join(dir, cluster.LeaseStateFile)
	if _, err := os.Lstat(state); err == nil {
		f, err := os.OpenFile(state, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fail(err)
		}
		_ = f.Close()
	}
	return nil
}

// RunLock is the file in VIPD_STATE_DIR that a running vipd holds a lock
// on (flock) for its whole life: `vipd cleanup` refuses while it is held.
// The kernel drops the lock when the process dies, however it dies.
const RunLock = "vipd.lock"

// holdRunLock takes the run lock in dir and returns what releases it. It
// fails when dir cannot hold the file (a node without a state directory
// runs without it) or another process holds it.
func holdRunLock(dir string) (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, RunLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil
}

// runLockHeld reports whether a process holds the run lock in dir.
func runLockHeld(dir string) bool {
	f, err := os.Open(filepath.Join(dir, RunLock))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
