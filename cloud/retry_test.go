package cloud

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func TestClassify(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	someErr := errors.New("boom")
	tests := []struct {
		name    string
		status  int
		header  http.Header
		err     error
		ctxErr  error
		outcome string
		retry   bool
		wait    time.Duration
	}{
		{"ok", 200, nil, nil, nil, OutcomeSuccess, false, 0},
		{"created", 201, nil, nil, nil, OutcomeSuccess, false, 0},
		{"connection refused", 0, nil, someErr, nil, OutcomeTransport, true, 0},
		{"ctx ended wins", 0, nil, someErr, context.DeadlineExceeded, OutcomeCanceled, false, 0},
		{"401", 401, nil, someErr, nil, OutcomeUnauthorized, false, 0},
		{"403", 403, nil, someErr, nil, OutcomeUnauthorized, false, 0},
		{"404", 404, nil, someErr, nil, OutcomeNotFound, false, 0},
		{"422", 422, nil, someErr, nil, OutcomeUnprocessable, false, 0},
		{"423 locked (Hetzner)", 423, nil, someErr, nil, OutcomeLocked, false, 0},
		{"409 conflict (Hetzner) is retried", 409, nil, someErr, nil, OutcomeConflict, true, 0},
		{"409 with Retry-After", 409, h("Retry-After", "3"), someErr, nil, OutcomeConflict, true, 3 * time.Second},
		{"400", 400, nil, someErr, nil, OutcomeClientError, false, 0},
		{"429 reset", 429, h("RateLimit-Reset", strconv.FormatInt(now.Unix()+7, 10)), someErr, nil, OutcomeRateLimited, true, 7 * time.Second},
		{"429 retry-after longer than reset", 429, h("RateLimit-Reset", strconv.FormatInt(now.Unix()+2, 10), "Retry-After", "9"), someErr, nil, OutcomeRateLimited, true, 9 * time.Second},
		{"429 reset in the past", 429, h("RateLimit-Reset", strconv.FormatInt(now.Unix()-100, 10)), someErr, nil, OutcomeRateLimited, true, 0},
		{"429 no headers", 429, nil, someErr, nil, OutcomeRateLimited, true, 0},
		{"429 garbage reset", 429, h("RateLimit-Reset", "soon"), someErr, nil, OutcomeRateLimited, true, 0},
		{"503 retry-after date", 503, h("Retry-After", now.Add(4*time.Second).UTC().Format(http.TimeFormat)), someErr, nil, OutcomeServerError, true, 4 * time.Second},
		{"500", 500, nil, someErr, nil, OutcomeServerError, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := classify(tc.status, tc.header, tc.err, tc.ctxErr, now)
			if v.outcome != tc.outcome || v.retry != tc.retry || v.wait != tc.wait {
				t.Fatalf("classify = %+v, want outcome %s retry %v wait %v", v, tc.outcome, tc.retry, tc.wait)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}.withDefaults()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.delay(i + 1); got != w*time.Millisecond {
			t.Errorf("delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	d := Backoff{}.withDefaults()
	if d.Base != 500*time.Millisecond || d.Max != 10*time.Second || d.RateLimitMax != 5*time.Minute {
		t.Errorf("defaults = %+v", d)
	}
}

func TestGate(t *testing.T) {
	// The fake clock starts at the real time: waitGate compares it with a
	// real context deadline.
	clk := &fakeClock{t: time.Now()}
	g := newGate(Backoff{Base: time.Second, Max: 4 * time.Second, RateLimitMax: time.Minute}, clk.Now)
	g.jitter = func(d time.Duration) time.Duration { return d } // deterministic

	if d, _ := g.wait(); d > 0 {
		t.Fatalf("fresh gate waits %v", d)
	}
	cause := errors.New("HTTP 503")
	steps := []struct {
		v    verdict
		want time.Duration
	}{
		{verdict{outcome: OutcomeServerError, retry: true}, time.Second},
		{verdict{outcome: OutcomeServerError, retry: true}, 2 * time.Second},
		{verdict{outcome: OutcomeRateLimited, retry: true, wait: 30 * time.Second}, 30 * time.Second},
		{verdict{outcome: OutcomeRateLimited, retry: true, wait: time.Hour}, time.Minute}, // capped
		{verdict{outcome: OutcomeTransport, retry: true}, 4 * time.Second},                // backoff max
	}
	for i, s := range steps {
		if got := g.failed(s.v, cause); got != s.want {
			t.Fatalf("step %d: failed() = %v, want %v", i, got, s.want)
		}
	}
	// The gate keeps the latest deadline: the 1-minute 429, not the 4s backoff.
	if d, last := g.wait(); d != time.Minute || !errors.Is(last, cause) {
		t.Fatalf("wait = %v, %v; want 1m and the cause", d, last)
	}

	// A caller whose deadline comes first is turned away at once.
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Second))
	defer cancel()
	start := time.Now()
	err := g.waitGate(ctx)
	if err == nil || !errors.Is(err, cause) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("waitGate = %v after %v, want an immediate error wrapping the cause", err, time.Since(start))
	}
	clk.Advance(time.Minute)
	if err := g.waitGate(ctx); err != nil {
		t.Fatalf("after the wait: %v", err)
	}
	g.succeeded()
	if got := g.failed(verdict{outcome: OutcomeServerError, retry: true}, cause); got != time.Second {
		t.Fatalf("after success the backoff restarts: got %v", got)
	}
}

func TestJitterNeverShortens(t *testing.T) {
	for i := 0; i < 200; i++ {
		d := addJitter(time.Second)
		if d < time.Second || d > 1200*time.Millisecond {
			t.Fatalf("jitter(1s) = %v", d)
		}
	}
	if addJitter(0) != 0 {
		t.Fatal("jitter(0) != 0")
	}
}

// TestGateLeavesTimeForTheCall: a wait that ends just before the attempt's
// deadline would send a call with no time left (it ended in "context
// deadline exceeded", not the gate's reason, on a loaded CI machine): the
// attempt is turned away at once unless minCallTime remains after the wait.
func TestGateLeavesTimeForTheCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		after  time.Duration // the deadline, after the end of the wait
		turned bool
	}{
		{"deadline 10ms after the wait", 10 * time.Millisecond, true},
		{"deadline just short of minCallTime after the wait", minCallTime - 5*time.Millisecond, true},
		{"deadline well after the wait", minCallTime + 200*time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(Backoff{Base: 50 * time.Millisecond, Max: time.Second, RateLimitMax: time.Minute}, time.Now)
			g.jitter = func(d time.Duration) time.Duration { return d }
			cause := errors.New("HTTP 429")
			wait := g.failed(verdict{outcome: OutcomeRateLimited, retry: true, wait: 200 * time.Millisecond}, cause)
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(wait+tc.after))
			defer cancel()
			start := time.Now()
			err := g.waitGate(ctx)
			took := time.Since(start)
			if tc.turned {
				if err == nil || !errors.Is(err, cause) || took > wait/2 {
					t.Fatalf("waitGate = %v after %v, want an immediate error wrapping the cause", err, took)
				}
				return
			}
			if err != nil || took < wait-10*time.Millisecond {
				t.Fatalf("waitGate = %v after %v, want nil after the %v wait", err, took, wait)
			}
		})
	}
}
