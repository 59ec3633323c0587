package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/cluster"
	"github.com/vipd/vipd/internal/wire"
	"github.com/vipd/vipd/vip"
)

// fakeElector answers HandOver with fixed results and records the request.
type fakeElector struct {
	results []cluster.HandoverResult
	vips    []string
	to      string
}

func (e *fakeElector) SetHealthy(bool)          {}
func (e *fakeElector) SetHolding(string, bool)  {}
func (e *fakeElector) SetFailed(string, string) {}
func (e *fakeElector) Status() any              { return nil }
func (e *fakeElector) Close() error             { return nil }
func (e *fakeElector) Run(ctx context.Context, _ func(vip.Event)) error {
	<-ctx.Done()
	return ctx.Err()
}
func (e *fakeElector) HandOver(_ context.Context, vips []string, to string, stopping bool) ([]cluster.HandoverResult, error) {
	e.vips, e.to = vips, to
	return e.results, nil
}

func TestHandoverCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		results  []cluster.HandoverResult
		code     int
		stdout   string
		stderr   string
		wantVIPs []string
		wantTo   string
	}{
		{"handed over", []string{"--to", "cp-2", "10.0.0.100"},
			[]cluster.HandoverResult{{VIP: "10.0.0.100/32", To: "cp-2", OK: true, Took: 12 * time.Millisecond}},
			0, "10.0.0.100/32: handed over to cp-2 in 12ms\n", "", []string{"10.0.0.100/32"}, "cp-2"},
		{"refused: one line, exit 1", nil,
			[]cluster.HandoverResult{{VIP: "10.0.0.100/32", Refused: true, Reason: "no eligible successor for 10.0.0.100/32: no other member is alive, healthy, with quorum and able to hold it"}},
			1, "", "vipd: cannot hand over 10.0.0.100/32: no eligible successor for 10.0.0.100/32: no other member is alive, healthy, with quorum and able to hold it\n", nil, ""},
		{"nothing held", nil, []cluster.HandoverResult{{Refused: true, Reason: "this node holds no VIP"}},
			1, "", "vipd: cannot hand over: this node holds no VIP\n", nil, ""},
		{"IPv6 in CIDR form", []string{"fd00::100/128"}, []cluster.HandoverResult{{VIP: "fd00::100/128", To: "cp-3", OK: true}},
			0, "fd00::100/128: handed over to cp-3 in 0s\n", "", []string{"fd00::100/128"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			el := &fakeElector{results: tt.results}
			d := &daemon{elector: el}
			cs, err := startControlServer(dir, d, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			st, err := os.Stat(filepath.Join(dir, ControlSocket))
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("control socket: %v mode %v, want 0600", err, st.Mode())
			}
			var out, errOut bytes.Buffer
			code := execute(append([]string{"handover", "--state-dir", dir}, tt.args...), &out, &errOut)
			if code != tt.code || out.String() != tt.stdout || errOut.String() != tt.stderr {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out.String(), errOut.String(), tt.code, tt.stdout, tt.stderr)
			}
			if !slices.Equal(el.vips, tt.wantVIPs) || el.to != tt.wantTo {
				t.Fatalf("request vips %v to %q, want %v %q", el.vips, el.to, tt.wantVIPs, tt.wantTo)
			}
		})
	}
}

func TestHandoverCommandErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := execute([]string{"handover", "--state-dir", t.TempDir()}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "cannot reach vipd's control socket") {
		t.Fatalf("no daemon: exit %d %q", code, errOut.String())
	}
	errOut.Reset()
	if code := execute([]string{"handover", "--state-dir", t.TempDir(), "banana"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `"banana" is not a VIP`) {
		t.Fatalf("bad VIP: exit %d %q", code, errOut.String())
	}
	// A file that is not a socket where the socket goes is refused, not removed.
	dir := t.TempDir()
	p := filepath.Join(dir, ControlSocket)
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := startControlServer(dir, &daemon{}, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("regular file: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal("the regular file was removed")
	}
}

func TestPrintStatusHandover(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 10, 0, time.UTC)
	at := now.Add(-2 * time.Second)
	tl := vip.Timeline{VIP: netip.MustParsePrefix("10.0.0.1/32"), Handover: true, PrevHolder: "n2",
		DecidedAt: at.Add(300 * time.Microsecond), BoundAt: at.Add(800 * time.Microsecond), AnnouncedAt: at.Add(1100 * time.Microsecond)}
	s := Status{Node: "n1", Version: "v1", Mode: "l2", Started: now.Add(-time.Minute),
		VIPs: []VIPStatus{{VIP: "10.0.0.1/32", Held: true, LastFailover: &tl}},
		Components: map[string]any{"cluster": cluster.LeaseStatusDoc{Election: "lease",
			LastHandover: map[string]cluster.HandoverResult{"fd00::1/128": {VIP: "fd00::1/128", To: "n3", Reason: "n3 did not acknowledge within 500ms", At: now.Add(-time.Second), Took: 500 * time.Millisecond}}}}}
	var b bytes.Buffer
	if err := printStatus(&b, s, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"last handover to this node:  10.0.0.1/32 from n2, 2s ago, decision to bound 0.5 ms, bound to first announcement 0.3 ms",
		"last handover fd00::1/128:", "failed to n3 1s ago (500ms): n3 did not acknowledge within 500ms",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// TestHandoverWire: what the daemon answers on its control socket
// (cluster.HandoverResult) is what vipd-controllers' cordon watch decodes
// (wire.HandoverResult), field by field.
func TestHandoverWire(t *testing.T) {
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	el := &fakeElector{results: []cluster.HandoverResult{
		{VIP: "10.0.0.100/32", To: "cp-2", OK: true, Reason: "ready", At: at, Took: 12 * time.Millisecond, Preempt: true},
		{VIP: "10.0.0.101/32", Reason: "no eligible successor", At: at, Refused: true},
	}}
	dir := t.TempDir()
	cs, err := startControlServer(dir, &daemon{elector: el}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var got []wire.HandoverResult
	if err := wire.PostHandover(context.Background(), filepath.Join(dir, wire.ControlSocket), wire.HandoverRequest{To: "cp-2"}, 5*time.Second, &got); err != nil {
		t.Fatal(err)
	}
	if el.to != "cp-2" {
		t.Fatalf("the daemon read to=%q", el.to)
	}
	if len(got) != len(el.results) {
		t.Fatalf("decoded %+v", got)
	}
	// Re-encoded, the child's view is the daemon's answer: a field the
	// daemon adds or renames shows here.
	want, _ := json.Marshal(el.results)
	again, _ := json.Marshal(got)
	if string(again) != string(want) {
		t.Fatalf("the child decodes\n%s\nthe daemon sends\n%s", again, want)
	}
	if !got[0].OK || got[0].Took != 12*time.Millisecond || !got[1].Refused || !got[1].At.Equal(at) {
		t.Fatalf("decoded %+v", got)
	}
}
