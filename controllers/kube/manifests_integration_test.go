package kube

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/vipd/vipd/controllers/api/v1alpha1"
	"github.com/vipd/vipd/internal/fakedo"
	"github.com/vipd/vipd/internal/kubetest"
)

// TestShippedManifestsAreAccepted sends every manifest under deploy/kube to
// the apiserver with a server-side dry run, so schema or field mistakes in
// the Deployment, RBAC or examples fail here.
func TestShippedManifestsAreAccepted(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	files, err := filepath.Glob(repoPath(t, "deploy/kube/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	examples, _ := filepath.Glob(repoPath(t, "deploy/kube/examples/*.yaml"))
	files = append(files, examples...)
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	objs, err := kubetest.ReadObjects(files...)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]schema.GroupVersionResource{
		"Namespace":          {Version: "v1", Resource: "namespaces"},
		"ServiceAccount":     {Version: "v1", Resource: "serviceaccounts"},
		"Deployment":         {Group: "apps", Version: "v1", Resource: "deployments"},
		"ClusterRole":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
		"ClusterRoleBinding": {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
		"Role":               {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
		"RoleBinding":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
		"FloatingIPPool":     FloatingIPPoolResource,
		"NodeDNSRecordSet":   NodeDNSRecordSetResource,
		"IPPool":             v1alpha1.IPPoolResource,
		"Service":            {Version: "v1", Resource: "services"},
		"EgressPolicy":       {Group: "vipd.io", Version: "v1alpha1", Resource: "egresspolicies"},
	}
	for _, o := range objs {
		gvr, ok := resources[o.GetKind()]
		if !ok {
			t.Fatalf("no resource known for kind %s", o.GetKind())
		}
		o.SetResourceVersion("")
		var err error
		if ns := o.GetNamespace(); ns != "" {
			_, err = h.dyn.Resource(gvr).Namespace(ns).Create(h.ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		} else {
			_, err = h.dyn.Resource(gvr).Create(h.ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		}
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("%s %s/%s rejected: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func TestCreateIPErrorsAndRecovery(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	h.do.AddFault(fakedo.Fault{Method: "POST", Path: "/v2/reserved_ips", Status: 429, Count: 1})
	h.apply(h.example("floatingippool.yaml", func(spec map[string]any) { spec["desiredIPs"] = int64(1) }))
	h.start("one")
	eventually(t, 15*time.Second, "creation error in status", func() error {
		if e := h.pool("ingress-pool").Status.Error; !strings.HasPrefix(e, "creating new ip with provider: ") {
			return fmt.Errorf("status.error %q", e)
		}
		return nil
	})
	eventually(t, 15*time.Second, "created after the backoff", func() error {
		p := h.pool("ingress-pool")
		if len(p.Spec.IPs) != 1 || p.Status.Error != "" {
			return fmt.Errorf("spec.ips %v, status.error %q", p.Spec.IPs, p.Status.Error)
		}
		if p.Status.IPs[p.Spec.IPs[0]].State != IPStateUnassigned {
			return fmt.Errorf("status %+v", p.Status.IPs)
		}
		return nil
	})
	never(t, 2*time.Second, "exactly one IP created", func() error {
		if n := h.do.Count("POST", "/v2/reserved_ips"); n != 2 { // the 429 and the success
			return fmt.Errorf("%d create calls", n)
		}
		return nil
	})
}

// TestCRDsAcceptFLIPOPObjects: vipd's CRDs accept every object FLIPOP's
// accept (read from FLIPOP's k8s/*.crd.yaml): IPv4 with leading zeros,
// IPv6 forms with a zone, an empty ips list, FLIPOP's examples as they are
// (including the NodeDNSRecordSet with spec.provider that FLIPOP's README
// shows), and keep what FLIPOP's schema would prune.
func TestCRDsAcceptFLIPOPObjects(t *testing.T) {
	h := newHarness(t)
	t.Parallel()
	pool := func(ips ...any) map[string]any {
		return map[string]any{
			"apiVersion": Group + "/" + Version, "kind": "FloatingIPPool",
			"metadata": map[string]any{"generateName": "p-", "namespace": h.ns},
			"spec": map[string]any{"provider": "digitalocean", "ips": ips, "desiredIPs": int64(0),
				"assignmentCoolOffSeconds": 0.5,
				"match": map[string]any{"tolerations": []any{map[string]any{
					"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": int64(30)}}},
				"dnsRecordSet": map[string]any{"zone": "example.com", "recordName": "x"}},
		}
	}
	accepted := []map[string]any{
		pool("010.0.0.1", "192.168.001.001", "0.0.0.0", "255.255.255.255"),
		pool("2001:db8::1", "fe80::1%eth0", "::"),
		pool(),
		{
			"apiVersion": Group + "/" + Version, "kind": "NodeDNSRecordSet",
			"metadata": map[string]any{"generateName": "n-", "namespace": h.ns},
			"spec": map[string]any{"addressType": "InternalIP",
				"dnsRecordSet": map[string]any{"provider": "cloudflare", "zone": "0123456789abcdef0123456789abcdef", "recordName": "a.example.com", "ttl": int64(0)}},
		},
	}
	for _, file := range []string{"floatingippool.yaml", "nodednsrecordset.yaml"} { // FLIPOP's examples, unchanged
		objs, err := kubetest.ReadObjects(repoPath(t, "deploy/kube/examples/"+file))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			o.SetNamespace(h.ns)
			accepted = append(accepted, o.Object)
		}
	}
	for i, obj := range accepted {
		u := &unstructured.Unstructured{Object: obj}
		gvr := FloatingIPPoolResource
		if u.GetKind() == "NodeDNSRecordSet" {
			gvr = NodeDNSRecordSetResource
		}
		got, err := h.dyn.Resource(gvr).Namespace(h.ns).Create(h.ctx, u, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("object %d (%s) rejected: %v", i, u.GetKind(), err)
			continue
		}
		if u.GetKind() == "FloatingIPPool" {
			ips, _, _ := unstructured.NestedStringSlice(got.Object, "spec", "ips")
			want, _, _ := unstructured.NestedStringSlice(obj, "spec", "ips")
			if fmt.Sprint(ips) != fmt.Sprint(want) {
				t.Errorf("object %d: ips stored as %v, want %v", i, ips, want)
			}
			if tol, _, _ := unstructured.NestedSlice(got.Object, "spec", "match", "tolerations"); i < 3 && len(tol) == 1 {
				if s, _, _ := unstructured.NestedInt64(tol[0].(map[string]any), "tolerationSeconds"); s != 30 {
					t.Errorf("object %d: tolerationSeconds pruned", i)
				}
			}
		}
		if u.GetKind() == "NodeDNSRecordSet" && u.GetName() == "ingress-nodes" {
			if p, _, _ := unstructured.NestedString(got.Object, "spec", "provider"); p != "digitalocean" {
				t.Errorf("FLIPOP README's spec.provider pruned")
			}
		}
	}
	// What neither accepts is still refused (the schema is not "anything").
	for _, bad := range []any{"300.0.0.1", "example.com", "1.2.3"} {
		u := &unstructured.Unstructured{Object: pool(bad)}
		if _, err := h.dyn.Resource(FloatingIPPoolResource).Namespace(h.ns).Create(h.ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
			t.Errorf("ips [%q] accepted", bad)
		}
	}
}
