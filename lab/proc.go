package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vipd/vipd/internal/testenv"
)

// Proc is a process started in a lab namespace, with its output kept.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

// Start runs name with args and env inside the host's namespace. Output
// (stdout and stderr together) is kept and, if logPath is not empty, also
// written there.
func (h *Host) Start(label string, env []string, name string, args ...string) (*Proc, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	buf := &testenv.Buffer{}
	cmd.Stdout = buf
	cmd.Stderr = buf
	// Own process group so a kill reaches the program, not only `ip`
	// (ip netns exec execs the program, so the pid is the program's).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := h.lab.startProcess(cmd); err != nil {
		return nil, fmt.Errorf("start %s in %s: %w", label, h.NS, err)
	}
	p := &Proc{Name: label, cmd: cmd, out: buf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	h.lab.OnClose(p.Kill)
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Wait waits for the exit up to timeout and returns the exit code (-1 when
// killed by a signal or still running at the deadline).
func (p *Proc) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		if p.cmd.ProcessState == nil {
			return -1, p.err
		}
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("%s still running after %v", p.Name, timeout)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output returns everything the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// WaitOutput waits until the output contains substr.
func (p *Proc) WaitOutput(ctx context.Context, substr string) error {
	for {
		if strings.Contains(p.out.String(), substr) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %q not seen in output: %w\n%s", p.Name, substr, ctx.Err(), p.out.String())
		case <-p.done:
			if strings.Contains(p.out.String(), substr) {
				return nil
			}
			return fmt.Errorf("%s exited before printing %q:\n%s", p.Name, substr, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// VipdBinary returns the path of a vipd binary for tests: $VIPD_TEST_BINARY
// when set (the Makefile builds it once), otherwise one built now into dir.
func VipdBinary(ctx context.Context, dir string) (string, error) {
	if p := os.Getenv("VIPD_TEST_BINARY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("VIPD_TEST_BINARY: %w", err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// vipd-controllers is built next to vipd, where vipd looks for it.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "./cmd/vipd", "./cmd/vipd-controllers")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/vipd ./cmd/vipd-controllers: %w: %s", err, b)
	}
	return filepath.Join(dir, "vipd"), nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}
