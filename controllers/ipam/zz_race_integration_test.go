package ipam

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// (The file name makes this test run last in the package: the apiserver is
// shared, and 400 claimers are a load on every controller started after.)
//
// Two replicas with leader election off race over 200 Services (a pool of
// 150: demand exceeds supply) and 200 IPAddressClaims (a pool of 256).
// No address may end up with two claimers; every claimer gets one while
// addresses last; the rest are told the pool is exhausted; no allocation
// is left without its claimer.
func TestTwoReplicasRace(t *testing.T) {
	const n = 200
	h := newHarness(t, true)
	h.pool("race-svc", nil, "198.19.0.1-198.19.0.150")
	h.pool("race-capi", func(s *v1alpha1.IPPoolSpec) { no := false; s.AutoAssign = &no }, "198.19.1.0/24")
	opts := Options{Services: true, CAPI: true, OrphanGrace: 3 * time.Second, Workers: 8}
	h.run(opts, nil)
	h.run(opts, nil)

	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan func())
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	for i := range n {
		work <- func() { h.service(fmt.Sprintf("svc-%03d", i)) }
		work <- func() { h.claim(fmt.Sprintf("claim-%03d", i), "race-capi", nil) }
	}
	close(work)
	wg.Wait()
	t.Logf("created %d Services and %d claims in %s", n, n, time.Since(start).Round(time.Millisecond))

	type holder struct{ kind, name, uid string }
	var last string
	h.eventually(150*time.Second, "everything settled", func() string {
		owners := map[string][]holder{} // address -> holders seen in statuses / IPAddresses
		svcs, err := h.kc.CoreV1().Services(h.ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		served, exhausted := 0, 0
		for _, s := range svcs.Items {
			for _, ing := range s.Status.LoadBalancer.Ingress {
				owners[ing.IP] = append(owners[ing.IP], holder{"Service", s.Name, string(s.UID)})
			}
			c := condition(&s)
			switch {
			case len(s.Status.LoadBalancer.Ingress) == 1 && c != nil && c.Status == metav1.ConditionTrue:
				served++
			case len(s.Status.LoadBalancer.Ingress) == 0 && c != nil && c.Reason == ReasonExhausted && strings.Contains(c.Message, "race-svc"):
				exhausted++
			}
		}
		addrs, err := h.dyn.Resource(IPAddressResource).Namespace(h.ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		claimUID := map[string]string{}
		claims, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for _, c := range claims.Items {
			claimUID[c.GetName()] = string(c.GetUID())
		}
		for _, a := range addrs.Items {
			ip := unstructuredString(&a, "spec", "address")
			claim := unstructuredString(&a, "spec", "claimRef", "name")
			owners[ip] = append(owners[ip], holder{"IPAddressClaim", claim, claimUID[claim]})
		}
		// The safety property, checked on every poll, settled or not.
		for ip, hs := range owners {
			if len(hs) > 1 {
				t.Fatalf("%s handed to %d claimers: %v", ip, len(hs), hs)
			}
		}
		allocs := h.allocations()
		mine := 0
		for ip, al := range allocs {
			if al.Spec.Pool != "race-svc" && al.Spec.Pool != "race-capi" {
				continue
			}
			mine++
			hs := owners[ip]
			if len(hs) != 1 {
				return fmt.Sprintf("allocation %s (%s) has no claimer showing it yet", ip, DescribeRef(al.Spec.ClaimRef))
			}
			if hs[0].kind != al.Spec.ClaimRef.Kind || hs[0].name != al.Spec.ClaimRef.Name || hs[0].uid != al.Spec.ClaimRef.UID {
				t.Fatalf("%s: the status shows %v but the allocation is for %s %s", ip, hs[0], DescribeRef(al.Spec.ClaimRef), al.Spec.ClaimRef.UID)
			}
		}
		for ip, hs := range owners {
			if al := allocs[ip]; al == nil {
				return fmt.Sprintf("%s shown to %v has no allocation", ip, hs)
			}
		}
		last = fmt.Sprintf("services served %d exhausted %d, IPAddresses %d, allocations %d", served, exhausted, len(addrs.Items), mine)
		if served != 150 || exhausted != n-150 || len(addrs.Items) != n || mine != 150+n {
			return last
		}
		return ""
	})
	t.Logf("settled %s after creation: %s", time.Since(start).Round(time.Millisecond), last)

	// Every claim is Ready and its IPAddress is in the pool.
	claims, err := h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var notReady []string
	for _, c := range claims.Items {
		if rc := readyCondition(&c); rc == nil || rc["status"] != "True" {
			notReady = append(notReady, c.GetName())
		}
	}
	sort.Strings(notReady)
	if len(notReady) > 0 {
		t.Errorf("claims not Ready: %v", notReady)
	}
	p := h.getPool("race-svc")
	if p.Status.Total != 150 || p.Status.Allocated != 150 || p.Status.Free != 0 {
		t.Errorf("race-svc status %+v", p.Status)
	}

	// Freeing 20 Services serves 20 of the waiting ones, still exclusive.
	for i := range 20 {
		if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, fmt.Sprintf("svc-%03d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually(30*time.Second, "waiting Services served", func() string {
		svcs, err := h.kc.CoreV1().Services(h.ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		seen := map[string]string{}
		served := 0
		for _, s := range svcs.Items {
			for _, ing := range s.Status.LoadBalancer.Ingress {
				if other, ok := seen[ing.IP]; ok {
					t.Fatalf("%s shown by %s and %s", ing.IP, other, s.Name)
				}
				seen[ing.IP] = s.Name
				served++
			}
		}
		if len(svcs.Items) != n-20 || served != 150 {
			return fmt.Sprintf("%d Services, %d served", len(svcs.Items), served)
		}
		return ""
	})

	// Every claimer goes: every address comes back.
	deleting := time.Now()
	del := make(chan func())
	var dwg sync.WaitGroup
	for range 32 {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			for f := range del {
				f()
			}
		}()
	}
	for i := range n {
		del <- func() {
			_ = h.kc.CoreV1().Services(h.ns).Delete(h.ctx, fmt.Sprintf("svc-%03d", i), metav1.DeleteOptions{})
		}
		del <- func() {
			_ = h.dyn.Resource(IPAddressClaimResource).Namespace(h.ns).Delete(h.ctx, fmt.Sprintf("claim-%03d", i), metav1.DeleteOptions{})
		}
	}
	close(del)
	dwg.Wait()
	h.eventually(150*time.Second, "every address released", func() string {
		left := 0
		for _, al := range h.allocations() {
			if al.Spec.Pool == "race-svc" || al.Spec.Pool == "race-capi" {
				left++
			}
		}
		if left > 0 {
			return fmt.Sprintf("%d allocations left", left)
		}
		return ""
	})
	t.Logf("all %d claimers deleted and their addresses released in %s", 2*n, time.Since(deleting).Round(time.Millisecond))
}
