package v1alpha1

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/vipd/vipd/internal/kubetest"
)

var env kubetest.Env

func TestMain(m *testing.M) { os.Exit(env.Main(m)) }

func toUnstructured(t *testing.T, obj any) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// The apiserver itself validates pools and allocation records: the CRDs'
// schemas and CEL rules are the first line against bad input.
func TestCRDValidation(t *testing.T) {
	srv := env.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.ReadObjects(filepath.Join(root, "deploy/kube/crds/ippool.yaml"), filepath.Join(root, "deploy/kube/crds/ipallocation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config(), objs...); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(IPPoolResource)
	allocs := dyn.Resource(IPAllocationResource)

	pool := func(name string, addrs ...string) *unstructured.Unstructured {
		return toUnstructured(t, &IPPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: "IPPool"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       IPPoolSpec{Addresses: addrs},
		})
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		bad   string // part of the error; empty: accepted
	}{
		{"v4-cidr", []string{"192.0.2.0/28"}, ""},
		{"mixed", []string{"192.0.2.10-192.0.2.20", "2001:db8::/120", "2001:db8:1::1-2001:db8:1::9"}, ""},
		{"garbage", []string{"not-an-ip"}, "must be a CIDR"},
		{"mixed-family-range", []string{"192.0.2.1-2001:db8::1"}, "must be a CIDR"},
		{"three-part-range", []string{"192.0.2.1-192.0.2.2-192.0.2.3"}, "must be a CIDR"},
		{"empty", nil, "addresses"},
	} {
		_, err := pools.Create(ctx, pool(tc.name, tc.addrs...), metav1.CreateOptions{})
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("pool %s %v refused: %v", tc.name, tc.addrs, err)
		case tc.bad != "" && err == nil:
			t.Errorf("pool %s %v accepted, want an error containing %q", tc.name, tc.addrs, tc.bad)
		case tc.bad != "" && !strings.Contains(err.Error(), tc.bad):
			t.Errorf("pool %s %v: error %q does not contain %q", tc.name, tc.addrs, err, tc.bad)
		}
	}
	got, err := pools.Get(ctx, "v4-cidr", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mode, _, _ := unstructured.NestedString(got.Object, "spec", "mode"); mode != ModeL2 {
		t.Errorf("default mode = %q, want %q", mode, ModeL2)
	}
	bad := pool("bad-mode", "192.0.2.0/28")
	_ = unstructured.SetNestedField(bad.Object, "ospf", "spec", "mode")
	if _, err := pools.Create(ctx, bad, metav1.CreateOptions{}); err == nil {
		t.Error("mode ospf accepted")
	}

	alloc := func(name, addr string) *unstructured.Unstructured {
		return toUnstructured(t, &IPAllocation{
			TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: "IPAllocation"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: IPAllocationSpec{Address: addr, Pool: "v4-cidr", ClaimedAt: metav1.Now(),
				ClaimRef: ClaimRef{Kind: "Service", Namespace: "default", Name: "web"}},
		})
	}
	name6, _ := AllocationName(netip.MustParseAddr("2001:db8::7"))
	for _, tc := range []struct {
		name, addr string
		ok         bool
	}{
		{"192.0.2.7", "192.0.2.7", true},
		{name6, "2001:db8::7", true},
		{"192.0.2.8", "192.0.2.9", false},
		{"2001-0db8-0000-0000-0000-0000-0000-0008", "2001:db8::7", false},
		{"web", "192.0.2.10", false},
		{"2001-0db8-0000-0000-0000-0000-0000-0009", "2001:DB8::9", false}, // not canonical
		{"192.0.2.11", "192.0.2.011", false},
	} {
		_, err := allocs.Create(ctx, alloc(tc.name, tc.addr), metav1.CreateOptions{})
		if tc.ok != (err == nil) {
			t.Errorf("allocation %s for %s: err %v, want ok=%v", tc.name, tc.addr, err, tc.ok)
		}
	}
	// Taking a taken address fails with AlreadyExists: this is the claim.
	if _, err := allocs.Create(ctx, alloc("192.0.2.7", "192.0.2.7"), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("second allocation of 192.0.2.7: %v, want AlreadyExists", err)
	}
	// The address of a record never changes.
	cur, err := allocs.Get(ctx, "192.0.2.7", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(cur.Object, "other", "spec", "pool")
	if _, err := allocs.Update(ctx, cur, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("changing the pool of an allocation: %v, want immutable", err)
	}
}
