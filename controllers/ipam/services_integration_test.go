package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
)

// The life of a LoadBalancer Service: class, first free address, requested
// addresses (annotation and spec.loadBalancerIP), named pools, IPv6,
// release on a type change and on deletion.
func TestServiceLifecycle(t *testing.T) {
	h := newHarness(t, false)
	h.pool("life-a", func(s *v1alpha1.IPPoolSpec) { s.AvoidBuggyIPs = true }, "198.18.0.0/30")
	h.pool("life-b", func(s *v1alpha1.IPPoolSpec) { no := false; s.AutoAssign = &no },
		"198.18.1.10-198.18.1.12", "2001:db8:18::10-2001:db8:18::12")
	h.run(Options{Services: true}, nil)

	// First free of the auto-assigning pool, .0 skipped (avoidBuggyIPs).
	web := h.service("web")
	s := h.waitIngress("web", "198.18.0.1(VIP)")
	if c := condition(s); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAllocated {
		t.Errorf("condition %+v, want True/%s", c, ReasonAllocated)
	}
	if !slices.Contains(s.Finalizers, FinalizerService) {
		t.Errorf("finalizers %v, want %s", s.Finalizers, FinalizerService)
	}
	al := h.allocations()["198.18.0.1"]
	if al == nil || al.Spec.Pool != "life-a" || al.Spec.ClaimRef.Kind != "Service" || al.Spec.ClaimRef.Name != "web" ||
		al.Spec.ClaimRef.Namespace != h.ns || al.Spec.ClaimRef.UID != string(web.UID) {
		t.Fatalf("allocation of 198.18.0.1 = %+v", al)
	}
	h.waitEvent("web", corev1.EventTypeNormal, ReasonAllocated, "198.18.0.1")

	// Other classes and plain LoadBalancers (no --default-class) are not served.
	h.service("other", withClass("example.com/lb"))
	h.service("classless", withClass(""))
	// A pool named by annotation, even with autoAssign off; an address
	// requested by annotation; spec.loadBalancerIP; an IPv6 request.
	h.service("named", withAnnotation(AnnotationIPPool, "life-b"))
	h.service("wants", withAnnotation(AnnotationLoadBalancerIPs, "198.18.0.3"))
	h.service("legacy", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "198.18.1.12" })
	h.service("v6", withAnnotation(AnnotationLoadBalancerIPs, "2001:db8:18::11"))
	h.waitIngress("named", "198.18.1.10(VIP)")
	h.waitIngress("wants", "198.18.0.3(VIP)")
	h.waitIngress("legacy", "198.18.1.12(VIP)")
	h.waitIngress("v6", "2001:db8:18::11(VIP)")
	// Outside every pool, and a bad request: a condition and a Warning.
	h.service("outside", withAnnotation(AnnotationLoadBalancerIPs, "203.0.113.9"))
	h.service("garbage", withAnnotation(AnnotationLoadBalancerIPs, "not-an-ip"))
	h.waitEvent("outside", corev1.EventTypeWarning, ReasonNotInPool, "203.0.113.9")
	h.waitEvent("garbage", corev1.EventTypeWarning, ReasonBadRequest, "vipd.io/loadBalancerIPs")
	if c := condition(h.getService("outside")); c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonNotInPool {
		t.Errorf("outside: condition %+v", c)
	}
	if got := ingressIPs(h.getService("garbage")); got != "" {
		t.Errorf("a Service with an unreadable request got %q", got)
	}
	for _, n := range []string{"other", "classless"} {
		if s := h.getService(n); len(s.Status.LoadBalancer.Ingress) > 0 || len(s.Finalizers) > 0 {
			t.Errorf("Service %s of another class was served: %+v %v", n, s.Status, s.Finalizers)
		}
	}

	// Type change: released, status and finalizer cleared.
	s = h.getService("wants")
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.LoadBalancerClass = nil
	if _, err := h.kc.CoreV1().Services(h.ns).Update(h.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitIngress("wants", "")
	h.eventually(10*time.Second, "198.18.0.3 released", func() string {
		if al := h.allocations()["198.18.0.3"]; al != nil {
			return "still allocated"
		}
		if s := h.getService("wants"); len(s.Finalizers) > 0 || condition(s) != nil {
			return fmt.Sprintf("finalizers %v condition %+v", s.Finalizers, condition(s))
		}
		return ""
	})
	// Deletion: the finalizer holds the Service until the address is free.
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitGone(func() error {
		_, err := h.kc.CoreV1().Services(h.ns).Get(h.ctx, "web", metav1.GetOptions{})
		return err
	}, "Service web")
	if al := h.allocations()["198.18.0.1"]; al != nil {
		t.Errorf("198.18.0.1 still allocated after the Service was deleted: %+v", al.Spec)
	}
	// The freed address goes to the next Service.
	h.service("next")
	h.waitIngress("next", "198.18.0.1(VIP)")
}

// Two Services want one address: one wins, the other gets a Warning and a
// condition naming the holder. Sharing with the same key and disjoint
// ports; refused on a port clash; the address passes on when the first
// holder goes.
func TestServiceConflictAndSharing(t *testing.T) {
	h := newHarness(t, false)
	h.pool("share", nil, "198.18.2.0/29")
	h.run(Options{Services: true}, nil)

	h.service("first", withAnnotation(AnnotationLoadBalancerIPs, "198.18.2.5"))
	h.waitIngress("first", "198.18.2.5(VIP)")
	h.service("second", withAnnotation(AnnotationLoadBalancerIPs, "198.18.2.5"))
	h.waitEvent("second", corev1.EventTypeWarning, ReasonAddressInUse, "Service "+h.ns+"/first")
	c := condition(h.getService("second"))
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonAddressInUse || !strings.Contains(c.Message, h.ns+"/first") {
		t.Errorf("loser's condition %+v, want False/%s naming %s/first", c, ReasonAddressInUse, h.ns)
	}
	if got := ingressIPs(h.getService("second")); got != "" {
		t.Errorf("loser got %q", got)
	}

	key := withAnnotation(AnnotationSharingKey, "shared")
	h.service("dns-tcp", key, withPorts(53))
	s := h.waitIngress("dns-tcp", "198.18.2.0(VIP)")
	h.service("dns-udp", key, withAnnotation(AnnotationLoadBalancerIPs, "198.18.2.0"), func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
	})
	h.service("web", key, withPorts(80, 443))
	h.waitIngress("dns-udp", "198.18.2.0(VIP)")
	h.waitIngress("web", "198.18.2.0(VIP)") // joins the address of its key
	al := h.allocations()["198.18.2.0"]
	if al == nil || al.Spec.SharingKey != "shared" || al.Spec.ClaimRef.UID != string(s.UID) || len(al.Spec.Shares) != 2 {
		t.Fatalf("shared allocation %+v", al)
	}
	// A port clash under the same key: its own address instead.
	h.service("web2", key, withPorts(443))
	h.waitIngress("web2", "198.18.2.1(VIP)")
	// A clash on a requested shared address: refused, naming the holder.
	h.service("web3", key, withPorts(80), withAnnotation(AnnotationLoadBalancerIPs, "198.18.2.0"))
	h.waitEvent("web3", corev1.EventTypeWarning, ReasonSharingRejected, "80/TCP")

	// The first holder goes: the address stays with the sharers.
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "dns-tcp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(10*time.Second, "the share passes on", func() string {
		al := h.allocations()["198.18.2.0"]
		if al == nil {
			return "released"
		}
		if al.Spec.ClaimRef.Name == "dns-tcp" || slices.ContainsFunc(al.Spec.Shares, func(r v1alpha1.ClaimRef) bool { return r.Name == "dns-tcp" }) {
			return fmt.Sprintf("still held by dns-tcp: %+v", al.Spec)
		}
		if len(al.Spec.Shares) != 1 {
			return fmt.Sprintf("%+v", al.Spec)
		}
		return ""
	})
	// The winner of the conflict goes: the loser gets the address.
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitIngress("second", "198.18.2.5(VIP)")
}

// Pools: counts, Ready/Invalid/Exhausted conditions, overlapping pools and
// a range that starts after it ends; exhaustion of Services; a pool shrunk
// under an allocation moves the Service; --default-class.
func TestPoolsStatusExhaustionAndShrink(t *testing.T) {
	h := newHarness(t, false)
	h.pool("small", nil, "198.18.3.1-198.18.3.2")
	// Created in the same second as small: seniority falls to the name.
	h.pool("small-overlap", nil, "198.18.3.2/32")
	h.pool("reversed", nil, "198.18.3.20-198.18.3.10")
	h.pool("big6", nil, "2001:db8:19::/64")
	h.run(Options{Services: true, DefaultClass: true}, nil)

	cond := func(p v1alpha1.IPPool, typ string) *metav1.Condition {
		return meta.FindStatusCondition(p.Status.Conditions, typ)
	}
	h.eventually(10*time.Second, "pool conditions", func() string {
		for _, tc := range []struct {
			pool, typ string
			status    metav1.ConditionStatus
			reason    string
		}{
			{"small", PoolReady, metav1.ConditionTrue, ReasonValid},
			{"small-overlap", PoolInvalid, metav1.ConditionTrue, ReasonOverlap},
			{"small-overlap", PoolReady, metav1.ConditionFalse, ReasonOverlap},
			{"reversed", PoolInvalid, metav1.ConditionTrue, ReasonBadAddresses},
			{"big6", PoolExhausted, metav1.ConditionFalse, ReasonFree},
		} {
			c := cond(h.getPool(tc.pool), tc.typ)
			if c == nil || c.Status != tc.status || c.Reason != tc.reason {
				return fmt.Sprintf("%s %s = %+v, want %s/%s", tc.pool, tc.typ, c, tc.status, tc.reason)
			}
		}
		return ""
	})
	if p := h.getPool("big6"); p.Status.Total != 1<<63-1 || p.Status.Free != 1<<63-1 {
		t.Errorf("big6 status %d/%d/%d, want saturated counts", p.Status.Total, p.Status.Allocated, p.Status.Free)
	}
	if c := cond(h.getPool("reversed"), PoolInvalid); !strings.Contains(c.Message, "starts after it ends") {
		t.Errorf("reversed: message %q", c.Message)
	}

	// --default-class: a classless LoadBalancer is served too.
	h.service("a", withClass(""))
	h.service("b")
	h.waitIngress("a", "198.18.3.1(VIP)")
	h.waitIngress("b", "198.18.3.2(VIP)")
	h.service("c")
	h.waitEvent("c", corev1.EventTypeWarning, ReasonExhausted, "small")
	h.eventually(10*time.Second, "small exhausted", func() string {
		p := h.getPool("small")
		c := cond(p, PoolExhausted)
		if p.Status.Total != 2 || p.Status.Allocated != 2 || p.Status.Free != 0 || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("status %+v", p.Status)
		}
		return ""
	})
	// Shrink the pool under b: b moves (the node side withdraws the old
	// address). The waiting c and the overlapping pool (valid once small
	// no longer holds 198.18.3.2) go first, so the move is the only change.
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.dyn.Resource(v1alpha1.IPPoolResource).Delete(h.ctx, "small-overlap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.updatePool("small", func(s *v1alpha1.IPPoolSpec) { s.Addresses = []string{"198.18.3.1/32", "198.18.3.5/32"} })
	h.waitIngress("b", "198.18.3.5(VIP)")
	if al := h.allocations()["198.18.3.2"]; al != nil && al.Spec.Pool == "small" {
		t.Errorf("198.18.3.2 still allocated from small: %+v", al.Spec)
	}
	h.service("c2")
	h.waitEvent("c2", corev1.EventTypeWarning, ReasonExhausted, "small")
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitIngress("c2", "198.18.3.1(VIP)") // the waiting Service is served as soon as one frees
}

// Services deleted while their allocation is in flight leave nothing
// behind: the finalizer holds each until its address is released, or the
// orphan collector frees a record whose Service vanished first.
func TestServiceDeletedWhileAllocating(t *testing.T) {
	h := newHarness(t, false)
	h.pool("flight", nil, "198.18.7.0/28")
	h.run(Options{Services: true, Resync: time.Second}, nil)
	for i := range 10 {
		name := fmt.Sprintf("gone-%d", i)
		h.service(name)
		if i%2 == 1 {
			time.Sleep(time.Duration(i) * 20 * time.Millisecond)
		}
		if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually(20*time.Second, "nothing left behind", func() string {
		l, err := h.kc.CoreV1().Services(h.ns).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		if len(l.Items) > 0 {
			return fmt.Sprintf("%d Services still there", len(l.Items))
		}
		for addr, al := range h.allocations() {
			if al.Spec.Pool == "flight" {
				return fmt.Sprintf("%s still allocated to %s", addr, DescribeRef(al.Spec.ClaimRef))
			}
		}
		return ""
	})
}

// State lives in the API server: a restarted controller adopts what is
// there and allocates nothing new; an allocation whose claimer is gone or
// was re-created (other UID) is released; a Service deleted while its
// claim was in flight leaves nothing behind.
func TestRestartAndOrphans(t *testing.T) {
	h := newHarness(t, false)
	h.pool("restart", nil, "198.18.4.0/29")
	stop := h.run(Options{Services: true}, nil)
	for i := range 3 {
		h.service(fmt.Sprintf("s%d", i))
		h.waitIngress(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.4.%d(VIP)", i))
	}
	before := h.allocations()
	stop()

	// While no controller runs: a record for a Service that never
	// existed, one for s1 with a stale UID (as if s1 were re-created), and
	// s2 deleted (its finalizer keeps it until a controller runs).
	a := NewAllocator(h.dyn)
	ghost := v1alpha1.ClaimRef{Kind: "Service", Namespace: h.ns, Name: "ghost", UID: "00000000-0000-0000-0000-000000000001"}
	if _, err := a.Take(h.ctx, mustParse("198.18.4.6"), "restart", ghost, ""); err != nil {
		t.Fatal(err)
	}
	stale := v1alpha1.ClaimRef{Kind: "Service", Namespace: h.ns, Name: "s1", UID: "00000000-0000-0000-0000-000000000002"}
	if _, err := a.Take(h.ctx, mustParse("198.18.4.7"), "restart", stale, ""); err != nil {
		t.Fatal(err)
	}
	if err := h.kc.CoreV1().Services(h.ns).Delete(h.ctx, "s2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	h.run(Options{Services: true}, nil)
	h.waitGone(func() error { _, err := h.kc.CoreV1().Services(h.ns).Get(h.ctx, "s2", metav1.GetOptions{}); return err }, "Service s2")
	h.eventually(15*time.Second, "orphans released", func() string {
		all := h.allocations()
		for _, addr := range []string{"198.18.4.2", "198.18.4.6", "198.18.4.7"} {
			if all[addr] != nil {
				return addr + " still allocated"
			}
		}
		return ""
	})
	after := h.allocations()
	for _, addr := range []string{"198.18.4.0", "198.18.4.1"} {
		if before[addr] == nil || after[addr] == nil || before[addr].UID != after[addr].UID {
			t.Errorf("%s: allocation changed across the restart: %v -> %v", addr, before[addr], after[addr])
		}
	}
	for i := range 2 {
		h.waitIngress(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.4.%d(VIP)", i))
	}
	// A record deleted by hand: the Service takes the same address back.
	if err := h.dyn.Resource(v1alpha1.IPAllocationResource).Delete(h.ctx, "198.18.4.1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(10*time.Second, "198.18.4.1 taken back", func() string {
		al := h.allocations()["198.18.4.1"]
		if al == nil || al.Spec.ClaimRef.Name != "s1" || al.UID == after["198.18.4.1"].UID {
			return fmt.Sprintf("%+v", al)
		}
		return ""
	})
	h.waitIngress("s1", "198.18.4.1(VIP)")

	// Release is conditional on the record's UID: a record re-created for
	// someone else survives a stale delete. (IPAddressClaim claimers: this
	// Services-only controller leaves them alone.)
	x := v1alpha1.ClaimRef{APIGroup: ipamGroup, Kind: "IPAddressClaim", Namespace: h.ns, Name: "x", UID: "00000000-0000-0000-0000-00000000000a"}
	y := v1alpha1.ClaimRef{APIGroup: ipamGroup, Kind: "IPAddressClaim", Namespace: h.ns, Name: "y", UID: "00000000-0000-0000-0000-00000000000b"}
	old, err := a.Take(h.ctx, mustParse("198.18.4.5"), "restart", x, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Take(h.ctx, mustParse("198.18.4.5"), "restart", y, ""); err == nil {
		t.Fatal("a taken address was taken again")
	} else if te, ok := err.(*TakenError); !ok || te.Holder.Name != "x" {
		t.Fatalf("taking a taken address: %v, want a TakenError naming x", err)
	}
	if err := a.Client.Delete(h.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Take(h.ctx, mustParse("198.18.4.5"), "restart", y, ""); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(h.ctx, old, x); err != nil {
		t.Fatalf("stale release: %v", err)
	}
	cur, err := a.Get(h.ctx, mustParse("198.18.4.5"))
	if err != nil || cur.Spec.ClaimRef.Name != "y" {
		t.Errorf("after a stale release: %+v, %v; want the record of y", cur, err)
	}
	if err := a.Release(h.ctx, cur, y); err != nil {
		t.Fatal(err)
	}
}

func mustParse(s string) netip.Addr { return netip.MustParseAddr(s) }

// The apiserver loses its etcd while Services wait for addresses: the
// controller keeps retrying (errors, not a crash or a stuck queue), and
// once etcd is back every Service gets exactly one address.
func TestAPIServerErrors(t *testing.T) {
	h := newHarness(t, false)
	h.pool("outage", nil, "198.18.6.0/29")
	h.run(Options{Services: true, Resync: time.Second}, nil)
	h.service("before")
	h.waitIngress("before", "198.18.6.0(VIP)")

	killed := time.Now()
	h.srv.KillEtcd()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = h.srv.StartEtcd(context.Background())
		}
	})
	// Writes fail while etcd is down: a Service created now cannot even be
	// stored; the controller's pending work meets errors.
	time.Sleep(2 * time.Second)
	if err := h.srv.StartEtcd(h.ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("etcd back after %s", time.Since(killed).Round(time.Millisecond))
	for i := range 3 {
		h.service(fmt.Sprintf("after-%d", i))
	}
	seen := map[string]bool{"198.18.6.0": true}
	for i := range 3 {
		s := h.waitIngressAny(fmt.Sprintf("after-%d", i))
		if seen[s] {
			t.Errorf("%s handed out twice", s)
		}
		seen[s] = true
	}
	h.waitIngress("before", "198.18.6.0(VIP)")
	t.Logf("all served %s after etcd was killed", time.Since(killed).Round(time.Millisecond))
}

// waitIngressAny waits for one ingress address and returns it.
func (h *harness) waitIngressAny(name string) string {
	h.t.Helper()
	var got string
	h.eventually(30*time.Second, "Service "+name+" gets an address", func() string {
		s, err := h.kc.CoreV1().Services(h.ns).Get(h.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(s.Status.LoadBalancer.Ingress) != 1 {
			return fmt.Sprintf("status %+v", s.Status)
		}
		got = s.Status.LoadBalancer.Ingress[0].IP
		return ""
	})
	return got
}
