// Package retryafter parses the Retry-After header (RFC 9110 §10.2.3), the
// one copy shared by the cloud providers and the DNS providers.
package retryafter

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Parse reads a Retry-After value, delay seconds or an HTTP date, as the
// wait from now. ok is false when v is empty or neither form; a date in
// the past or a zero delay is (0, true).
func Parse(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		// Clamp before multiplying: a huge value must not overflow.
		return time.Duration(min(n, int64(365*24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
