package cloud

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/vipd/vipd/internal/retryafter"
)

// Outcomes of one API call, the outcome label of vipd_cloud_calls_total.
const (
	OutcomeSuccess       = "success"
	OutcomeRateLimited   = "rate_limited"
	OutcomeServerError   = "server_error"
	OutcomeTransport     = "transport_error"
	OutcomeUnauthorized  = "unauthorized"
	OutcomeNotFound      = "not_found"
	OutcomeUnprocessable = "unprocessable" // 422: DigitalOcean's lock, or a refusal
	OutcomeLocked        = "locked"        // 423: Hetzner's "another action is running"
	OutcomeConflict      = "conflict"      // 409: Hetzner's "changed during the request, retry"
	OutcomeClientError   = "client_error"
	OutcomeCanceled      = "canceled"
)

var outcomes = []string{OutcomeSuccess, OutcomeRateLimited, OutcomeServerError, OutcomeTransport,
	OutcomeUnauthorized, OutcomeNotFound, OutcomeUnprocessable, OutcomeLocked, OutcomeConflict,
	OutcomeClientError, OutcomeCanceled}

// Backoff shapes the waits after failures.
type Backoff struct {
	// Base is the wait after the first failure (default 500ms); it doubles
	// per consecutive failure up to Max (default 10s).
	Base, Max time.Duration
	// RateLimitMax caps how long a 429's RateLimit-Reset / Retry-After is
	// honoured (default 5m), a guard against clock skew.
	RateLimitMax time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = 500 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	if b.Max < b.Base {
		b.Max = b.Base
	}
	if b.RateLimitMax <= 0 {
		b.RateLimitMax = 5 * time.Minute
	}
	return b
}

// delay is the wait after the n-th consecutive failure (n >= 1), before
// jitter.
func (b Backoff) delay(n int) time.Duration {
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	return d
}

// verdict is the pure classification of one call's result.
type verdict struct {
	outcome string
	retry   bool
	// wait is what the server asked for (429 RateLimit-Reset, Retry-After);
	// zero means "use the backoff".
	wait time.Duration
}

// classify decides what a call's result means. status is the HTTP status
// (0 when no answer arrived), header the answer's headers (may be nil).
func classify(status int, header http.Header, err error, ctxErr error, now time.Time) verdict {
	switch {
	case err == nil && status >= 200 && status < 300:
		return verdict{outcome: OutcomeSuccess}
	case ctxErr != nil:
		return verdict{outcome: OutcomeCanceled}
	case status == 0:
		return verdict{outcome: OutcomeTransport, retry: true}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return verdict{outcome: OutcomeUnauthorized}
	case status == http.StatusNotFound:
		return verdict{outcome: OutcomeNotFound}
	case status == http.StatusUnprocessableEntity:
		return verdict{outcome: OutcomeUnprocessable}
	case status == http.StatusLocked:
		return verdict{outcome: OutcomeLocked}
	case status == http.StatusConflict:
		return verdict{outcome: OutcomeConflict, retry: true, wait: retryAfter(header, now)}
	case status == http.StatusTooManyRequests:
		return verdict{outcome: OutcomeRateLimited, retry: true, wait: serverWait(header, now)}
	case status >= 500:
		return verdict{outcome: OutcomeServerError, retry: true, wait: retryAfter(header, now)}
	default:
		return verdict{outcome: OutcomeClientError}
	}
}

// serverWait reads how long a 429 asks us to wait: the later of
// Retry-After and RateLimit-Reset (Unix seconds). Zero if neither parses
// or both are in the past.
func serverWait(h http.Header, now time.Time) time.Duration {
	w := retryAfter(h, now)
	if h == nil {
		return w
	}
	if v := h.Get("RateLimit-Reset"); v != "" {
		if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
			if d := time.Unix(sec, 0).Sub(now); d > w {
				w = d
			}
		}
	}
	return w
}

// retryAfter reads Retry-After (delta seconds or an HTTP date); zero when
// absent, unparsable or in the past.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	d, _ := retryafter.Parse(h.Get("Retry-After"), now)
	return d
}

// gate spaces the calls of one API client: after a retryable failure no
// call is sent before notBefore. It is shared by every call of the client,
// so a 429 on one call pauses them all, as the API's quota is per token.
type gate struct {
	backoff Backoff
	now     func() time.Time
	jitter  func(time.Duration) time.Duration

	mu        sync.Mutex
	notBefore time.Time
	failures  int
	last      error // the failure that set notBefore
}

func newGate(b Backoff, now func() time.Time) *gate {
	return &gate{backoff: b.withDefaults(), now: now, jitter: addJitter}
}

// addJitter spreads d by up to +20% so nodes sharing a token do not retry
// in lockstep; it never shortens a wait the server asked for.
func addJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}

// failed records a retryable failure (err, classified as v) and returns
// the wait until the next call may go out.
func (g *gate) failed(v verdict, err error) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failures++
	d := g.backoff.delay(g.failures)
	if v.wait > 0 {
		d = v.wait
		if d > g.backoff.RateLimitMax {
			d = g.backoff.RateLimitMax
		}
	}
	d = g.jitter(d)
	if t := g.now().Add(d); t.After(g.notBefore) {
		g.notBefore = t
		g.last = err
	}
	return d
}

// hold keeps the gate closed for d from now (no failure counted).
func (g *gate) hold(d time.Duration) {
	if d <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := g.now().Add(d); t.After(g.notBefore) {
		g.notBefore = t
		g.last = fmt.Errorf("%w: the API's rate-limit bucket is empty", ErrRateLimited)
	}
}

// succeeded resets the failure count.
func (g *gate) succeeded() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failures = 0
}

// wait returns how long to wait before the next call (<= 0: go now) and
// the failure that closed the gate.
func (g *gate) wait() (time.Duration, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.notBefore.Sub(g.now()), g.last
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitGate blocks until the gate opens. When ctx's deadline comes first it
// returns at once, without waiting, an error wrapping the failure that
// closed the gate so the caller can report why.
// minCallTime is the least time an API call is given after waitGate's wait:
// with less left before the attempt's deadline, the attempt ends at once with
// the gate's reason (rate limited, unavailable) instead.
const minCallTime = 100 * time.Millisecond

func (g *gate) waitGate(ctx context.Context) error {
	d, last := g.wait()
	if d <= 0 {
		return nil
	}
	// A call needs time after the wait too: one sent with a few
	// milliseconds left would only end in this attempt's deadline (and
	// spend a request of the provider's budget for nothing).
	if dl, ok := ctx.Deadline(); ok && dl.Before(g.now().Add(d+minCallTime)) {
		if last == nil {
			last = ErrUnavailable
		}
		return fmt.Errorf("next API call allowed in %v, after this attempt's deadline: %w", d.Round(time.Millisecond), last)
	}
	return sleep(ctx, d)
}

// isCtxErr reports whether err comes from ctx ending.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
