package pools

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxLine bounds one snapshot line of the feed (about 150,000 addresses):
// a longer line is refused, the child restarted, the last snapshot kept.
const MaxLine = 16 << 20

// StateFile is the name of the last snapshot in VIPD_STATE_DIR: after a
// restart vipd announces what it knew while the feed comes up (or while the
// apiserver is down).
const StateFile = "pools.json"

// FeedConfig shapes a Feed.
type FeedConfig struct {
	// Command is the feed child: binary and arguments.
	Command []string
	// Env is the child's environment.
	Env []string
	// StateDir keeps the last snapshot ("" : not kept).
	StateDir string
	// Backoff is the first pause before a restart (doubling to 30 s);
	// zero: 1 s.
	Backoff time.Duration
}

// Feed runs the feed child, restarts it with back-off when it stops, and
// hands every snapshot it writes to a callback. A child that dies, hangs
// up or writes garbage changes nothing: the last snapshot stays in force
// until the next good one.
type Feed struct {
	cfg FeedConfig
	log *slog.Logger

	mu     sync.Mutex
	status FeedStatus

	mUp        prometheus.Gauge
	mRestarts  prometheus.Counter
	mSnapshots prometheus.Counter
}

// FeedStatus is the feed's part of /status.
type FeedStatus struct {
	Running      bool      `json:"running"`
	Restarts     int       `json:"restarts"`
	Snapshots    int       `json:"snapshots"`
	LastSnapshot time.Time `json:"last_snapshot,omitzero"`
	Generation   uint64    `json:"generation"`
	Addresses    int       `json:"addresses"`
	FromDisk     bool      `json:"from_disk,omitempty"` // the addresses are the ones saved by a previous run
	LastError    string    `json:"last_error,omitempty"`
}

// NewFeed returns a feed; reg may be nil.
func NewFeed(cfg FeedConfig, log *slog.Logger, reg prometheus.Registerer) (*Feed, error) {
	f := &Feed{cfg: cfg, log: log.With("component", "pools-feed"),
		mUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vipd_pool_feed_up",
			Help: "1 while the pool feed child (vipd-controllers pools-feed) runs."}),
		mRestarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_pool_feed_restarts_total",
			Help: "Times the pool feed child stopped and was restarted."}),
		mSnapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "vipd_pool_feed_snapshots_total",
			Help: "Snapshots of the allocated pool addresses received from the feed."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{f.mUp, f.mRestarts, f.mSnapshots} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Load returns the snapshot saved by a previous run, if any.
func (f *Feed) Load() (Snapshot, bool) {
	if f.cfg.StateDir == "" {
		return Snapshot{}, false
	}
	b, err := os.ReadFile(filepath.Join(f.cfg.StateDir, StateFile))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			f.log.Warn("cannot read the saved pool addresses", "err", err)
		}
		return Snapshot{}, false
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		f.log.Warn("ignoring unreadable saved pool addresses", "file", filepath.Join(f.cfg.StateDir, StateFile), "err", err)
		return Snapshot{}, false
	}
	f.mu.Lock()
	f.status.FromDisk, f.status.Addresses = true, len(s.Addresses)
	f.mu.Unlock()
	return s, true
}

func (f *Feed) save(line []byte) {
	if f.cfg.StateDir == "" {
		return
	}
	p := filepath.Join(f.cfg.StateDir, StateFile)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, line, 0o600); err != nil {
		f.log.Warn("cannot save the pool addresses", "err", err)
		return
	}
	if err := os.Rename(tmp, p); err != nil {
		f.log.Warn("cannot save the pool addresses", "err", err)
	}
}

// Run keeps the child running until ctx is done, calling onSnapshot (from
// Run's goroutine) with every valid snapshot.
func (f *Feed) Run(ctx context.Context, onSnapshot func(Snapshot)) {
	first := f.cfg.Backoff
	if first <= 0 {
		first = time.Second
	}
	backoff := first
	for {
		start := time.Now()
		err := f.runOnce(ctx, onSnapshot)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = first
		}
		f.mRestarts.Inc()
		f.mu.Lock()
		f.status.Restarts++
		if err != nil {
			f.status.LastError = err.Error()
		}
		f.mu.Unlock()
		f.log.Error("the pool feed stopped; keeping the last known addresses and restarting it", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (f *Feed) runOnce(ctx context.Context, onSnapshot func(Snapshot)) error {
	if len(f.cfg.Command) == 0 {
		return fmt.Errorf("no feed command")
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(cctx, f.cfg.Command[0], f.cfg.Command[1:]...)
	cmd.Env = f.cfg.Env
	cmd.Stderr = os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", f.cfg.Command[0], err)
	}
	f.setRunning(true)
	defer f.setRunning(false)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	var readErr error
	for sc.Scan() {
		line := sc.Bytes()
		var s Snapshot
		if err := json.Unmarshal(line, &s); err != nil {
			readErr = fmt.Errorf("unreadable snapshot from the feed: %w", err)
			break
		}
		f.mSnapshots.Inc()
		f.mu.Lock()
		f.status.Snapshots++
		f.status.LastSnapshot = time.Now()
		f.status.Generation = s.Generation
		f.status.Addresses = len(s.Addresses)
		f.status.FromDisk = false
		f.mu.Unlock()
		onSnapshot(s)
		f.save(append(line, '\n'))
	}
	if readErr == nil {
		readErr = sc.Err()
	}
	cancel() // a child that wrote garbage or too long a line is stopped
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(readErr, werr)
}

func (f *Feed) setRunning(r bool) {
	f.mu.Lock()
	f.status.Running = r
	f.mu.Unlock()
	if r {
		f.mUp.Set(1)
	} else {
		f.mUp.Set(0)
	}
}

// Status returns the feed's state.
func (f *Feed) Status() FeedStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}
