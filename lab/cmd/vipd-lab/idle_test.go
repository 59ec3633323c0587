package main

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestParseSchedstat: a thread's schedstat line gives its CPU time and
// its time slices; anything else is an error that quotes the line.
func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		line      string
		cpu, runs int64
		bad       bool
	}{
		{line: "2512345 98765 42\n", cpu: 2512345, runs: 42},
		{line: "0 0 0", cpu: 0, runs: 0},
		{line: "2512345 98765", bad: true},
		{line: "", bad: true},
		{line: "x 1 2", bad: true},
		{line: "1 2 y", bad: true},
		{line: "1 2 3 4", bad: true},
	} {
		st, err := parseSchedstat(tc.line)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSchedstat(%q) = %+v, want an error", tc.line, st)
			}
			continue
		}
		if err != nil || st.cpuNS != tc.cpu || st.runs != tc.runs {
			t.Errorf("parseSchedstat(%q) = %+v, %v; want cpu %d, runs %d", tc.line, st, err, tc.cpu, tc.runs)
		}
	}
}

// TestGroupSchedCountsWakeUps: a real process group whose leader wakes
// 20 times (once for each child it waits for) is counted with at least
// 20 runs and some CPU time, read from /proc.
func TestGroupSchedCountsWakeUps(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 20 ]; do sleep 0.01; i=$((i+1)); done; echo done; exec sleep 30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	before, err := groupSched(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	done := make(chan error, 1)
	go func() { _, err := out.Read(buf); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the shell did not finish its 20 sleeps")
	}
	after, err := groupSched(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if runs := after.runs - before.runs; runs < 20 {
		t.Errorf("the group ran %d times between the readings, want at least 20 (one per child waited for)", runs)
	}
	if after.cpuNS <= before.cpuNS {
		t.Errorf("CPU time %d ns, then %d ns: want it to grow", before.cpuNS, after.cpuNS)
	}
}
