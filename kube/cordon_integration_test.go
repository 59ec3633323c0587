package kube

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestWatchCordon runs the cordon watch against the real apiserver: a
// Node created after the watch started, kubectl cordon (the same merge
// patch of spec.unschedulable), a handover that fails and is asked again,
// kubectl uncordon, and another node's cordon, which this node ignores.
func TestWatchCordon(t *testing.T) {
	h := newHarness(t)
	name, other := "cordon-"+h.id, "cordon-other-"+h.id
	const retry = 300 * time.Millisecond
	calls := make(chan time.Time, 100)
	var fail atomic.Bool
	fail.Store(true)
	handOver := func(context.Context) (string, error) {
		calls <- time.Now()
		if fail.Load() {
			return "cannot hand over: no eligible successor", nil
		}
		return "10.0.0.100/32: handed over to n2", nil
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() {
		done <- WatchCordon(ctx, h.kc, name, retry, handOver, slog.New(slog.NewTextHandler(h.logs, nil)))
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchCordon: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("WatchCordon did not return after cancel")
		}
	}()
	for _, n := range []string{name, other} {
		if _, err := h.kc.CoreV1().Nodes().Create(h.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels: map[string]string{caseLabel: h.id}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cordon := func(n string, on bool) time.Time {
		t.Helper()
		patch := `{"spec":{"unschedulable":true}}`
		if !on {
			patch = `{"spec":{"unschedulable":null}}`
		}
		at := time.Now()
		if _, err := h.kc.CoreV1().Nodes().Patch(h.ctx, n, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		return at
	}
	quiet := func(d time.Duration, what string) {
		t.Helper()
		select {
		case c := <-calls:
			t.Fatalf("%s: handover asked at %v\n%s", what, c, h.logs.String())
		case <-time.After(d):
		}
	}
	next := func(what string) time.Time {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no handover asked\n%s", what, h.logs.String())
			return time.Time{}
		}
	}
	quiet(3*retry, "uncordoned node")
	cordon(other, true)
	quiet(3*retry, "another node cordoned")

	at := cordon(name, true)
	first := next("cordoned")
	t.Logf("handover asked %v after the cordon", first.Sub(at).Round(time.Millisecond))
	// The handover failed (no successor): asked again after retry.
	second := next("retry after a failed handover")
	if d := second.Sub(first); d < retry {
		t.Fatalf("asked again after %v, want at least %v", d, retry)
	}
	fail.Store(false)
	next("retry while still cordoned")
	cordon(name, false)
	// At most one request that was already due may still come.
	select {
	case <-calls:
	case <-time.After(2 * retry):
	}
	quiet(3*retry, "uncordoned")
}
