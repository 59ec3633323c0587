package lifecycle

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// journal records what the parts did, in order.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lines = append(j.lines, s)
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// worker is a part that runs a goroutine of its own until its ctx is done
// and records when it returned and when its Stop ran.
func worker(name string, j *journal, started *sync.WaitGroup) Part {
	started.Add(1)
	return Part{
		Name: name,
		Run: func(ctx context.Context) error {
			inner := make(chan struct{})
			go func() { defer close(inner); <-ctx.Done() }() // a goroutine the part owns
			started.Done()
			<-inner
			j.add("returned " + name)
			return ctx.Err()
		},
		Stop: func(context.Context) error { j.add("stopped " + name); return nil },
	}
}

func TestStopsInReverseOrder(t *testing.T) {
	var j journal
	var started sync.WaitGroup
	p := New(nil)
	p.Add(Part{Name: "announcer", Stop: func(context.Context) error { j.add("stopped announcer"); return nil }})
	for _, n := range []string{"egress", "election", "driver", "pools"} {
		p.Add(worker(n, &j, &started))
	}
	p.Add(Part{Name: "trim", Run: func(context.Context) error { j.add("returned trim"); return nil }}) // finishes early
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, 5*time.Second) }()
	started.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after a stop asked for: %v", err)
	}
	got := slices.DeleteFunc(j.get(), func(s string) bool { return s == "returned trim" })
	want := []string{"returned pools", "stopped pools", "returned driver", "stopped driver", "returned election", "stopped election",
		"returned egress", "stopped egress", "stopped announcer"}
	if !slices.Equal(got, want) {
		t.Fatalf("stop order\n got %q\nwant %q", got, want)
	}
	if !slices.Contains(j.get(), "returned trim") {
		t.Fatal("the part that finishes early never ran")
	}
	if names := p.Names(); !slices.Equal(names, []string{"announcer", "egress", "election", "driver", "pools", "trim"}) {
		t.Fatalf("Names %q", names)
	}
}

// TestFatalErrorStopsEveryPart: one part failing stops the others (in
// reverse order), and Run returns its error under its name.
func TestFatalErrorStopsEveryPart(t *testing.T) {
	var j journal
	var started sync.WaitGroup
	p := New(nil)
	p.Add(worker("election", &j, &started))
	fail := make(chan struct{})
	p.Add(Part{Name: "controllers", Run: func(ctx context.Context) error {
		select {
		case <-fail:
			return errors.New("configuration rejected")
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	p.Add(worker("driver", &j, &started))
	var stopping []error
	p.Stopping = func(err error) { stopping = append(stopping, err) }
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), 5*time.Second) }()
	started.Wait()
	close(fail)
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5 s after a fatal error")
	}
	if err == nil || err.Error() != "controllers: configuration rejected" {
		t.Fatalf("Run = %v, want the controllers' error", err)
	}
	if len(stopping) != 1 || stopping[0] != err {
		t.Fatalf("Stopping called with %v, want once with %v", stopping, err)
	}
	if got, want := j.get(), []string{"returned driver", "stopped driver", "returned election", "stopped election"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestStopDeadline: a part that ignores its context is named once the
// deadline passed; the parts before it still stop, and its Stop still runs.
func TestStopDeadline(t *testing.T) {
	var j journal
	var started sync.WaitGroup
	release := make(chan struct{})
	stuckDone := make(chan struct{})
	p := New(nil)
	p.Add(worker("election", &j, &started))
	p.Add(Part{Name: "stuck", Run: func(context.Context) error {
		defer close(stuckDone)
		<-release // ignores its ctx
		return nil
	}, Stop: func(context.Context) error { j.add("stopped stuck"); return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, 200*time.Millisecond) }()
	started.Wait()
	start := time.Now()
	cancel()
	err := <-done
	took := time.Since(start)
	close(release) // let the stuck part go, for the leak check
	<-stuckDone
	var se *StopError
	if !errors.As(err, &se) || !slices.Equal(se.Parts, []string{"stuck"}) || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("Run = %v, want a StopError naming stuck", err)
	}
	if took > 2*time.Second {
		t.Fatalf("Run took %v to give up on a stuck part, deadline 200ms", took)
	}
	if got, want := j.get(), []string{"stopped stuck", "returned election", "stopped election"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestPartsKeepTheirContextUntilTheirTurn: cancelling ctx does not cancel
// a part's context before the parts after it have stopped (the election
// keeps running while the driver releases the VIPs).
func TestPartsKeepTheirContextUntilTheirTurn(t *testing.T) {
	var electionCtx context.Context
	ready := make(chan struct{})
	sawElectionLive := false
	p := New(nil)
	p.Add(Part{Name: "election", Run: func(ctx context.Context) error {
		electionCtx = ctx
		close(ready)
		<-ctx.Done()
		return nil
	}})
	p.Add(Part{Name: "driver", Run: func(ctx context.Context) error {
		<-ctx.Done()
		<-ready
		sawElectionLive = electionCtx.Err() == nil // releasing the VIPs
		return nil
	}})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, 5*time.Second) }()
	<-ready
	if electionCtx.Value(ctxKey{}) != "v" {
		t.Fatal("a part's context lost the parent's values")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !sawElectionLive {
		t.Fatal("the election's context was cancelled before the driver had stopped")
	}
}

type ctxKey struct{}

// TestStartFailureStopsThePartsStarted: a part whose Start fails ends the
// start; the parts started before it stop in reverse, the parts after it
// never start, and its own Stop is not called.
func TestStartFailureStopsThePartsStarted(t *testing.T) {
	var j journal
	var started sync.WaitGroup
	p := New(nil)
	p.Add(Part{Name: "announcer", Stop: func(context.Context) error { j.add("stopped announcer"); return nil }})
	p.Add(worker("election", &j, &started))
	p.Add(Part{Name: "status server", Start: func() error { return errors.New("address in use") },
		Stop: func(context.Context) error { j.add("stopped status server"); return nil }})
	p.Add(Part{Name: "driver", Start: func() error { j.add("started driver"); return nil }})
	err := p.Run(context.Background(), 5*time.Second)
	if err == nil || err.Error() != "status server: address in use" {
		t.Fatalf("Run = %v, want the status server's error", err)
	}
	if got, want := j.get(), []string{"returned election", "stopped election", "stopped announcer"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
