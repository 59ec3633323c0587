package gridclock

import (
	"testing"
	"time"
)

func TestPreciseTimer(t *testing.T) {
	tm := Precise{}.NewTimer(20 * time.Millisecond)
	defer tm.Stop()
	if _, ok := tm.(*fdTimer); !ok {
		t.Fatalf("NewTimer gave %T, want a timerfd timer", tm)
	}
	start := time.Now()
	select {
	case at := <-tm.C():
		if el := at.Sub(start); el < 19*time.Millisecond {
			t.Errorf("fired after %v, want 20ms", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("did not fire")
	}

	// Reset to later: the earlier deadline does not fire.
	tm.Reset(10 * time.Millisecond)
	tm.Reset(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("fired at the replaced deadline")
	case <-time.After(100 * time.Millisecond):
	}
	// Reset(0) fires at once, and drops the pending hour.
	tm.Reset(0)
	select {
	case <-tm.C():
	case <-time.After(time.Second):
		t.Fatal("Reset(0) did not fire")
	}
	select {
	case <-tm.C():
		t.Fatal("fired twice")
	case <-time.After(400 * time.Millisecond):
	}

	// A due tick not read is dropped by Reset.
	tm.Reset(time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	tm.Reset(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("a due tick survived Reset")
	case <-time.After(50 * time.Millisecond):
	}

	// Stop: nothing fires, a later Reset does nothing.
	tm.Reset(10 * time.Millisecond)
	tm.Stop()
	tm.Reset(time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("fired after Stop")
	case <-time.After(100 * time.Millisecond):
	}
}
