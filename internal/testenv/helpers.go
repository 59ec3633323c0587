package testenv

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// FreeAddr is a loopback host:port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stopError ends Eventually at once.
type stopError struct{ err error }

func (e stopError) Error() string { return e.err.Error() }
func (e stopError) Unwrap() error { return e.err }

// Stop wraps err so that Eventually fails the test at once instead of
// polling on (the thing polled for can no longer happen: its process
// exited).
func Stop(err error) error { return stopError{err} }

// Eventually polls cond every 100 ms until it returns nil; it fails the
// test when timeout passes, ctx ends, or cond returns an error made by
// Stop.
func Eventually(ctx context.Context, t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		var stop stopError
		if errors.As(err, &stop) {
			t.Fatalf("%s: %v", what, stop.err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: still failing after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Relay listens on addr with listen (net.Listen, or a network namespace's
// Listen) and relays each connection to target until the test ends;
// cleanup closes the listener and every relayed connection and waits for
// the relay's goroutines. It returns the address it listens on.
func Relay(t testing.TB, listen func(network, addr string) (net.Listener, error), addr, target string) string {
	t.Helper()
	ln, err := listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			if closed { // accepted while the test ended
				mu.Unlock()
				_, _ = in.Close(), out.Close()
				return
			}
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return ln.Addr().String()
}
