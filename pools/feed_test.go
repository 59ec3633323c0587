package pools

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestFeedHelper is the fake feed child: each run (counted in a file)
// does what POOLS_FEED_SCRIPT's line for that run says.
func TestFeedHelper(t *testing.T) {
	script := os.Getenv("POOLS_FEED_SCRIPT")
	if script == "" {
		return // only as the helper process
	}
	runs := filepath.Join(os.Getenv("POOLS_FEED_DIR"), "runs")
	b, _ := os.ReadFile(runs)
	n, _ := strconv.Atoi(string(b))
	_ = os.WriteFile(runs, []byte(strconv.Itoa(n+1)), 0o600)
	switch fmt.Sprint(n) {
	case "0": // a snapshot, then a crash
		fmt.Println(`{"generation":1,"addresses":[{"address":"192.0.2.1","pool":"a","mode":"l2","all":true}]}`)
		os.Exit(3)
	default: // garbage (skipped), a good snapshot, then stays up
		fmt.Println(`{"generation":1,"addresses":[{"address":"not-an-ip"}]}`)
		fmt.Println(`{"generation":7,"addresses":[{"address":"192.0.2.2","pool":"a","mode":"l2","all":true},{"address":"2001:db8::2","pool":"a","mode":"bgp","nodes":["n1"]}]}`)
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

// TestFeedSurvivesCrashesAndGarbage: a crashed child is restarted, a
// garbage line is skipped and counted (the child keeps running), the last good snapshot
// stays in force meanwhile and is saved for the next run of vipd.
func TestFeedSurvivesCrashesAndGarbage(t *testing.T) {
	dir := t.TempDir()
	f, err := NewFeed(FeedConfig{
		Command:  []string{os.Args[0], "-test.run=^TestFeedHelper$"},
		Env:      append(os.Environ(), "POOLS_FEED_SCRIPT=1", "POOLS_FEED_DIR="+dir),
		StateDir: dir, Backoff: 50 * time.Millisecond,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []Snapshot
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx, func(s Snapshot) {
			mu.Lock()
			got = append(got, s)
			mu.Unlock()
		})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d snapshots, want 2; status %+v", n, f.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := f.Status()
	cancel()
	<-done
	if got[0].Generation != 1 || got[1].Generation != 7 || len(got[1].Addresses) != 2 {
		t.Fatalf("snapshots %+v", got)
	}
	if got[1].Addresses[1].Addr.String() != "2001:db8::2" || got[1].Addresses[1].Eligible("n2") || !got[1].Addresses[1].Eligible("n1") {
		t.Fatalf("decoded %+v", got[1].Addresses[1])
	}
	if st.Restarts != 1 || st.BadLines != 1 || !st.Running || st.Generation != 7 || st.Snapshots != 2 || st.LastError == "" {
		t.Fatalf("status %+v: want 1 restart (the crash), 1 bad line, running, generation 7, 2 snapshots, an error", st)
	}
	if f.Status().Running {
		t.Fatal("child still running after ctx was cancelled")
	}
	// The next vipd starts from the saved snapshot.
	g, _ := NewFeed(FeedConfig{StateDir: dir}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	s, ok := g.Load()
	if !ok || s.Generation != 7 || len(s.Addresses) != 2 || !g.Status().FromDisk {
		t.Fatalf("loaded %+v %v", s, ok)
	}
}

// TestFeedStopKillsAStuckChild: a feed child that ignores SIGTERM is
// killed after child.DefaultStopTimeout (1 s), so that the daemon's stop
// (which releases the pool addresses and the VIPs after it) fits the
// unit's TimeoutStopSec.
func TestFeedStopKillsAStuckChild(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "feed")
	body := "#!/bin/sh\ntrap '' TERM\necho '{\"generation\":1,\"addresses\":[]}'\nwhile :; do sleep 0.1; done\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := NewFeed(FeedConfig{Command: []string{script}}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx, func(Snapshot) {
			select {
			case got <- struct{}{}:
			default:
			}
		})
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("no snapshot from the feed child")
	}
	start := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(6 * time.Second):
		t.Fatal("the feed did not stop")
	}
	if took := time.Since(start); took < time.Second || took > 2*time.Second {
		t.Errorf("the stop took %v; want the kill after 1 s", took.Round(time.Millisecond))
	}
	if f.Status().Running {
		t.Error("the child still runs after the stop")
	}
}
