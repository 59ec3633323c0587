package poolfeed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/wire"
)

// Debounce gathers a burst of changes (a thousand allocations created at
// once) into one snapshot.
const Debounce = 100 * time.Millisecond

// Config shapes the feed.
type Config struct {
	Kubeconfig string // "": in-cluster
	UserAgent  string
}

// Run watches the API and writes a snapshot line to w whenever the view
// changes (the first once every cache has synced), until ctx is done.
func Run(ctx context.Context, cfg Config, w io.Writer, log *slog.Logger) error {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("VIPD_KUBECONFIG: %w", err)
	}
	rc.UserAgent = cfg.UserAgent
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	core := informers.NewSharedInformerFactory(kc, 0)
	poolInf := dyn.ForResource(v1alpha1.IPPoolResource).Informer()
	allocInf := dyn.ForResource(v1alpha1.IPAllocationResource).Informer()
	nodeInf := core.Core().V1().Nodes().Informer()
	svcInf := core.Core().V1().Services().Informer()
	sliceInf := core.Discovery().V1().EndpointSlices().Informer()

	poke := make(chan struct{}, 1)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick(poke) },
		UpdateFunc: func(any, any) { kick(poke) },
		DeleteFunc: func(any) { kick(poke) },
	}
	for _, inf := range []cache.SharedIndexInformer{poolInf, allocInf, nodeInf, svcInf, sliceInf} {
		// The caches keep only what Compute reads.
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	dyn.Start(ctx.Done())
	core.Start(ctx.Done())
	defer dyn.Shutdown()
	defer core.Shutdown()

	synced := make(chan bool, 1)
	go func() {
		synced <- cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced, allocInf.HasSynced, nodeInf.HasSynced, svcInf.HasSynced, sliceInf.HasSynced)
	}()
	slow := time.NewTicker(30 * time.Second)
	defer slow.Stop()
wait:
	for {
		select {
		case ok := <-synced:
			if !ok {
				return ctx.Err()
			}
			break wait
		case <-slow.C:
			log.Warn("still waiting for the first list of IPPools, IPAllocations, Nodes, Services and EndpointSlices (apiserver down, CRDs missing or RBAC?)")
		}
	}
	log.Info("pool feed synced")

	var last []byte
	var gen uint64
	lastProblems := map[string]string{}
	kick(poke)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
		}
		// Debounce: take every change that arrives meanwhile.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(Debounce):
		}
		select {
		case <-poke:
		default:
		}
		st := State{Services: map[string]*corev1.Service{}, Slices: map[string][]*discoveryv1.EndpointSlice{}}
		for _, o := range poolInf.GetStore().List() {
			var p v1alpha1.IPPool
			if err := fromUnstructured(o, &p); err != nil {
				log.Warn("unreadable IPPool", "err", err)
				continue
			}
			st.Pools = append(st.Pools, p)
		}
		for _, o := range allocInf.GetStore().List() {
			var a v1alpha1.IPAllocation
			if err := fromUnstructured(o, &a); err != nil {
				log.Warn("unreadable IPAllocation", "err", err)
				continue
			}
			st.Allocations = append(st.Allocations, a)
		}
		for _, o := range nodeInf.GetStore().List() {
			st.Nodes = append(st.Nodes, *o.(*corev1.Node))
		}
		for _, o := range svcInf.GetStore().List() {
			s := o.(*corev1.Service)
			st.Services[s.Namespace+"/"+s.Name] = s
		}
		for _, o := range sliceInf.GetStore().List() {
			sl := o.(*discoveryv1.EndpointSlice)
			if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
				k := sl.Namespace + "/" + svc
				st.Slices[k] = append(st.Slices[k], sl)
			}
		}
		addrs, probs := Compute(st)
		now := map[string]string{}
		for _, p := range probs {
			now[p.Object] = p.Reason
			if lastProblems[p.Object] != p.Reason {
				log.Warn("skipping", "object", p.Object, "reason", p.Reason)
			}
		}
		lastProblems = now
		body, err := json.Marshal(addrs)
		if err != nil {
			return err
		}
		if bytes.Equal(body, last) {
			continue
		}
		last = body
		gen++
		if addrs == nil {
			addrs = []wire.PoolAddress{}
		}
		line, err := json.Marshal(wire.PoolSnapshot{Generation: gen, Addresses: addrs})
		if err != nil {
			return err
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("write snapshot: %w", err) // vipd is gone
		}
		log.Debug("snapshot written", "generation", gen, "addresses", len(addrs))
	}
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func stripManagedFields(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return o, nil
}

func fromUnstructured(o any, into any) error {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("unexpected %T", o)
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}
