package pools

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vipd/vipd/internal/child"
)

// MaxLine bounds one snapshot line of the feed (about 150,000 addresses):
// a longer line is skipped like any bad line, the last snapshot kept.
const MaxLine = child.DefaultMaxLine

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

// Feed runs the feed child (internal/child: restarts with back-off, a bad
// line counted, logged and skipped) and hands every snapshot it writes to
// a callback. A child that dies, hangs up or writes garbage changes
// nothing: the last snapshot stays in force until the next good one.
type Feed struct {
	cfg FeedConfig
	log *slog.Logger
	sup *child.Supervisor
	// onSnapshot is set by Run before the child starts.
	onSnapshot func(Snapshot)

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
	BadLines     int       `json:"bad_lines,omitempty"` // lines of the child that were not a snapshot, skipped
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
	var cmd []string
	if len(cfg.Command) > 0 {
		cmd = cfg.Command
	} else {
		cmd = []string{""}
	}
	// The child logs vipd's own records (same format and level): its
	// stderr lines go to vipd's stderr whole.
	ccfg := child.Config{Name: "pool feed", Path: cmd[0], Args: cmd[1:], Env: cfg.Env, Stderr: os.Stderr,
		Backoff: child.Backoff{First: cfg.Backoff}, MaxLine: MaxLine, Line: f.line,
		Started: func() { f.mUp.Set(1) },
		Exited: func(error, time.Duration) {
			f.mUp.Set(0)
			f.mRestarts.Inc()
		},
	}
	if cfg.StateDir != "" {
		ccfg.SnapshotFile = filepath.Join(cfg.StateDir, StateFile)
	}
	f.sup = child.New(ccfg, f.log)
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

// line handles one line of the child: a snapshot, or an error.
func (f *Feed) line(b []byte) error {
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	f.mSnapshots.Inc()
	f.mu.Lock()
	f.status.Generation = s.Generation
	f.status.Addresses = len(s.Addresses)
	f.status.FromDisk = false
	f.mu.Unlock()
	f.onSnapshot(s)
	return nil
}

// Run keeps the child running until ctx is done, calling onSnapshot (from
// Run's goroutine) with every valid snapshot.
func (f *Feed) Run(ctx context.Context, onSnapshot func(Snapshot)) {
	f.onSnapshot = onSnapshot
	defer f.mUp.Set(0)
	_ = f.sup.Run(ctx) // no Final: it only ends with ctx
}

// Status returns the feed's state.
func (f *Feed) Status() FeedStatus {
	c := f.sup.Status()
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.status
	s.Running, s.Restarts, s.Snapshots, s.LastSnapshot, s.LastError, s.BadLines = c.Running, c.Restarts, c.Lines, c.LastLine, c.LastError, c.BadLines
	return s
}
