package vip

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAnnouncer records calls; Acquire fails while failAcquire is set.
type fakeAnnouncer struct {
	mu          sync.Mutex
	bound       map[netip.Prefix]bool
	failAcquire bool
	calls       []string
}

func (f *fakeAnnouncer) record(s string) { f.calls = append(f.calls, s) }

func (f *fakeAnnouncer) Acquire(_ context.Context, v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("acquire")
	if f.failAcquire {
		return errors.New("conflict")
	}
	f.bound[v] = true
	return nil
}

func (f *fakeAnnouncer) Release(_ context.Context, v netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("release")
	delete(f.bound, v)
	return nil
}

func (f *fakeAnnouncer) Announce(context.Context, netip.Prefix) error { return nil }

func (f *fakeAnnouncer) Present(_ context.Context, v netip.Prefix) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bound[v], nil
}

func (f *fakeAnnouncer) Close() error { return nil }

func TestDriverNeverPublishesAFailedAcquire(t *testing.T) {
	ann := &fakeAnnouncer{bound: map[netip.Prefix]bool{}, failAcquire: true}
	var mu sync.Mutex
	var trans []Transition
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil,
		DriverOptions{Mode: "l2", OnTransition: func(tr Transition) { mu.Lock(); trans = append(trans, tr); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	d.Send(HealthChanged{Healthy: true})
	time.Sleep(800 * time.Millisecond) // first attempt and one retry
	mu.Lock()
	for _, tr := range trans {
		if tr.Held {
			t.Errorf("published a hold that failed: %+v", tr)
		}
	}
	mu.Unlock()
	ann.mu.Lock()
	ann.failAcquire = false
	ann.mu.Unlock()
	time.Sleep(2500 * time.Millisecond) // next retry succeeds
	if st := d.State(); len(st) != 1 || !st[0].Held {
		t.Fatalf("state after the conflict cleared: %+v", st)
	}
	cancel()
	<-done
	if ok, _ := ann.Present(context.Background(), v4); ok {
		t.Fatal("VIP left bound after shutdown")
	}
	mu.Lock()
	last := trans[len(trans)-1]
	mu.Unlock()
	if last.Held {
		t.Fatalf("last transition %+v, want a release", last)
	}
}

// countingAnnouncer counts announcements.
type countingAnnouncer struct {
	fakeAnnouncer
	announced int
}

func (c *countingAnnouncer) Announce(context.Context, netip.Prefix) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.announced++
	return nil
}

func TestDriverNeverAnnouncesAVIPItCouldNotBind(t *testing.T) {
	ann := &countingAnnouncer{fakeAnnouncer: fakeAnnouncer{bound: map[netip.Prefix]bool{}, failAcquire: true}}
	d, err := NewDriver(New([]netip.Prefix{v4}, Options{Announce: true}), ann, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, DriverOptions{Mode: "l2"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx, time.Second); close(done) }()
	d.Send(HealthChanged{Healthy: true})
	time.Sleep(1200 * time.Millisecond) // the first acquire and two retries fail
	cancel()
	<-done
	ann.mu.Lock()
	defer ann.mu.Unlock()
	if ann.announced != 0 {
		t.Fatalf("%d announcements for a VIP that was never bound (they would steal the other host's ARP entries)", ann.announced)
	}
	if n := strings.Count(strings.Join(ann.calls, ","), "acquire"); n < 2 {
		t.Fatalf("acquire tried %d times, want retries", n)
	}
}
