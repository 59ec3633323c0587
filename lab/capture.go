package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Frame is one captured frame as tcpdump decoded it.
type Frame struct {
	At   time.Time
	Src  string // source MAC
	Line string // tcpdump's text after the link-level header
}

// Capture records frames seen on a host's eth0 with tcpdump.
type Capture struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	frames []Frame
	done   chan struct{}
	errs   strings.Builder
}

// StartCapture starts tcpdump in the host's namespace with a capture
// filter (e.g. "arp or icmp6") and waits until it listens.
func (h *Host) StartCapture(ctx context.Context, filter string) (*Capture, error) {
	args := []string{"netns", "exec", h.NS, "tcpdump", "-i", h.Link, "-l", "-n", "-e", "-vv", "--time-stamp-precision=micro", "-tt", "-U"}
	args = append(args, strings.Fields(filter)...)
	cmd := exec.Command("ip", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.lab.startProcess(cmd); err != nil {
		return nil, fmt.Errorf("tcpdump in %s: %w", h.NS, err)
	}
	c := &Capture{cmd: cmd, done: make(chan struct{})}
	h.lab.OnClose(c.Stop)
	// ready carries whether tcpdump said it listens: false when it
	// ended first (not installed, no such link, a bad filter).
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			c.mu.Lock()
			c.errs.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if strings.Contains(sc.Text(), "listening on") {
				once.Do(func() { ready <- true })
			}
		}
		once.Do(func() { ready <- false })
	}()
	go c.read(stdout)
	select {
	case ok := <-ready:
		if !ok {
			c.Stop()
			return nil, fmt.Errorf("tcpdump in %s did not start listening on %s: %s", h.NS, h.Link, strings.TrimSpace(c.stderr()))
		}
	case <-ctx.Done():
		c.Stop()
		return nil, ctx.Err()
	}
	// tcpdump prints "listening" just before the socket is attached; a
	// short pause avoids losing the first frame.
	time.Sleep(100 * time.Millisecond)
	return c, nil
}

func (c *Capture) read(r io.Reader) {
	defer close(c.done)
	sc := bufio.NewScanner(r)
	var cur *Frame
	flush := func() {
		if cur != nil {
			c.mu.Lock()
			c.frames = append(c.frames, *cur)
			c.mu.Unlock()
			cur = nil
		}
	}
	for sc.Scan() {
		line := sc.Text()
		// Continuation lines (-vv) start with whitespace.
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			if cur != nil {
				cur.Line += " " + strings.TrimSpace(line)
			}
			continue
		}
		flush()
		f := strings.SplitN(line, " ", 3)
		if len(f) < 3 {
			continue
		}
		secs, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, int64(secs*1e6)*1000)
		cur = &Frame{At: at, Src: f[1], Line: f[2]}
	}
	flush()
}

// stderr returns what tcpdump printed on its standard error so far.
func (c *Capture) stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs.String()
}

// Stop ends the capture and waits for the last frames to be read.
func (c *Capture) Stop() {
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(syscall.SIGINT)
	}
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	_ = c.cmd.Wait()
}

// Frames returns the frames captured so far whose text contains every one
// of the given substrings.
func (c *Capture) Frames(match ...string) []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Frame
next:
	for _, f := range c.frames {
		for _, m := range match {
			if !strings.Contains(f.Line, m) {
				continue next
			}
		}
		out = append(out, f)
	}
	return out
}

// WaitFrames waits until at least n frames match.
func (c *Capture) WaitFrames(ctx context.Context, n int, match ...string) ([]Frame, error) {
	for {
		if fs := c.Frames(match...); len(fs) >= n {
			return fs, nil
		}
		select {
		case <-ctx.Done():
			return c.Frames(match...), fmt.Errorf("waiting for %d frames matching %q: %w (all: %d)", n, match, ctx.Err(), len(c.Frames()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// All returns every captured frame, for failure messages.
func (c *Capture) All() string {
	var b strings.Builder
	for _, f := range c.Frames() {
		fmt.Fprintf(&b, "%s %s %s\n", f.At.Format("15:04:05.000000"), f.Src, f.Line)
	}
	return b.String()
}
