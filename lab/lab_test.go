package lab

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
)

func TestLabConnectivityAndCleanup(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "ping")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Create(Options{Nodes: 2, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	api, err := l.Nodes[0].StartAPIServer("0.0.0.0:6443", OK)
	if err != nil {
		t.Fatal(err)
	}
	// The client reaches node 1's fake apiserver over the bridge and is told who answered.
	name, err := l.Client.Probe(ctx, l.Nodes[0].IPv4.String()+":6443", time.Second)
	if err != nil || name != "n1" {
		t.Fatalf("probe: %q %v", name, err)
	}
	if _, err := l.Client.Output(ctx, "ping", "-6", "-c1", "-W2", l.Nodes[1].IPv6.String()); err != nil {
		t.Fatalf("ipv6 ping: %v", err)
	}
	if err := api.SetMode(Failing); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.Probe(ctx, l.Nodes[0].IPv4.String()+":6443", time.Second); err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("failing apiserver answered: %v", err)
	}
	if err := api.SetMode(Down); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.Probe(ctx, l.Nodes[0].IPv4.String()+":6443", time.Second); err == nil {
		t.Fatal("down apiserver answered")
	}
	p, err := l.Nodes[1].Start("sleeper", nil, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("process survived lab close")
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), l.ID) {
		t.Fatalf("namespaces left behind:\n%s", out)
	}
}

// A capture that never listens (here a filter tcpdump rejects; on a
// machine without tcpdump, its missing binary) is an error, not an empty
// capture: the idle bench counted 0 neighbour frames a second on a
// machine without tcpdump, and reported that as a measurement.
func TestCaptureThatNeverListensFails(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "tcpdump", "ping")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Create(Options{Nodes: 1, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if c, err := l.Client.StartCapture(ctx, "no-such-primitive and"); err == nil {
		c.Stop()
		t.Fatal("a capture with a filter tcpdump rejects started")
	} else if !strings.Contains(err.Error(), "did not start listening") {
		t.Fatalf("error does not say the capture never listened: %v", err)
	}
	c, err := l.Client.StartCapture(ctx, "icmp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client.Output(ctx, "ping", "-c1", "-W2", l.Nodes[0].IPv4.String()); err != nil {
		t.Fatalf("ping: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(c.Frames("ICMP echo request")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the capture saw no echo request: %d frames", len(c.Frames()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.Stop()
}
