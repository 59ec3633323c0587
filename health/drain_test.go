package health

import (
	"testing"
	"time"
)

func TestJudgeReadyz(t *testing.T) {
	// Bodies as k8s.io/apiserver v0.34's healthz handler writes them.
	failing := "[+]ping ok\n[+]log ok\n[+]etcd ok\n[-]shutdown failed: reason withheld\n[+]poststarthook/start-apiextensions-informers ok\nreadyz check failed\n"
	etcdDown := "[+]ping ok\n[-]etcd failed: reason withheld\n[+]shutdown ok\nreadyz check failed\n"
	for _, tc := range []struct {
		name string
		code int
		body string
		want Readyz
	}{
		{"ok", 200, "ok", ReadyzServing},
		{"shutdown", 500, failing, ReadyzShutdown},
		{"other check failing", 500, etcdDown, ReadyzServing},
		{"500 without a list", 500, "internal error", ReadyzUnknown},
		{"forbidden", 403, `{"kind":"Status","reason":"Forbidden"}`, ReadyzUnknown},
		{"no answer", 0, "", ReadyzUnknown},
	} {
		if got := JudgeReadyz(tc.code, []byte(tc.body)); got != tc.want {
			t.Errorf("%s: JudgeReadyz(%d) = %v, want %v", tc.name, tc.code, got, tc.want)
		}
	}
}

// step is one probe fed to a Drain and what it must decide.
type step struct {
	livez     string // a Reason
	readyz    Readyz
	handedOK  *bool // then HandedOver with this
	draining  bool
	handOver  bool
	eligible  bool // Eligible(true) after the step (and its HandedOver)
	reason    string
	sinceStep int // the episode started at this step's time
}

func yes() *bool { v := true; return &v }
func no() *bool  { v := false; return &v }

func TestDrain(t *testing.T) {
	const (
		ok    = ReasonOK
		refus = ReasonRefused
		tmo   = ReasonTimeout
		h5xx  = ReasonHTTP5xx
	)
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"serving stays quiet", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: ok, readyz: ReadyzUnknown, eligible: true},
			{livez: ok, readyz: ReadyzServing, eligible: true},
		}},
		{"graceful shutdown with a delay: hand over at once, then ineligible until the restart", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: ok, readyz: ReadyzShutdown, draining: true, handOver: true, reason: DrainShutdown, sinceStep: 1, handedOK: yes()},
			{livez: ok, readyz: ReadyzShutdown, draining: true, reason: DrainShutdown, sinceStep: 1},
			{livez: refus, draining: true, reason: DrainShutdown, sinceStep: 1},
			{livez: refus, draining: true, reason: DrainShutdown, sinceStep: 1},
			// restarted: livez before readyz passes its post-start hooks
			{livez: ok, readyz: ReadyzUnknown, eligible: true},
			{livez: ok, readyz: ReadyzServing, eligible: true},
		}},
		{"shutdown ends when readyz says serving again", []step{
			{livez: ok, readyz: ReadyzShutdown, draining: true, handOver: true, reason: DrainShutdown, handedOK: yes()},
			{livez: ok, readyz: ReadyzUnknown, draining: true, reason: DrainShutdown},
			{livez: ok, readyz: ReadyzServing, eligible: true},
		}},
		{"failed handover is asked again on the next probe and the node stays eligible", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: ok, readyz: ReadyzShutdown, draining: true, handOver: true, eligible: true, reason: DrainShutdown, sinceStep: 1, handedOK: no()},
			{livez: ok, readyz: ReadyzShutdown, draining: true, handOver: true, eligible: true, reason: DrainShutdown, sinceStep: 1},
			// still in flight: not asked twice
			{livez: ok, readyz: ReadyzShutdown, draining: true, reason: DrainShutdown, sinceStep: 1, handedOK: yes()},
			{livez: ok, readyz: ReadyzShutdown, draining: true, reason: DrainShutdown, sinceStep: 1},
		}},
		{"stop without a delay: the first refused probe hands over", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: refus, draining: true, handOver: true, reason: DrainRefused, sinceStep: 1, handedOK: yes()},
			{livez: refus, draining: true, reason: DrainRefused, sinceStep: 1},
			{livez: ok, readyz: ReadyzServing, eligible: true},
		}},
		{"refused before the first good probe is no episode (not started yet)", []step{
			{livez: refus, eligible: true},
			{livez: refus, eligible: true},
			{livez: ok, readyz: ReadyzServing, eligible: true},
		}},
		{"timeouts and 5xx are left to the fail threshold", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: tmo, eligible: true},
			{livez: h5xx, eligible: true},
			{livez: refus, eligible: true}, // not right after a good probe
		}},
		{"a refused blip ends with the next good probe", []step{
			{livez: ok, readyz: ReadyzServing, eligible: true},
			{livez: refus, draining: true, handOver: true, eligible: true, reason: DrainRefused, sinceStep: 1},
			{livez: ok, readyz: ReadyzUnknown, eligible: true},
		}},
		{"a refused episode turns into a shutdown one when readyz tells", []step{
			{livez: ok, eligible: true},
			{livez: refus, draining: true, handOver: true, reason: DrainRefused, sinceStep: 1, handedOK: yes()},
			{livez: ok, readyz: ReadyzShutdown, draining: true, reason: DrainShutdown, sinceStep: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Drain
			t0 := time.Unix(1000, 0)
			prevDraining := false
			for i, s := range tc.steps {
				now := t0.Add(time.Duration(i) * time.Second)
				dec := d.Observe(Result{OK: s.livez == ReasonOK, Reason: s.livez}, s.readyz, now)
				if dec.Draining != s.draining || dec.HandOver != s.handOver || dec.Reason != s.reason {
					t.Fatalf("step %d (%s, %v): got draining=%v handOver=%v reason=%q, want %v %v %q",
						i, s.livez, s.readyz, dec.Draining, dec.HandOver, dec.Reason, s.draining, s.handOver, s.reason)
				}
				if dec.Changed != (s.draining != prevDraining) {
					t.Fatalf("step %d: Changed=%v, draining %v -> %v", i, dec.Changed, prevDraining, s.draining)
				}
				prevDraining = s.draining
				if s.draining && !dec.Since.Equal(t0.Add(time.Duration(s.sinceStep)*time.Second)) {
					t.Fatalf("step %d: Since=%v, want step %d's time", i, dec.Since, s.sinceStep)
				}
				if s.handedOK != nil {
					d.HandedOver(*s.handedOK)
				}
				if got := d.Eligible(true); got != s.eligible {
					t.Fatalf("step %d: Eligible(true)=%v, want %v", i, got, s.eligible)
				}
				if d.Eligible(false) {
					t.Fatalf("step %d: Eligible(false) is true", i)
				}
			}
		})
	}
}
