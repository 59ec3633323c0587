package cordon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/kubetest"
	"github.com/vipd/vipd/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

var env kubetest.Env

func TestMain(m *testing.M) { os.Exit(env.Main(m)) }

// caseLabel marks this test's Nodes on the shared apiserver.
const caseLabel = "vipd.test/case"

// harness is one test's view of the shared apiserver.
type harness struct {
	ctx  context.Context
	kc   kubernetes.Interface
	id   string // value of caseLabel on this test's nodes
	logs *testenv.Buffer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	testenv.Short(t)
	srv := env.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{ctx: ctx, id: fmt.Sprintf("c%d", time.Now().UnixNano()), logs: &testenv.Buffer{}}
	var err error
	if h.kc, err = kubernetes.NewForConfig(srv.Config()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.kc.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: caseLabel + "=" + h.id})
		if t.Failed() {
			t.Logf("watch logs:\n%s", h.logs.String())
		}
	})
	return h
}

// TestWatch runs the cordon watch against the real apiserver: a
// Node created after the watch started, kubectl cordon (the same merge
// patch of spec.unschedulable), a handover that fails and is asked again,
// kubectl uncordon, and another node's cordon, which this node ignores.
func TestWatch(t *testing.T) {
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
		done <- Watch(ctx, h.kc, name, retry, handOver, slog.New(slog.NewTextHandler(h.logs, nil)))
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Watch did not return after cancel")
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
