package main

import (
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// raisePriority sets the nice value of every thread of the process, and a
// thread started afterwards inherits it. The test lowers the priority (a
// positive nice needs no privilege) so it can run anywhere.
func TestRaisePrioritySetsEveryThread(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if failed := raisePriority(7, log); failed != 0 {
		t.Fatalf("%d threads not set", failed)
	}
	// A new OS thread (a locked goroutine forces the runtime to start one
	// when the others are busy) inherits the value.
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		<-done
	}()
	defer close(done)
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err != nil {
			continue // the thread exited
		}
		if nice := 20 - p; nice != 7 {
			t.Errorf("thread %d: nice %d, want 7", tid, nice)
		}
	}
	if raisePriority(0, log) != 0 {
		t.Fatal("nice 0 must leave the threads alone")
	}
}
