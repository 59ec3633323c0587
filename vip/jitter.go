package vip

import (
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// NodeJitter is the Options.Jitter of the node named name: a stable
// function of its name below 500 ms, so that two lone holders that both
// gave a VIP up do not try again in step.
func NodeJitter(name string) time.Duration {
	h := sha256.Sum256([]byte(name))
	return time.Duration(binary.BigEndian.Uint16(h[:2])%500) * time.Millisecond
}
