package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records the first Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runEventually(timeout time.Duration, cond func() error) (string, time.Duration) {
	tb := &fatalTB{}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(context.Background(), tb, timeout, "the thing", cond)
	}()
	<-done
	return tb.msg, time.Since(start)
}

func TestEventually(t *testing.T) {
	n := 0
	msg, _ := runEventually(5*time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if msg != "" || n != 3 {
		t.Errorf("a condition true at the third poll: failed %q after %d polls", msg, n)
	}

	msg, took := runEventually(300*time.Millisecond, func() error { return errors.New("never") })
	if !strings.Contains(msg, "the thing: still failing after 300ms: never") || took < 300*time.Millisecond {
		t.Errorf("a condition never true: %q after %v", msg, took)
	}

	msg, took = runEventually(5*time.Second, func() error { return Stop(errors.New("vipd exited")) })
	if msg != "the thing: vipd exited" || took > time.Second {
		t.Errorf("a stopped condition: %q after %v, want at once", msg, took)
	}
}

func TestRelay(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("echo " + line))
			}()
		}
	}()
	addr := Relay(t, net.Listen, "127.0.0.1:0", target.Addr().String())
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || got != "echo hello\n" {
			t.Fatalf("through the relay: %q, %v", got, err)
		}
		_ = c.Close()
	}
}
