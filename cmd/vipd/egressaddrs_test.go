package main

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/pools"
)

// TestEgressAddrsState: the runtime egress addresses survive a restart in
// the state directory (what a crash may have left bound is known to the
// next run); an unreadable file is ignored with one warning; entries that
// are not l2 addresses are dropped.
func TestEgressAddrsState(t *testing.T) {
	dir := t.TempDir()
	var logs strings.Builder
	e := &egressAddrs{log: slog.New(slog.NewTextHandler(&logs, nil)), state: filepath.Join(dir, EgressAddrsFile)}
	if got := e.load(); got != nil {
		t.Fatalf("nothing saved yet, loaded %v", got)
	}
	want := []pools.Address{{Addr: netip.MustParseAddr("10.0.0.201"), Pool: egressPool, Mode: pools.ModeL2, Nodes: []string{"n1", "n2"}, Service: "a/b"}}
	e.save(append(want, pools.Address{Addr: netip.MustParseAddr("10.0.0.202"), Mode: pools.ModeBGP}))
	got := e.load()
	if len(got) != 1 || got[0].Addr != want[0].Addr || got[0].Service != "a/b" || len(got[0].Nodes) != 2 {
		t.Fatalf("loaded %+v", got)
	}
	if fi, err := os.Stat(e.state); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	if err := os.WriteFile(e.state, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := e.load(); got != nil {
		t.Fatalf("garbage loaded as %v", got)
	}
	if n := strings.Count(logs.String(), "ignoring unreadable saved runtime egress addresses"); n != 1 {
		t.Fatalf("%d warnings:\n%s", n, logs.String())
	}
}

// TestEgressAddressMovesWithTheSelector drives two nodes' pools machines
// as vipd runs them for a runtime egress IP (fake clock): the winner among
// the listed nodes takes it, a node that is not listed never does, and
// when the selector stops matching the holder, it releases at once and the
// other listed node takes it over.
func TestEgressAddressMovesWithTheSelector(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ip := netip.MustParseAddr("10.0.0.201")
	view := pools.View{Members: []pools.Member{{Name: "n1", Eligible: true, Pools: true}, {Name: "n2", Eligible: true, Pools: true}, {Name: "n3", Eligible: true, Pools: true}}}
	addr := func(nodes ...string) pools.Desired {
		return pools.Desired{Addresses: []pools.Address{{Addr: ip, Pool: egressPool, Mode: pools.ModeL2, Nodes: nodes, Service: "a/p"}}}
	}
	first := pools.Winner(ip, []string{"n1", "n2"})
	other := map[string]string{"n1": "n2", "n2": "n1"}[first]
	ms := map[string]*pools.Machine{}
	for _, n := range []string{"n1", "n2", "n3"} {
		m := pools.NewMachine(pools.Config{Name: n, Probe: true}, t0)
		m.Step(view, t0)
		m.Step(addr("n1", "n2"), t0)
		ms[n] = m
	}
	// step feeds ev to every machine at now (acquires succeed: nobody answers the
	// probe) and keeps holders up to date.
	holders := map[string]bool{}
	step := func(now time.Time, ev pools.Event) {
		for n, m := range ms {
			out := m.Step(ev, now)
			for _, r := range out.Release {
				if r.Addr == ip {
					delete(holders, n)
				}
			}
			if len(out.Acquire) > 0 {
				m.Step(pools.Acquired{Results: []pools.Result{{Addr: ip}}}, now)
				holders[n] = true
			}
		}
	}
	now := t0.Add(pools.StartupWait + time.Millisecond)
	step(now, pools.Tick{})
	if len(holders) != 1 || !holders[first] {
		t.Fatalf("holders %v, want %s", holders, first)
	}
	// The selector no longer matches the holder: it releases, the other
	// listed node takes over; n3 never holds.
	now = now.Add(time.Second)
	step(now, addr(other))
	step(now.Add(10*time.Millisecond), pools.Tick{})
	if len(holders) != 1 || !holders[other] {
		t.Fatalf("after the selector change: holders %v, want %s", holders, other)
	}
	// No node matches: nobody holds it.
	step(now.Add(time.Second), addr())
	if len(holders) != 0 {
		t.Fatalf("with no eligible node: holders %v", holders)
	}
}
