package retryafter

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"7", 7 * time.Second, true},
		{" 2 ", 2 * time.Second, true},
		{"0", 0, true},
		{"-3", 0, false},
		{"soon", 0, false},
		{"99999999999999999", 365 * 24 * time.Hour, true},
		{"Thu, 26 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Thu, 26 Nov 2026 11:00:00 GMT", 0, true},
	} {
		got, ok := Parse(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}
