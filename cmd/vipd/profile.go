package main

import (
	"time"

	"github.com/vipd/vipd/config"
)

// probeWait is how long the l2 conflict probe waits for an answer: half
// as long in the fast profile (an answer on a LAN takes well under a
// millisecond; the wait is part of every failover).
func probeWait(profile string) time.Duration {
	if profile == config.ProfileFast {
		return probeTimeout / 2
	}
	return probeTimeout
}
