package vip

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"
)

// TestDriverSendAfterRunReturned: once Run has returned, Send returns at
// once instead of blocking its caller (the health checker, the election)
// forever on a queue nobody reads; the VIP was released by Run.
func TestDriverSendAfterRunReturned(t *testing.T) {
	ann := &fakeAnnouncer{bound: map[netip.Prefix]bool{}}
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, DriverOptions{Mode: "l2"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	d.Send(HealthChanged{Healthy: true})
	deadline := time.Now().Add(5 * time.Second)
	for !ann.has(v4) {
		if time.Now().After(deadline) {
			t.Fatal("VIP never acquired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if ann.has(v4) {
		t.Fatal("VIP still bound after Run returned")
	}
	// More events than the queue holds: each Send must return.
	sent := make(chan struct{})
	go func() {
		for i := 0; i < 2*cap(d.events)+10; i++ {
			d.Send(HealthChanged{Healthy: i%2 == 0})
		}
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("Send blocks after Run returned")
	}
}

func (f *fakeAnnouncer) has(v netip.Prefix) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bound[v]
}
