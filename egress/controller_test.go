package egress

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestControllerStopDrainsAfterHandover is the CI failure at the
// controller: the gateway hands the egress IP over before its stop (it
// is a director when its context ends); it must keep its table until it
// left the cluster, then hold the stopping state for DrainQuiet, and
// only then remove everything. (It removed everything at once, and the
// CNI masqueraded the directors' packets still arriving.)
func TestControllerStopDrainsAfterHandover(t *testing.T) {
	ns, k, link := testNS(t)
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	watch, err := NewKernelAt(h) // the test's own view of the kernel
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	s := settings()
	s.Link = link
	var mu sync.Mutex
	gw := Gateway{Self: true, Node: "n1"}
	c := NewController(Options{Rules: rules()[:1], Settings: s, Poll: 10 * time.Millisecond, Lookup: func(netip.Addr) Gateway {
		mu.Lock()
		defer mu.Unlock()
		return gw
	}}, k, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	left := make(chan struct{})
	c.SetLeft(left)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	chains := func() []string {
		obs, err := watch.Observe(s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ch := range obs.Chains {
			out = append(out, ch.Key)
		}
		return out
	}
	has := func(name string) bool {
		return slices.ContainsFunc(chains(), func(k string) bool { return len(k) > len(name) && k[:len(name)+1] == name+" " })
	}
	waitUntil := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: chains %v", what, chains())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUntil("gateway", func() bool { return has("forward") })
	// What vipd answers the egressfeed child (GET /egress/gateways).
	if g := c.Gateways(); !slices.Equal(g, []netip.Addr{rules()[0].IP}) {
		t.Fatalf("gateway of %v, want %v", g, rules()[0].IP)
	}
	// The hand-over: the node becomes a director, then its stop begins.
	mu.Lock()
	gw = Gateway{Node: "n2", Addr: netip.MustParseAddr("10.0.0.12")}
	mu.Unlock()
	waitUntil("director", func() bool { return has("mark") && !has("forward") })
	if g := c.Gateways(); len(g) != 0 {
		t.Fatalf("a director is the gateway of %v", g)
	}
	cancel()
	// Not left yet: the director's table stays (the directors may still
	// route here; this node passes their packets on to the new gateway).
	time.Sleep(150 * time.Millisecond)
	if !has("mark") {
		t.Fatalf("the table changed before the node left the cluster: %v", chains())
	}
	t1 := time.Now()
	close(left)
	waitUntil("the stopping state after the leave", func() bool { return has(ChainArrivals) })
	if has("mark") {
		t.Fatalf("stopping state still marks: %v", chains())
	}
	<-done
	if d := time.Since(t1); d < DrainQuiet {
		t.Fatalf("removed %v after the leave, want the stopping state held for DrainQuiet (%v)", d, DrainQuiet)
	}
	if obs, err := watch.Observe(s); err != nil || obs.Table || len(obs.IPRules)+len(obs.Routes) != 0 {
		t.Fatalf("after the drain: %+v, %v", obs, err)
	}
}

// TestControllerStopDirectorAtOnce: a node that was never a gateway has
// nothing to drain; its stop removes everything without waiting for the
// leave.
func TestControllerStopDirectorAtOnce(t *testing.T) {
	ns, k, link := testNS(t)
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	watch, err := NewKernelAt(h) // not the controller's netlink sockets
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	s := settings()
	s.Link = link
	c := NewController(Options{Rules: rules()[:1], Settings: s, Poll: 10 * time.Millisecond, Lookup: func(netip.Addr) Gateway {
		return Gateway{Node: "n2", Addr: netip.MustParseAddr("10.0.0.12")}
	}}, k, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	c.SetLeft(make(chan struct{})) // never closed
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if obs, err := watch.Observe(s); err == nil && obs.Table {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no table")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	cancel()
	<-done
	// Waiting for the leave would take DrainMax (2 s): the leave never comes.
	if d := time.Since(t0); d > 1500*time.Millisecond {
		t.Fatalf("a director's stop took %v", d)
	}
	if obs, err := watch.Observe(s); err != nil || obs.Table || len(obs.IPRules)+len(obs.Routes) != 0 {
		t.Fatalf("after the stop: %+v, %v", obs, err)
	}
}
