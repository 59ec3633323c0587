package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster"
)

// forgettingElector is a lease-style elector: it forgets on request.
type forgettingElector struct {
	fakeElector
	forgot []string
	err    error
}

func (e *forgettingElector) Forget(name string) error {
	e.forgot = append(e.forgot, name)
	return e.err
}

func TestForgetThroughTheLeaseElection(t *testing.T) {
	dir := t.TempDir()
	el := &forgettingElector{}
	cs, err := startControlServer(dir, &daemon{elector: el}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var out, errOut bytes.Buffer
	if code := execute([]string{"forget", "--state-dir", dir, "cp-old"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "forgot cp-old") {
		t.Fatalf("exit %d, %q %q", code, out.String(), errOut.String())
	}
	if len(el.forgot) != 1 || el.forgot[0] != "cp-old" {
		t.Fatalf("forgot %v", el.forgot)
	}
	el.err = errors.New("election busy: try again")
	out.Reset()
	errOut.Reset()
	if code := execute([]string{"forget", "--state-dir", dir, "cp-old"}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "election busy") {
		t.Fatalf("busy: exit %d, %q", code, errOut.String())
	}
}

// The gossip election's daemon answers 501: forget edits members.json.
func TestForgetGossipFallsBackToTheFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := cluster.SaveKnown(dir, cluster.Known{Members: map[string]cluster.KnownMember{"cp-old": {}}}); err != nil {
		t.Fatal(err)
	}
	cs, err := startControlServer(dir, &daemon{elector: &fakeElector{}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var out, errOut bytes.Buffer
	if code := execute([]string{"forget", "--state-dir", dir, "cp-old"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, %q", code, errOut.String())
	}
	k, _, err := cluster.LoadKnown(dir)
	if err != nil || len(k.Members) != 0 {
		t.Fatalf("members %v %v", k.Members, err)
	}
}

// A node of the lease election whose daemon is stopped cannot forget by
// itself: one line says where to run it.
func TestForgetLeaseWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, cluster.LeaseStateFile), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := execute([]string{"forget", "--state-dir", dir, "cp-old"}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "run vipd forget cp-old on a node where vipd runs") || strings.Count(strings.TrimSpace(errOut.String()), "\n") != 0 {
		t.Fatalf("exit %d, %q", code, errOut.String())
	}
}

// vipd status shows the lease election: leader, term, voters, learners,
// witnesses, the leader's lease and who holds what.
func TestPrintStatusLease(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 10, 0, time.UTC)
	doc := cluster.LeaseStatusDoc{Election: "lease", Role: "voter", State: "StateLeader", Leader: "cp-1", Term: 7, Quorum: true,
		Voters: []string{"cp-1", "cp-2", "w"}, Learners: []string{"cp-3"}, Witnesses: []string{"w"}, LeaseLeft: "612ms",
		Holders: map[string]string{"10.0.0.1/32": "cp-1"}, Holds: map[string]time.Time{"10.0.0.1/32": now.Add(700 * time.Millisecond)},
		Members: []cluster.LeaseMemberStatus{{Name: "cp-2", Addr: "10.0.0.12:7950", Alive: true}},
		Broken:  map[string]string{"10.0.0.2/32": "last attempt failed 12:00:09: interface down"}}
	s := Status{Node: "cp-1", Version: "v1", Mode: "l2", Started: now.Add(-time.Minute), Components: map[string]any{"cluster": doc}}
	var b bytes.Buffer
	if err := printStatus(&b, s, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lease election, voter (StateLeader), leader cp-1, term 7, quorum true", "leader lease:", "612ms left",
		"voters:", "cp-1, cp-2, w", "learners:", "cp-3", "witnesses:", "10.0.0.1/32", "700ms", "cp-2", "10.0.0.12:7950",
		"CANNOT HOLD 10.0.0.2/32:", "interface down"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}
