package lab

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testenv"
)

// The election tests (test/election) rest on these watchers and faults: a
// watcher that cannot see two holders, or a cut that lets traffic through,
// would let every test pass. Each is shown here to see and do what it says,
// without vipd.
func TestWatchersAndFaults(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "nft", "ping", "arping")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := New(t, Options{Nodes: 3, Client: true})
	n1, n2, n3 := l.Nodes[0], l.Nodes[1], l.Nodes[2]
	vip := l.VIP4(7)
	bind := func(h *Host) {
		t.Helper()
		if _, err := h.Output(ctx, "ip", "addr", "add", netip.PrefixFrom(vip, 32).String(), "dev", h.Link); err != nil {
			t.Fatal(err)
		}
	}
	unbind := func(h *Host) {
		t.Helper()
		if _, err := h.Output(ctx, "ip", "addr", "del", netip.PrefixFrom(vip, 32).String(), "dev", h.Link); err != nil {
			t.Fatal(err)
		}
	}
	mon, err := l.Monitor(vip)
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.Client.StartARPWatch(vip, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}

	// One holder: every round answered by its MAC alone.
	bind(n1)
	start := time.Now()
	time.Sleep(400 * time.Millisecond)
	one := w.Between(start, time.Now())
	answered := 0
	for _, r := range one {
		if len(r.MACs) > 1 || (len(r.MACs) == 1 && r.MACs[0] != n1.MAC.String()) {
			t.Fatalf("one holder, round answered by %v", r.MACs)
		}
		answered += len(r.MACs)
	}
	if answered < len(one)/2 {
		t.Fatalf("only %d of %d rounds answered by the one holder", answered, len(one))
	}

	// Two holders: seen bound on both and answering one question together.
	bind(n2)
	both := time.Now()
	time.Sleep(400 * time.Millisecond)
	if m := w.Multi(both, time.Now()); len(m) == 0 {
		t.Fatalf("two holders bound, no ARP round with two MACs:\n%s", w.Timeline(start))
	}
	if d := mon.Longest(both, time.Now(), func(n int) bool { return n == 2 }); d < 300*time.Millisecond {
		t.Fatalf("two holders bound, monitor saw two for %v:\n%s", d, mon)
	}
	unbind(n2)

	// Cut: nothing between n1 and n2, ARP included, both still reach n3
	// and the client.
	if err := l.Cut(ctx, n1, n2); err != nil {
		t.Fatal(err)
	}
	reach := func(from, to *Host) bool {
		_, err := from.Output(ctx, "ping", "-c1", "-W1", to.IPv4.String())
		return err == nil
	}
	if reach(n1, n2) || reach(n2, n1) {
		t.Fatal("n1 and n2 still reach each other through the cut")
	}
	if !reach(n1, n3) || !reach(n2, n3) || !reach(l.Client, n1) || !reach(l.Client, n2) {
		t.Fatal("the cut between n1 and n2 also cut n3 or the client off")
	}
	if _, err := n2.Output(ctx, "arping", "-c1", "-w1", "-I", n2.Link, n1.IPv4.String()); err == nil {
		t.Fatal("n2's ARP reaches n1 through the cut")
	}
	if err := l.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	healed := false
	for i := 0; i < 5 && !healed; i++ { // a failed neighbour entry is resolved again
		healed = reach(n1, n2)
	}
	if !healed {
		t.Fatal("healed, n1 still does not reach n2")
	}

	// One-way: n1's packets do not arrive at n2; n2's arrive at n1 (a UDP
	// datagram from n2 is received by n1; the reverse is lost).
	if err := DropOneWay(ctx, n1, n2); err != nil {
		t.Fatal(err)
	}
	if got := datagram(t, n2, n1); !got {
		t.Fatal("one-way loss n1->n2 also dropped n2->n1")
	}
	if got := datagram(t, n1, n2); got {
		t.Fatal("one-way loss n1->n2 let a datagram from n1 through")
	}
	if err := l.Heal(ctx); err != nil {
		t.Fatal(err)
	}

	// PowerOff: the process dies, the address goes with the link, and
	// nothing answers any more.
	p, err := n1.Start("sleeper", nil, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	if err := n1.PowerOff(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("process survived power off")
	}
	off := time.Now()
	time.Sleep(300 * time.Millisecond)
	if now := mon.Now(); len(now) != 0 {
		t.Fatalf("after power off the VIP is still seen bound on %v", now)
	}
	for _, r := range w.Between(off.Add(100*time.Millisecond), time.Now()) {
		if len(r.MACs) != 0 {
			t.Fatalf("a powered-off node answered ARP: %v", r.MACs)
		}
	}
}

// datagram sends one UDP datagram from a to b and reports whether b got it.
func datagram(t *testing.T, from, to *Host) bool {
	t.Helper()
	var ln net.PacketConn
	if err := to.Run(func() error {
		var err error
		ln, err = net.ListenPacket("udp4", net.JoinHostPort(to.IPv4.String(), "7999"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := from.Run(func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(to.IPv4.String(), "7999"))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_ = ln.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 16)
	n, _, err := ln.ReadFrom(buf)
	return err == nil && string(buf[:n]) == "x"
}
