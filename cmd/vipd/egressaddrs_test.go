package main

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
