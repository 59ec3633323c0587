// Package cordon hands this node's VIPs over while its Node object is
// cordoned (kubectl cordon or drain): the pure decision (Cordon), the
// watch of the Node (Watch) and the request to the local vipd over its
// control socket (Run). It runs in vipd-controllers on every node that
// elects a holder, not leader-elected: each node moves its own VIPs.
package cordon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// DefaultRetry is how often a cordoned node asks for a handover again while
// it stays cordoned: a handover that found no successor is retried, and a
// VIP that came back to the node (its successor failed) leaves again.
const DefaultRetry = 5 * time.Second

// Cordon decides when a node whose Node object is cordoned
// (spec.unschedulable, set by kubectl cordon and kubectl drain) asks the
// local vipd to hand its VIPs over. It does no I/O and reads no clock.
//
// A node that becomes cordoned asks at once; while it stays cordoned it
// asks again every DefaultRetry after the previous answer (asking a node
// that holds nothing is a no-op in the daemon); one request is in flight
// at a time. An uncordoned node asks nothing.
type Cordon struct {
	// Retry is the time between requests while cordoned; zero:
	// DefaultRetry.
	Retry    time.Duration
	cordoned bool
	asking   bool      // a request is in flight
	next     time.Time // when to ask again (zero: at once)
}

// Observe records the Node's unschedulable flag and reports whether to
// ask for a handover now.
func (c *Cordon) Observe(unschedulable bool, now time.Time) bool {
	if unschedulable && !c.cordoned {
		c.next = time.Time{}
	}
	c.cordoned = unschedulable
	return c.Tick(now)
}

// Tick reports whether to ask for a handover at now.
func (c *Cordon) Tick(now time.Time) bool {
	if !c.cordoned || c.asking || now.Before(c.next) {
		return false
	}
	c.asking = true
	return true
}

// Answered records that the request ended (whatever its outcome).
func (c *Cordon) Answered(now time.Time) {
	c.asking = false
	r := c.Retry
	if r <= 0 {
		r = DefaultRetry
	}
	c.next = now.Add(r)
}

// Deadline is when Tick next wants to run; zero when nothing is due.
func (c *Cordon) Deadline() time.Time {
	if !c.cordoned || c.asking {
		return time.Time{}
	}
	return c.next
}

// Cordoned reports the last observed flag.
func (c *Cordon) Cordoned() bool { return c.cordoned }

// HandOverFunc asks the local vipd to hand every VIP it holds to another
// node and returns a one-line summary of what happened.
type HandOverFunc func(ctx context.Context) (string, error)

// Watch watches the Node named node and asks handOver for a planned
// handover while it is cordoned, until ctx is done. It runs on every
// node (no leader election): each node moves its own VIPs. A Node that
// does not exist yet is waited for. retry is Cordon.Retry.
func Watch(ctx context.Context, cs kubernetes.Interface, node string, retry time.Duration, handOver HandOverFunc, log *slog.Logger) error {
	if node == "" {
		return fmt.Errorf("VIPD_NODE_NAME is empty: the cordon watch needs this node's name")
	}
	events := make(chan bool, 1)
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", node))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})
	send := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		select {
		case <-events: // keep only the latest
		default:
		}
		events <- n.Spec.Unschedulable
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    send,
		UpdateFunc: func(_, obj any) { send(obj) },
		DeleteFunc: func(any) {
			select {
			case <-events:
			default:
			}
			events <- false
		},
	}); err != nil {
		return fmt.Errorf("cordon watch: %w", err)
	}
	go inf.RunWithContext(ctx)
	log.Info("watching this node's Node object: kubectl cordon or drain hands the VIPs over", "node", node)

	c := Cordon{Retry: retry}
	answers := make(chan string, 1)
	inflight := false
	start := func() {
		inflight = true
		go func() {
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			sum, err := handOver(hctx)
			if err != nil {
				sum = "error: " + err.Error()
			}
			answers <- sum
		}()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		if d := c.Deadline(); !d.IsZero() {
			timer.Reset(max(time.Until(d), 0))
		}
		select {
		case <-ctx.Done():
			if inflight {
				<-answers
			}
			return nil
		case cordoned := <-events:
			if cordoned != c.Cordoned() {
				log.Info("Node cordon changed", "node", node, "unschedulable", cordoned)
			}
			if c.Observe(cordoned, time.Now()) {
				start()
			}
		case <-timer.C:
			if c.Tick(time.Now()) {
				start()
			}
		case sum := <-answers:
			inflight = false
			c.Answered(time.Now())
			log.Info("cordoned: asked vipd for a handover", "node", node, "result", sum)
		}
	}
}
