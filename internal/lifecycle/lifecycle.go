// Package lifecycle starts and stops the long-running parts of the daemon
// from one owner: in the order they were added, and in reverse, with one
// deadline for the whole stop. Nothing a part starts outlives it: a part's
// Run returns only once every goroutine it started has returned, and
// Parts.Run returns only once every part has.
//
// The order is the daemon's contract: what must stop last (leave the
// cluster after the VIPs are released; remove the egress rules after
// leaving) is added first.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Part is one long-running part.
type Part struct {
	// Name names the part in logs and errors.
	Name string
	// Start, if set, runs before Run, on the caller's goroutine and in
	// order: open what the part needs (a listener). If it fails, the
	// parts started before it are stopped in reverse and Parts.Run
	// returns its error; this part's Stop is not called.
	Start func() error
	// Run runs until ctx is done and returns once everything it started
	// has stopped. nil: the part only has a Stop. A Run that returns nil
	// before its ctx is done has finished its work; an error other than
	// ctx's is fatal: every part stops.
	Run func(ctx context.Context) error
	// Stop, if set, runs once Run has returned (or the stop deadline
	// passed), with the stop deadline's context: release what the part
	// holds (close a listener, leave the cluster).
	Stop func(ctx context.Context) error
}

// Parts is an ordered set of parts with one owner. The zero value is
// ready; Add every part before Run.
type Parts struct {
	list []Part
	log  *slog.Logger
	// Stopping, if set, is called once when the stop begins, with the
	// fatal error that caused it (nil: ctx was done).
	Stopping func(fatal error)
}

// New returns an empty set that logs to log.
func New(log *slog.Logger) *Parts { return &Parts{log: log} }

// Add appends a part: it starts after, and stops before, every part
// added earlier.
func (p *Parts) Add(part Part) { p.list = append(p.list, part) }

// Names lists the parts in start order.
func (p *Parts) Names() []string {
	out := make([]string, len(p.list))
	for i, part := range p.list {
		out[i] = part.Name
	}
	return out
}

// StopError names the parts that had not stopped when the stop deadline
// passed.
type StopError struct {
	Parts   []string
	Timeout time.Duration
}

func (e *StopError) Error() string {
	return fmt.Sprintf("not stopped within %v: %s", e.Timeout, strings.Join(e.Parts, ", "))
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
}

// Run starts every part in order, each Run on a goroutine with a context
// of its own (not cancelled by ctx: only by the owner, in order; it keeps
// ctx's values), and waits until ctx is done or a part fails. Then it stops
// the parts in reverse order: it cancels a part's context, waits until its
// Run has returned, calls its Stop, and goes on to the part before it. The
// whole stop is bounded by stopTimeout: a part whose Run has not returned
// by then is named in a StopError and left behind, and each part before
// it still gets a tenth of stopTimeout to stop.
//
// Run returns the first fatal error of a part (wrapped with its name),
// joined with the StopError if any; nil after a stop asked for by ctx.
func (p *Parts) Run(ctx context.Context, stopTimeout time.Duration) error {
	log := p.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	failed := make(chan error, len(p.list))
	var rs []*running // the parts started
	var fatal error
	for _, part := range p.list {
		if part.Start != nil {
			if err := part.Start(); err != nil {
				fatal = fmt.Errorf("%s: %w", part.Name, err)
				break
			}
		}
		r := &running{done: make(chan struct{})}
		rs = append(rs, r)
		if part.Run == nil {
			close(r.done)
			continue
		}
		pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r.cancel = cancel
		go func() {
			defer close(r.done)
			if err := part.Run(pctx); err != nil && pctx.Err() == nil {
				failed <- fmt.Errorf("%s: %w", part.Name, err)
			}
		}()
	}
	if fatal == nil {
		select {
		case <-ctx.Done():
		case fatal = <-failed:
		}
	}
	if p.Stopping != nil {
		p.Stopping(fatal)
	}

	deadline := time.Now().Add(stopTimeout)
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var late []string
	for i := len(rs) - 1; i >= 0; i-- {
		part, r := p.list[i], rs[i]
		if r.cancel != nil {
			r.cancel()
		}
		// After the deadline each part still gets a tenth of it: one stuck
		// part does not leave the parts before it running.
		wait := max(time.Until(deadline), stopTimeout/10)
		timer := time.NewTimer(wait)
		select {
		case <-r.done:
		case <-timer.C:
			late = append(late, part.Name)
			log.Error("a part did not stop in time", "part", part.Name, "timeout", stopTimeout)
		}
		timer.Stop()
		if part.Stop != nil {
			if err := part.Stop(sctx); err != nil {
				log.Warn("stopping a part", "part", part.Name, "err", err)
			}
		}
	}
	err := fatal
	if len(late) > 0 {
		err = errors.Join(err, &StopError{Parts: late, Timeout: stopTimeout})
	}
	return err
}
