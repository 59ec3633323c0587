package rawconn

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NonBlocking retries an interrupted call, hands EAGAIN back to the poller
// and reports any other outcome as done.
func TestNonBlocking(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errs  []syscall.Errno // what the call returns, in turn
		done  bool
		err   error
		calls int
	}{
		{"success", []syscall.Errno{0}, true, nil, 1},
		{"interrupted, then success", []syscall.Errno{unix.EINTR, unix.EINTR, 0}, true, nil, 3},
		{"would block: wait in the poller", []syscall.Errno{unix.EAGAIN}, false, nil, 1},
		{"interrupted, then would block", []syscall.Errno{unix.EINTR, unix.EAGAIN}, false, nil, 2},
		{"an error", []syscall.Errno{unix.ECONNREFUSED}, true, unix.ECONNREFUSED, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			var err error
			if tc.done {
				err = errors.New("stale") // a done call sets it
			}
			done := NonBlocking(func() syscall.Errno {
				e := tc.errs[calls]
				calls++
				return e
			}, &err)
			if done != tc.done || calls != tc.calls || err != tc.err {
				t.Fatalf("done=%v calls=%d err=%v, want %v %d %v", done, calls, err, tc.done, tc.calls, tc.err)
			}
		})
	}
}

// An HTTPS client over wrapped connections: bodies far larger than the
// socket buffers both ways (reads and writes that would block), one
// connection kept for every request.
func TestConnCarriesHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(in)
		w.Header().Set("X-Sum", hex.EncodeToString(sum[:]))
		_, _ = w.Write(bytes.Repeat([]byte("livez "), 1<<20)) // 6 MiB
	}))
	defer srv.Close()
	var dials atomic.Int32
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		return Wrap(c)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	body := bytes.Repeat([]byte{0x5a, 0xa5, 0}, 3<<20) // 9 MiB
	want := sha256.Sum256(body)
	for i := range 3 {
		resp, err := client.Post(srv.URL, "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: body: %v", i, err)
		}
		if resp.Header.Get("X-Sum") != hex.EncodeToString(want[:]) {
			t.Fatalf("request %d: the server read a different body", i)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte("livez "), 1<<20)) {
			t.Fatalf("request %d: %d bytes, not the response sent", i, len(got))
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 3 requests, want 1 (kept alive)", n)
	}
}

// pair returns a wrapped client connection and the server's end.
func pair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-acc
	if srv == nil {
		t.Fatal("accept failed")
	}
	w, err := Wrap(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); srv.Close() })
	return w, srv
}

// The edges a caller relies on: a deadline ends a waiting read with a
// timeout, Close ends it with net.ErrClosed, the peer's close is io.EOF,
// a write to a reset connection fails, and a connection without a socket
// of its own is refused.
func TestConnEdges(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		c, _ := pair(t)
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		start := time.Now()
		_, err := c.Read(make([]byte, 10))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read past the deadline: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the deadline ended the read after %v", d)
		}
	})
	t.Run("close", func(t *testing.T) {
		c, _ := pair(t)
		done := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 10))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		c.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read after close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end a waiting read")
		}
	})
	t.Run("peer closes", func(t *testing.T) {
		c, srv := pair(t)
		_, _ = srv.Write([]byte("ok"))
		srv.Close()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "ok" {
			t.Fatalf("read %q, %v; want \"ok\" then EOF", got, err)
		}
	})
	t.Run("peer resets", func(t *testing.T) {
		c, srv := pair(t)
		_ = srv.(*net.TCPConn).SetLinger(0)
		srv.Close()
		var err error
		for i := 0; i < 100 && err == nil; i++ {
			_, err = c.Write(make([]byte, 64<<10))
			time.Sleep(time.Millisecond)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" || !(errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)) {
			t.Fatalf("write to a reset connection: %v", err)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if _, err := Wrap(a); err == nil {
			t.Fatal("wrapped an in-memory pipe")
		}
	})
}
