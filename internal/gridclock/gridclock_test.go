package gridclock

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestClock: the timerfd clock ticks on the wall clock's multiples of
// its interval, and Close ends a wait in progress.
func TestClock(t *testing.T) {
	iv := 50 * time.Millisecond
	c, err := New(iv, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var late []time.Duration
	for range 6 {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		late = append(late, now.Sub(now.Truncate(iv)))
	}
	slices.Sort(late)
	// Most ticks land within a few ms after a multiple (a loaded CI host
	// may delay one or two).
	if late[len(late)/2] > 10*time.Millisecond {
		t.Errorf("ticks %v after the grid's multiples, want within 10 ms", late)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	time.Sleep(5 * time.Millisecond)
	// Between two ticks: Close must end the wait at once.
	c.Close()
	select {
	case err := <-done:
		// Either the wait saw the close, or a tick came first; a second
		// wait must fail.
		if err == nil {
			if err := c.Wait(); err == nil {
				t.Error("wait on a closed clock succeeded")
			}
		}
	case <-time.After(time.Second):
		t.Fatal("Close did not end the wait")
	}
	// A clock off the grid (the wall clock was stepped) is re-armed onto
	// it at its next tick.
	iv2 := 200 * time.Millisecond
	c2, err := New(iv2, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Arm(time.Now().Add(-iv2 / 2)); err != nil { // ticks half an interval off
		t.Fatal(err)
	}
	// A tick is never early, only late (scheduling): the least late of a
	// few ticks shows where the clock is armed.
	phase := func() time.Duration {
		least := time.Duration(-1)
		for range 3 {
			if err := c2.Wait(); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if ph := now.Sub(now.Truncate(iv2)); least < 0 || ph < least {
				least = ph
			}
		}
		return least
	}
	if ph := phase(); ph < iv2/4 || ph > iv2-iv2/4 {
		t.Fatalf("clock armed off the grid ticked at phase %v", ph)
	}
	if err := c2.Realign(time.Now()); err != nil {
		t.Fatal(err)
	}
	if ph := phase(); ph > 20*time.Millisecond {
		t.Errorf("re-armed clock ticked at phase %v, want on the grid", ph)
	}
}

// TestDrain: after work that ran past a tick, Drain reads it, and the next
// Wait waits for the tick after instead of returning at once.
func TestDrain(t *testing.T) {
	iv := 50 * time.Millisecond
	c, err := New(iv, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(iv + iv/2) // ran past the next tick
	before := time.Now()
	if err := c.Drain(); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	// The wait ended on a tick after the drain (on a loaded host it may
	// come soon after, but never before it: a tick left undrained would
	// end the wait at once, with no multiple of iv in between).
	if end := time.Now(); !end.Truncate(iv).After(before) {
		t.Fatalf("Wait after Drain returned %v after the drain, before the next tick", end.Sub(before))
	}
	// Nothing due: Drain does not wait.
	start := time.Now()
	if err := c.Drain(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > iv { // a blocking read would wait for the next tick
		t.Fatalf("Drain with no tick due took %v", el)
	}
}

// TestTicker: the wait returns on the grid until the context ends, then
// false at once, also when it was waiting.
func TestTicker(t *testing.T) {
	iv := 40 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var errs []error
	wait, drain, _ := Ticker(ctx, iv, func(err error) { errs = append(errs, err) })
	for range 3 {
		if !wait() {
			t.Fatal("wait ended before the context")
		}
		now := time.Now()
		if ph := now.Sub(now.Truncate(iv)); ph > 15*time.Millisecond {
			t.Logf("tick at phase %v", ph) // a loaded host may be late
		}
	}
	drain()
	done := make(chan bool, 1)
	go func() { done <- wait() }()
	time.Sleep(5 * time.Millisecond)
	cancel()
	select {
	case ok := <-done:
		if ok {
			// A tick may have come first; the next wait must end.
			if wait() {
				t.Fatal("wait after the context ended returned true")
			}
		}
	case <-time.After(time.Second):
		t.Fatal("cancelling the context did not end the wait")
	}
	if len(errs) != 0 {
		t.Fatalf("errors %v", errs)
	}
}

// TestTickerKick: a kick ends the wait in progress at once, a kick while
// nobody waits makes the next wait return at once, and the wait after a
// kick is on the grid again, at the multiple after the next one (the kick
// took the next one's place).
func TestTickerKick(t *testing.T) {
	iv := 2 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errs []error
	wait, _, kick := Ticker(ctx, iv, func(err error) { errs = append(errs, err) })
	start := time.Now()
	time.AfterFunc(30*time.Millisecond, kick)
	if !wait() {
		t.Fatal("wait ended")
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Fatalf("a kick 30 ms in ended the wait after %v", el)
	}
	kick()
	start = time.Now()
	if !wait() {
		t.Fatal("wait ended")
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Fatalf("the wait after a kick while nobody waited took %v", el)
	}
	kickedAt := time.Now()
	if !wait() {
		t.Fatal("wait ended")
	}
	now := time.Now()
	if ph := now.Sub(now.Truncate(iv)); ph > 100*time.Millisecond {
		t.Fatalf("the wait after the kicks returned at phase %v, not on the grid", ph)
	}
	if want := kickedAt.Truncate(iv).Add(2 * iv); now.Before(want) {
		t.Fatalf("the wait after a kick returned at the next multiple (%v), want the one after (%v)", now.Truncate(iv), want)
	}
	if len(errs) != 0 {
		t.Fatalf("errors %v", errs)
	}
}
