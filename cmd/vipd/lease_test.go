package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/cluster/lease"
	"github.com/vipd/vipd/vip"
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

// A daemon that runs no election (no VIPD_PEERS) answers 501: forget
// fails with its one line and edits nothing.
func TestForgetWithoutElection(t *testing.T) {
	dir := t.TempDir()
	cs, err := startControlServer(dir, &daemon{elector: &fakeElector{}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var out, errOut bytes.Buffer
	if code := execute([]string{"forget", "--state-dir", dir, "cp-old"}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "runs no election") ||
		strings.Count(strings.TrimSpace(errOut.String()), "\n") != 0 {
		t.Fatalf("exit %d, %q", code, errOut.String())
	}
}

// A node whose daemon is stopped cannot forget by itself: one line says
// where to run it.
func TestForgetLeaseWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
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
		Members: []cluster.LeaseMemberStatus{{Name: "cp-2", Addr: "10.0.0.12:7950", Alive: true, Healthy: true, Eligible: false}},
		Broken:  map[string]string{"10.0.0.2/32": "last attempt failed 12:00:09: interface down"},
		LastHandover: map[string]cluster.HandoverResult{"10.0.0.3/32": {VIP: "10.0.0.3/32", To: "cp-2", OK: true, At: now.Add(-2 * time.Second),
			Took: 41 * time.Millisecond, Reason: "lease transferred"}}}
	s := Status{Node: "cp-1", Version: "v1", Mode: "l2", Started: now.Add(-time.Minute), Components: map[string]any{"cluster": doc}}
	var b bytes.Buffer
	if err := printStatus(&b, s, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lease election, voter (StateLeader), leader cp-1, term 7, quorum true", "leader lease:", "612ms left",
		"voters:", "cp-1, cp-2, w", "learners:", "cp-3", "witnesses:", "10.0.0.1/32", "700ms", "cp-2", "10.0.0.12:7950",
		"CANNOT HOLD 10.0.0.2/32:", "interface down", "last handover 10.0.0.3/32:", "done to cp-2 2s ago (41ms): lease transferred",
		"ALIVE  HEALTHY  ELIGIBLE", "true   true     false"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// The lease elector tells the l2 announcer (SetHolder) who holds each
// VIPD_ADDRESS address as this node knows it, and when this node does: the
// wire checks (conflict detection) compare the answers with it.
func TestLeaseElectorTellsTheHolder(t *testing.T) {
	type call struct {
		vip    string
		holder string
		self   bool
	}
	var got []call
	e := &leaseElector{log: slog.New(slog.NewTextHandler(io.Discard, nil)), core: map[string]bool{"10.0.0.100/32": true},
		decided: func(v netip.Prefix, holder string, self bool) { got = append(got, call{v.String(), holder, self}) }}
	var sent []vip.Event
	send := func(ev vip.Event) { sent = append(sent, ev) }
	k := lease.Address{Key: "10.0.0.100/32"}
	for _, d := range []cluster.LeaseDecision{
		{Address: k, Reason: "no holder yet: no leader"},
		{Address: k, Node: "b", Reason: "b holds it"},
		{Address: k, Holder: true, Node: "a", Until: time.Now().Add(time.Second), Reason: "lease granted by a majority"},
		{Address: k, Reason: "lease not renewed"},
	} {
		e.toCore(d, send)
	}
	want := []call{{"10.0.0.100/32", "", false}, {"10.0.0.100/32", "b", false}, {"10.0.0.100/32", "a", true}, {"10.0.0.100/32", "", false}}
	if !slices.Equal(got, want) || len(sent) != 4 {
		t.Fatalf("SetHolder calls\n got %+v\nwant %+v (%d core events)", got, want, len(sent))
	}
	// A witness (no core) tells nobody.
	got = nil
	e.toCore(cluster.LeaseDecision{Address: k, Node: "b"}, nil)
	if len(got) != 0 {
		t.Fatalf("a witness called SetHolder: %+v", got)
	}
}
