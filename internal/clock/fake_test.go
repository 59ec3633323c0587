package clock

import (
	"context"
	"testing"
	"time"
)

var start = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func fired(t Timer) bool {
	select {
	case <-t.C():
		return true
	default:
		return false
	}
}

func TestFakeTimers(t *testing.T) {
	f := NewFake(start)
	a, b := f.NewTimer(time.Second), f.NewTimer(3*time.Second)
	if got := f.Deadline(); !got.Equal(start.Add(time.Second)) {
		t.Fatalf("deadline %v, want +1s", got)
	}
	f.Advance(999 * time.Millisecond)
	if fired(a) || fired(b) {
		t.Fatal("a timer fired before its deadline")
	}
	f.Advance(time.Millisecond)
	if !fired(a) || fired(b) {
		t.Fatal("at +1s: want a only")
	}
	b.Stop()
	f.Advance(5 * time.Second)
	if fired(b) {
		t.Fatal("a stopped timer fired")
	}
	a.Reset(0)
	if !fired(a) {
		t.Fatal("Reset(0) did not fire at once")
	}
	// A due tick not read is dropped by Reset.
	a.Reset(time.Second)
	f.Advance(time.Second)
	a.Reset(time.Second)
	if fired(a) {
		t.Fatal("a stale tick survived Reset")
	}
	if !f.Deadline().Equal(f.Now().Add(time.Second)) {
		t.Fatalf("deadline %v, want now+1s", f.Deadline())
	}
}

// TestFakeStep: a loop that re-arms its timer every 250 ms is woken once
// per deadline on the way, and Step returns with the clock at the end.
func TestFakeStep(t *testing.T) {
	f := NewFake(start)
	tm := f.NewTimer(250 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := make(chan time.Time, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tm.C():
				seen <- now
				tm.Reset(250 * time.Millisecond)
			}
		}
	}()
	if err := f.Step(ctx, time.Second+100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := f.Now(); !got.Equal(start.Add(1100 * time.Millisecond)) {
		t.Fatalf("now %v after Step", got)
	}
	if len(seen) != 4 {
		t.Fatalf("%d wake-ups in 1.1 s of 250 ms, want 4", len(seen))
	}
	for i := range 4 {
		if at := <-seen; !at.Equal(start.Add(time.Duration(i+1) * 250 * time.Millisecond)) {
			t.Fatalf("wake-up %d at %v", i, at.Sub(start))
		}
	}
	cancel()
	<-done
	// Nobody re-arms: Step gives up with ctx's error instead of hanging.
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	tm.Reset(time.Millisecond)
	if err := f.Step(short, time.Second); err == nil {
		t.Fatal("Step returned nil with nobody handling the timer")
	}
}
