package main

import (
	"strings"
	"testing"

	"github.com/vipd/vipd/pools"
)

// TestPrintPoolsFeed: `vipd status` names the feed's skipped lines only
// when there are some.
func TestPrintPoolsFeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		feed pools.FeedStatus
		want string
	}{
		{"clean", pools.FeedStatus{Running: true, Snapshots: 3}, "feed running, 3 snapshots, 0 restarts\n"},
		{"bad lines", pools.FeedStatus{Running: true, Snapshots: 3, Restarts: 1, BadLines: 2, LastError: "exit status 3"},
			"feed running, 3 snapshots, 1 restarts, 2 unreadable lines skipped, last error: exit status 3\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := printPools(&b, PoolsStatus{Feed: tc.feed}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), tc.want) {
				t.Fatalf("printed %q, want a line with %q", b.String(), tc.want)
			}
		})
	}
}
