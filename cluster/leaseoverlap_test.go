package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/cluster/lease"
)

func TestOverlapTracker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type step struct {
		at    int
		out   lease.Output
		wantN []string // notify calls: "key:on" / "key:off"
	}
	held := func(keys ...string) map[string]time.Time {
		h := map[string]time.Time{}
		for _, k := range keys {
			h[k] = ms(1000)
		}
		return h
	}
	for _, tc := range []struct {
		name          string
		steps         []step
		wantObserved  int
		wantFallbacks map[string]float64
		wantLog       []string
	}{
		{
			name: "old holder, confirmed",
			steps: []step{
				{0, lease.Output{Holds: held("vip"), Overlaps: map[string]lease.Overlap{"vip": {With: "b", Old: true, Since: ms(0), Until: ms(300)}}}, []string{"vip:on"}},
				{5, lease.Output{Holds: held()}, nil},
			},
			wantObserved: 1, wantFallbacks: map[string]float64{fallbackUnconfirmed: 0},
			wantLog: []string{"from=a to=b", "overlap=5ms confirmed=true"},
		},
		{
			name: "old holder, released at the bound",
			steps: []step{
				{0, lease.Output{Holds: held("vip"), Overlaps: map[string]lease.Overlap{"vip": {With: "b", Old: true, Since: ms(0), Until: ms(300)}}}, []string{"vip:on"}},
				{300, lease.Output{Holds: held()}, nil},
			},
			wantObserved: 1, wantFallbacks: map[string]float64{fallbackUnconfirmed: 1},
			wantLog: []string{"confirmed=false"},
		},
		{
			name: "successor: window ends while it holds (announce again), not measured here",
			steps: []step{
				{0, lease.Output{Holds: held("vip"), Overlaps: map[string]lease.Overlap{"vip": {With: "a", Since: ms(0), Until: ms(306)}}}, []string{"vip:on"}},
				{306, lease.Output{Holds: held("vip")}, []string{"vip:off"}},
			},
			wantLog: []string{"from=a to=self"},
		},
		{
			name: "successor released during the window: no announcement",
			steps: []step{
				{0, lease.Output{Holds: held("vip"), Overlaps: map[string]lease.Overlap{"vip": {With: "a", Since: ms(0), Until: ms(306)}}}, []string{"vip:on"}},
				{10, lease.Output{Holds: held()}, nil},
			},
		},
		{
			name: "break-before-make fallbacks from the machine's notes",
			steps: []step{
				{0, lease.Output{Notes: []lease.Note{{Msg: "planned move to a member not heard from within a heartbeat: break-before-make"}}}, nil},
				{1, lease.Output{Notes: []lease.Note{{Msg: "handover target has not answered within a heartbeat: nothing handed over"}, {Msg: "no eligible node answered within a heartbeat: nothing handed over"}}}, nil},
			},
			wantFallbacks: map[string]float64{fallbackNotLive: 1, fallbackNoSuccessor: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			self := "a"
			if strings.HasPrefix(tc.name, "successor") {
				self = "self"
			}
			tr := newOverlapTracker(self, slog.New(slog.NewTextHandler(&logs, nil)))
			var got []string
			tr.notify = func(k string, _ lease.Overlap, on bool) {
				s := k + ":off"
				if on {
					s = k + ":on"
				}
				got = append(got, s)
			}
			for _, st := range tc.steps {
				got = nil
				tr.observe(ms(st.at), st.out)
				if strings.Join(got, ",") != strings.Join(st.wantN, ",") {
					t.Errorf("at %d ms: notify %v, want %v", st.at, got, st.wantN)
				}
			}
			if n := testutil.CollectAndCount(tr.seconds); tc.wantObserved > 0 && n != 1 {
				t.Errorf("histogram series %d", n)
			}
			if c := histCount(t, tr); c != uint64(tc.wantObserved) {
				t.Errorf("overlaps observed %d, want %d", c, tc.wantObserved)
			}
			for r, want := range tc.wantFallbacks {
				if got := testutil.ToFloat64(tr.fallbacks.WithLabelValues(r)); got != want {
					t.Errorf("fallbacks{%s} = %v, want %v", r, got, want)
				}
			}
			for _, s := range tc.wantLog {
				if !strings.Contains(logs.String(), s) {
					t.Errorf("log lacks %q:\n%s", s, logs.String())
				}
			}
		})
	}
}

func histCount(t *testing.T, tr *overlapTracker) uint64 {
	t.Helper()
	mfs, err := gatherOne(tr)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

func gatherOne(tr *overlapTracker) (uint64, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(tr.seconds); err != nil {
		return 0, err
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) == 0 {
		return 0, err
	}
	return mfs[0].GetMetric()[0].GetHistogram().GetSampleCount(), nil
}

// Pool addresses (no bind report): their overlaps run to the bound by
// design; neither measured nor counted as fallbacks.
func TestOverlapTrackerSkipsUnreported(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := newOverlapTracker("a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	tr.reported = func(k string) bool { return k == "vip" }
	ov := map[string]lease.Overlap{"10.0.1.1/32": {With: "b", Old: true, Since: t0, Until: t0.Add(300 * time.Millisecond)}}
	tr.observe(t0, lease.Output{Holds: map[string]time.Time{"10.0.1.1/32": t0.Add(time.Second)}, Overlaps: ov})
	tr.observe(t0.Add(300*time.Millisecond), lease.Output{})
	if c := histCount(t, tr); c != 0 {
		t.Errorf("a pool overlap was measured (%d)", c)
	}
	if got := testutil.ToFloat64(tr.fallbacks.WithLabelValues(fallbackUnconfirmed)); got != 0 {
		t.Errorf("a pool overlap counted as a fallback (%v)", got)
	}
}
