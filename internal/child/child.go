// Package child supervises the daemon's child processes (vipd-controllers
// and its feeds) with one behaviour: the child runs in its own process
// group and is killed (SIGKILL) when vipd dies; a stop sends SIGTERM to
// the group and SIGKILL after a deadline; a child that stops is restarted
// with capped exponential back-off (Restarts); its stdout is read as
// NDJSON lines handed to a callback, a bad line is counted, logged
// (BadLines) and skipped, the last good line stays in force and can be
// saved to disk; its stderr goes to the daemon's log (through the logger,
// or line by line to the daemon's stderr for a child that writes vipd's
// own log records).
package child

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vipd/vipd/internal/atomicfile"
)

// DefaultMaxLine bounds one line of a child's stdout.
const DefaultMaxLine = 16 << 20

// Config shapes a Supervisor.
type Config struct {
	// Name names the child in logs and errors ("pool feed").
	Name string
	// Path and Args are the command (Args without the program name).
	Path string
	Args []string
	// Env is the child's whole environment.
	Env []string
	// StopTimeout is how long a stopped child has between SIGTERM and
	// SIGKILL (zero: DefaultStopTimeout).
	StopTimeout time.Duration
	Backoff     Backoff
	// MaxLine bounds a stdout line (zero: DefaultMaxLine); a longer one
	// is a bad line.
	MaxLine int
	// Line handles one non-empty stdout line (without its newline; not
	// to be kept after it returns), from the supervisor's goroutine; an
	// error makes it a bad line. nil: stdout is treated like stderr.
	Line func(line []byte) error
	// Stderr, when set, receives the child's stderr lines whole (one
	// write a line, so the lines of several children never mix): for a
	// child that already writes vipd's own log records (vipd-controllers
	// logs with the same format and level). nil: each line is logged
	// through the supervisor's logger.
	Stderr io.Writer
	// SnapshotFile, when set, receives every good line (atomicfile,
	// mode 0600): the last good snapshot survives a restart of vipd.
	SnapshotFile string
	// Final looks at a child's exit: a non-nil result ends Run with it
	// instead of a restart (a child that rejected its configuration).
	Final func(exit error) error
	// Started and Exited are told of every start and stop (metrics).
	Started func()
	Exited  func(err error, restartIn time.Duration)
}

// Status is what the supervisor knows of its child.
type Status struct {
	Running   bool      `json:"running"`
	Restarts  int       `json:"restarts"`
	Lines     int       `json:"lines"`
	BadLines  int       `json:"bad_lines"`
	LastLine  time.Time `json:"last_line,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

// Supervisor runs one child until its context ends.
type Supervisor struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	status Status
	bad    BadLines

	stderrMu sync.Mutex // one line at a time to cfg.Stderr
}

// DefaultStopTimeout is a child's time between SIGTERM and SIGKILL unless
// its Config says otherwise. vipd's whole stop must fit the unit's
// TimeoutStopSec (5 s) with the VIPs' release in it: a child with state to
// give back (the controllers' Kubernetes lease) sets more, a watch such as
// a feed needs no more than this.
const DefaultStopTimeout = time.Second

// New returns a supervisor; nothing runs before Run.
func New(cfg Config, log *slog.Logger) *Supervisor {
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = DefaultMaxLine
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Path
	}
	return &Supervisor{cfg: cfg, log: log}
}

// Status returns the child's state.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Run starts the child and restarts it whenever it stops, until ctx is
// done (then it stops the child and returns nil) or Final turns an exit
// into an error. Every goroutine it starts has ended when it returns.
func (s *Supervisor) Run(ctx context.Context) error {
	r := NewRestarts(s.cfg.Backoff)
	for {
		if ctx.Err() != nil {
			return nil
		}
		r.Started(time.Now())
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if s.cfg.Final != nil {
			if ferr := s.cfg.Final(err); ferr != nil {
				return ferr
			}
		}
		if err == nil {
			err = errors.New("exited")
		}
		pause := r.Exited(time.Now())
		s.mu.Lock()
		s.status.Restarts++
		s.status.LastError = err.Error()
		s.mu.Unlock()
		if s.cfg.Exited != nil {
			s.cfg.Exited(err, pause)
		}
		s.log.Error("the "+s.cfg.Name+" stopped; restarting it", "err", err, "in", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// runOnce runs the child once, until it exits or ctx is done.
func (s *Supervisor) runOnce(ctx context.Context) error {
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start %s: %w", s.cfg.Name, err)
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return fmt.Errorf("start %s: %w", s.cfg.Name, err)
	}
	defer errR.Close()
	cmd := exec.Command(s.cfg.Path, s.cfg.Args...)
	cmd.Env = s.cfg.Env
	cmd.Stdout, cmd.Stderr = outW, errW
	// Pdeathsig is sent when the thread that started the child ends:
	// this goroutine keeps its thread until the child is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		return fmt.Errorf("start %s: %w", s.cfg.Name, err)
	}
	pgid := cmd.Process.Pid
	s.setRunning(true)
	defer s.setRunning(false)
	if s.cfg.Started != nil {
		s.cfg.Started()
	}
	s.log.Info("started the "+s.cfg.Name, "binary", s.cfg.Path, "pid", pgid)

	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		s.readLines(outR, s.stdoutLine)
	}()
	go func() {
		defer readers.Done()
		s.readLines(errR, func(line []byte, tooLong bool) { s.logLine(line, tooLong) })
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var werr error
	select {
	case werr = <-exited:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(s.cfg.StopTimeout)
		select {
		case werr = <-exited:
		case <-t.C:
			s.log.Warn("the "+s.cfg.Name+" did not stop after SIGTERM; killing it", "after", s.cfg.StopTimeout)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-exited
		}
		t.Stop()
	}
	// Whatever is left of the group (the child's own children) goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	// The readers end at EOF once every writer is gone; a writer that
	// left the group does not hold them longer than the stop deadline.
	dl := time.Now().Add(s.cfg.StopTimeout)
	_ = outR.SetReadDeadline(dl)
	_ = errR.SetReadDeadline(dl)
	readers.Wait()
	return werr
}

func (s *Supervisor) setRunning(r bool) {
	s.mu.Lock()
	s.status.Running = r
	s.mu.Unlock()
}

// stdoutLine handles one line of the child's stdout.
func (s *Supervisor) stdoutLine(line []byte, tooLong bool) {
	if s.cfg.Line == nil {
		s.logLine(line, tooLong)
		return
	}
	var err error
	if tooLong {
		err = fmt.Errorf("line longer than %d bytes", s.cfg.MaxLine)
	} else {
		err = s.cfg.Line(line)
	}
	now := time.Now()
	s.mu.Lock()
	if err != nil {
		s.status.BadLines++
		log, suppressed := s.bad.Bad(now)
		s.mu.Unlock()
		if log {
			s.log.Error("unreadable line from the "+s.cfg.Name+": skipped, the last good one stays in force",
				"err", err, "bytes", len(line), "not_logged", suppressed)
		}
		return
	}
	s.status.Lines++
	s.status.LastLine = now
	s.mu.Unlock()
	if s.cfg.SnapshotFile != "" {
		if err := atomicfile.Write(s.cfg.SnapshotFile, append(bytes.Clone(line), '\n'), 0o600); err != nil {
			s.log.Warn("cannot save the last line of the "+s.cfg.Name, "err", err)
		}
	}
}

// logLine passes on a line the child wrote to stderr.
func (s *Supervisor) logLine(line []byte, tooLong bool) {
	switch {
	case tooLong:
		s.log.Warn("the "+s.cfg.Name+" wrote a log line longer than the limit: dropped", "limit", s.cfg.MaxLine)
	case len(bytes.TrimSpace(line)) == 0:
	case s.cfg.Stderr != nil:
		s.stderrMu.Lock()
		_, _ = s.cfg.Stderr.Write(append(bytes.Clone(line), '\n'))
		s.stderrMu.Unlock()
	default:
		s.log.Info(string(line), "child", s.cfg.Name)
	}
}

// readLines calls fn with every non-empty line of r (without its
// newline; a line longer than MaxLine is passed empty with tooLong set,
// its bytes dropped) until EOF or a read error. fn must not keep line.
func (s *Supervisor) readLines(r io.Reader, fn func(line []byte, tooLong bool)) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	long := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !long {
			if len(buf)+len(chunk) > s.cfg.MaxLine+1 {
				long, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if line := bytes.TrimRight(buf, "\r\n"); len(line) > 0 || long {
			fn(line, long)
		}
		buf, long = buf[:0], false
		if err != nil {
			return
		}
	}
}
