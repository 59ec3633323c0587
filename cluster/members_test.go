package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestKnownFile(t *testing.T) {
	t.Run("missing file is an empty list", func(t *testing.T) {
		k, mod, err := LoadKnown(t.TempDir())
		if err != nil || len(k.Members) != 0 || !mod.IsZero() {
			t.Fatalf("%+v %v %v", k, mod, err)
		}
	})
	t.Run("round trip keeps members and the ones that left", func(t *testing.T) {
		dir := t.TempDir()
		in := Known{
			Members: map[string]KnownMember{"n1": {Addr: "10.0.0.1:7946", FirstSeen: t0}},
			Left:    map[string]KnownMember{"n2": {Addr: "10.0.0.2:7946", FirstSeen: t0, LeftAt: t0.Add(time.Hour)}},
		}
		if _, err := SaveKnown(dir, in); err != nil {
			t.Fatal(err)
		}
		out, _, err := LoadKnown(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out.Names(), []string{"n1"}) || !out.Left["n2"].LeftAt.Equal(t0.Add(time.Hour)) {
			t.Fatalf("loaded %+v", out)
		}
	})
	t.Run("a file from an older version (no left list) loads", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, MembersFile), []byte(`{"members":{"n1":{"first_seen":"2026-01-01T00:00:00Z"}}}`), 0o640); err != nil {
			t.Fatal(err)
		}
		k, _, err := LoadKnown(dir)
		if err != nil || !slices.Equal(k.Names(), []string{"n1"}) || len(k.Left) != 0 {
			t.Fatalf("%+v %v", k, err)
		}
	})
	t.Run("forget removes a member and a member that left", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := SaveKnown(dir, Known{
			Members: map[string]KnownMember{"n1": {}, "n3": {}},
			Left:    map[string]KnownMember{"n2": {LeftAt: t0}},
		}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n2", "n3"} {
			if ok, err := Forget(dir, n); !ok || err != nil {
				t.Fatalf("forget %s: %v %v", n, ok, err)
			}
		}
		if ok, err := Forget(dir, "n9"); ok || err != nil {
			t.Fatalf("forget of an unknown name: %v %v", ok, err)
		}
		k, _, _ := LoadKnown(dir)
		if !slices.Equal(k.Names(), []string{"n1"}) || len(k.Left) != 0 {
			t.Fatalf("after forget: %+v", k)
		}
	})
}

// The tombstone of a member that left survives a restart of a node without
// quorum: it still counts the member again when it is back.
func TestElectionLeftSurvivesRestart(t *testing.T) {
	e := newEl("n1", "n2", "n3")
	e.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0)
	out := e.Step(ViewChanged{Left: []string{"n2"}}, t0.Add(time.Second))
	if out.Known == nil || out.Known.Left["n2"].LeftAt.IsZero() {
		t.Fatalf("the persisted list lacks n2's leave: %+v", out.Known)
	}
	// vipd restarts from the persisted list, then n2 is back.
	e2 := NewElection(e.cfg, *out.Known, t0.Add(2*time.Second))
	e2.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n1", "n2", "n3")})}}, t0.Add(3*time.Second))
	st := e2.Status(t0)
	if !slices.Equal(st.Known, []string{"n1", "n2", "n3"}) || !st.Quorum.OK {
		t.Fatalf("after the restart: known %v quorum %+v", st.Known, st.Quorum)
	}
	// vipd forget on a tombstone: not counted when back.
	e3 := NewElection(e.cfg, *out.Known, t0.Add(2*time.Second))
	k := *out.Known
	k.Left = nil
	e3.Forgotten(k)
	e3.Step(ViewChanged{Members: []Member{peer("n2", Alive, Meta{Counts: counts("n2")})}}, t0.Add(3*time.Second))
	if st := e3.Status(t0); !slices.Equal(st.Known, []string{"n1", "n3"}) {
		t.Fatalf("forgotten n2 counted again: %v", st.Known)
	}
}
